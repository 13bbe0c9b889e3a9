//! Shared harness for the integration tests: they drive the real `kennel` binary on the real
//! kernel. Nothing here mocks what Kennel isolates with.
#![allow(dead_code)]

pub mod dockerd;
pub mod vm;

use std::io::{BufRead, Write};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

pub const KENNEL: &str = env!("CARGO_BIN_EXE_kennel");

/// The interpreter used inside sandboxes (the host's `python3` may be a pyenv shim).
pub const PY: &str = "/usr/bin/python3";

pub fn kennel() -> Command {
    Command::new(KENNEL)
}

/// Whether the test may go on. A missing host feature fails the test in CI (`CI=true`) and,
/// only outside CI, skips it with the reason printed.
pub fn require(feature: &str, available: bool) -> bool {
    if available {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("this test needs {feature}, which this CI machine lacks");
    }
    eprintln!("SKIPPED: this test needs {feature}");
    false
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a client's test program (an SDK's test runner, a framework's tests) against this build's
/// `kennel`, with no token or server URL from this environment: its stdout and stderr, which
/// must end in success.
pub fn client_tests(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .env("KENNEL_BIN", KENNEL)
        .env_remove("KENNEL_TOKEN")
        .env_remove("KENNEL_URL")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{report}",
        out.status
    );
    report
}

/// Runs `kennel` with `args` and `stdin`, returning the raw output.
pub fn kennel_output(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = kennel()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kennel starts");
    let mut pipe = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = pipe.write_all(&data);
    });
    let out = child.wait_with_output().expect("kennel ends");
    feeder.join().unwrap();
    out
}

/// `kennel run --json <opts> -- <argv>`: the parsed result, which must exist.
pub fn run_json(opts: &[&str], argv: &[&str]) -> Value {
    let mut args = vec!["run", "--json"];
    args.extend_from_slice(opts);
    args.push("--");
    args.extend_from_slice(argv);
    parse_result(&kennel_output(&args, b""))
}

/// The result a `kennel run --json` printed, which must be a result and not an error.
pub fn parse_result(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}): stdout {text}, stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(v.get("error").is_none(), "kennel failed: {v}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "kennel --json exits 0 with a result"
    );
    v
}

/// Runs Python `code` in a default sandbox (plus `opts`) and returns the result.
pub fn py(opts: &[&str], code: &str) -> Value {
    run_json(opts, &[PY, "-c", code])
}

/// Runs Python `code` and returns its stdout, asserting that it exited 0.
pub fn py_ok(opts: &[&str], code: &str) -> String {
    let r = py(opts, code);
    assert_eq!(r["exit_code"], 0, "python failed: {}", r["stderr"]);
    r["stdout"].as_str().unwrap().to_string()
}

/// A probe that prints how `path` looks inside: `(major, minor) bytes` for a device (a mask by
/// /dev/null reads `(1, 3) 0`), or the errno name.
pub fn device_probe(path: &str) -> String {
    format!(
        "{SYSCALL_PRELUDE}\ntry:\n    st = os.stat({path:?})\n    print((os.major(st.st_rdev), os.minor(st.st_rdev)), len(open({path:?}, 'rb').read()))\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
    )
}

/// A prelude for Python probes: `sys_errno(nr, *args)` makes a raw syscall and returns the
/// errno name ("OK" on success), so tests compare exact errnos.
pub const SYSCALL_PRELUDE: &str = r#"
import ctypes, errno, os, socket, sys
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
def sys_errno(nr, *args):
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return "OK" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def os_errno(fn, *args):
    try:
        fn(*args)
        return "OK"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
"#;

/// Paths of cgroups that the kennel process `pid` created, anywhere under /sys/fs/cgroup.
pub fn kennel_cgroups_of(pid: u32) -> Vec<String> {
    let prefix = format!("kennel-{pid}-");
    kennel_cgroups()
        .into_iter()
        .filter(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with(&prefix)))
        .collect()
}

/// Paths of cgroups named after Kennel anywhere under /sys/fs/cgroup.
pub fn kennel_cgroups() -> Vec<String> {
    cgroups_named(|name| name.starts_with("kennel-"))
}

/// Paths of the cgroups anywhere under /sys/fs/cgroup whose name `wanted` accepts.
pub fn cgroups_named(wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let mut found = vec![];
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let name = e.file_name().to_string_lossy().into_owned();
                if wanted(&name) {
                    found.push(e.path().display().to_string());
                }
                if dir.components().count() < 8 {
                    stack.push(e.path());
                }
            }
        }
    }
    found
}

/// A minimal rootfs for `--rootfs` (dash as /bin/sh and the libraries it needs, an empty /etc)
/// at `path`, made afresh; the caller removes it.
pub fn dash_rootfs(path: &std::path::Path) {
    let _ = std::fs::remove_dir_all(path);
    for (host, inside) in [
        ("/bin/dash", "bin/sh"),
        (
            "/lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/libc.so.6",
        ),
        ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
    ] {
        let dst = path.join(inside);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(host, &dst).unwrap();
    }
    std::fs::create_dir_all(path.join("etc")).unwrap();
}

