//! The proxy's SOCKS5 side: CONNECT with host names, no authentication.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};

use crate::proxy::{decide, event, tunnel, Conn};
use kennel_types::net::NetEvent;

/// SOCKS5, CONNECT with host names only (no authentication).
pub(super) fn serve_socks(mut conn: TcpStream, shared: &Conn) -> Option<NetEvent> {
    let malformed = || {
        Some(event(
            "",
            0,
            "socks5",
            "denied",
            "a malformed SOCKS5 handshake",
        ))
    };
    let mut head = [0u8; 2];
    if conn.read_exact(&mut head).is_err() {
        return malformed();
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    if conn.read_exact(&mut methods).is_err() {
        return malformed();
    }
    if head[0] != 5 || !methods.contains(&0) {
        let _ = conn.write_all(&[5, 0xff]);
        return Some(event(
            "",
            0,
            "socks5",
            "denied",
            "only SOCKS5 without authentication is spoken",
        ));
    }
    conn.write_all(&[5, 0]).ok()?;
    let Some((command, host, port)) = socks_request(&mut conn) else {
        reply(&mut conn, 1);
        return malformed();
    };
    if command != 1 {
        reply(&mut conn, 7);
        return Some(event(
            &host,
            port,
            "socks5",
            "denied",
            "only CONNECT is supported",
        ));
    }
    let addr = match decide(shared.allow(), &host, port) {
        Ok(a) => a,
        Err(why) => {
            reply(&mut conn, 2);
            return Some(event(&host, port, "socks5", "denied", why));
        }
    };
    reply(&mut conn, 0);
    Some(tunnel(conn, shared, &host, port, addr, "socks5", vec![]))
}

fn reply(conn: &mut TcpStream, code: u8) {
    let _ = conn.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
}

/// A SOCKS5 request: (command, host or address literal, port).
fn socks_request(conn: &mut TcpStream) -> Option<(u8, String, u16)> {
    let mut req = [0u8; 4];
    conn.read_exact(&mut req).ok()?;
    let host = match req[3] {
        3 => {
            let mut len = [0u8; 1];
            conn.read_exact(&mut len).ok()?;
            let mut name = vec![0u8; usize::from(len[0])];
            conn.read_exact(&mut name).ok()?;
            String::from_utf8_lossy(&name).into_owned()
        }
        1 => {
            let mut a = [0u8; 4];
            conn.read_exact(&mut a).ok()?;
            IpAddr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            conn.read_exact(&mut a).ok()?;
            format!("[{}]", IpAddr::from(a))
        }
        _ => return None,
    };
    let mut port = [0u8; 2];
    conn.read_exact(&mut port).ok()?;
    Some((req[1], host, u16::from_be_bytes(port)))
}
