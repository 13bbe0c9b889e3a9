//! Interception through the proxy, end to end on 127.0.0.1: a client CONNECTs and speaks TLS
//! trusting the sandbox's CA, loopback upstreams (HTTPS with a test CA given as an extra root,
//! and plain HTTP) record what they receive.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kennel_net::{Interceptor, Proxy, Roots, Secret, SecretEventKind, SecretValue};
use kennel_types::net::{Allowlist, NetEvent, Rule};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{
    ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection, StreamOwned,
};

const VALUE: &str = "sk-live-REAL-VALUE-42";
const PLACEHOLDER: &str = "KENNEL_PLACEHOLDER_abc123";

/// The size of `/big`'s response: many times the proxy's buffers.
const BIG: usize = 8 << 20;

type Received = Arc<Mutex<Vec<u8>>>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA, as a company's would be: the proxy trusts it as an extra root.
struct TestCa(CertifiedIssuer<'static, KeyPair>);

impl TestCa {
    fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        TestCa(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    fn server(&self, host: &str) -> Arc<ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![host.to_string()])
            .unwrap()
            .signed_by(&key, &self.0)
            .unwrap();
        server_config(cert.der().clone(), key)
    }
}

fn server_config(cert: CertificateDer<'static>, key: KeyPair) -> Arc<ServerConfig> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    Arc::new(config)
}

/// Reads one HTTP message (head, then a Content-Length or chunked body); empty at EOF.
fn read_message(s: &mut impl Read) -> Vec<u8> {
    let mut msg = vec![];
    let mut b = [0u8; 1];
    while !msg.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => msg.push(b[0]),
            _ => return msg,
        }
    }
    let head = String::from_utf8_lossy(&msg).to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        while !msg.ends_with(b"\r\n0\r\n\r\n") && s.read(&mut b).is_ok_and(|n| n == 1) {
            msg.push(b[0]);
        }
    } else if let Some(n) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|n| n.trim().parse::<usize>().ok())
    {
        let mut body = vec![0u8; n];
        if s.read_exact(&mut body).is_ok() {
            msg.extend(body);
        }
    }
    msg
}

/// Answers each request on `s` with 200 `ok`, recording the requests, until EOF.
fn answer(mut s: impl Read + Write, got: &Received) {
    loop {
        let req = read_message(&mut s);
        if req.is_empty() {
            return;
        }
        got.lock().unwrap().extend_from_slice(&req);
        if req.starts_with(b"GET /big ") {
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n");
            let _ = s.write_all(&vec![b'x'; BIG]);
            continue;
        }
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    }
}

/// An upstream on 127.0.0.1: HTTPS with `tls`, else plain HTTP.
fn upstream(tls: Option<Arc<ServerConfig>>) -> (u16, Received) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Received::default();
    let g = got.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            match &tls {
                Some(config) => {
                    let conn = ServerConnection::new(config.clone()).unwrap();
                    answer(StreamOwned::new(conn, c), &g);
                }
                None => answer(c, &g),
            }
        }
    });
    (port, got)
}

fn rules(rules: &[String]) -> Vec<Rule> {
    rules.iter().map(|r| Rule::parse(r).unwrap()).collect()
}

/// A proxy allowing `allow` (every host pinned to 127.0.0.1), intercepting for one secret
/// that may go to `secret_hosts`; its HTTP listener's address and the sandbox CA's PEM.
fn proxy(allow: &[String], secret_hosts: &[String], roots: Roots) -> (Proxy, SocketAddr, String) {
    let rules = rules(allow);
    let pins = rules
        .iter()
        .map(|r| (r.domain.clone(), "127.0.0.1".parse().unwrap()))
        .collect();
    let bind = || TcpListener::bind("127.0.0.1:0").unwrap();
    let http = bind();
    let at = http.local_addr().unwrap();
    let mut proxy = Proxy::serve(http, bind(), Allowlist { rules, pins }).unwrap();
    let secret = Secret {
        name: "API".into(),
        placeholder: PLACEHOLDER.into(),
        value: SecretValue::new(VALUE.into()),
        header: "Authorization".into(),
        hosts: self::rules(secret_hosts),
    };
    let icpt = Interceptor::new(vec![secret], roots).unwrap();
    let ca = icpt.ca_pem();
    proxy.intercept(icpt);
    (proxy, at, ca)
}

