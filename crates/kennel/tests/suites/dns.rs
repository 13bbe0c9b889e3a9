// The DNS suite, included by one test target per tier, which names it in its `RUNTIME`
// constant (see `tier.rs`).
//
// Programs that ignore proxy variables (aiohttp, Node's fetch, raw sockets) resolve names
// themselves: the sandbox's resolver at 127.0.0.1:53 answers an allowed name with a synthetic
// address of 198.18.0.0/15 whose listener is the proxy's own. Nothing leaves the machine: the
// far side is a Python server on a free port of the host's 127.0.0.1, killed by its PID when
// its guard drops, and its names are pinned with `--resolve NAME:127.0.0.1`. Every sandboxed
// program runs with the six proxy variables unset, so that only the resolver can lead it out.

include!("session_kit.rs");

/// Python helpers of the probes: `query(name, qtype)` sends one DNS question over UDP to the
/// resolver (built with `struct`, not a library) and returns `(rcode, ancount, answers)` with
/// each answer as `(type, ttl, address)`; `gai(name)` is getaddrinfo's IPv4 addresses or its
/// error's name; `errno_of(fn, *args)` is an errno's name or OK; `get(sock, host)` sends a
/// GET of `/host` by hand and returns the status line and the body.
const PRELUDE: &str = r#"
import errno, socket, struct, time
def query(name, qtype):
    q = struct.pack(">HHHHHH", 0x4b4e, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    q += struct.pack(">HH", qtype, 1)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(q, ("127.0.0.1", 53))
    a = u.recv(4096)
    ident, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", a[:12])
    assert ident == 0x4b4e and flags & 0x8000 and qd == 1, a
    i = len(q)
    answers = []
    for _ in range(an):
        if a[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while a[i]:
                i += a[i] + 1
            i += 1
        rtype, rclass, ttl, rdlen = struct.unpack(">HHIH", a[i:i + 10])
        rdata = a[i + 10:i + 10 + rdlen]
        i += 10 + rdlen
        answers.append((rtype, ttl, socket.inet_ntoa(rdata) if rtype == 1 else rdata.hex()))
    return flags & 0xF, an, answers
def gai(name, port=80):
    try:
        return sorted({a[4][0] for a in socket.getaddrinfo(name, port)})
    except socket.gaierror as e:
        names = {socket.EAI_NONAME: "EAI_NONAME", socket.EAI_AGAIN: "EAI_AGAIN"}
        return names.get(e.errno, e.errno)
def errno_of(fn, *args):
    try:
        fn(*args)
        return "OK"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def get(s, host):
    s.sendall(b"GET /host HTTP/1.0\r\nHost: %s\r\n\r\n" % host.encode())
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    head, body = got.split(b"\r\n\r\n", 1)
    return head.split(b"\r\n")[0].decode(), body.decode()
"#;

/// The environment that unsets every proxy variable, as an argv prefix.
const UNSET: [&str; 13] = [
    "/usr/bin/env",
    "-u",
    "HTTP_PROXY",
    "-u",
    "http_proxy",
    "-u",
    "HTTPS_PROXY",
    "-u",
    "https_proxy",
    "-u",
    "ALL_PROXY",
    "-u",
    "all_proxy",
];

/// A directory of the test's own (scripts, certificates) and the servers it started: the
/// servers are killed by their PIDs before the directory goes, however the test ends.
struct Far {
    servers: Vec<PortServer>,
    dir: RemoveTree,
}

impl Far {
    /// `n` plain HTTP servers ([`SERVE_PY`]: `/host` answers with the `repr` of the request's
    /// Host header).
    fn http(tag: &str, n: usize) -> Far {
        let dir = server_common::test_dir(&format!("dns-{tag}"));
        std::fs::write(dir.join("serve.py"), SERVE_PY).unwrap();
        let servers = (0..n)
            .map(|_| PortServer::start(&[&dir.join("serve.py"), &dir]))
            .collect();
        Far {
            servers,
            dir: RemoveTree(dir),
        }
    }

    /// One TLS server whose self-signed certificate (`ca.pem`) names `secure.test`.
    fn tls(tag: &str) -> Far {
        let mut far = Far::http(tag, 0);
        let d = &far.dir.0;
        secure_test_cert(d);
        let args = ["serve.py", "", "ca.pem", "key.pem"].map(|f| d.join(f));
        let args: Vec<&std::path::Path> = args.iter().map(|p| p.as_path()).collect();
        far.servers.push(PortServer::start(&args));
        far
    }

    fn port(&self, i: usize) -> u16 {
        self.servers[i].port
    }
}

/// Whether the host has what these tests drive: root (the resolver and the proxy are bound in
/// the sandbox's network namespace) and openssl; outside the microvm tier (whose clients are
/// in the suite's image), the host's aiohttp and Node, which the sandbox sees in /usr.
fn ready() -> bool {
    tier();
    let host_clients = microvm()
        || require(
            "Debian's python3-aiohttp (scripts/setup-ci.sh installs it)",
            std::path::Path::new("/usr/lib/python3/dist-packages/aiohttp").is_dir(),
        ) && require("Node at /usr/bin/node", std::path::Path::new("/usr/bin/node").is_file());
    require("root (network mode allow binds the resolver in the sandbox)", is_root())
        && require(
            "openssl",
            std::process::Command::new("openssl")
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success()),
        )
        && host_clients
}

/// The options that give a run its clients: in the microvm tier the suite's image (built once
/// per machine into the shared state), elsewhere none (the host's /usr is the sandbox's).
fn client_opts() -> Vec<&'static str> {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if !microvm() {
        return vec![];
    }
    BUILT.get_or_init(|| {
        let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images/dns-clients.toml");
        common::vm::build_image("dns-clients", &spec);
    });
    vec!["--image", "dns-clients"]
}

