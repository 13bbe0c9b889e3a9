//! Classic BPF instructions, as the seccomp filters (`profile::seccomp`) and the socket filter
//! of the synthetic range's watch (`sys::syn_watch`) write them.

use libc::sock_filter;

/// An instruction that does not jump.
pub(crate) const fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// A conditional jump: `jt` instructions ahead when true, `jf` when false.
pub(crate) const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}
