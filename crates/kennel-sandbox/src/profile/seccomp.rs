//! The seccomp-bpf deny list, as data, and the small compiler that turns it into BPF, run by
//! rustc at build time ([`PROGRAM`]).
//!
//! Everything not listed is allowed: the namespaces, Landlock and the dropped capabilities
//! already confine the ordinary syscalls, and this filter removes the kernel surface that
//! sandboxed code has no business reaching. Sockets are the exception: only the address
//! families a sandbox needs are allowed ([`ALLOWED_FAMILIES`]), every other is denied. Denials
//! return [`DENIED_ERRNO`], `ENOSYS`, which none of these calls returns on this kernel for any
//! other reason; it is also the errno glibc expects before it falls back from `clone3` to
//! `clone`. The clock-setting calls are the exception: they answer `EPERM`, as the kernel does
//! for callers without `CAP_SYS_TIME`. Calls of the other ABIs (i386 through `int 0x80`, x32)
//! are all denied with `ENOSYS`, whatever their number ([`ForeignAbi`]).

// BPF works in 32-bit words, and the compiler is a `const fn` (where `try_from` is not
// available): syscall numbers, errnos and argument words are narrowed on purpose, and every
// value in the rule table fits (the tests compare the static program with the table).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use crate::bpf::{jump, stmt};
use libc::sock_filter;

pub const DENIED_ERRNO: i32 = libc::ENOSYS;
pub const DENIED_ERRNO_NAME: &str = "ENOSYS";
pub const PROFILE: &str = "kennel-default-v1";

/// Which calls of a syscall are denied.
#[derive(Debug, Clone, Copy)]
pub enum When {
    Always,
    /// Every condition holds, each on the low 32 bits of an argument.
    Args(&'static [Cond]),
    /// `arg[index] & mask != 0`, on the low 32 bits of the argument.
    ArgAnyBit {
        index: u8,
        mask: u32,
    },
    /// The low 32 bits of `arg[index]` are none of `allowed`: an allowlist within a deny rule.
    /// A report names the call by the value, `names[value]`, where the table has it (the
    /// rule's own name otherwise), so that it says which family was asked for.
    ArgNotIn {
        index: u8,
        allowed: &'static [u32],
        names: &'static [&'static str],
    },
}

/// `(arg[index] & mask) == value`, or `!=` when `equal` is false (then `mask` is all ones, so
/// that the OCI form, which has no masked `!=`, says the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cond {
    pub index: u8,
    pub mask: u32,
    pub value: u32,
    pub equal: bool,
}

const fn masked_eq(index: u8, mask: u32, value: u32) -> Cond {
    Cond {
        index,
        mask,
        value,
        equal: true,
    }
}

const fn eq(index: u8, value: u32) -> Cond {
    masked_eq(index, u32::MAX, value)
}

const fn ne(index: u8, value: u32) -> Cond {
    Cond {
        index,
        mask: u32::MAX,
        value,
        equal: false,
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub name: &'static str,
    pub nr: libc::c_long,
    pub when: When,
    /// [`DENIED_ERRNO`], but for calls whose callers expect the kernel's own answer.
    pub errno: i32,
    /// Why the call is denied: the table's documentation, which no code reads.
    #[allow(dead_code)]
    pub reason: &'static str,
    /// Whether a watched sandbox reports the call to its supervisor (which answers with the
    /// same errno); `false` for calls that libc makes and expects to fail as a matter of
    /// course, which stay plain in-kernel answers.
    pub notify: bool,
}

const NEW_NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
const SOCK_TYPE_MASK: u32 = 0xf;
/// The obsolete packet socket type (libc deprecates the constant, the kernel still has it).
const SOCK_PACKET: u32 = 10;

/// The socket address families a sandbox may use: local sockets, IP (its network namespace
/// decides where that reaches), and netlink, whose rule then allows only `NETLINK_ROUTE`.
/// Every other family is denied, those added to the kernel later included: several are not
/// namespaced at all (`AF_VSOCK` reaches the host's vsock port space and the hypervisor), and
/// the rest are kernel surface no sandboxed code needs (`AF_PACKET`, `AF_ALG`, `AF_XDP`, ...).
pub const ALLOWED_FAMILIES: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
    libc::AF_NETLINK as u32,
];

/// `call(AF_NAME)` for every address family of Linux 6.18 (include/linux/socket.h), indexed by
/// its number: the names reports give a denied family.
macro_rules! family_names {
    ($call:literal: $($family:ident)*) => {
        &[$(concat!($call, "(AF_", stringify!($family), ")")),*]
    };
}

const SOCKET_FAMILIES: &[&str] = family_names!("socket":
    UNSPEC UNIX INET AX25 IPX APPLETALK NETROM BRIDGE ATMPVC X25 INET6 ROSE DECnet NETBEUI
    SECURITY KEY NETLINK PACKET ASH ECONET ATMSVC RDS SNA IRDA PPPOX WANPIPE LLC IB MPLS CAN
    TIPC BLUETOOTH IUCV RXRPC ISDN PHONET IEEE802154 CAIF ALG NFC VSOCK KCM QIPCRTR SMC XDP MCTP);
const SOCKETPAIR_FAMILIES: &[&str] = family_names!("socketpair":
    UNSPEC UNIX INET AX25 IPX APPLETALK NETROM BRIDGE ATMPVC X25 INET6 ROSE DECnet NETBEUI
    SECURITY KEY NETLINK PACKET ASH ECONET ATMSVC RDS SNA IRDA PPPOX WANPIPE LLC IB MPLS CAN
    TIPC BLUETOOTH IUCV RXRPC ISDN PHONET IEEE802154 CAIF ALG NFC VSOCK KCM QIPCRTR SMC XDP MCTP);

