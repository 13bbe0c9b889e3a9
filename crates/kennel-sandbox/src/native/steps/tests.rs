//! The isolation order, checked without root through a recording `Os`.

use std::io;

use super::*;
use crate::channel::Plan;
use crate::native::landlock::Outcome;
use crate::profile::mounts::View;
use kennel_types::policy::Policy;

#[derive(Default)]
struct Recorder {
    calls: Vec<String>,
    /// What Landlock answers; enforced when `None`.
    landlock: Option<Outcome>,
    /// The capabilities kept, which /proc/self/status then shows.
    caps: u64,
}

impl Recorder {
    fn log(&mut self, call: impl Into<String>) -> io::Result<()> {
        self.calls.push(call.into());
        Ok(())
    }

    fn index(&self, prefix: &str) -> usize {
        self.calls
            .iter()
            .position(|c| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("no call starting with {prefix:?} in {:#?}", self.calls))
    }

    fn last_index(&self, prefix: &str) -> usize {
        self.calls
            .iter()
            .rposition(|c| c.starts_with(prefix))
            .expect(prefix)
    }
}

impl Os for Recorder {
    fn mount_volume(
        &mut self,
        image: &std::path::Path,
        read_only: bool,
    ) -> io::Result<std::os::fd::OwnedFd> {
        self.log(format!("mount_volume {} ro={read_only}", image.display()))?;
        Ok(std::fs::File::open("/dev/null")?.into())
    }
    fn attach_mount(&mut self, _: &std::os::fd::OwnedFd, target: &str) -> io::Result<()> {
        self.log(format!("attach_mount {target}"))
    }
    fn join_cgroup(&mut self, file: &str) -> io::Result<()> {
        self.log(format!("join_cgroup {file}"))
    }
    fn unshare(&mut self, flags: libc::c_int) -> io::Result<()> {
        self.log(format!("unshare({flags:#x})"))
    }
    fn request_id_map(&mut self) -> io::Result<()> {
        self.log("request_id_map")
    }
    fn become_root(&mut self, _: bool) -> io::Result<()> {
        self.log("become_root")
    }
    fn set_parent_death_signal(&mut self) -> io::Result<()> {
        self.log("pdeathsig")
    }
    fn parent_pid(&mut self) -> i32 {
        SUPERVISOR
    }
    fn set_dumpable(&mut self, on: bool) -> io::Result<()> {
        self.log(format!("dumpable({on})"))
    }
    fn mount(
        &mut self,
        source: Option<&str>,
        target: &str,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        _: Option<&str>,
    ) -> io::Result<()> {
        let kind = if flags & libc::MS_REMOUNT != 0 {
            "remount"
        } else {
            "mount"
        };
        self.log(format!(
            "{kind} {} {} on {target}",
            fstype.unwrap_or("-"),
            source.unwrap_or("-")
        ))
    }
    fn mount_flags_of(&mut self, _: &str) -> io::Result<libc::c_ulong> {
        Ok(libc::MS_NOSUID)
    }
    fn umount_detach(&mut self, target: &str) -> io::Result<()> {
        self.log(format!("umount {target}"))
    }
    fn pivot_root(&mut self, _: &str, _: &str) -> io::Result<()> {
        self.log("pivot_root")
    }
    fn mkdir_all(&mut self, path: &str) -> io::Result<()> {
        self.log(format!("mkdir {path}"))
    }
    fn touch(&mut self, path: &str) -> io::Result<()> {
        self.log(format!("touch {path}"))
    }
    fn symlink(&mut self, _: &str, link: &str) -> io::Result<()> {
        self.log(format!("symlink {link}"))
    }
    fn write_file(&mut self, path: &str, _: &[u8], _: u32) -> io::Result<()> {
        self.log(format!("write {path}"))
    }
    fn remove_file(&mut self, path: &str) -> io::Result<()> {
        self.log(format!("remove {path}"))
    }
    fn chdir(&mut self, path: &str) -> io::Result<()> {
        self.log(format!("chdir {path}"))
    }
    fn sethostname(&mut self, _: &str) -> io::Result<()> {
        self.log("sethostname")
    }
    fn loopback_up(&mut self) -> io::Result<()> {
        self.log("loopback_up")
    }
    fn set_cpu_affinity(&mut self, _: &[usize]) -> io::Result<()> {
        self.log("affinity")
    }
    fn setsid(&mut self) -> io::Result<()> {
        self.log("setsid")
    }
    fn reset_signals(&mut self) -> io::Result<()> {
        self.log("reset_signals")
    }
    fn set_rlimit(&mut self, resource: libc::__rlimit_resource_t, _: u64) -> io::Result<()> {
        self.log(format!("rlimit {resource}"))
    }
    fn limit_capabilities(&mut self, keep: u64) -> io::Result<()> {
        self.caps = keep;
        self.log("drop_caps")
    }
    fn set_no_new_privs(&mut self) -> io::Result<()> {
        self.log("no_new_privs")
    }
    fn landlock(&mut self, _: &[&str], _: &[&str]) -> io::Result<Outcome> {
        self.log("landlock")?;
        Ok(self.landlock.unwrap_or(Outcome {
            enforced: true,
            abi: Some(6),
        }))
    }
    fn close_fds_from(&mut self, first: i32) -> io::Result<()> {
        self.log(format!("close_fds_from {first}"))
    }
    fn install_seccomp(
        &mut self,
        _: &[libc::sock_filter],
        _: bool,
    ) -> io::Result<Option<std::os::fd::OwnedFd>> {
        self.log("seccomp")?;
        Ok(Some(std::fs::File::open("/dev/null")?.into()))
    }
    fn hand_over_listener(&mut self, _: std::os::fd::OwnedFd) -> io::Result<()> {
        self.log("hand over listener")
    }
    fn read_to_string(&mut self, path: &str) -> io::Result<String> {
        self.log(format!("read {path}"))?;
        let caps = self.caps;
        Ok(format!(
            "NoNewPrivs:\t1\nSeccomp:\t2\nCapInh:\t0000000000000000\nCapPrm:\t{caps:016x}\n\
            CapEff:\t{caps:016x}\nCapBnd:\t{caps:016x}\nCapAmb:\t0000000000000000\n"
        ))
    }
    fn report(&mut self, _: &Msg) -> io::Result<()> {
        self.log("report")
    }
    fn exec(&mut self, path: &str, _: &[String], _: &[String]) -> io::Error {
        self.calls.push(format!("exec {path}"));
        io::Error::from_raw_os_error(libc::ENOEXEC)
    }
}