/// `kennel run` in this tier with `--allow-net NAME:PORT --resolve NAME:127.0.0.1` for each
/// of `names`, plus `extra`, of `argv` with every proxy variable unset: the result.
fn run_bare(names: &[(&str, u16)], extra: &[&str], argv: &[&str]) -> Value {
    let mut opts = pinned_allow(names);
    opts.extend(client_opts().iter().chain(extra).map(|s| s.to_string()));
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    let all: Vec<&str> = UNSET.iter().chain(argv).copied().collect();
    run_json(&opts, &all)
}

/// Python `code` (after [`PRELUDE`]) in a run of [`run_bare`], which must exit 0: its stdout,
/// and the result.
fn py_bare(names: &[(&str, u16)], extra: &[&str], code: &str) -> (String, Value) {
    let r = run_bare(names, extra, &["python3", "-c", &format!("{PRELUDE}\n{code}")]);
    assert_eq!(r["exit_code"], 0, "python failed: {}", r["stderr"]);
    (r["stdout"].as_str().unwrap().to_string(), r)
}

/// A `direct` connection to `host:port` the proxy let through to the host's server.
fn direct(host: &str, port: u16) -> Value {
    json!({
        "host": host, "port": port, "protocol": "direct", "decision": "allowed",
        "reason": "on the allowlist", "address": format!("127.0.0.1:{port}"),
    })
}

/// The log entry of a connection the kernel refused at a synthetic address (`host` is the
/// name it stands for, or the address itself), which the proxy's watch saw.
fn refused(host: &str, port: u16, reason: &str) -> Value {
    json!({
        "host": host, "port": port, "protocol": "direct", "decision": "denied",
        "reason": reason, "address": null,
    })
}

/// The log's entries without their byte counts, in a stable order (an entry is written when
/// its connection ends, so the log's own order is that of the ends).
fn log_of(entries: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let o = e.as_object_mut().unwrap();
            o.remove("bytes_up");
            o.remove("bytes_down");
            e
        })
        .collect();
    out.sort_by_key(Value::to_string);
    out
}

/// Asserts that `r`'s network log holds exactly `expected`, in any order.
fn assert_log(r: &Value, expected: &[Value]) {
    let got = log_of(r["network_log"].as_array().expect("a network_log array"));
    assert_eq!(got, log_of(expected), "network_log: {}", r["network_log"]);
}

// ---- clients that ignore proxy variables -----------------------------------------------------