macro_rules! always {
    ($sys:ident, $why:literal) => {
        always!($sys, DENIED_ERRNO, $why)
    };
    ($sys:ident, $errno:expr, $why:literal) => {
        Rule {
            name: stringify!($sys),
            nr: paste_nr!($sys),
            when: When::Always,
            errno: $errno,
            reason: $why,
            notify: true,
        }
    };
}

/// A socket(2) rule on its arguments, or (with the call first) a socketpair(2) one.
macro_rules! socket {
    ($name:literal, $conds:expr, $why:literal) => {
        socket!(socket, $name, When::Args($conds), $why)
    };
    ($call:ident, $name:literal, $when:expr, $why:literal) => {
        Rule {
            name: $name,
            nr: paste_nr!($call),
            when: $when,
            errno: DENIED_ERRNO,
            reason: $why,
            notify: true,
        }
    };
}

/// An ioctl(2) rule on its request.
macro_rules! ioctl {
    ($name:literal, $request:expr, $why:literal) => {
        Rule {
            name: $name,
            nr: libc::SYS_ioctl,
            when: When::Args(&[eq(1, $request)]),
            errno: DENIED_ERRNO,
            reason: $why,
            notify: true,
        }
    };
}
macro_rules! paste_nr {
    ($sys:ident) => {
        sysno::$sys
    };
}

/// Syscall numbers by name, so the table reads like the syscall list.
#[allow(non_upper_case_globals)]
mod sysno {
    pub use libc::{
        SYS_acct as acct, SYS_add_key as add_key, SYS_adjtimex as adjtimex, SYS_bpf as bpf,
        SYS_chroot as chroot, SYS_clock_adjtime as clock_adjtime,
        SYS_clock_settime as clock_settime, SYS_clone3 as clone3,
        SYS_delete_module as delete_module, SYS_finit_module as finit_module,
        SYS_fsconfig as fsconfig, SYS_fsmount as fsmount, SYS_fsopen as fsopen,
        SYS_fspick as fspick, SYS_init_module as init_module, SYS_io_uring_enter as io_uring_enter,
        SYS_io_uring_register as io_uring_register, SYS_io_uring_setup as io_uring_setup,
        SYS_ioperm as ioperm, SYS_iopl as iopl, SYS_kcmp as kcmp,
        SYS_kexec_file_load as kexec_file_load, SYS_kexec_load as kexec_load, SYS_keyctl as keyctl,
        SYS_lookup_dcookie as lookup_dcookie, SYS_mount as mount,
        SYS_mount_setattr as mount_setattr, SYS_move_mount as move_mount,
        SYS_name_to_handle_at as name_to_handle_at, SYS_open_by_handle_at as open_by_handle_at,
        SYS_open_tree as open_tree, SYS_perf_event_open as perf_event_open,
        SYS_pidfd_getfd as pidfd_getfd, SYS_pivot_root as pivot_root,
        SYS_process_vm_readv as process_vm_readv, SYS_process_vm_writev as process_vm_writev,
        SYS_ptrace as ptrace, SYS_quotactl as quotactl, SYS_reboot as reboot,
        SYS_request_key as request_key, SYS_setns as setns, SYS_settimeofday as settimeofday,
        SYS_socket as socket, SYS_socketpair as socketpair, SYS_swapoff as swapoff,
        SYS_swapon as swapon, SYS_syslog as syslog, SYS_umount2 as umount2, SYS_unshare as unshare,
        SYS_uselib as uselib, SYS_userfaultfd as userfaultfd, SYS_vhangup as vhangup,
    };
}

