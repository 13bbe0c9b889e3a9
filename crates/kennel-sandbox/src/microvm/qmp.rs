//! A QMP client for the few commands Kennel sends QEMU: capabilities, status, stop and
//! cont, and the migration that saves and restores a snapshot (with `getfd`, which passes a
//! descriptor over the socket). QEMU is not trusted either: every line it sends is bounded.
//!
//! Written here rather than with the `qapi` crate: its generated schema of every QMP command
//! would grow the helper binary that every native run execs, for six commands.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::sys;

/// The longest line QEMU may send (its answers here are a few hundred bytes).
const MAX_LINE: u64 = 1 << 20;

/// A QMP connection, past its capabilities negotiation.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to QEMU's QMP socket at `path`, which QEMU creates as it starts: retried until
    /// `bound`.
    pub fn connect(path: &Path, bound: Duration) -> io::Result<Qmp> {
        let until = Instant::now() + bound;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= until => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        stream.set_read_timeout(Some(bound))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        let greeting = qmp.line()?;
        if greeting.get("QMP").is_none() {
            return Err(bad(format!("not a QMP greeting: {greeting}")));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// Runs `command` and returns its `return` value; QEMU's `error` is an error.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> io::Result<Value> {
        self.send(command, arguments, None)
    }

    /// `getfd`: hands QEMU `fd` under `name`, for a later `fd:NAME` migration URI.
    pub fn pass_fd(&mut self, name: &str, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.send("getfd", Some(json!({ "fdname": name })), Some(fd))
            .map(drop)
    }

    /// Waits until the migration (either way) has completed; its failure is an error.
    pub fn await_migration(&mut self, bound: Duration) -> io::Result<()> {
        let until = Instant::now() + bound;
        loop {
            let status = self.execute("query-migrate", None)?;
            match status.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some("failed" | "cancelled") => {
                    let why = status.get("error-desc").cloned().unwrap_or(Value::Null);
                    return Err(bad(format!("the migration failed: {why}")));
                }
                _ if Instant::now() >= until => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the migration did not complete in time",
                    ))
                }
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    fn send(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        fd: Option<BorrowedFd<'_>>,
    ) -> io::Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = serde_json::to_vec(&msg).map_err(io::Error::other)?;
        line.extend_from_slice(b"\r\n");
        match fd {
            Some(fd) => sys::send_with_fd(&self.writer, &line, fd)?,
            None => self.writer.write_all(&line)?,
        }
        loop {
            let answer = self.line()?;
            if let Some(r) = answer.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = answer.get("error") {
                return Err(bad(format!("QEMU refused {command}: {e}")));
            }
            // Anything else is an event, which these commands do not wait for.
        }
    }

    fn line(&mut self) -> io::Result<Value> {
        let mut buf = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "QEMU closed its QMP socket",
            ));
        }
        if !buf.ends_with(b"\n") {
            return Err(bad("a QMP line past its bound".into()));
        }
        serde_json::from_slice(&buf).map_err(|e| bad(format!("a QMP line is not JSON: {e}")))
    }
}

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A fake QEMU on a socket: the greeting, then `answers` to the commands in order.
    fn qemu(
        answers: &'static [&'static str],
    ) -> (std::path::PathBuf, std::thread::JoinHandle<Vec<String>>) {
        let dir = std::env::temp_dir().join(format!(
            "kennel-qmp-{}-{}",
            std::process::id(),
            answers.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let handle = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            w.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n")
                .unwrap();
            let mut got = vec![];
            for a in answers {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                got.push(line.trim().to_string());
                w.write_all(a.as_bytes()).unwrap();
            }
            let _ = std::fs::remove_dir_all(dir);
            got
        });
        (path, handle)
    }

    #[test]
    fn commands_are_negotiated_answered_and_events_skipped() {
        let (path, fake) = qemu(&[
            "{\"return\": {}}\r\n",
            "{\"event\": \"STOP\", \"timestamp\": {}}\r\n{\"return\": {\"status\": \"paused\"}}\r\n",
            "{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}}\r\n",
        ]);
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        let status = q.execute("query-status", None).unwrap();
        assert_eq!(status["status"], "paused");
        let err = q.execute("cont", None).unwrap_err();
        assert!(err.to_string().contains("QEMU refused cont"), "{err}");
        let sent = fake.join().unwrap();
        assert_eq!(sent[0], "{\"execute\":\"qmp_capabilities\"}");
        assert_eq!(sent[1], "{\"execute\":\"query-status\"}");
    }

    #[test]
    fn garbage_from_qemu_is_an_error_not_a_panic() {
        let (path, fake) = qemu(&["not json\r\n"]);
        let err = Qmp::connect(&path, Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
        fake.join().unwrap();
    }
}
