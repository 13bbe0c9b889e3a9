//! Landlock: a second filesystem layer beneath the mount namespace. Even if a mount were left
//! writable by mistake, only the scratch directories accept writes.

use std::io;

use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};

use crate::sys;

/// What Landlock did for this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub enforced: bool,
    pub abi: Option<u32>,
}

/// The newest ABI Kennel knows how to use; older kernels get the subset they have.
const TARGET_ABI: ABI = ABI::V5;

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Restricts this process (and its future children) to reading and executing beneath
/// `read_only` and to full access beneath `writable`. Paths must be existing directories.
pub fn restrict(read_only: &[&str], writable: &[&str]) -> io::Result<Outcome> {
    let abi = sys::landlock_abi();
    if abi.is_none() {
        return Ok(Outcome {
            enforced: false,
            abi,
        });
    }
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .map_err(other)?
        .create()
        .map_err(other)?
        .add_rules(path_beneath_rules(
            read_only,
            AccessFs::from_read(TARGET_ABI),
        ))
        .map_err(other)?
        .add_rules(path_beneath_rules(writable, AccessFs::from_all(TARGET_ABI)))
        .map_err(other)?
        .restrict_self()
        .map_err(other)?;
    Ok(Outcome {
        enforced: status.ruleset != RulesetStatus::NotEnforced,
        abi,
    })
}
