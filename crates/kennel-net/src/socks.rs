//! The proxy's SOCKS5 side: CONNECT with host names, no authentication. It reads the
//! handshake and says how SOCKS5 answers; `conn` does the rest.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};

use kennel_types::net::NetEvent;

use crate::conn::{Answer, Conn, Protocol, Target};
use crate::denial::Denial;

/// Reply codes of RFC 1928 §6.
const SUCCEEDED: u8 = 0;
const GENERAL_FAILURE: u8 = 1;
const NOT_ALLOWED: u8 = 2;
const COMMAND_NOT_SUPPORTED: u8 = 7;

/// SOCKS5's answers: a reply with its code (the reason is only in the log).
struct Socks5;

impl Answer for Socks5 {
    fn refuse(&self, client: &mut TcpStream, _why: &Denial) {
        let _ = reply(client, NOT_ALLOWED);
    }

    fn open(&self, client: &mut TcpStream) -> io::Result<()> {
        reply(client, SUCCEEDED)
    }
}

fn reply(client: &mut TcpStream, code: u8) -> io::Result<()> {
    client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0])
}

/// SOCKS5, CONNECT with host names only (no authentication).
pub(crate) fn serve_socks(mut client: TcpStream, conn: &Conn) -> Option<NetEvent> {
    let unnamed = |why| Some(Target::new("", 0, Protocol::Socks5).denied(why));
    let Some(methods) = greeting(&mut client) else {
        return unnamed(Denial::BadSocks);
    };
    if !methods {
        let _ = client.write_all(&[5, 0xff]);
        return unnamed(Denial::SocksAuth);
    }
    client.write_all(&[5, 0]).ok()?;
    let Some((command, host, port)) = socks_request(&mut client) else {
        let _ = reply(&mut client, GENERAL_FAILURE);
        return unnamed(Denial::BadSocks);
    };
    let target = Target::new(host, port, Protocol::Socks5);
    if command != 1 {
        let _ = reply(&mut client, COMMAND_NOT_SUPPORTED);
        return Some(target.denied(Denial::SocksCommand));
    }
    Some(conn.tunnel(client, &target, vec![], &Socks5))
}

/// The client's greeting: whether it is SOCKS5 offering "no authentication"; `None` if it is
/// cut short.
fn greeting(client: &mut TcpStream) -> Option<bool> {
    let mut head = [0u8; 2];
    client.read_exact(&mut head).ok()?;
    let mut methods = vec![0u8; usize::from(head[1])];
    client.read_exact(&mut methods).ok()?;
    Some(head[0] == 5 && methods.contains(&0))
}

/// A SOCKS5 request: (command, host or address literal, port).
fn socks_request(client: &mut TcpStream) -> Option<(u8, String, u16)> {
    let mut req = [0u8; 4];
    client.read_exact(&mut req).ok()?;
    let host = match req[3] {
        3 => {
            let mut len = [0u8; 1];
            client.read_exact(&mut len).ok()?;
            let mut name = vec![0u8; usize::from(len[0])];
            client.read_exact(&mut name).ok()?;
            String::from_utf8_lossy(&name).into_owned()
        }
        1 => {
            let mut a = [0u8; 4];
            client.read_exact(&mut a).ok()?;
            IpAddr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            client.read_exact(&mut a).ok()?;
            format!("[{}]", IpAddr::from(a))
        }
        _ => return None,
    };
    let mut port = [0u8; 2];
    client.read_exact(&mut port).ok()?;
    Some((req[1], host, u16::from_be_bytes(port)))
}
