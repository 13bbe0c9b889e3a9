//! gVisor on KVM: where KVM cannot run guests, `kennel doctor` says so with the reason, and a
//! run that asks for it fails at once (125) instead of waiting for its timeout.
//!
//! What this host's KVM can do is detected, not assumed: the expectation below comes from the
//! loaded modules only to pick which answer is right here.

mod common;

use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// Where Kennel keeps the answer of its KVM probe for this boot.
const KVM_CACHE: &str = "/run/kennel/oci/runsc-kvm";

/// Whether this host's KVM is one that gVisor's guests cannot run on: none at all, or PVM (a
/// paravirtual KVM inside a VM). `None` where it may well work.
fn kvm_expected_unusable() -> Option<&'static str> {
    let usable_dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    if !usable_dev {
        Some("/dev/kvm cannot be opened")
    } else if Path::new("/sys/module/kvm_pvm").exists() {
        Some("kvm_pvm")
    } else {
        None
    }
}

fn runsc_ready() -> bool {
    require("root (the oci tier)", is_root())
        && require("runsc (gVisor)", Path::new("/usr/bin/runsc").exists())
}

#[test]
fn doctor_says_why_kvm_is_not_usable() {
    if !runsc_ready() {
        return;
    }
    let out = kennel().args(["doctor", "--json"]).output().unwrap();
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runsc = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "oci runsc")
        .expect("doctor checks runsc");
    let detail = runsc["detail"].as_str().unwrap();
    assert!(runsc["ok"] == true, "ptrace works here: {runsc}");
    assert!(!detail.contains("status 137"), "{detail}");
    match kvm_expected_unusable() {
        Some(why) => {
            let (_, reason) = detail
                .split_once("on kvm: KVM is not usable here: ")
                .unwrap_or_else(|| panic!("doctor does not say KVM is unusable: {detail}"));
            assert!(reason.contains(why), "the reason names {why}: {reason}");
        }
        None => {
            eprintln!("KVM may work here; doctor says: {detail}");
            assert!(
                detail.contains("on kvm in") || detail.contains("KVM is not usable here: "),
                "{detail}"
            );
        }
    }
}

/// A run on KVM where KVM cannot run guests fails with the reason, long before its timeout
/// (60 s here), whether Kennel probes now (no answer kept) or already knows.
#[test]
fn a_run_on_unusable_kvm_fails_fast_with_the_reason() {
    if !runsc_ready() {
        return;
    }
    let Some(why) = kvm_expected_unusable() else {
        eprintln!("SKIPPED: KVM may work on this host; nothing to refuse");
        return;
    };
    for fresh in [true, false] {
        if fresh {
            let _ = std::fs::remove_file(KVM_CACHE);
        }
        let started = Instant::now();
        let out = kennel_output(
            &[
                "run",
                "--runtime",
                "runsc",
                "--platform",
                "kvm",
                "--timeout",
                "60s",
                "--",
                "/bin/true",
            ],
            b"",
        );
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains("KVM is not usable here: "), "{err}");
        assert!(err.contains(why), "the reason names {why}: {err}");
        assert!(err.contains("--platform ptrace"), "a hint: {err}");
        assert!(
            took < Duration::from_secs(20),
            "took {took:?} (fresh probe: {fresh})"
        );
    }
}
