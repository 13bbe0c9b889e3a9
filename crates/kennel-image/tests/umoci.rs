//! `import` against the reference: umoci (the OCI project's own image tool) unpacks the same
//! layout, and the two trees must match entry for entry.

mod support;

use std::path::Path;
use std::process::Command;

use tempfile::TempDir;

use kennel_image::oci::import;
use kennel_image::NoProgress;
use support::layout::{image, index, sample_config, sample_layers, tagged, SAMPLE_LISTING};
use support::tree::{link_groups, listing, snapshot, without_inodes};

/// Whether umoci can be run; without it the test fails under CI (where setup-ci installs it)
/// and is skipped elsewhere.
fn have_umoci() -> bool {
    let found = Command::new("umoci")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        let why = "umoci is not installed (Debian: apt-get install umoci)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why}; CI must have it"
        );
        eprintln!("skipping the umoci comparison: {why}");
    }
    found
}

fn umoci_unpack(layout: &Path, tag: &str, bundle: &Path) {
    let out = Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:{tag}", layout.display()))
        .arg(bundle)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "umoci unpack failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn import_matches_umoci_unpack() {
    if !have_umoci() {
        return;
    }
    let work = TempDir::new().unwrap();
    let layout = work.path().join("layout");
    let root = work.path().join("root");
    let scratch = work.path().join("scratch");
    for dir in [&layout, &root, &scratch] {
        std::fs::create_dir(dir).unwrap();
    }
    let manifest = image(&layout, &sample_layers(), &sample_config());
    index(&layout, vec![tagged(&manifest, "test", None)]);

    let imported = import(&layout, &root, &scratch, &NoProgress).unwrap();
    assert_eq!(imported.layers, 2);
    assert_eq!(imported.config, sample_config());
    assert_eq!(listing(&root), SAMPLE_LISTING);

    let bundle = work.path().join("bundle");
    umoci_unpack(&layout, "test", &bundle);
    let theirs = snapshot(&bundle.join("rootfs"));
    let ours = snapshot(&root);
    assert_eq!(link_groups(&ours), link_groups(&theirs));
    assert_eq!(
        link_groups(&ours).into_iter().collect::<Vec<_>>(),
        [
            vec!["usr/bin/busybox", "usr/bin/ls", "usr/bin/sh"],
            vec!["usr/local/tool", "usr/local/tool2"]
        ]
    );
    // Paths, types, modes, owners, contents and link targets, entry for entry.
    let (ours, theirs) = (without_inodes(ours), without_inodes(theirs));
    for (path, entry) in &ours {
        assert_eq!(Some(entry), theirs.get(path), "{path}");
    }
    assert_eq!(
        ours.len(),
        theirs.len(),
        "umoci has entries that import lacks"
    );
}