const SUPERVISOR: i32 = 4242;

struct Host;

impl View for Host {
    fn kind(&self, rel: &str) -> Option<mounts::Kind> {
        match rel {
            "usr" | "etc" | "proc/sys" => Some(mounts::Kind::Dir),
            "etc/shadow" | "proc/kcore" => Some(mounts::Kind::File),
            "bin" => Some(mounts::Kind::Symlink("usr/bin".into())),
            _ => None,
        }
    }
    fn top_level(&self) -> Vec<String> {
        vec![]
    }
    fn submounts(&self, _: &str) -> Vec<String> {
        vec![]
    }
}

fn plan() -> Plan {
    Plan {
        build: crate::channel::BUILD.to_string(),
        argv: vec!["/bin/true".into()],
        env: vec![("PATH".into(), "/bin".into())],
        policy: Policy::default(),
        collect: vec![],
        files: 1,
        full_id_range: true,
        cgroup_join: vec!["/sys/fs/cgroup/memory/kennel-1/tasks".into()],
        cpus: vec![0],
        host_dirs: vec![],
        devices: vec![],
        boot_id: None,
        volumes: vec![kennel_types::volume::Volume {
            name: "data".into(),
            image: "/state/volumes/t/data.img".into(),
            path: "/workspace/data".into(),
            read_only: false,
            kind: kennel_types::volume::VolumeKind::Host,
        }],
        ca_bundle: None,
    }
}

/// Runs the three phases as the helper, init and program would, one after the other.
fn record() -> Recorder {
    let plan = plan();
    let files = vec![(
        FileMeta {
            path: "/workspace/job.py".into(),
            mode: 0o644,
        },
        b"print(1)".to_vec(),
    )];
    let (proc_mount, proc_mask) = mounts::proc(&Host, None);
    let fs = FsPlan {
        system: mounts::system_view(&Host, "", false),
        scratch: mounts::scratch(&plan.policy),
        dev: mounts::dev(&plan.policy, &plan.devices),
        proc_mount,
        proc_mask,
    };
    let mut ctx = Ctx {
        plan: &plan,
        supervisor_pid: SUPERVISOR,
        files: &files,
        fs,
        namespaces: vec![],
        landlock: None,
        listener: None,
        volumes: vec![],
    };
    let mut rec = Recorder::default();
    run_steps(Step::HELPER, &mut ctx, &mut rec).unwrap();
    rec.calls.push("fork init".into());
    run_steps(Step::INIT, &mut ctx, &mut rec).unwrap();
    rec.calls.push("fork program".into());
    let (step, _) = run_steps(Step::PROGRAM, &mut ctx, &mut rec).unwrap_err();
    assert_eq!(step, Step::Exec, "only the recorder's exec fails");
    rec
}