/// The deny list. Each entry says why, so a reviewer can weigh it without a manual.
pub const RULES: &[Rule] = &[
    always!(
        ptrace,
        "reads and writes other processes' memory and registers"
    ),
    always!(process_vm_readv, "reads another process's memory"),
    always!(process_vm_writev, "writes another process's memory"),
    always!(
        kcmp,
        "compares kernel objects of other processes, leaking their layout"
    ),
    always!(pidfd_getfd, "steals file descriptors from other processes"),
    always!(
        mount,
        "changes the filesystem view the sandbox was built on"
    ),
    always!(umount2, "uncovers what masking mounts hide"),
    always!(pivot_root, "changes the root the sandbox was built on"),
    always!(chroot, "a classic step in escapes from a changed root"),
    always!(move_mount, "new mount API: changes the filesystem view"),
    always!(open_tree, "new mount API: clones mount trees"),
    always!(fsopen, "new mount API: creates filesystems"),
    always!(fsconfig, "new mount API: configures filesystems"),
    always!(fsmount, "new mount API: creates mounts"),
    always!(fspick, "new mount API: reconfigures mounts"),
    always!(
        mount_setattr,
        "new mount API: clears read-only and other mount flags"
    ),
    always!(
        unshare,
        "new namespaces reopen kernel surface (nested user namespaces above all)"
    ),
    always!(setns, "joins other namespaces"),
    Rule {
        name: "clone",
        nr: libc::SYS_clone,
        when: When::ArgAnyBit {
            index: 0,
            mask: NEW_NAMESPACE_FLAGS,
        },
        errno: DENIED_ERRNO,
        reason: "clone with CLONE_NEW* flags creates namespaces, like unshare",
        notify: true,
    },
    // Not notified: glibc tries clone3 for every new thread and falls back to clone on
    // ENOSYS, so reporting it would report every thread (and cost each a round trip).
    Rule {
        notify: false,
        ..always!(
            clone3,
            "its flags sit behind a pointer seccomp cannot read; glibc falls back to clone on ENOSYS"
        )
    },
    always!(keyctl, "the kernel keyring is not namespaced"),
    always!(add_key, "the kernel keyring is not namespaced"),
    always!(request_key, "the kernel keyring is not namespaced"),
    always!(bpf, "loads programs into the kernel"),
    always!(
        perf_event_open,
        "a frequent source of kernel exploits and side channels"
    ),
    always!(
        userfaultfd,
        "a staple of kernel exploits (it stalls the kernel at chosen points)"
    ),
    always!(
        io_uring_setup,
        "io_uring bypasses seccomp for the operations it performs"
    ),
    always!(
        io_uring_enter,
        "io_uring bypasses seccomp for the operations it performs"
    ),
    always!(
        io_uring_register,
        "io_uring bypasses seccomp for the operations it performs"
    ),
    always!(kexec_load, "replaces the running kernel"),
    always!(kexec_file_load, "replaces the running kernel"),
    always!(init_module, "loads kernel modules"),
    always!(finit_module, "loads kernel modules"),
    always!(delete_module, "unloads kernel modules"),
    always!(reboot, "reboots the host"),
    always!(swapon, "changes the host's swap"),
    always!(swapoff, "changes the host's swap"),
    // EPERM, the kernel's answer to callers without CAP_SYS_TIME (which code written for
    // unprivileged users expects: Python raises PermissionError); read-only adjtimex calls,
    // which the kernel allows, are denied too.
    always!(settimeofday, libc::EPERM, "sets the host clock"),
    always!(clock_settime, libc::EPERM, "sets the host clock"),
    always!(clock_adjtime, libc::EPERM, "adjusts the host clock"),
    always!(adjtimex, libc::EPERM, "adjusts the host clock"),
    always!(
        open_by_handle_at,
        "opens files by handle, bypassing the mount view (the 'shocker' escape)"
    ),
    always!(name_to_handle_at, "the other half of open_by_handle_at"),
    ioctl!(
        "ioctl(TIOCSTI)",
        TIOCSTI,
        "pushes keystrokes into a terminal, typing commands outside the sandbox"
    ),
    ioctl!(
        "ioctl(TIOCLINUX)",
        TIOCLINUX,
        "reads and injects console contents"
    ),
    // Before the netlink rule, which would otherwise name a denied family's call first.
    socket!(
        socket,
        "socket(other families)",
        When::ArgNotIn {
            index: 0,
            allowed: ALLOWED_FAMILIES,
            names: SOCKET_FAMILIES,
        },
        "families but unix, inet, inet6 and netlink reach kernel subsystems and, for vsock, \
         the host and its hypervisor across the network namespace"
    ),
    socket!(
        socketpair,
        "socketpair(other families)",
        When::ArgNotIn {
            index: 0,
            allowed: ALLOWED_FAMILIES,
            names: SOCKETPAIR_FAMILIES,
        },
        "socketpair creates two sockets of the family before it fails for most of them"
    ),
    // NETLINK_ROUTE (0) stays: glibc's if_nameindex and getifaddrs, `ip addr` and psutil list
    // interfaces over it. In the sandbox's network namespace it shows only loopback, and
    // changing anything needs CAP_NET_ADMIN, which the sandbox never holds.
    socket!(
        "socket(AF_NETLINK)",
        &[
            eq(0, libc::AF_NETLINK as u32),
            ne(2, libc::NETLINK_ROUTE as u32)
        ],
        "the other netlink families reach kernel subsystems (audit, netfilter, uevents)"
    ),
    socket!(
        socketpair,
        "socketpair(AF_NETLINK)",
        When::Args(&[
            eq(0, libc::AF_NETLINK as u32),
            ne(2, libc::NETLINK_ROUTE as u32)
        ]),
        "creates two sockets of the other netlink families before it fails"
    ),
    // Netlink sockets are SOCK_RAW too; the rule above decides for them.
    socket!(
        "socket(SOCK_RAW)",
        &[
            masked_eq(1, SOCK_TYPE_MASK, libc::SOCK_RAW as u32),
            ne(0, libc::AF_NETLINK as u32)
        ],
        "raw sockets forge packets"
    ),
    socket!(
        "socket(SOCK_PACKET)",
        &[masked_eq(1, SOCK_TYPE_MASK, SOCK_PACKET)],
        "obsolete packet sockets forge frames"
    ),
    always!(acct, "process accounting writes host files"),
    always!(quotactl, "manipulates host disk quotas"),
    always!(syslog, "reads the kernel log, which leaks addresses"),
    always!(lookup_dcookie, "a kernel profiling interface"),
    always!(vhangup, "hangs up the terminal"),
    always!(iopl, "raises I/O privilege"),
    always!(ioperm, "grants direct port I/O"),
    always!(uselib, "an obsolete loader syscall with a history of bugs"),
];

// Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
/// BPF_LD | BPF_W | BPF_ABS (the first two are zero).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x05 | 0x10;
const BPF_JGE_K: u16 = 0x05 | 0x30;
const BPF_JSET_K: u16 = 0x05 | 0x40;
const BPF_AND_K: u16 = 0x04 | 0x50;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const OFFSET_ARGS: u32 = 16;
/// The kernel's limit on a classic BPF program (linux/bpf_common.h).
const BPF_MAXINSNS: usize = 4096;