/// A proxy intercepting for `api.test`, an HTTPS upstream with a test CA's leaf.
struct Api {
    /// The upstream's port, and what it received.
    port: u16,
    got: Received,
    proxy: Proxy,
    /// The proxy's HTTP listener, and the sandbox CA's PEM.
    at: SocketAddr,
    ca: String,
}

/// [`Api`], the proxy trusting `roots` and the test CA.
fn api(mut roots: Roots) -> Api {
    let test_ca = TestCa::new();
    let (port, got) = upstream(Some(test_ca.server("api.test")));
    roots
        .add_pem(test_ca.0.pem().as_bytes(), "the test CA")
        .unwrap();
    let rule = vec![format!("api.test:{port}")];
    let (proxy, at, ca) = proxy(&rule, &rule, roots);
    Api {
        port,
        got,
        proxy,
        at,
        ca,
    }
}

/// A TLS stream to `host:port` through the proxy at `at`, trusting `ca` (PEM).
fn connect(
    at: SocketAddr,
    host: &str,
    port: u16,
    ca: &str,
) -> StreamOwned<ClientConnection, TcpStream> {
    let mut s = TcpStream::connect(at).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
    )
    .unwrap();
    let answer = read_message(&mut s);
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    tls_over(s, host, ca)
}

/// TLS to `host` over `s`, trusting `ca` (PEM), offering h2 too as browsers and curl do.
fn tls_over(s: TcpStream, host: &str, ca: &str) -> StreamOwned<ClientConnection, TcpStream> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let name = ServerName::try_from(host.to_string()).unwrap();
    StreamOwned::new(ClientConnection::new(Arc::new(config), name).unwrap(), s)
}

fn no_value_in(log: &[NetEvent], proxy_debug: &str) {
    let shown = format!("{log:?} {proxy_debug}");
    assert!(!shown.contains(VALUE), "{shown}");
}

#[test]
fn the_upstream_receives_the_value_on_every_kept_alive_request() {
    // The public roots too, as a server's would be: the test CA is one more.
    let Api {
        port,
        got,
        proxy,
        at,
        ca,
    } = api(Roots::public());
    let mut tls = connect(at, "api.test", port, &ca);
    let get =
        format!("GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n");
    tls.write_all(get.as_bytes()).unwrap();
    assert_eq!(
        read_message(&mut tls),
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    );
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    let body = "4\r\nwiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n";
    let post = format!("POST /p HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\nTransfer-Encoding: chunked\r\n\r\n{body}");
    tls.write_all(post.as_bytes()).unwrap();
    assert_eq!(
        read_message(&mut tls),
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    );
    tls.conn.send_close_notify();
    let _ = tls.flush();
    drop(tls);
    std::thread::sleep(Duration::from_millis(200));
    let expect = format!(
        "{}{}",
        get.replace(PLACEHOLDER, VALUE),
        post.replace(PLACEHOLDER, VALUE)
    );
    assert_eq!(String::from_utf8_lossy(&got.lock().unwrap()), expect);
    // Events are recorded as the connection ends: read them once the proxy has stopped.
    let (live, shown) = (proxy.live(), format!("{proxy:?}"));
    let log = proxy.stop();
    let events = live.take_secret_events();
    let shown = format!("{events:?} {shown}");
    assert_eq!(log.len(), 1, "{log:?}");
    let ev = &log[0];
    assert_eq!(
        (ev.protocol.as_str(), ev.decision.as_str()),
        ("connect", "allowed")
    );
    assert_eq!(ev.reason, "on the allowlist; intercepted to inject secrets");
    assert_eq!(ev.bytes_up, (get.len() + post.len()) as u64, "{ev:?}");
    assert_eq!(events.len(), 2, "{events:?}");
    for e in &events {
        assert_eq!(e.kind, SecretEventKind::Injected);
        assert_eq!(
            (e.secret.as_str(), e.host.as_str(), e.port),
            ("API", "api.test", port)
        );
    }
    no_value_in(&log, &shown);
}