#[test]
fn namespaces_come_first_and_ids_are_mapped_before_becoming_root() {
    let rec = record();
    assert_eq!(
        rec.calls[0], "join_cgroup /sys/fs/cgroup/memory/kennel-1/tasks",
        "the cgroup is joined before anything else"
    );
    assert_eq!(
        rec.calls[1], "mount_volume /state/volumes/t/data.img ro=false",
        "a volume is mounted (detached) while the helper is still host root"
    );
    assert!(rec.calls[2].starts_with("unshare("), "{:?}", rec.calls);
    let flags = i64::from_str_radix(
        rec.calls[2]
            .trim_start_matches("unshare(0x")
            .trim_end_matches(')'),
        16,
    )
    .unwrap();
    for ns in [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWCGROUP,
    ] {
        assert_ne!(flags & i64::from(ns), 0, "namespace flag {ns:#x} missing");
    }
    assert!(rec.index("request_id_map") < rec.index("become_root"));
    assert!(rec.index("become_root") < rec.index("fork init"));
    assert!(
        rec.index("become_root") < rec.index("pdeathsig"),
        "set again after the credential change"
    );
}

#[test]
fn mounts_are_private_before_any_mount_and_proc_follows_the_pid_fork() {
    let rec = record();
    let private = rec.index("mount - - on /");
    assert!(rec.index("fork init") < private);
    assert!(private < rec.index("mount tmpfs"), "{:#?}", rec.calls);
    assert!(rec.index("fork init") < rec.index("mount proc"));
    assert!(rec.index("mount proc") < rec.index("pivot_root"));
    assert!(rec.index("pivot_root") < rec.index("umount ."));
    assert!(rec.index("write /tmp/workspace/job.py") < rec.index("pivot_root"));
    assert!(
        rec.index("mount tmpfs tmpfs on /tmp/workspace") < rec.index("write /tmp/workspace/job.py")
    );
    let root_ro = rec
        .calls
        .iter()
        .position(|c| c == "remount - - on /")
        .expect("root remounted");
    assert!(rec.index("umount .") < root_ro);
}

#[test]
fn secrets_are_masked_after_etc_is_shown() {
    let rec = record();
    assert!(
        rec.index("mount - /etc on /tmp/etc") < rec.index("mount - /dev/null on /tmp/etc/shadow")
    );
    assert!(rec.index("mount proc") < rec.index("mount - /dev/null on /tmp/proc/kcore"));
}

#[test]
fn capabilities_go_after_the_last_mount_and_seccomp_is_last_before_exec() {
    let rec = record();
    let last_mount = rec.last_index("mount").max(rec.last_index("remount"));
    let drop_caps = rec.index("drop_caps");
    assert!(
        last_mount < drop_caps,
        "caps dropped after the last privileged mount"
    );
    assert!(rec.index("fork program") < rec.index("setsid"));
    assert!(drop_caps < rec.index("no_new_privs"));
    assert!(
        rec.index("no_new_privs") < rec.index("landlock"),
        "Landlock needs no_new_privs"
    );
    assert!(rec.index("landlock") < rec.index("close_fds_from"));
    assert!(
        rec.index("close_fds_from") < rec.index("seccomp"),
        "fds closed late"
    );
    let seccomp = rec.index("seccomp");
    let exec = rec.index("exec");
    assert!(seccomp < exec);
    // Between seccomp and exec only the listener's hand-over (before any code can hold it,
    // and before the execve it is notified of), the self-check and its report happen.
    assert_eq!(
        &rec.calls[seccomp + 1..exec],
        ["hand over listener", "read /proc/self/status", "report"]
    );
}

#[test]
fn required_landlock_that_is_not_enforced_fails_its_step() {
    let plan = plan();
    let mut ctx = Ctx {
        plan: &plan,
        supervisor_pid: SUPERVISOR,
        files: &[],
        fs: FsPlan::default(),
        namespaces: vec![],
        landlock: None,
        listener: None,
        volumes: vec![],
    };
    let mut rec = Recorder {
        landlock: Some(Outcome {
            enforced: false,
            abi: None,
        }),
        ..Recorder::default()
    };
    let (step, fail) = run_steps(Step::PROGRAM, &mut ctx, &mut rec).unwrap_err();
    assert_eq!(step, Step::RestrictFilesystem);
    assert_eq!(fail.errno, Some(libc::EOPNOTSUPP));
    assert!(
        fail.detail.contains("Landlock is required"),
        "{}",
        fail.detail
    );
    assert!(
        !rec.calls.iter().any(|c| c.starts_with("exec")),
        "nothing runs after a failed step"
    );
}

#[test]
fn a_volume_is_attached_beneath_the_new_scratch_before_the_root_is_pivoted() {
    let rec = record();
    let attach = rec.index("attach_mount /tmp/workspace/data");
    assert!(rec.index("mount_volume") < rec.index("unshare("));
    assert!(rec.index("fork init") < attach, "{:#?}", rec.calls);
    assert!(
        rec.index("mount tmpfs tmpfs on /tmp/workspace") < attach,
        "{:#?}",
        rec.calls
    );
    assert!(attach < rec.index("pivot_root"), "{:#?}", rec.calls);
}