const fn deny(errno: i32) -> sock_filter {
    stmt(BPF_RET_K, SECCOMP_RET_ERRNO | (errno as u32 & 0xffff))
}

/// A jump distance, which classic BPF holds in a byte; a rule too long for it fails the build.
const fn hop(n: usize) -> u8 {
    assert!(
        n <= u8::MAX as usize,
        "seccomp rule too long for a BPF jump"
    );
    n as u8
}

/// The filter the sandboxed program gets: [`RULES`] compiled once, by the compiler, into the
/// binary's read-only data. It depends on nothing but the table (one profile, x86-64 only, the
/// same for every policy and tier), so no run builds it, allocates for it or can get it wrong.
pub static PROGRAM: [sock_filter; program_len(RULES, Mode::Plain)] = compile(RULES, Mode::Plain);

/// The same filter for a watched sandbox: the denied calls marked `notify` go to the
/// supervisor's listener instead of failing in the kernel (it answers the same errno), and so
/// do [`EXEC_CALLS`], which it lets continue once it has logged them.
pub static WATCHED: [sock_filter; program_len(RULES, Mode::Watched)] =
    compile(RULES, Mode::Watched);

/// [`WATCHED`] without the execs (`layers.exec_log = false`): denials reported, execs free.
pub static WATCHED_NO_EXECS: [sock_filter; program_len(RULES, Mode::DenialsOnly)] =
    compile(RULES, Mode::DenialsOnly);

/// What a filter hands to its listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing: every denial answered in the kernel.
    Plain,
    /// The notified denials.
    DenialsOnly,
    /// The notified denials and [`EXEC_CALLS`].
    Watched,
}

impl Mode {
    const fn denials(self) -> bool {
        !matches!(self, Mode::Plain)
    }

    const fn execs(self) -> bool {
        matches!(self, Mode::Watched)
    }
}

/// The calls a watched sandbox reports and lets through: the programs the code executes.
pub const EXEC_CALLS: &[(libc::c_long, &str)] = &[
    (libc::SYS_execve, "execve"),
    (libc::SYS_execveat, "execveat"),
];

/// The length of [`compile`]'s output for `rules`.
pub const fn program_len(rules: &[Rule], mode: Mode) -> usize {
    let mut len = PRELUDE_LEN + 1;
    if mode.execs() {
        len += 2 * EXEC_CALLS.len();
    }
    let mut i = 0;
    while i < rules.len() {
        len += match rules[i].when {
            When::Always => 2,
            When::Args(conds) => 3 * conds.len() + 3,
            When::ArgAnyBit { .. } => 5,
            When::ArgNotIn { allowed, .. } => allowed.len() + 4,
        };
        i += 1;
    }
    len
}

const PRELUDE_LEN: usize = 6;

/// Compiles `rules` into a filter for x86-64: calls of the other ABIs are denied whatever their
/// number (no i386 or x32 back door), listed calls get their rule's errno (`watched`: the
/// notified ones, and the other ABIs', go to the listener, and [`EXEC_CALLS`] too), everything
/// else is allowed. `N` must be [`program_len`]`(rules, mode)`; a `const fn`, so that
/// [`PROGRAM`] is built at compile time.
pub const fn compile<const N: usize>(rules: &[Rule], mode: Mode) -> [sock_filter; N] {
    assert!(
        N == program_len(rules, mode),
        "N must be program_len(rules, mode)"
    );
    assert!(
        N <= BPF_MAXINSNS,
        "seccomp program longer than the kernel accepts"
    );
    let mut p = [stmt(0, 0); N];
    // Another ABI's call is denied before any rule looks at its number, which would mean
    // another call there; a watched sandbox reports it (see `ForeignAbi`).
    let foreign = match mode.denials() {
        true => stmt(BPF_RET_K, SECCOMP_RET_USER_NOTIF),
        false => deny(DENIED_ERRNO),
    };
    let prelude = [
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        foreign,
        stmt(BPF_LD_W_ABS, OFFSET_NR),
        jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        foreign,
    ];
    let mut at = 0;
    while at < PRELUDE_LEN {
        p[at] = prelude[at];
        at += 1;
    }
    let mut r = 0;
    while r < rules.len() {
        let rule = &rules[r];
        let nr = rule.nr as u32;
        let verdict = match mode.denials() && rule.notify {
            true => stmt(BPF_RET_K, SECCOMP_RET_USER_NOTIF),
            false => deny(rule.errno),
        };
        match rule.when {
            When::Always => {
                p[at] = jump(BPF_JEQ_K, nr, 0, 1);
                p[at + 1] = verdict;
                at += 2;
            }
            When::Args(conds) => {
                // Three instructions per condition, then the verdict, then A reloaded with nr
                // for the next rule; a condition that fails jumps to that reload.
                let n = conds.len();
                p[at] = jump(BPF_JEQ_K, nr, 0, hop(3 * n + 2));
                at += 1;
                let mut i = 0;
                while i < n {
                    let c = conds[i];
                    let to_reload = hop(3 * (n - i) - 2);
                    p[at] = stmt(BPF_LD_W_ABS, OFFSET_ARGS + 8 * c.index as u32);
                    p[at + 1] = stmt(BPF_AND_K, c.mask);
                    p[at + 2] = match c.equal {
                        true => jump(BPF_JEQ_K, c.value, 0, to_reload),
                        false => jump(BPF_JEQ_K, c.value, to_reload, 0),
                    };
                    at += 3;
                    i += 1;
                }
                p[at] = verdict;
                p[at + 1] = stmt(BPF_LD_W_ABS, OFFSET_NR);
                at += 2;
            }
            When::ArgAnyBit { index, mask } => {
                p[at] = jump(BPF_JEQ_K, nr, 0, 4);
                p[at + 1] = stmt(BPF_LD_W_ABS, OFFSET_ARGS + 8 * index as u32);
                p[at + 2] = jump(BPF_JSET_K, mask, 0, 1);
                p[at + 3] = verdict;
                p[at + 4] = stmt(BPF_LD_W_ABS, OFFSET_NR);
                at += 5;
            }
            When::ArgNotIn { index, allowed, .. } => {
                // The argument, then one comparison per allowed value, each jumping to the
                // reload of nr when it matches; none matched: the verdict.
                let n = allowed.len();
                p[at] = jump(BPF_JEQ_K, nr, 0, hop(n + 3));
                p[at + 1] = stmt(BPF_LD_W_ABS, OFFSET_ARGS + 8 * index as u32);
                at += 2;
                let mut i = 0;
                while i < n {
                    p[at] = jump(BPF_JEQ_K, allowed[i], hop(n - i), 0);
                    at += 1;
                    i += 1;
                }
                p[at] = verdict;
                p[at + 1] = stmt(BPF_LD_W_ABS, OFFSET_NR);
                at += 2;
            }
        }
        r += 1;
    }
    let mut e = 0;
    while mode.execs() && e < EXEC_CALLS.len() {
        p[at] = jump(BPF_JEQ_K, EXEC_CALLS[e].0 as u32, 0, 1);
        p[at + 1] = stmt(BPF_RET_K, SECCOMP_RET_USER_NOTIF);
        at += 2;
        e += 1;
    }
    p[at] = stmt(BPF_RET_K, SECCOMP_RET_ALLOW);
    p
}

