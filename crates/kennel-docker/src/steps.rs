//! The docker runtime's sequence, one flat list of named steps, each with its reason. A failure
//! names its step (`docker: <step>`) and the engine's answer.

use std::io;

use kennel_sandbox::Error;

/// One step of a docker run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Connect,
    Image,
    Create,
    Start,
    Network,
    Files,
    Exec,
    Collect,
    Remove,
}

/// Every step in the order a run takes them, with why it is there.
pub const STEPS: &[(Step, &str)] = &[
    (Step::Connect, "reach the engine on its unix socket (DOCKER_HOST or /var/run/docker.sock) and learn whether it remaps user namespaces"),
    (Step::Image, "the root: the host's view as a skeleton image with read-only binds, or a Kennel image imported once by digest"),
    (Step::Create, "the policy as a container: read-only root, limits, capabilities, seccomp, no_new_privs, masks, tmpfs scratch, an init"),
    (Step::Start, "start the container's idle holder, so that the network and the files are in place before any code runs"),
    (Step::Network, "for an allowlist, bind Kennel's proxy inside the container's own network namespace"),
    (Step::Files, "write the input files into the scratch space through the container's root, no symlink followed"),
    (Step::Exec, "run the code in the container, with its stdin, capped output and the deadline enforced from outside"),
    (Step::Collect, "read the files to return through the container's root, no symlink followed, before it is removed"),
    (Step::Remove, "kill and remove the container, whatever happened"),
];

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Connect => "docker: connect",
            Step::Image => "docker: image",
            Step::Create => "docker: create",
            Step::Start => "docker: start",
            Step::Network => "docker: network",
            Step::Files => "docker: files",
            Step::Exec => "docker: exec",
            Step::Collect => "docker: collect",
            Step::Remove => "docker: remove",
        }
    }

    /// The error of this step failing for `why`.
    pub fn fail(self, why: impl std::fmt::Display) -> Error {
        Error::Io {
            what: self.name(),
            source: io::Error::other(why.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_run_in_this_order() {
        let order: Vec<Step> = STEPS.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            order,
            [
                Step::Connect,
                Step::Image,
                Step::Create,
                Step::Start,
                Step::Network,
                Step::Files,
                Step::Exec,
                Step::Collect,
                Step::Remove
            ]
        );
    }
}
