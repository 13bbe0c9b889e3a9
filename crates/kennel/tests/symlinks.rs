//! Symlinks are never followed on the way out of a sandbox, by one rule wherever a path comes
//! from: a cold run's `collect` (the native helper, openat2 `RESOLVE_NO_SYMLINKS`), a pooled
//! run's `collect` and the session files API (both the session agent's `open_parent`, which
//! walks the path with `O_NOFOLLOW` on every component). A path that is, or passes through, a
//! symlink is refused, whether the link names a file or a directory, ours or the host's.

mod common;
mod server_common;

use serde_json::{json, Value};
use server_common::Server;

/// Makes, in /workspace: `real/f` ("inside"), `dlink -> real`, `flink -> real/f`,
/// `root -> /` and `etc -> /etc`.
const MAKE_LINKS: &str = "import os\n\
os.makedirs('/workspace/real', exist_ok=True)\n\
open('/workspace/real/f', 'w').write('inside')\n\
for target, name in (('/workspace/real', 'dlink'), ('/workspace/real/f', 'flink'), \
('/', 'root'), ('/etc', 'etc')):\n    os.symlink(target, '/workspace/' + name)\n";

/// Through a symlinked directory (ours, /, /etc), and a symlink to a file.
const REFUSED: [&str; 4] = [
    "/workspace/dlink/f",
    "/workspace/root/etc/hostname",
    "/workspace/etc/hostname",
    "/workspace/flink",
];

fn collect_list() -> Vec<&'static str> {
    let mut paths = REFUSED.to_vec();
    paths.push("/workspace/real/f");
    paths
}

/// Checks a result's `files`: each refused path has an error naming the symlink and no
/// content; the real path comes back.
fn assert_collected(tier: &str, result: &Value) {
    let files = result["files"].as_array().expect("files");
    assert_eq!(files.len(), REFUSED.len() + 1, "{tier}: {result}");
    for f in files {
        let path = f["path"].as_str().unwrap();
        if path == "/workspace/real/f" {
            assert!(f["error"].is_null(), "{tier}: {f}");
            assert_eq!(f["content"]["text"], "inside", "{tier}: {f}");
        } else {
            let error = f["error"].as_str().unwrap_or_default();
            assert!(
                error.contains("is or passes through a symlink; not followed"),
                "{tier}: {path} should be refused: {f}"
            );
            assert!(f["content"].is_null(), "{tier}: {f}");
        }
    }
}

#[test]
fn cold_collect_refuses_symlinked_files_and_directories_alike() {
    let mut args = vec!["run", "--json"];
    for p in collect_list() {
        args.extend(["--collect", p]);
    }
    args.extend(["--", common::PY, "-c", MAKE_LINKS]);
    let out = common::kennel_output(&args, b"");
    let result = common::parse_result(&out);
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_collected("cold", &result);
}

#[test]
fn pooled_collect_refuses_them_as_cold_collect_does() {
    let server = Server::start("symlinks-pool", "[pool]\npython = 1\nbash = 0\n");
    server.wait_pool(1, 0);
    let hits = server.client.metric("kennel_pool_hits_total");
    let result = server.client.run(&json!({
        "language": "python",
        "code": MAKE_LINKS,
        "collect": collect_list(),
    }));
    assert_eq!(
        server.client.metric("kennel_pool_hits_total"),
        hits + 1.0,
        "the pool served the run"
    );
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_collected("pooled", &result);
}

#[test]
fn the_files_api_refuses_them_as_collect_does() {
    let server = Server::start("symlinks-files", "[pool]\npython = 0\nbash = 0\n");
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let made = c.exec(&id, "python", MAKE_LINKS);
    assert_eq!(made["exit_code"], 0, "{made}");
    let url = |p: &str| format!("/v1/sessions/{id}/files{p}");
    let refused = |what: &str, r: server_common::Resp| {
        let (code, message) = r.error(400);
        assert_eq!(code, "bad_request", "{what}: {message}");
        assert!(
            message.contains("ELOOP") && message.contains("symlink"),
            "{what}: {message}"
        );
    };
    for path in REFUSED {
        refused(&format!("GET {path}"), c.get(&url(path)));
        refused(&format!("PUT {path}"), c.put(&url(path), b"new"));
    }
    refused(
        "PUT a new file",
        c.put(&url("/workspace/dlink/new"), b"new"),
    );
    for dir in [
        "/workspace/dlink",
        "/workspace/root",
        "/workspace/etc",
        "/workspace/flink",
    ] {
        refused(
            &format!("list {dir}"),
            c.get(&format!("/v1/sessions/{id}/files?path={dir}")),
        );
    }
    // Nothing was written through a link; the real file is still served.
    let real = c.get(&url("/workspace/real/f"));
    assert_eq!((real.status, real.text()), (200, "inside".to_string()));
    let listing = c
        .get(&format!("/v1/sessions/{id}/files?path=/workspace/real"))
        .json();
    assert_eq!(
        listing["entries"].as_array().map(Vec::len),
        Some(1),
        "{listing}"
    );
    let links = c.get(&format!("/v1/sessions/{id}/files")).json();
    for name in ["dlink", "flink", "root", "etc"] {
        let entry = links["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {links}"));
        assert_eq!(entry["type"], "symlink", "{entry}");
    }
}