/// The rule that denies a call, as the filter decides it (the first that matches), for the
/// supervisor that hears of it.
pub fn rule_for(nr: i32, args: &[u64; 6]) -> Option<&'static Rule> {
    RULES
        .iter()
        .find(|r| r.nr == libc::c_long::from(nr) && r.matches(args))
}

impl Rule {
    /// Whether the call's arguments meet the rule's condition, on their low 32 bits as BPF
    /// sees them.
    pub fn matches(&self, args: &[u64; 6]) -> bool {
        let low = |i: u8| args[i as usize] as u32;
        match self.when {
            When::Always => true,
            When::Args(conds) => conds
                .iter()
                .all(|c| (low(c.index) & c.mask == c.value) == c.equal),
            When::ArgAnyBit { index, mask } => low(index) & mask != 0,
            When::ArgNotIn { index, allowed, .. } => !allowed.contains(&low(index)),
        }
    }

    /// What a report calls one denied call of this rule: its name, or, for a rule that names
    /// calls by an argument's value, that name (`socket(AF_VSOCK)`). The names come from a
    /// fixed table, so a report holds a bounded number of them whatever the code asks for.
    pub fn event_name(&self, args: &[u64; 6]) -> &'static str {
        match self.when {
            When::ArgNotIn { index, names, .. } => usize::try_from(args[index as usize] as u32)
                .ok()
                .and_then(|v| names.get(v).copied())
                .unwrap_or(self.name),
            _ => self.name,
        }
    }
}

/// A call made through another ABI than x86-64's: the filter denies every such call before it
/// looks at the number (which names another call there), and a watched sandbox reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignAbi {
    /// The 32-bit ABI (`int 0x80`, `sysenter`, a 32-bit code segment's `syscall`): the only
    /// other architecture an x86-64 kernel runs.
    I386,
    /// A number with the x32 bit set (or above it, which is no call at all).
    X32,
}

impl ForeignAbi {
    /// The foreign ABI of a call with audit architecture `arch` and number `nr`, as the
    /// filter sees them; `None` for an x86-64 call.
    pub fn of(arch: u32, nr: i32) -> Option<ForeignAbi> {
        if arch != AUDIT_ARCH_X86_64 {
            Some(ForeignAbi::I386)
        } else if nr as u32 >= X32_SYSCALL_BIT {
            Some(ForeignAbi::X32)
        } else {
            None
        }
    }

    /// The name its reports carry in place of a syscall's.
    pub fn name(self) -> &'static str {
        match self {
            ForeignAbi::I386 => "i386",
            ForeignAbi::X32 => "x32",
        }
    }
}

