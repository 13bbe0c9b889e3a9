//! `kennel vm prepare` with the real tools: the host's apt, dpkg, kmod and mmdebstrap, into the
//! per-machine test state (the first run on a machine downloads about 30 MB and builds the
//! base image; later ones find it up to date). What it leaves is what the microVM tier boots.

mod common;

use std::process::Command;

use common::vm::{prepare_json, prepared_vm, vm_dir, STATE};
use common::KENNEL;
use serde_json::Value;

/// A module's name from its file name in the manifest (`03-virtio_mmio.ko` -> `virtio_mmio`).
fn module_name(file: &str) -> &str {
    let name = file.split_once('-').map_or(file, |(_, rest)| rest);
    name.strip_suffix(".ko").unwrap_or(name)
}

#[test]
fn prepare_unpacks_a_bootable_guest_and_is_then_up_to_date() {
    if !common::vm::can_prepare() {
        return;
    }
    let (first, took) = prepare_json();
    eprintln!(
        "first prepare: {:.1} s (up_to_date: {})",
        took.as_secs_f64(),
        first["up_to_date"]
    );
    let vm = vm_dir();
    assert_eq!(first["dir"], vm.root.to_str().unwrap(), "{first}");

    // The manifest is written, complete, and is what the command printed.
    let manifest = vm.check().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        serde_json::to_value(&manifest).unwrap(),
        first["manifest"],
        "the printed manifest is the one on disk"
    );

    // The kernel: uncompressed ELF, the size of a real one.
    let vmlinux = std::fs::read(vm.vmlinux()).unwrap();
    assert!(vmlinux.starts_with(b"\x7fELF"), "vmlinux is not ELF");
    assert!(
        vmlinux.len() > 10_000_000,
        "vmlinux is {} bytes",
        vmlinux.len()
    );
    assert_eq!(first["sizes"]["vmlinux_bytes"], vmlinux.len());
    assert!(
        manifest
            .packages
            .iter()
            .any(|p| p.starts_with(&format!("linux-image-{}=", manifest.kernel_release))),
        "{:?}",
        manifest.packages
    );

    // The modules: numbered in load order, dependencies first.
    for (i, file) in manifest.modules.iter().enumerate() {
        assert!(
            file.starts_with(&format!("{i:02}-")),
            "{file} is not number {i}"
        );
        assert!(vm.modules_dir().join(file).is_file(), "{file} is missing");
    }
    let names: Vec<&str> = manifest.modules.iter().map(|m| module_name(m)).collect();
    assert_eq!(
        names.get(..2),
        Some(&["virtio_ring", "virtio"][..]),
        "{names:?}"
    );
    let at = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| panic!("{name} is not among {names:?}"))
    };
    for wanted in ["virtio_mmio", "virtio_console", "virtio_blk", "erofs"] {
        assert!(at("virtio") < at(wanted), "{names:?}");
    }
    if names.contains(&"libcrc32c") {
        assert!(at("libcrc32c") < at("erofs"), "{names:?}");
    }

    // The unpacked QEMU runs with its private libraries, and is backports' (7.2 has no `rom=`).
    let libs = std::env::join_paths(vm.qemu_library_dirs()).unwrap();
    let out = Command::new(vm.qemu_binary())
        .arg("--version")
        .env("LD_LIBRARY_PATH", libs)
        .output()
        .expect("the unpacked qemu starts");
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        common::vm::snapshot_capable_qemu(&version),
        "{version}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(version.lines().next(), Some(manifest.qemu_version.as_str()));
    assert!(first["sizes"]["qemu_bytes"].as_u64().unwrap() > 10_000_000);

    // The base image is in the store under the name the tier boots by default.
    let base = &first["base_image"];
    assert_eq!(base["name"], "microvm-base");
    let out = Command::new(KENNEL)
        .args(["image", "inspect", "microvm-base"])
        .env("KENNEL_STATE_DIR", STATE)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inspected: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected["record"]["digest"], base["digest"]);

    // Nothing of the prepare is left behind.
    let staged: Vec<String> = std::fs::read_dir(&vm.root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging-") || n.ends_with(".tmp"))
        .collect();
    assert!(staged.is_empty(), "{staged:?}");

    // Again: nothing to do.
    let (second, took) = prepare_json();
    eprintln!("repeat prepare: {:.1} s", took.as_secs_f64());
    assert_eq!(second["up_to_date"], true, "{second}");
    assert_eq!(second["manifest"], first["manifest"]);
    assert_eq!(second["base_image"]["digest"], base["digest"]);

    // The helper other microVM tests use finds the same directory.
    assert_eq!(prepared_vm(), Some(vm));
}
