//! The workspace's modules depend one way: `scripts/check-cycles.py` finds no module that imports
//! a module importing it back, and no base module of `kennel-sandbox` that imports a tier. A
//! second test gives the checker a small workspace with known cycles, so that a checker that
//! finds nothing cannot pass for a clean tree.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PY: &str = "/usr/bin/python3";

/// `kennel-sandbox`'s base, which may name no tier: the rule ARCHITECTURE.md states.
const SANDBOX_RULE: &str = "kennel-sandbox:error,channel,steps,profile,supervise,sys,cgroup,\
                            request,watch,state:native,oci,microvm";

fn checker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/check-cycles.py")
}

fn check(workspace: &Path, args: &[&str]) -> Output {
    Command::new(PY)
        .arg(checker())
        .arg(workspace)
        .args(args)
        .output()
        .expect("running /usr/bin/python3 scripts/check-cycles.py")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = check(&workspace, &["--forbid", SANDBOX_RULE]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Writes `files` (path, content) under a fresh directory and returns it.
fn fixture(files: &[(&str, &str)]) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, content) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    dir
}

#[test]
fn the_checker_finds_cycles_through_reexports_parents_and_children() {
    let dir = fixture(&[
        ("crates/a/Cargo.toml", "[package]\nname = \"a\"\n"),
        (
            "crates/a/src/lib.rs",
            "mod x;\nmod y;\nmod z;\nmod quiet;\npub use x::X;\n",
        ),
        // x -> y through a path, y -> x through the root's re-export: a cycle.
        (
            "crates/a/src/x.rs",
            "pub struct X;\nfn f() { crate::y::g() }\n",
        ),
        (
            "crates/a/src/y.rs",
            "use crate::{X as Renamed};\npub fn g() {}\n",
        ),
        // A parent that names its child, and a child that names its parent: a cycle.
        (
            "crates/a/src/z/mod.rs",
            "mod w;\npub struct Z;\nfn f() { w::h() }\n",
        ),
        ("crates/a/src/z/w.rs", "use super::Z;\npub fn h() {}\n"),
        // Neither a test module's `super`, nor a string, nor a comment imports anything.
        (
            "crates/a/src/quiet.rs",
            "// crate::x::X\nconst S: &str = \"crate::y::g\";\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        ("crates/b/Cargo.toml", "[package]\nname = \"b\"\n"),
        ("crates/b/src/lib.rs", "mod base;\nmod tier;\n"),
        ("crates/b/src/base.rs", "use crate::tier::T;\n"),
        ("crates/b/src/tier.rs", "pub struct T;\n"),
    ]);
    let out = check(&dir, &["--forbid", "b:base:tier"]);
    let printed = text(&out);
    let verdicts: Vec<&str> = printed.lines().filter(|l| !l.starts_with(' ')).collect();
    assert_eq!(
        verdicts,
        [
            "a: cycle among x, y",
            "a: cycle among z, z::w",
            "b: base module base imports tier (names crate::tier::T)",
        ],
        "{printed}"
    );
    assert_eq!(out.status.code(), Some(1), "{printed}");
    let _ = std::fs::remove_dir_all(&dir);
}
