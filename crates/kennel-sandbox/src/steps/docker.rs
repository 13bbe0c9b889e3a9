//! The docker runtime's sequence (the oci tier on a Docker Engine): one flat, ordered list of
//! named steps, each with its reason. `kennel-docker` runs them; a failure is
//! `Error::Setup { step: SetupStep::Docker(..), .. }` with the engine's answer as its detail.

steps! {
    Connect = "connect",
        "reach the engine on its unix socket (DOCKER_HOST or /var/run/docker.sock) and learn whether it remaps user namespaces";
    Image = "image",
        "the root: the host's view as a skeleton image with read-only binds, or a Kennel image imported once by digest";
    Create = "create",
        "the policy as a container: read-only root, limits, capabilities, seccomp, no_new_privs, masks, tmpfs scratch, an init";
    Start = "start",
        "start the container's idle holder, so that the network and the files are in place before any code runs";
    Network = "network",
        "for an allowlist, bind Kennel's proxy inside the container's own network namespace";
    Files = "files",
        "write the input files into the scratch space through the container's root, no symlink followed";
    Exec = "exec",
        "run the code in the container, with its stdin, capped output and the deadline enforced from outside";
    Collect = "collect",
        "read the files to return through the container's root, no symlink followed, before it is removed";
    Remove = "remove",
        "kill and remove the container, whatever happened";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_run_in_the_documented_order() {
        assert_eq!(
            Step::ALL,
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
        let pos = |s: Step| Step::ALL.iter().position(|x| *x == s).unwrap();
        // Nothing of the code runs before its sandbox is complete: the proxy listens and the
        // files are in place before the exec, in a container already started.
        assert!(pos(Step::Start) < pos(Step::Network));
        assert!(pos(Step::Network) < pos(Step::Exec));
        assert!(pos(Step::Files) < pos(Step::Exec));
        // The files come back through the container's root, so before it is removed.
        assert!(pos(Step::Collect) < pos(Step::Remove));
        assert_eq!(pos(Step::Remove), Step::ALL.len() - 1);
    }
}