/// aiohttp (whose `trust_env` is off by default) resolves `app.test` through the resolver and
/// connects to its synthetic address: the proxy carries the request, and logs it `direct`.
#[test]
fn aiohttp_reaches_an_allowed_name() {
    if !ready() {
        return;
    }
    let far = Far::http("aiohttp", 1);
    let p = far.port(0);
    let code = format!(
        "import aiohttp, asyncio\n\
         async def main():\n\
         \x20   async with aiohttp.ClientSession() as s:\n\
         \x20       async with s.get('http://app.test:{p}/host') as r:\n\
         \x20           print(r.status, await r.text())\n\
         asyncio.run(main())\n"
    );
    let (out, r) = py_bare(&[("app.test", p)], &[], &code);
    assert_eq!(out, format!("200 'app.test:{p}'\n"));
    assert_log(&r, &[direct("app.test", p)]);
}

/// Node's `fetch` (undici, which reads no proxy variable) reaches the name the same way. The
/// native and runsc tiers run the host's Node 20; the microvm tier its image's, bookworm's
/// Node 18, whose `fetch` is the same undici client (its experimental warning goes to stderr).
#[test]
fn node_fetch_reaches_an_allowed_name() {
    if !ready() {
        return;
    }
    let far = Far::http("node", 1);
    let p = far.port(0);
    let code = format!(
        "fetch('http://app.test:{p}/host').then(async r => console.log(r.status, await r.text()))"
    );
    let r = run_bare(&[("app.test", p)], &[], &["node", "-e", &code]);
    assert_eq!(r["exit_code"], 0, "node failed: {}", r["stderr"]);
    assert_eq!(r["stdout"], format!("200 'app.test:{p}'\n"));
    assert_log(&r, &[direct("app.test", p)]);
}

/// A raw socket speaking HTTP by hand: `create_connection((name, port))` lands on the name's
/// synthetic address, the first one the sandbox gave out.
#[test]
fn a_raw_socket_reaches_an_allowed_name() {
    if !ready() {
        return;
    }
    let far = Far::http("raw", 1);
    let p = far.port(0);
    let code = format!(
        "s = socket.create_connection(('app.test', {p}), timeout=20)\n\
         print(s.getpeername())\n\
         print(*get(s, 'app.test'))\n"
    );
    let (out, r) = py_bare(&[("app.test", p)], &[], &code);
    assert_eq!(out, format!("('198.18.0.1', {p})\nHTTP/1.0 200 OK 'app.test'\n"));
    assert_log(&r, &[direct("app.test", p)]);
}

// ---- the resolver's answers ------------------------------------------------------------------

/// The resolver's answers, read off the wire: an allowed name's A query gets its synthetic
/// address with a TTL of 60 s, its AAAA query an empty NOERROR (RCODE 0, ANCOUNT 0), an
/// unlisted name NXDOMAIN (RCODE 3) at once, which getaddrinfo reports as EAI_NONAME. A lookup
/// connects nowhere: nothing is logged.
#[test]
fn the_resolver_answers_allowed_names_and_nxdomain_for_the_rest() {
    if !ready() {
        return;
    }
    let far = Far::http("answers", 1);
    let p = far.port(0);
    let code = "print(query('app.test', 1))\n\
                print(query('app.test', 28))\n\
                t = time.monotonic()\n\
                print(query('evil.test', 1), query('evil.test', 28))\n\
                print(gai('evil.test'), time.monotonic() - t < 1)\n\
                print(gai('app.test'), gai('APP.test.'))\n";
    let (out, r) = py_bare(&[("app.test", p)], &[], code);
    assert_eq!(
        out,
        "(0, 1, [(1, 60, '198.18.0.1')])\n(0, 0, [])\n(3, 0, []) (3, 0, [])\n\
         EAI_NONAME True\n['198.18.0.1'] ['198.18.0.1']\n"
    );
    assert_log(&r, &[]);
}

/// A synthetic address listens only on the ports its name's rules allow: another port of the
/// allowed name is refused by the sandbox's kernel (ECONNREFUSED), though the host's server on
/// that port accepts (the control). The proxy's watch of the synthetic range sees the attempt
/// and logs it denied, with the reason.
#[test]
fn another_port_of_an_allowed_name_is_refused() {
    if !ready() {
        return;
    }
    let far = Far::http("port", 2);
    let (p, other) = (far.port(0), far.port(1));
    std::net::TcpStream::connect(("127.0.0.1", other)).expect("the host's server accepts");
    let code = format!("print(errno_of(socket.create_connection, ('app.test', {other}), 5))\n");
    let (out, r) = py_bare(&[("app.test", p)], &[], &code);
    assert_eq!(out, "ECONNREFUSED\n");
    let why = format!("port {other} is not allowed for app.test");
    assert_log(&r, &[refused("app.test", other, &why)]);
}