/// A loopback HTTP server on 127.0.0.1 that answers every request with `body`, for a sandbox
/// to reach through a pin; it stops with the test process. Returns its port.
pub fn http_answering(body: &'static str) -> u16 {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let port = listener.local_addr().expect("a bound address").port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// Writes a pure-Python wheel, `kennel-probe` 0.1 (whose module `kennel_probe` has `VALUE =
/// 'kennel-probe-ok'`), and a PEP 503 simple index for it under `root`: `root/simple/` is
/// the index, `root/files/` has the wheel.
pub fn write_pip_index(root: &std::path::Path) {
    let builder = r#"
import base64, hashlib, os, sys, zipfile
root = sys.argv[1]
files = {
    "kennel_probe/__init__.py": "VALUE = 'kennel-probe-ok'\n",
    "kennel_probe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: kennel-probe\nVersion: 0.1\n",
    "kennel_probe-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: kennel-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
def digest(b):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
record = "".join(f"{n},{digest(c.encode())},{len(c.encode())}\n" for n, c in files.items())
files["kennel_probe-0.1.dist-info/RECORD"] = record + "kennel_probe-0.1.dist-info/RECORD,,\n"
os.makedirs(os.path.join(root, "files"), exist_ok=True)
os.makedirs(os.path.join(root, "simple", "kennel-probe"), exist_ok=True)
whl = os.path.join(root, "files", "kennel_probe-0.1-py3-none-any.whl")
with zipfile.ZipFile(whl, "w") as z:
    for n, c in files.items():
        z.writestr(n, c)
sha = hashlib.sha256(open(whl, "rb").read()).hexdigest()
with open(os.path.join(root, "simple", "kennel-probe", "index.html"), "w") as f:
    f.write(f'<!DOCTYPE html><html><body><a href="../../files/kennel_probe-0.1-py3-none-any.whl#sha256={sha}">kennel_probe-0.1-py3-none-any.whl</a></body></html>\n')
"#;
    let out = Command::new(PY)
        .arg("-c")
        .arg(builder)
        .arg(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A server process on the host; killed by its PID (and reaped) on drop.
pub struct PortServer {
    child: std::process::Child,
    pub port: u16,
}

impl PortServer {
    /// Starts `/usr/bin/python3 args...`, which must print the port it listens on as its first
    /// line once it is listening.
    pub fn start(args: &[&std::path::Path]) -> PortServer {
        let mut child = Command::new(PY)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = match line.trim().parse() {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not print its port: {line:?}");
            }
        };
        PortServer { child, port }
    }
}

impl Drop for PortServer {
    fn drop(&mut self) {
        // Child::kill signals this child's PID only.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Gives an SDK's tests (`cmd`) the stronger tiers their sessions open: checks that gVisor's
/// runsc is installed, and prepares the microVM guest in [`vm::STATE`], naming it in
/// `KENNEL_SDK_TEST_STATE` and its kernel release in `KENNEL_SDK_TEST_GUEST_RELEASE`. In CI a
/// missing piece fails the test; elsewhere it is said, and the SDK's tests of that tier skip.
pub fn sdk_tiers(cmd: &mut Command) {
    require(
        "gVisor's runsc (scripts/setup-ci.sh installs it)",
        std::path::Path::new("/usr/bin/runsc").is_file(),
    );
    let Some(vm) = vm::prepared_vm() else {
        return;
    };
    let manifest = vm.manifest().expect("a prepared guest has a manifest");
    cmd.env("KENNEL_SDK_TEST_STATE", vm::STATE)
        .env("KENNEL_SDK_TEST_GUEST_RELEASE", manifest.kernel_release);
}

/// A threaded static file server on a free port of 127.0.0.1, optionally in TLS. It prints its
/// port, then serves its first argument's directory (in TLS when a certificate and its key
/// follow). Two extra paths report what the server saw: `/sni` answers with the
/// TLS server name of the connection (`repr`, so `None` without TLS) and `/host` with the Host
/// header. The TLS handshake runs in the connection's thread, so a stalled client blocks no one.
/// Connections end gracefully (FIN, then wait for the client's): a server that closes with the
/// client's last bytes unread (a TLS close_notify) ends with an RST instead, and then the proxy
/// logs 0 bytes down (see the network suite's `a_download_the_server_resets_still_counts_its_bytes`).
pub const SERVE_PY: &str = r#"
import http.server, socket, ssl, sys
root = sys.argv[1]
ctx = None
if len(sys.argv) > 3:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[2], sys.argv[3])
    def sni(sock, name, _ctx):
        sock.kennel_sni = name
    ctx.sni_callback = sni
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, text):
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/sni":
            return self.reply(repr(getattr(self.request, "kennel_sni", None)))
        if self.path == "/host":
            return self.reply(repr(self.headers.get("Host")))
        return super().do_GET()
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
    def finish_request(self, request, addr):
        request.settimeout(20)
        conn = request
        try:
            if ctx:
                conn = ctx.wrap_socket(request, server_side=True)
            self.RequestHandlerClass(conn, addr, self, directory=root)
        finally:
            # Close gracefully: FIN, then read until the client's FIN. Closing with the client's
            # late bytes unread (a TLS close_notify) would send an RST instead.
            try:
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(5)
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            conn.close()
srv = S(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// A self-signed certificate for `secure.test` (`ca.pem`) and its key (`key.pem`) in `dir`, for
/// [`SERVE_PY`]'s TLS.
pub fn secure_test_cert(dir: &std::path::Path) {
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes"])
        .args(["-subj", "/CN=secure.test"])
        .args(["-addext", "subjectAltName=DNS:secure.test", "-days", "1"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("ca.pem"))
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--allow-net NAME:PORT --resolve NAME:127.0.0.1` for each name.
pub fn pinned_allow(names: &[(&str, u16)]) -> Vec<String> {
    names
        .iter()
        .flat_map(|(n, p)| {
            [
                "--allow-net".to_string(),
                format!("{n}:{p}"),
                "--resolve".to_string(),
                format!("{n}:127.0.0.1"),
            ]
        })
        .collect()
}