/// The names of the denied calls, for the result's `isolation`.
pub fn denied_names() -> Vec<String> {
    RULES.iter().map(|r| r.name.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny classic-BPF interpreter, enough to run our own filters in unit tests.
    fn run(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let ins = prog[pc];
            pc += 1;
            match ins.code {
                BPF_LD_W_ABS => {
                    let k = ins.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                BPF_AND_K => acc &= ins.k,
                BPF_RET_K => return ins.k,
                code => {
                    let taken = match code {
                        BPF_JEQ_K => acc == ins.k,
                        BPF_JGE_K => acc >= ins.k,
                        BPF_JSET_K => acc & ins.k != 0,
                        _ => panic!("unknown opcode {code:#x}"),
                    };
                    pc += usize::from(if taken { ins.jt } else { ins.jf });
                }
            }
        }
    }

    fn verdict(nr: libc::c_long, args: [u64; 6]) -> u32 {
        run(&PROGRAM, AUDIT_ARCH_X86_64, nr as u32, args)
    }

    const DENY: u32 = SECCOMP_RET_ERRNO | DENIED_ERRNO as u32;

    #[test]
    fn listed_calls_are_denied_and_others_allowed() {
        assert_eq!(verdict(libc::SYS_ptrace, [0; 6]), DENY);
        assert_eq!(verdict(libc::SYS_bpf, [0; 6]), DENY);
        assert_eq!(verdict(libc::SYS_read, [0; 6]), SECCOMP_RET_ALLOW);
        assert_eq!(verdict(libc::SYS_openat, [0; 6]), SECCOMP_RET_ALLOW);
    }

    #[test]
    fn argument_rules_look_at_the_argument() {
        let tiocsti = [0, u64::from(TIOCSTI), 0, 0, 0, 0];
        assert_eq!(verdict(libc::SYS_ioctl, tiocsti), DENY);
        assert_eq!(
            verdict(libc::SYS_ioctl, [0, 0x5401, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        let netlink = |protocol: i32| {
            let args = [
                libc::AF_NETLINK as u64,
                libc::SOCK_RAW as u64,
                protocol as u64,
                0,
                0,
                0,
            ];
            verdict(libc::SYS_socket, args)
        };
        assert_eq!(netlink(libc::NETLINK_ROUTE), SECCOMP_RET_ALLOW);
        assert_eq!(netlink(libc::NETLINK_AUDIT), DENY);
        assert_eq!(netlink(libc::NETLINK_KOBJECT_UEVENT), DENY);
        let packet = [libc::AF_PACKET as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0];
        assert_eq!(verdict(libc::SYS_socket, packet), DENY);
        let raw = [
            libc::AF_INET as u64,
            (libc::SOCK_RAW | libc::SOCK_CLOEXEC) as u64,
            0,
            0,
            0,
            0,
        ];
        assert_eq!(verdict(libc::SYS_socket, raw), DENY);
        let tcp = [
            libc::AF_INET as u64,
            (libc::SOCK_STREAM | libc::SOCK_NONBLOCK) as u64,
            0,
            0,
            0,
            0,
        ];
        assert_eq!(verdict(libc::SYS_socket, tcp), SECCOMP_RET_ALLOW);
        let fork_like = [(libc::SIGCHLD | libc::CLONE_VM) as u64, 0, 0, 0, 0, 0];
        assert_eq!(verdict(libc::SYS_clone, fork_like), SECCOMP_RET_ALLOW);
        let new_user = [(libc::SIGCHLD | libc::CLONE_NEWUSER) as u64, 0, 0, 0, 0, 0];
        assert_eq!(verdict(libc::SYS_clone, new_user), DENY);
    }

    #[test]
    fn clock_setting_calls_answer_eperm_as_the_kernel_would() {
        let eperm = SECCOMP_RET_ERRNO | libc::EPERM as u32;
        for nr in [
            libc::SYS_clock_settime,
            libc::SYS_settimeofday,
            libc::SYS_adjtimex,
            libc::SYS_clock_adjtime,
        ] {
            assert_eq!(verdict(nr, [0; 6]), eperm, "{nr}");
        }
        assert_eq!(verdict(libc::SYS_clock_gettime, [0; 6]), SECCOMP_RET_ALLOW);
    }

    /// Arguments that `rule` denies and no rule before it: a `!=` condition takes the first of
    /// the value's complement, the allowed socket families and zero that leaves earlier rules
    /// behind (a raw socket of a denied family is the family rule's), and an argument no
    /// condition names is zero or AF_INET (a socket type's rule needs an allowed family).
    fn hitting(rule: &Rule) -> [u64; 6] {
        let fill = |base: u64, ne_value: &dyn Fn(u32) -> u32| {
            let mut args = [base, 0, 0, 0, 0, 0];
            match rule.when {
                When::Always => {}
                When::Args(conds) => {
                    for c in conds {
                        let v = if c.equal { c.value } else { ne_value(c.value) };
                        args[c.index as usize] = u64::from(v);
                    }
                }
                When::ArgAnyBit { index, mask } => args[index as usize] = u64::from(mask),
                When::ArgNotIn { index, allowed, .. } => {
                    let outside = (0..).find(|v| !allowed.contains(v)).unwrap();
                    args[index as usize] = u64::from(outside);
                }
            }
            args
        };
        let complement = |v: u32| !v;
        let mut tries: Vec<Box<dyn Fn(u32) -> u32>> = vec![Box::new(complement)];
        for &family in ALLOWED_FAMILIES.iter().chain(&[0]) {
            tries.push(Box::new(move |v| if v == family { !v } else { family }));
        }
        [0, libc::AF_INET as u64]
            .iter()
            .flat_map(|&base| tries.iter().map(move |t| (base, t)))
            .map(|(base, t)| fill(base, t.as_ref()))
            .find(|args| rule_for(rule.nr as i32, args).map(|r| r.name) == Some(rule.name))
            .unwrap_or_else(|| panic!("no arguments reach {}", rule.name))
    }

    /// Every rule's conditions are each needed: flipping any one of them lets the call through.
    #[test]
    fn every_condition_of_a_rule_counts() {
        for rule in RULES {
            let When::Args(conds) = rule.when else {
                continue;
            };
            let args = hitting(rule);
            let denied = SECCOMP_RET_ERRNO | rule.errno as u32;
            assert_eq!(verdict(rule.nr, args), denied, "{}", rule.name);
            for c in conds {
                let mut off = args;
                off[c.index as usize] =
                    u64::from(if c.equal { !c.value & c.mask } else { c.value });
                // Another rule may still deny the flipped call; this one must not be why.
                let v = verdict(rule.nr, off);
                let other = RULES
                    .iter()
                    .any(|r| r.name != rule.name && r.nr == rule.nr && r.matches(&off));
                assert!(
                    v == SECCOMP_RET_ALLOW || other,
                    "{}: {c:?} did not count",
                    rule.name
                );
            }
        }
    }

    fn fields(p: &[sock_filter]) -> Vec<(u16, u8, u8, u32)> {
        p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
    }

    /// The static program is the table compiled; the same compiler run now agrees with rustc.
    #[test]
    fn the_static_program_is_the_table_compiled() {
        let now = compile::<{ program_len(RULES, Mode::Plain) }>(
            std::hint::black_box(RULES),
            Mode::Plain,
        );
        assert_eq!(fields(&now), fields(&PROGRAM));
        let watched = compile::<{ program_len(RULES, Mode::Watched) }>(
            std::hint::black_box(RULES),
            Mode::Watched,
        );
        assert_eq!(fields(&watched), fields(&WATCHED));
        let quiet = compile::<{ program_len(RULES, Mode::DenialsOnly) }>(
            std::hint::black_box(RULES),
            Mode::DenialsOnly,
        );
        assert_eq!(fields(&quiet), fields(&WATCHED_NO_EXECS));
        // Without the execs, an exec is allowed in the kernel and a denial still notified.
        let run_quiet =
            |nr: libc::c_long| run(&WATCHED_NO_EXECS, AUDIT_ARCH_X86_64, nr as u32, [0; 6]);
        assert_eq!(run_quiet(libc::SYS_execve), SECCOMP_RET_ALLOW);
        assert_eq!(run_quiet(libc::SYS_ptrace), SECCOMP_RET_USER_NOTIF);
    }

    /// Every jump lands inside the program, and the program ends in a verdict.
    #[test]
    fn every_jump_lands_inside_the_program() {
        for (pc, ins) in PROGRAM.iter().enumerate() {
            if matches!(ins.code, BPF_JEQ_K | BPF_JGE_K | BPF_JSET_K) {
                let furthest = pc + 1 + usize::from(ins.jt.max(ins.jf));
                assert!(furthest < PROGRAM.len(), "jump at {pc} leaves the program");
            }
        }
        assert_eq!(PROGRAM.last().map(|i| i.code), Some(BPF_RET_K));
    }

    /// What building the filter per run cost, against what reading the static one costs now.
    /// Prints only: timings on a shared machine are no test oracle.
    #[test]
    fn build_cost_per_run_is_printed() {
        let t = std::time::Instant::now();
        let first = compile::<{ program_len(RULES, Mode::Plain) }>(
            std::hint::black_box(RULES),
            Mode::Plain,
        );
        let first_time = t.elapsed();
        std::hint::black_box(&first);
        let runs = 2000u32;
        let t = std::time::Instant::now();
        for _ in 0..runs {
            std::hint::black_box(compile::<{ program_len(RULES, Mode::Plain) }>(
                std::hint::black_box(RULES),
                Mode::Plain,
            ));
        }
        let per_build = t.elapsed() / runs;
        let t = std::time::Instant::now();
        for _ in 0..runs {
            std::hint::black_box(std::hint::black_box(&PROGRAM).as_slice());
        }
        let per_read = t.elapsed() / runs;
        println!(
            "seccomp program, {} instructions: built per run {first_time:?} (first) and \
             {per_build:?} (warm); static {per_read:?}",
            PROGRAM.len()
        );
    }

    /// The watched program answers exactly as the plain one, but that notified denials and the
    /// exec calls go to the listener; clone3 stays an in-kernel ENOSYS.
    #[test]
    fn the_watched_program_notifies_what_it_denies_and_execs() {
        let watched =
            |nr: libc::c_long, args: [u64; 6]| run(&WATCHED, AUDIT_ARCH_X86_64, nr as u32, args);
        for rule in RULES {
            let args = hitting(rule);
            let want = if rule.notify {
                SECCOMP_RET_USER_NOTIF
            } else {
                SECCOMP_RET_ERRNO | rule.errno as u32
            };
            assert_eq!(watched(rule.nr, args), want, "{}", rule.name);
            assert_eq!(
                rule_for(rule.nr as i32, &args).map(|r| r.name),
                Some(rule.name),
                "the supervisor names {} as the filter does",
                rule.name
            );
        }
        assert_eq!(watched(libc::SYS_clone3, [0; 6]), DENY);
        assert_eq!(watched(libc::SYS_execve, [0; 6]), SECCOMP_RET_USER_NOTIF);
        assert_eq!(watched(libc::SYS_execveat, [0; 6]), SECCOMP_RET_USER_NOTIF);
        assert_eq!(verdict(libc::SYS_execve, [0; 6]), SECCOMP_RET_ALLOW);
        for nr in [
            libc::SYS_read,
            libc::SYS_openat,
            libc::SYS_stat,
            libc::SYS_clone,
        ] {
            assert_eq!(watched(nr, [0; 6]), SECCOMP_RET_ALLOW, "{nr}");
        }
    }

    /// Every syscall a tripwire group names is one the filter denies and notifies.
    #[test]
    fn every_tripwire_names_a_notified_rule() {
        for group in kennel_types::security::TripwireGroup::ALL {
            for call in group.calls() {
                let rule = RULES.iter().find(|r| r.name == *call);
                assert!(
                    rule.is_some_and(|r| r.notify),
                    "tripwire {group:?}: {call} is not a notified rule"
                );
            }
        }
    }

    /// i386 and x32 calls are denied whatever their number (i386's 20 is getpid, 59
    /// oldolduname: neither may be read as x86-64's writev or execve), and a watched sandbox
    /// hands them to its listener, which names their ABI.
    #[test]
    fn foreign_abis_are_denied_and_reported() {
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        let x32_read = X32_SYSCALL_BIT | libc::SYS_read as u32;
        for (arch, nr, abi) in [
            (AUDIT_ARCH_I386, 20, ForeignAbi::I386),
            (AUDIT_ARCH_I386, 59, ForeignAbi::I386),
            (AUDIT_ARCH_X86_64, x32_read, ForeignAbi::X32),
            (AUDIT_ARCH_X86_64, u32::MAX, ForeignAbi::X32),
        ] {
            assert_eq!(run(&PROGRAM, arch, nr, [0; 6]), DENY, "{arch:#x} {nr:#x}");
            for watched in [&WATCHED[..], &WATCHED_NO_EXECS[..]] {
                assert_eq!(run(watched, arch, nr, [0; 6]), SECCOMP_RET_USER_NOTIF);
            }
            assert_eq!(ForeignAbi::of(arch, nr as i32), Some(abi));
        }
        assert_eq!(ForeignAbi::of(AUDIT_ARCH_X86_64, 59), None);
        assert_eq!(
            [ForeignAbi::I386.name(), ForeignAbi::X32.name()],
            ["i386", "x32"]
        );
    }

    /// Only unix, inet, inet6 and netlink sockets are made, by socket and socketpair alike; a
    /// denied family is named in reports, from the table, whatever the upper 32 bits hold.
    #[test]
    fn only_the_allowed_socket_families_pass() {
        for call in [libc::SYS_socket, libc::SYS_socketpair] {
            for family in 0..64u32 {
                let args = [u64::from(family), libc::SOCK_STREAM as u64, 0, 0, 0, 0];
                let want = match ALLOWED_FAMILIES.contains(&family) {
                    true => SECCOMP_RET_ALLOW,
                    false => DENY,
                };
                assert_eq!(verdict(call, args), want, "{call} {family}");
                let upper = [(1 << 32) | u64::from(family), 1, 0, 0, 0, 0];
                assert_eq!(
                    verdict(call, upper),
                    want,
                    "{call} {family} with upper bits"
                );
            }
        }
        let name = |call: libc::c_long, family: i32| {
            let args = [family as u64, 1, 0, 0, 0, 0];
            rule_for(call as i32, &args).map(|r| r.event_name(&args))
        };
        assert_eq!(
            name(libc::SYS_socket, libc::AF_VSOCK),
            Some("socket(AF_VSOCK)")
        );
        assert_eq!(
            name(libc::SYS_socket, libc::AF_PACKET),
            Some("socket(AF_PACKET)")
        );
        assert_eq!(name(libc::SYS_socket, libc::AF_ALG), Some("socket(AF_ALG)"));
        assert_eq!(name(libc::SYS_socket, 44), Some("socket(AF_XDP)"));
        assert_eq!(name(libc::SYS_socket, 45), Some("socket(AF_MCTP)"));
        assert_eq!(name(libc::SYS_socket, 0), Some("socket(AF_UNSPEC)"));
        assert_eq!(name(libc::SYS_socket, 46), Some("socket(other families)"));
        assert_eq!(name(libc::SYS_socket, -1), Some("socket(other families)"));
        assert_eq!(
            name(libc::SYS_socketpair, libc::AF_VSOCK),
            Some("socketpair(AF_VSOCK)")
        );
        assert_eq!(name(libc::SYS_socket, libc::AF_INET), None);
        assert_eq!(SOCKET_FAMILIES.len(), 46);
        assert_eq!(SOCKETPAIR_FAMILIES.len(), 46);
        // Netlink but routing stays denied, for socketpair too.
        let audit = [
            libc::AF_NETLINK as u64,
            3,
            libc::NETLINK_AUDIT as u64,
            0,
            0,
            0,
        ];
        assert_eq!(verdict(libc::SYS_socketpair, audit), DENY);
        assert_eq!(
            rule_for(libc::SYS_socketpair as i32, &audit).map(|r| r.name),
            Some("socketpair(AF_NETLINK)")
        );
    }

    #[test]
    fn the_issue_s_required_denials_are_all_listed() {
        let names = denied_names();
        for must in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "mount",
            "umount2",
            "pivot_root",
            "unshare",
            "clone",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "kexec_load",
            "init_module",
            "finit_module",
            "delete_module",
            "reboot",
            "swapon",
            "swapoff",
            "settimeofday",
            "clock_settime",
            "open_by_handle_at",
            "ioctl(TIOCSTI)",
            "ioctl(TIOCLINUX)",
            "socket(SOCK_RAW)",
            "socket(AF_NETLINK)",
        ] {
            assert!(names.iter().any(|n| n == must), "{must} is not denied");
        }
    }
}
