//! The agent's sources, and how a sandbox's python boots it from its stdin.

use std::io::Write;
use std::sync::OnceLock;

use super::protocol::encode;

/// The agent's source; its docstring is the protocol.
pub const AGENT_SRC: &str = include_str!("agent.py");
/// How the agent starts, as `python3 -u -c BOOT [PRELOADS]`: it reads the agent from its
/// stdin, the first line there (see [`boot_line`]), and runs its bytecode when the sandbox's
/// python has the magic number of the python that compiled it, else its source. The agent
/// comes on stdin, not in `argv`, so that `ps` in a session shows a short command line, not
/// the agent's 100 KB and more. Compiling the agent cost each pooled sandbox about 9 of its
/// 41 ms of CPU (`bench/load.sh`). The line is read to its exact length, byte for byte, so
/// that the requests after it stay on stdin for the agent. `boot.py` has no comments, as it
/// is the command line; its `HEAD` and `SIZE` are [`BOOT_HEAD`]'s and [`BOOT_SIZE`]'s
/// lengths ([`boot_program`]).
const BOOT: &str = include_str!("boot.py");

/// The boot line's head: an `op` the running agent ignores (a resumed microVM's agent gets
/// the line again), then the size of the rest as a fixed-width string.
const BOOT_HEAD: &str = r#"{"op":"boot","id":0,"size":""#;
/// The digits of the rest's size.
const BOOT_SIZE: usize = 10;

/// [`BOOT`] with its constants in place.
pub(super) fn boot_program() -> String {
    BOOT.replace("HEAD", &(BOOT_HEAD.len() + BOOT_SIZE + 2).to_string())
        .replace("SIZE", &BOOT_SIZE.to_string())
}

/// The agent as [`BOOT`] reads it from stdin: one JSON line, `{"op":"boot","id":0,
/// "size":"0000012345","code":BLOB,"src":SOURCE}`, where `size` counts the bytes after its
/// own field (the newline included), `BLOB` is base64 of zlib of the magic number and the
/// marshalled code (empty when the host could not compile it) and `SOURCE` base64 of the
/// source.
fn boot_line(blob: &str, src: &str) -> Vec<u8> {
    let rest = format!(r#""code":"{blob}","src":"{}"}}"#, encode(src.as_bytes())) + "\n";
    format!(
        "{BOOT_HEAD}{:0width$}\",{rest}",
        rest.len(),
        width = BOOT_SIZE
    )
    .into_bytes()
}

static COMPILED: OnceLock<String> = OnceLock::new();
static BOOT_LINE: OnceLock<Vec<u8>> = OnceLock::new();

/// What the host's python makes of the agent for `BOOT`: `""` when it cannot (no python, or
/// one that fails), and the agent then compiles itself as before. Made once per process; the
/// host's own interpreter, isolated (`-I -S`), only compiles our source, which runs nothing.
fn compiled() -> &'static str {
    COMPILED.get_or_init(|| compile_with(COMPILER, AGENT_SRC).unwrap_or_default())
}

/// The agent's boot line ([`boot_line`]) for async callers: its first call waits for the
/// host's python (about 50 ms), which belongs on the blocking pool, not on a runtime worker
/// that serves other requests.
pub(super) async fn boot_line_off_runtime() -> &'static [u8] {
    if let Some(line) = BOOT_LINE.get() {
        return line;
    }
    let blob = match COMPILED.get() {
        Some(blob) => blob,
        None => tokio::task::spawn_blocking(compiled)
            .await
            .unwrap_or_default(),
    };
    BOOT_LINE.get_or_init(|| boot_line(blob, AGENT_SRC))
}

/// What [`compiled`] runs in the host's python: the agent's source on its stdin, the
/// base64 of zlib of the magic number and the marshalled code on its stdout.
const COMPILER: &str = include_str!("compile.py");

fn compile_with(compiler: &str, src: &str) -> Option<String> {
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-I", "-S", "-c", compiler])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(src.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// The modules a session's agent is sent once (`define`) and compiles on the first request
/// that needs them: rich results (in the kernel, on the first python exec), archives,
/// background processes and file watches. A pooled one-shot sandbox is never sent them, so it
/// costs what it did without them.
pub(super) const LAZY: [(&str, &str); 4] = [
    ("rich", include_str!("rich.py")),
    ("archive", include_str!("archive.py")),
    ("procs", include_str!("procs.py")),
    ("watch", include_str!("watch.py")),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::protocol::{Numbered, Request};
    use serde_json::{json, Value};

    /// What `BOOT` prints, run by the host's python with `src` and `blob` as the agent's on
    /// its stdin, and a request after them.
    fn boot(src: &str, blob: &str) -> String {
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", &boot_program(), "preloads"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("/usr/bin/python3 runs (the sandboxes' python)");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&boot_line(blob, src)).unwrap();
        stdin.write_all(b"{\"op\":\"ping\"}\n").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The bytecode runs where the magic number matches, the source where it does not (or
    /// where there is none); either way the agent sees only its own arguments, and its
    /// stdin from the first request on.
    #[test]
    fn the_agent_boots_from_bytecode_only_a_python_of_its_own_magic_made() {
        let shows = "import sys; print(sys.argv[1:], sys.stdin.read())";
        let blob = compile_with(COMPILER, &format!("print('bytecode'); {shows}")).unwrap();
        let src = format!("print('source'); {shows}");
        let pinged = "['preloads'] {\"op\":\"ping\"}\n\n";
        assert_eq!(boot(&src, &blob), format!("bytecode\n{pinged}"));
        let foreign = COMPILER.replace("MAGIC_NUMBER + ", "b'\\x00\\x00\\r\\n' + ");
        let other = compile_with(&foreign, "print('bytecode')").unwrap();
        assert_ne!(other, blob);
        assert_eq!(boot(&src, &other), format!("source\n{pinged}"));
        assert_eq!(boot(&src, ""), format!("source\n{pinged}"));
        // And the agent itself compiles.
        assert!(!compiled().is_empty());
    }

    /// The boot line is one JSON line, whose `size` counts the bytes after its own field; the
    /// agent's command line is the short boot program.
    #[test]
    fn the_boot_line_is_json_and_the_command_line_short() {
        let line = boot_line("YmxvYg==", "print(1)");
        let text = std::str::from_utf8(&line).unwrap();
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            v,
            json!({"op": "boot", "id": 0, "size": v["size"], "code": "YmxvYg==",
                   "src": encode(b"print(1)")})
        );
        let head = BOOT_HEAD.len() + BOOT_SIZE + 2;
        let size: usize = v["size"].as_str().unwrap().parse().unwrap();
        assert_eq!(size, line.len() - head);
        assert!(line.ends_with(b"}\n"));
        assert!(boot_program().len() < 1024, "{}", boot_program().len());
    }

    /// A session's agent is sent rich.py's and archive.py's sources by name.
    #[test]
    fn the_lazy_sources_are_defined_by_name() {
        let sources = LAZY.into_iter().collect();
        let request = Request::Define { sources };
        let wire = serde_json::to_value(Numbered {
            id: 7,
            request: &request,
        })
        .unwrap();
        assert_eq!(wire["op"], "define");
        assert_eq!(wire["sources"]["rich"], include_str!("rich.py"));
        assert_eq!(wire["sources"]["archive"], include_str!("archive.py"));
    }
}
