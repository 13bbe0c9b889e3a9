//! A raw socket that reads the SYNs opening connections to a range of addresses, filtered in
//! the kernel: the egress proxy's resolver logs the ones nothing listens for (see
//! `kennel_net::dns::Resolver::watch_refusals`).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use libc::sock_filter;

use super::ret::check;

use crate::bpf::{jump, stmt};

/// Bytes of each packet kept: the IP header (with options) and the TCP ports.
const SNAP: u32 = 128;
const TCP_SYN: u32 = 0x02;
const TCP_ACK: u32 = 0x10;

/// The filter: IPv4 packets to `net`/`mask` whose TCP flags have SYN without ACK (a
/// connection's first segment), cut to [`SNAP`] bytes; everything else dropped in the kernel.
/// A raw IP socket's packet starts at the IP header.
fn program(net: Ipv4Addr, mask: Ipv4Addr) -> [sock_filter; 9] {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_IND, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_LDX,
        BPF_MSH, BPF_RET, BPF_W,
    };
    let (ld, alu, jeq) = (
        BPF_LD as u16,
        BPF_ALU as u16,
        (BPF_JMP | BPF_JEQ | BPF_K) as u16,
    );
    [
        // The destination address, masked.
        stmt(ld | (BPF_W | BPF_ABS) as u16, 16),
        stmt(alu | (BPF_AND | BPF_K) as u16, u32::from(mask)),
        jump(jeq, u32::from(net), 0, 5),
        // X = the IP header's length; the TCP flags are 13 bytes past it.
        stmt((BPF_LDX | BPF_B | BPF_MSH) as u16, 0),
        stmt(ld | (BPF_B | BPF_IND) as u16, 13),
        stmt(alu | (BPF_AND | BPF_K) as u16, TCP_SYN | TCP_ACK),
        jump(jeq, TCP_SYN, 0, 1),
        stmt((BPF_RET | BPF_K) as u16, SNAP),
        stmt((BPF_RET | BPF_K) as u16, 0),
    ]
}

/// A raw TCP socket of the current network namespace that reads only the SYNs to `net`/`mask`
/// (needs CAP_NET_RAW in the namespace's owner).
pub fn syn_watch_socket(net: Ipv4Addr, mask: Ipv4Addr) -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, Protocol, SocketFlags, SocketType};
    let tcp = Protocol::from_raw(
        std::num::NonZeroU32::new(libc::IPPROTO_TCP as u32).expect("IPPROTO_TCP is not zero"),
    );
    let sock = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(tcp),
    )?;
    let filter = program(net, mask);
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `filter`, a valid classic BPF program that outlives the call;
    // SO_ATTACH_FILTER copies it into the kernel and only reads it.
    check(unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            std::ptr::from_ref(&prog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    })?;
    Ok(sock)
}