#[test]
fn a_placeholder_goes_unreplaced_elsewhere_and_over_plain_http() {
    let test_ca = TestCa::new();
    let (tls_port, got_tls) = upstream(Some(test_ca.server("other.test")));
    let (plain_port, got_plain) = upstream(None);
    let mut roots = Roots::none();
    roots
        .add_pem(test_ca.0.pem().as_bytes(), "the test CA")
        .unwrap();
    let allow = vec![
        format!("other.test:{tls_port}"),
        format!("api.test:{plain_port},443"),
    ];
    let secret_hosts = vec![format!("api.test:{plain_port},443")];
    let (proxy, at, _ca) = proxy(&allow, &secret_hosts, roots);
    // Another host: a plain tunnel, its real certificate seen by the client.
    let mut tls = connect(at, "other.test", tls_port, &test_ca.0.pem());
    let get = format!(
        "GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n"
    );
    tls.write_all(get.as_bytes()).unwrap();
    assert!(read_message(&mut tls).ends_with(b"ok"));
    drop(tls);
    // The secret's own host, over plain HTTP.
    let mut s = TcpStream::connect(at).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let plain = format!("GET http://api.test:{plain_port}/ HTTP/1.1\r\nHost: api.test:{plain_port}\r\nAuthorization: Bearer {PLACEHOLDER}\r\nConnection: close\r\n\r\n");
    s.write_all(plain.as_bytes()).unwrap();
    assert!(read_message(&mut s).ends_with(b"ok"));
    drop(s);
    std::thread::sleep(Duration::from_millis(200));
    for got in [&got_tls, &got_plain] {
        let got = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
        assert!(got.contains(&format!("Bearer {PLACEHOLDER}")), "{got}");
    }
    let live = proxy.live();
    let log = proxy.stop();
    let events = live.take_secret_events();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.kind, SecretEventKind::Misused);
    assert_eq!(
        (e.secret.as_str(), e.host.as_str(), e.protocol.as_str()),
        ("API", "api.test", "http")
    );
    let reasons: Vec<&str> = log.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["on the allowlist", "on the allowlist"], "{log:?}");
    no_value_in(&log, &format!("{events:?}"));
}

#[test]
fn an_upstream_with_a_certificate_not_in_the_roots_is_refused() {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["bad.test".to_string()]).unwrap();
    let (port, got) = upstream(Some(server_config(cert.der().clone(), signing_key)));
    let rule = vec![format!("bad.test:{port}")];
    let (proxy, at, ca) = proxy(&rule, &rule, Roots::public());
    let mut tls = connect(at, "bad.test", port, &ca);
    let get =
        format!("GET / HTTP/1.1\r\nHost: bad.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n");
    assert!(
        tls.write_all(get.as_bytes())
            .and_then(|()| tls.flush())
            .is_err()
            || read_message(&mut tls).is_empty()
    );
    drop(tls);
    std::thread::sleep(Duration::from_millis(200));
    assert!(got.lock().unwrap().is_empty());
    let log = proxy.stop();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].decision, "denied", "{log:?}");
    assert!(
        log[0]
            .reason
            .starts_with("upstream TLS refused: invalid peer certificate"),
        "{log:?}"
    );
}

#[test]
fn a_direct_connection_to_a_secrets_host_is_intercepted_too() {
    let Api {
        port,
        got,
        proxy,
        ca,
        ..
    } = api(Roots::none());
    // As the sandbox's resolver would: a synthetic address whose connections are the proxy's.
    let synthetic = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = synthetic.local_addr().unwrap();
    let _ = proxy
        .live()
        .serve_direct(synthetic, "api.test".into(), port);
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = tls_over(s, "api.test", &ca);
    let get = format!("GET / HTTP/1.1\r\nHost: api.test\r\nX-Key: {PLACEHOLDER}\r\n\r\n");
    tls.write_all(get.as_bytes()).unwrap();
    assert!(read_message(&mut tls).ends_with(b"ok"));
    drop(tls);
    std::thread::sleep(Duration::from_millis(200));
    let got = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
    assert_eq!(got, get.replace(PLACEHOLDER, VALUE));
    let log = proxy.stop();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].protocol, "direct");
    assert_eq!(
        log[0].reason,
        "on the allowlist; intercepted to inject secrets"
    );
}

#[test]
fn a_large_response_and_the_next_request_cross_intact() {
    let Api {
        port,
        proxy,
        at,
        ca,
        ..
    } = api(Roots::none());
    let mut tls = connect(at, "api.test", port, &ca);
    tls.write_all(b"GET /big HTTP/1.1\r\nHost: api.test\r\n\r\n")
        .unwrap();
    // Read slowly at first, so that the proxy's buffers fill and it stops reading upstream.
    std::thread::sleep(Duration::from_millis(300));
    let big = read_message(&mut tls);
    assert!(big.ends_with(&vec![b'x'; BIG]), "{} bytes", big.len());
    tls.write_all(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
        .unwrap();
    assert!(read_message(&mut tls).ends_with(b"ok"));
    drop(tls);
    let log = proxy.stop();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].bytes_down > BIG as u64, "{log:?}");
}
