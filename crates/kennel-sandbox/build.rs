//! Gives the crate a build id: a hash of its sources. The supervisor sends it with every plan
//! and the helper binary checks it against its own, so that a helper left over from another
//! build (`cargo build -p kennel` does not rebuild `kennel-sandbox-helper`) is refused with a
//! clear message instead of running stale code.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    let mut all = vec![PathBuf::from("Cargo.toml")];
    files(Path::new("src"), &mut all);
    all.sort();
    let mut hasher = DefaultHasher::new();
    for path in &all {
        path.hash(&mut hasher);
        std::fs::read(path).unwrap_or_default().hash(&mut hasher);
    }
    println!(
        "cargo:rustc-env=KENNEL_SANDBOX_BUILD={:016x}",
        hasher.finish()
    );
}