/// TLS's server name must still match the name: a handshake to `secure.test`'s synthetic
/// address that names `evil.test` is closed after its ClientHello (the server never sees it)
/// and logged denied; the same handshake naming `secure.test` goes through.
#[test]
fn a_tls_server_name_must_match_the_synthetic_address_name() {
    if !ready() {
        return;
    }
    let far = Far::tls("sni");
    let s = far.port(0);
    let ca = format!("{}:/workspace/ca.pem", far.dir.0.join("ca.pem").display());
    let code = format!(
        "import ssl\n\
         ctx = ssl.create_default_context(cafile='/workspace/ca.pem')\n\
         ctx.check_hostname = False\n\
         for name in ('evil.test', 'secure.test'):\n\
         \x20   raw = socket.create_connection(('secure.test', {s}), timeout=20)\n\
         \x20   try:\n\
         \x20       print(*get(ctx.wrap_socket(raw, server_hostname=name), name))\n\
         \x20   except (ssl.SSLError, OSError) as e:\n\
         \x20       print(type(e).__name__)\n"
    );
    let (out, r) = py_bare(&[("secure.test", s)], &["--file", &ca], &code);
    assert_eq!(out, "SSLZeroReturnError\nHTTP/1.0 200 OK 'secure.test'\n");
    let mut refused = direct("secure.test", s);
    refused["decision"] = json!("denied");
    refused["reason"] =
        json!("TLS server name evil.test differs from the tunnel's host secure.test");
    refused["address"] = Value::Null;
    assert_log(&r, &[refused, direct("secure.test", s)]);
}

// ---- between sandboxes and over time ---------------------------------------------------------

/// A server of this tier that lets sessions pin names to the host's loopback.
fn pinning_server(name: &str) -> Server {
    tier();
    // The server's own key before the kit's tables.
    let config = format!("allow_pins_to = [\"127.0.0.1/32\"]\n{}", suite_config(""));
    let server = Server::start(name, &config);
    if microvm() {
        wait_for_clone(&server);
    }
    server
}

