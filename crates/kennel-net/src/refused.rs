//! Connections refused at a synthetic address, seen and logged: a port its name's rules do not
//! allow has no listener, so the kernel refuses the code's connection before the proxy sees
//! it. A raw socket of the sandbox's namespace, filtered in the kernel to the SYNs that open a
//! connection to the synthetic range (the sandbox crate makes it), shows each attempt; one to
//! a port nothing of the proxy's listens on is logged as a denial.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The destination of a TCP segment, from its IPv4 packet as a raw socket reads it (the IP
/// header first); `None` for a packet too short or not IPv4.
pub(crate) fn destination(packet: &[u8]) -> Option<(Ipv4Addr, u16)> {
    let first = *packet.first()?;
    if first >> 4 != 4 {
        return None;
    }
    let header = usize::from(first & 0x0f) * 4;
    let addr: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
    let port: [u8; 2] = packet.get(header + 2..header + 4)?.try_into().ok()?;
    Some((Ipv4Addr::from(addr), u16::from_be_bytes(port)))
}

/// Reads every SYN queued on `raw` now, without waiting, calling `seen` with each one's
/// destination; false once the socket is shut down.
pub(crate) fn drain(raw: &std::fs::File, seen: &dyn Fn(Ipv4Addr, u16)) -> bool {
    use rustix::io::Errno;
    let mut buf = [0u8; 128];
    loop {
        match rustix::net::recv(raw, &mut buf[..], rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => return false,
            Ok((n, _)) => {
                if let Some((addr, port)) = destination(&buf[..n.min(buf.len())]) {
                    seen(addr, port);
                }
            }
            Err(Errno::AGAIN) => return true,
            Err(Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Calls `turn` with `raw` each time it has something to read, until `turn` says the socket
/// is shut down or the watch is `stopped`. `turn` drains it (see [`drain`]).
pub(crate) fn watch(
    raw: std::fs::File,
    stopped: Arc<AtomicBool>,
    turn: impl Fn(&std::fs::File) -> bool + Send + 'static,
) -> JoinHandle<()> {
    use rustix::event::{poll, PollFd, PollFlags};
    std::thread::spawn(move || loop {
        let mut fds = [PollFd::new(&raw, PollFlags::IN)];
        if poll(&mut fds, None).is_err() && !stopped.load(Ordering::SeqCst) {
            continue;
        }
        if stopped.load(Ordering::SeqCst) || !turn(&raw) {
            break;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syns_destination_is_read_past_the_ip_headers_options() {
        // IPv4, header of 6 words (one option word), TCP to 198.18.0.7:9999.
        let mut p = vec![
            0x46, 0, 0, 44, 0, 0, 0x40, 0, 64, 6, 0, 0, 127, 0, 0, 1, 198, 18, 0, 7,
        ];
        p.extend([1, 1, 1, 1]); // the option word
        p.extend([0xd4, 0x31, 0x27, 0x0f, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02]);
        assert_eq!(destination(&p), Some((Ipv4Addr::new(198, 18, 0, 7), 9999)));
        assert_eq!(destination(&p[..22]), None);
        assert_eq!(destination(&[0x60; 40]), None);
    }
}
