//! Bulk files through the real server: a directory of a session in and out as a tar stream
//! (`/v1/sessions/{id}/archive`), with the files API's path rules and the workspace's bound.
//! Archives are made and read by the system's `tar` and by python's tarfile, as a client's
//! would be.

mod common;
mod server_common;

use std::path::Path;
use std::process::Command;

use common::PY;
use serde_json::json;
use server_common::{test_dir, Server};

fn tar_create(dir: &Path) -> Vec<u8> {
    let out = Command::new("tar")
        .args(["-cf", "-", "-C"])
        .arg(dir)
        .arg(".")
        .output()
        .expect("tar runs");
    assert!(out.status.success());
    out.stdout
}

/// An archive of one member, made by python's tarfile: `kind` "file" (with contents), "..",
/// "abs", "hardlink", "fifo" name what it holds.
fn crafted(kind: &str) -> Vec<u8> {
    let code = r#"
import io, sys, tarfile
kind = sys.argv[1]
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w") as tar:
    def add(name, type=tarfile.REGTYPE, data=b"x", link=""):
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = type, link, len(data) if type == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if type == tarfile.REGTYPE else None)
    add("fine.txt")
    if kind == "..":
        add("../../escape.txt")
    elif kind == "abs":
        add("/etc/evil")
    elif kind == "hardlink":
        add("h", tarfile.LNKTYPE, link="fine.txt")
    elif kind == "fifo":
        add("f", tarfile.FIFOTYPE)
    elif kind == "big":
        add("big.bin", data=b"b" * 2_000_000)
sys.stdout.buffer.write(out.getvalue())
"#;
    let out = Command::new(PY)
        .args(["-c", code, kind])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn a_directory_goes_in_and_comes_out_as_a_tar_stream() {
    let server = Server::start("archive-round-trip", "");
    let id = server.client.create_session(&json!({}));
    let src = test_dir("archive-src");
    std::fs::create_dir_all(src.join("pkg/deep")).unwrap();
    std::fs::write(src.join("pkg/deep/data.csv"), "a,b\n1,2\n").unwrap();
    std::fs::write(src.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    Command::new("chmod")
        .args(["755"])
        .arg(src.join("run.sh"))
        .status()
        .unwrap();
    std::os::unix::fs::symlink("pkg/deep/data.csv", src.join("link.csv")).unwrap();

    let put = server.client.put(
        &format!("/v1/sessions/{id}/archive?path=/workspace/proj"),
        &tar_create(&src),
    );
    assert_eq!(put.status, 204, "{}", put.text());
    let r = server.client.exec(
        &id,
        "bash",
        "cd /workspace/proj && ./run.sh && cat link.csv",
    );
    assert_eq!(r["stdout"], "ran\na,b\n1,2\n", "{r}");

    server
        .client
        .exec(&id, "bash", "echo new > /workspace/proj/pkg/made.txt");
    let got = server
        .client
        .get(&format!("/v1/sessions/{id}/archive?path=/workspace/proj"));
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.header("content-type"), Some("application/x-tar"));
    let dest = test_dir("archive-dest");
    std::fs::create_dir_all(&dest).unwrap();
    let tar = Command::new("tar")
        .args(["-xf", "-", "-C"])
        .arg(&dest)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    tar.stdin.as_ref().unwrap().write_all(&got.body).unwrap();
    assert!(tar.wait_with_output().unwrap().status.success());
    assert_eq!(
        std::fs::read_to_string(dest.join("pkg/made.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        std::fs::read_link(dest.join("link.csv")).unwrap(),
        Path::new("pkg/deep/data.csv")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dest.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    // The whole workspace by default.
    let all = server.client.get(&format!("/v1/sessions/{id}/archive"));
    assert_eq!(all.status, 200);
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&dest);
}

#[test]
fn archives_that_reach_outside_or_are_too_large_are_refused_whole() {
    let server = Server::start("archive-refused", "");
    let id = server
        .client
        .create_session(&json!({"limits": {"workspace_size": "1M"}}));
    let url = |path: &str| format!("/v1/sessions/{id}/archive?path={path}");
    for kind in ["..", "abs", "hardlink", "fifo"] {
        let r = server.client.put(&url("/workspace/in"), &crafted(kind));
        assert_eq!(r.status, 400, "{kind}: {}", r.text());
        let (code, message) = r.error(400);
        assert_eq!(code, "bad_request", "{kind}: {message}");
    }
    let r = server.client.put(&url("/workspace/in"), &crafted("big"));
    assert_eq!(r.status, 413, "{}", r.text());
    let listing = server
        .client
        .get(&format!("/v1/sessions/{id}/files?path=/workspace"))
        .json();
    assert_eq!(
        listing["entries"],
        json!([]),
        "nothing was written: {listing}"
    );

    let r = server
        .client
        .put(&url("/workspace/in"), b"this is not a tar archive at all");
    let (code, message) = r.error(400);
    assert_eq!(code, "bad_request");
    assert_eq!(
        message,
        "EINVAL: not a tar archive (plain, gzip, bzip2 or xz)"
    );
    assert_eq!(
        server.client.put(&url("/etc"), &crafted("file")).status,
        400
    );
    assert_eq!(server.client.get(&url("/workspace/../etc")).status, 400);
    assert_eq!(server.client.get(&url("/workspace/missing")).status, 404);
    server
        .client
        .exec(&id, "bash", "ln -s /etc /workspace/etc-link");
    assert_eq!(server.client.get(&url("/workspace/etc-link")).status, 400);
    // After all that, a good archive still goes in.
    let r = server.client.put(&url("/workspace/in"), &crafted("file"));
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(server.client.get("/v1/sessions/nope/archive").status, 404);
}