/// Python, in a session: the network log of every exec in `execs` together.
fn logs_of(execs: &[&Value]) -> Vec<Value> {
    execs
        .iter()
        .flat_map(|e| e["network_log"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// A synthetic address is one sandbox's own: while a session holds `a.test` at 198.18.0.1 (an
/// open connection there, and new ones work), a run whose allowlist names only `b.test` cannot
/// resolve `a.test` and finds nothing at 198.18.0.1 on the same port (ECONNREFUSED: it has
/// not given that address out, and the session's listener is in another namespace; its proxy
/// logs the attempt at an address that stands for no name). Once it
/// resolves `b.test`, 198.18.0.1 is `b.test` there: the same address, another name. The
/// session's open connection then still carries its request, to `a.test`.
#[test]
fn a_synthetic_address_of_another_sandbox_reaches_nothing() {
    if !ready() {
        return;
    }
    let far = Far::http("isolation", 1);
    let p = far.port(0);
    let server = pinning_server("dns-isolation");
    let session = open_session(
        &server,
        json!({"network": {
            "mode": "allow", "allow": [format!("a.test:{p}")], "resolve": ["a.test:127.0.0.1"],
        }}),
    );
    let id = session["id"].as_str().unwrap().to_string();
    let held = server.client.exec(
        &id,
        "python",
        &format!(
            "{PRELUDE}\nprint(gai('a.test'))\n\
             kept = socket.create_connection(('a.test', {p}), timeout=20)\n\
             print(kept.getpeername())\n"
        ),
    );
    assert_eq!(held["stdout"], format!("['198.18.0.1']\n('198.18.0.1', {p})\n"), "{held}");

    let code = format!(
        "print(gai('a.test'))\n\
         print(errno_of(socket.create_connection, ('198.18.0.1', {p}), 5))\n\
         print(gai('b.test'))\n\
         print(*get(socket.create_connection(('198.18.0.1', {p}), timeout=20), 'b.test'))\n"
    );
    let (out, other) = py_bare(&[("b.test", p)], &[], &code);
    assert_eq!(
        out,
        "EAI_NONAME\nECONNREFUSED\n['198.18.0.1']\nHTTP/1.0 200 OK 'b.test'\n"
    );
    let why = "198.18.0.1 is no allowed name's address now";
    assert_log(&other, &[refused("198.18.0.1", p, why), direct("b.test", p)]);

    let used = server.client.exec(
        &id,
        "python",
        &format!(
            "print(*get(kept, 'a.test'))\n\
             print(*get(socket.create_connection(('198.18.0.1', {p}), timeout=20), 'a.test'))\n"
        ),
    );
    assert_eq!(
        used["stdout"],
        "HTTP/1.0 200 OK 'a.test'\nHTTP/1.0 200 OK 'a.test'\n",
        "{used}"
    );
    // A connection is logged as it ends: in the exec that closed it, or (past its end) the next.
    let last = server.client.exec(&id, "python", "pass");
    let log = logs_of(&[&held, &used, &last]);
    assert_eq!(log_of(&log), log_of(&[direct("a.test", p), direct("a.test", p)]));
    assert_eq!(server.client.delete(&format!("/v1/sessions/{id}")).status, 204);
}

/// A live policy change applies to the resolver at once: a session resolves `a.test`, the
/// change removes it, and the next query of it gets NXDOMAIN, while `b.test`, still allowed,
/// resolves (to the session's next address: `a.test` kept its own). A program that kept the
/// old answer still reaches the address's listener, which now refuses the name: the
/// connection is closed before a byte goes up, and logged denied beside the change.
#[test]
fn a_live_policy_change_applies_to_the_resolver_at_once() {
    if !ready() {
        return;
    }
    let far = Far::http("live", 1);
    let p = far.port(0);
    let server = pinning_server("dns-live");
    let network = |names: &[&str]| {
        json!({
            "mode": "allow",
            "allow": names.iter().map(|n| format!("{n}:{p}")).collect::<Vec<_>>(),
            "resolve": ["a.test:127.0.0.1", "b.test:127.0.0.1"],
        })
    };
    let session = open_session(&server, json!({"network": network(&["a.test", "b.test"])}));
    let id = session["id"].as_str().unwrap().to_string();
    let before = server.client.exec(
        &id,
        "python",
        &format!("{PRELUDE}\nprint(query('a.test', 1), gai('a.test'))\n"),
    );
    assert_eq!(before["stdout"], "(0, 1, [(1, 60, '198.18.0.1')]) ['198.18.0.1']\n", "{before}");

    let r = server
        .client
        .patch_json(&format!("/v1/sessions/{id}/network"), &network(&["b.test"]));
    assert_eq!(r.status, 200, "{}", r.text());
    let after = server.client.exec(
        &id,
        "python",
        &format!(
            "print(query('a.test', 1), gai('a.test'))\nprint(gai('b.test'))\n\
             s = socket.create_connection(('198.18.0.1', {p}), timeout=20)\n\
             s.sendall(b'GET /host HTTP/1.0\\r\\nHost: a.test\\r\\n\\r\\n')\n\
             print(s.recv(4096))\n"
        ),
    );
    assert_eq!(
        after["stdout"],
        "(3, 0, []) EAI_NONAME\n['198.18.0.2']\nb''\n",
        "{after}"
    );
    let change = json!({
        "host": "", "port": 0, "protocol": "policy", "decision": "changed", "address": null,
        "reason": format!(
            "the session's network changed: mode allow, allow b.test:{p}, resolve \
             a.test:127.0.0.1 b.test:127.0.0.1; 0 open connection(s) closed"
        ),
    });
    let mut refused = direct("a.test", p);
    refused["decision"] = json!("denied");
    refused["reason"] = json!("a.test is not on the allowlist");
    refused["address"] = Value::Null;
    // The refused connection is logged as it ends, which may be just past the exec that saw
    // it closed: in that exec's log or the next's.
    let last = server.client.exec(&id, "python", "pass");
    let log = logs_of(&[&after, &last]);
    assert_eq!(log_of(&log), log_of(&[change, refused]));
    assert_eq!(server.client.delete(&format!("/v1/sessions/{id}")).status, 204);
}
