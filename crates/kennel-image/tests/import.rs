//! `import` of every form an image comes in: an OCI layout (a directory, a tarball of one),
//! `docker save` tarballs old and new; and of images that must be refused.

mod support;

use std::fs;
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use oci_spec::image::{Arch, ImageManifest, MediaType, Os};
use serde_json::json;
use tempfile::TempDir;

use kennel_image::digest::tree_digest;
use kennel_image::oci::{import, Imported};
use kennel_image::{ImageError, NoProgress};
use support::layout::{
    blob, image, index, sample_config, sample_layers, sha256, tagged, tar_dir, SAMPLE_LISTING,
};
use support::tarball::{gzip, Tarball};
use support::tree::listing;

/// An import into a fresh root, kept for inspection.
struct Run {
    dir: TempDir,
    result: Result<Imported, ImageError>,
}

impl Run {
    fn of(source: &Path) -> Run {
        let dir = TempDir::new().unwrap();
        fs::create_dir(dir.path().join("root")).unwrap();
        fs::create_dir(dir.path().join("scratch")).unwrap();
        let result = import(
            source,
            &dir.path().join("root"),
            &dir.path().join("scratch"),
            &NoProgress,
        );
        Run { dir, result }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn ok(self) -> (Imported, String, Vec<String>) {
        let imported = self
            .result
            .as_ref()
            .map_err(|e| e.to_string())
            .unwrap()
            .clone();
        (
            imported,
            tree_digest(&self.root()).unwrap(),
            listing(&self.root()),
        )
    }

    fn err(self) -> ImageError {
        match self.result {
            Ok(imported) => panic!("imported {imported:?}"),
            Err(e) => e,
        }
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    path
}

/// The sample image as an OCI layout in `dir`/layout.
fn sample_layout(dir: &Path) -> PathBuf {
    let layout = dir.join("layout");
    fs::create_dir(&layout).unwrap();
    let manifest = image(&layout, &sample_layers(), &sample_config());
    index(&layout, vec![tagged(&manifest, "latest", None)]);
    layout
}

fn manifest_of(layout: &Path) -> ImageManifest {
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap();
    let path = layout.join("blobs/sha256").join(&digest["sha256:".len()..]);
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn blob_path(layout: &Path, digest: &impl ToString) -> PathBuf {
    let digest = digest.to_string();
    layout.join("blobs/sha256").join(&digest["sha256:".len()..])
}

#[test]
fn an_oci_layout_as_a_directory_or_a_tarball() {
    let work = TempDir::new().unwrap();
    let layout = sample_layout(work.path());
    let (imported, digest, files) = Run::of(&layout).ok();
    assert_eq!(files, SAMPLE_LISTING);
    assert_eq!(imported.config, sample_config());
    assert_eq!(imported.layers, 2);
    assert_eq!(imported.stats.skipped, 0);
    assert!(imported.stats.entries >= SAMPLE_LISTING.len() as u64);

    let flat = write(work.path(), "flat.tar", &tar_dir(&layout, "."));
    let nested = write(work.path(), "nested.tar", &tar_dir(&layout, "image"));
    let zipped = write(work.path(), "flat.tar.gz", &gzip(&tar_dir(&layout, ".")));
    for tarball in [flat, nested, zipped] {
        let (again, same, _) = Run::of(&tarball).ok();
        assert_eq!(same, digest, "{}", tarball.display());
        assert_eq!(again, imported);
    }
}

/// The sample's layers, uncompressed, as `docker save` (before docker 25) writes them.
fn plain_layers() -> Vec<Vec<u8>> {
    sample_layers()
        .into_iter()
        .map(|(bytes, gzipped)| {
            if !gzipped {
                return bytes;
            }
            let mut plain = Vec::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_end(&mut plain)
                .unwrap();
            plain
        })
        .collect()
}

/// A docker config, with the fields docker writes that an OCI config lacks.
fn docker_config(diff_ids: &[String]) -> Vec<u8> {
    let config = sample_config();
    serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "2024-01-02T03:04:05.123456789Z",
        "docker_version": "24.0.7",
        "config": {
            "Hostname": "", "AttachStdin": false, "Tty": false, "Env": config.env,
            "Cmd": config.cmd, "Entrypoint": config.entrypoint,
            "WorkingDir": config.workdir, "User": config.user,
            "ExposedPorts": {"80/tcp": {}}, "Volumes": null, "OnBuild": null, "Labels": null,
        },
        "container_config": {"Cmd": ["/bin/sh", "-c", "#(nop) CMD"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "ADD rootfs /"}, {"created_by": "RUN x", "empty_layer": false}],
    }))
    .unwrap()
}

#[test]
fn a_docker_save_tarball() {
    let work = TempDir::new().unwrap();
    let mut layers = plain_layers();
    // Docker links identical layers (here two empty ones) to the first copy.
    layers.push(vec![0; 1024]);
    let diff_ids: Vec<String> = layers
        .iter()
        .chain([&layers[2]])
        .map(|l| format!("sha256:{}", sha256(l)))
        .collect();
    let config = docker_config(&diff_ids);
    let config_name = format!("{}.json", sha256(&config));
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": ["kennel/sample:1"],
        "Layers": ["l1/layer.tar", "l2/layer.tar", "l3/layer.tar", "l4/layer.tar"],
    }]);
    let saved = work.path().join("saved");
    for (i, layer) in layers.iter().enumerate() {
        fs::create_dir_all(saved.join(format!("l{}", i + 1))).unwrap();
        write(&saved, &format!("l{}/layer.tar", i + 1), layer);
        write(&saved, &format!("l{}/VERSION", i + 1), b"1.0");
    }
    fs::create_dir(saved.join("l4")).unwrap();
    symlink("../l3/layer.tar", saved.join("l4/layer.tar")).unwrap();
    write(&saved, &config_name, &config);
    write(
        &saved,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    write(&saved, "repositories", br#"{"kennel/sample":{"1":"l4"}}"#);
    let tarball = write(work.path(), "saved.tar", &tar_dir(&saved, "."));

    let (imported, _, files) = Run::of(&tarball).ok();
    assert_eq!(files, SAMPLE_LISTING);
    assert_eq!(imported.config, sample_config());
    assert_eq!(imported.layers, 4);

    // A changed byte no longer matches the config's diff_id.
    let tampered = fs::read(saved.join("l2/layer.tar"))
        .unwrap()
        .windows(5)
        .rposition(|w| w == b"fresh")
        .unwrap();
    let mut bytes = fs::read(saved.join("l2/layer.tar")).unwrap();
    bytes[tampered] = b'F';
    write(&saved, "l2/layer.tar", &bytes);
    let tarball = write(work.path(), "tampered.tar", &tar_dir(&saved, "."));
    let err = Run::of(&tarball).err();
    let ImageError::Layer {
        index: 2, source, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(
        matches!(**source, ImageError::DigestMismatch { .. }),
        "{err}"
    );
}

#[test]
fn a_docker_25_save_tarball_by_either_index() {
    let work = TempDir::new().unwrap();
    let layout = sample_layout(work.path());
    let manifest = manifest_of(&layout);
    let name = |d: &dyn ToString| format!("blobs/sha256/{}", &d.to_string()["sha256:".len()..]);
    let saved = json!([{
        "Config": name(manifest.config().digest()),
        "RepoTags": ["kennel/sample:1"],
        "Layers": manifest.layers().iter().map(|l| name(l.digest())).collect::<Vec<_>>(),
    }]);
    write(
        &layout,
        "manifest.json",
        &serde_json::to_vec(&saved).unwrap(),
    );
    let both = write(work.path(), "both.tar", &tar_dir(&layout, "."));
    fs::remove_file(layout.join("index.json")).unwrap();
    let docker_only = write(work.path(), "docker.tar", &tar_dir(&layout, "."));

    let (by_index, digest, files) = Run::of(&both).ok();
    assert_eq!(files, SAMPLE_LISTING);
    let (by_manifest, same, _) = Run::of(&docker_only).ok();
    assert_eq!(same, digest);
    assert_eq!(by_index, by_manifest);

    // The blob names carry digests, and they are checked.
    let config = blob_path(&layout, manifest.config().digest());
    let mut bytes = fs::read(&config).unwrap();
    bytes.push(b' ');
    fs::write(&config, bytes).unwrap();
    let err = Run::of(&layout).err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
}

#[test]
fn tampered_oci_blobs_are_refused() {
    let work = TempDir::new().unwrap();
    let layout = sample_layout(work.path());
    let manifest = manifest_of(&layout);
    // The second layer is uncompressed: a changed byte of file content (the last "fresh";
    // the first is in a header) still makes a valid tar.
    let layer = blob_path(&layout, manifest.layers()[1].digest());
    let mut bytes = fs::read(&layer).unwrap();
    let at = bytes.windows(5).rposition(|w| w == b"fresh").unwrap();
    bytes[at] = b'F';
    fs::write(&layer, &bytes).unwrap();
    let err = Run::of(&layout).err();
    let ImageError::Layer {
        index: 2,
        count: 2,
        source,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(
        matches!(**source, ImageError::DigestMismatch { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("does not match its digest"),
        "{err}"
    );

    // A changed config is refused before any layer is applied.
    let config = blob_path(&layout, manifest.config().digest());
    let mut bytes = fs::read(&config).unwrap();
    bytes[0] = b' ';
    fs::write(&config, bytes).unwrap();
    let run = Run::of(&layout);
    assert_eq!(listing(&run.root()), Vec::<String>::new());
    let err = run.err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");

    // A descriptor whose size is not the blob's (index.json has no digest of its own).
    let index_path = layout.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&fs::read(&index_path).unwrap()).unwrap();
    let size = index["manifests"][0]["size"].as_u64().unwrap();
    index["manifests"][0]["size"] = json!(size + 1);
    fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let err = Run::of(&layout).err();
    let expected = format!("is {size} bytes but its descriptor says {}", size + 1);
    assert!(err.to_string().contains(&expected), "{err}");
}

#[test]
fn a_blob_symlinked_out_of_the_image_is_refused() {
    let work = TempDir::new().unwrap();
    // A host file that is a valid layer: only the symlink check stops it.
    let secret = Tarball::new().file("secret", 0o600, b"host data").finish();
    let host = write(work.path(), "host.tar", &secret);
    let diff_id = format!("sha256:{}", sha256(&secret));

    let saved = work.path().join("saved");
    fs::create_dir_all(saved.join("evil")).unwrap();
    symlink(&host, saved.join("evil/layer.tar")).unwrap();
    let config = docker_config(&[diff_id]);
    write(&saved, "config.json", &config);
    let manifest = json!([{"Config": "config.json", "Layers": ["evil/layer.tar"]}]);
    write(
        &saved,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    let tarball = write(work.path(), "evil.tar", &tar_dir(&saved, "."));
    let run = Run::of(&tarball);
    let root = run.root();
    let err = run.result.as_ref().unwrap_err();
    assert!(err.to_string().contains("leads outside the image"), "{err}");
    assert_eq!(listing(&root), Vec::<String>::new());

    // The same in an OCI layout, with the right digest in the name.
    let layout = work.path().join("layout");
    let manifest = image(&layout, &[(secret.clone(), false)], &sample_config());
    index(&layout, vec![tagged(&manifest, "latest", None)]);
    let blob = layout.join("blobs/sha256").join(sha256(&secret));
    fs::remove_file(&blob).unwrap();
    symlink(&host, &blob).unwrap();
    let err = Run::of(&layout).err();
    assert!(err.to_string().contains("leads outside the image"), "{err}");

    // A manifest.json naming a path out of the image.
    let manifest = json!([{"Config": "../host.tar", "Layers": []}]);
    write(
        &saved,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    let err = Run::of(&saved).err();
    assert!(err.to_string().contains("`..`"), "{err}");
}

/// A one-file image, its manifest written into `layout`.
fn one_file_image(layout: &Path, file: &str) -> oci_spec::image::Descriptor {
    let layer = Tarball::new().file(file, 0o644, b"").finish();
    image(layout, &[(layer, false)], &sample_config())
}

#[test]
fn one_image_is_chosen_or_the_choices_are_listed() {
    let work = TempDir::new().unwrap();
    let layout = work.path().join("platforms");
    let amd64 = one_file_image(&layout, "amd64");
    let arm64 = one_file_image(&layout, "arm64");
    index(
        &layout,
        vec![
            tagged(&arm64, "multi", Some((Os::Linux, Arch::ARM64))),
            tagged(&amd64, "multi", Some((Os::Linux, Arch::Amd64))),
        ],
    );
    assert_eq!(Run::of(&layout).ok().2, ["amd64"]);

    // Only the platforms whose blobs were exported are candidates.
    let missing = work.path().join("missing");
    let amd64 = one_file_image(&missing, "amd64");
    let arm64 = one_file_image(&missing, "arm64");
    fs::remove_file(blob_path(&missing, amd64.digest())).unwrap();
    index(
        &missing,
        vec![
            tagged(&amd64, "multi", Some((Os::Linux, Arch::Amd64))),
            tagged(&arm64, "multi", Some((Os::Linux, Arch::ARM64))),
        ],
    );
    assert_eq!(Run::of(&missing).ok().2, ["arm64"]);

    // Through a nested index, as multi-platform exports write it.
    let nested = work.path().join("nested");
    let amd64 = one_file_image(&nested, "amd64");
    let arm64 = one_file_image(&nested, "arm64");
    let inner = oci_spec::image::ImageIndexBuilder::default()
        .schema_version(2u32)
        .manifests(vec![
            tagged(&arm64, "a", Some((Os::Linux, Arch::ARM64))),
            tagged(&amd64, "b", Some((Os::Linux, Arch::Amd64))),
        ])
        .build()
        .unwrap();
    let inner = blob(
        &nested,
        MediaType::ImageIndex,
        &serde_json::to_vec(&inner).unwrap(),
    );
    index(&nested, vec![tagged(&inner, "latest", None)]);
    assert_eq!(Run::of(&nested).ok().2, ["amd64"]);

    let two = work.path().join("two");
    let one = one_file_image(&two, "one");
    let other = one_file_image(&two, "other");
    index(
        &two,
        vec![tagged(&one, "first", None), tagged(&other, "second", None)],
    );
    let err = Run::of(&two).err();
    let ImageError::Ambiguous { choices, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(choices.len(), 2);
    assert!(choices[0].starts_with("first sha256:") && choices[1].starts_with("second sha256:"));
    assert!(err.to_string().contains("holds 2 images"), "{err}");

    let saved = work.path().join("saved");
    fs::create_dir(&saved).unwrap();
    let manifest = json!([
        {"Config": "a.json", "RepoTags": ["a:1", "a:latest"], "Layers": []},
        {"Config": "b.json", "RepoTags": ["b:2"], "Layers": []},
    ]);
    write(
        &saved,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    let err = Run::of(&saved).err();
    let ImageError::Ambiguous { choices, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(choices, &["a:1 a:latest", "b:2"]);
}

#[test]
fn what_is_not_an_image_is_refused_clearly() {
    let work = TempDir::new().unwrap();
    let empty = work.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert!(matches!(
        Run::of(&empty).err(),
        ImageError::NotAnImage { .. }
    ));

    let noise = write(work.path(), "noise", &[b'x'; 4096]);
    assert!(matches!(Run::of(&noise).err(), ImageError::Tar { .. }));

    let other = write(
        work.path(),
        "other.tar",
        &Tarball::new().file("hello", 0o644, b"").finish(),
    );
    assert!(matches!(
        Run::of(&other).err(),
        ImageError::NotAnImage { .. }
    ));

    let bad_json = work.path().join("bad-json");
    fs::create_dir(&bad_json).unwrap();
    write(&bad_json, "index.json", b"{\"manifests\": [");
    let err = Run::of(&bad_json).err();
    assert!(matches!(err, ImageError::Json { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("cannot parse the image index index.json"),
        "{err}"
    );

    write(
        &bad_json,
        "index.json",
        b"{\"schemaVersion\": 2, \"manifests\": []}",
    );
    let err = Run::of(&bad_json).err();
    assert!(err.to_string().contains("lists no image manifest"), "{err}");

    let sha512 = format!("sha512:{}", "a".repeat(128));
    let index_json = json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha512, "size": 2}]});
    write(
        &bad_json,
        "index.json",
        &serde_json::to_vec(&index_json).unwrap(),
    );
    let err = Run::of(&bad_json).err();
    assert!(err.to_string().contains("other than sha256"), "{err}");

    let saved = work.path().join("saved");
    fs::create_dir(&saved).unwrap();
    write(&saved, "manifest.json", b"[]");
    let err = Run::of(&saved).err();
    assert!(err.to_string().contains("lists no image"), "{err}");
}

#[test]
fn a_zstd_layer_is_named_in_the_error() {
    let work = TempDir::new().unwrap();
    let layout = work.path().join("layout");
    let zstd = vec![0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3];
    let manifest = image(&layout, &[(zstd, false)], &sample_config());
    index(&layout, vec![tagged(&manifest, "latest", None)]);
    let err = Run::of(&layout).err().to_string();
    assert!(err.starts_with("layer 1 of 1 (sha256:"), "{err}");
    assert!(err.contains("zstd layers are not supported yet"), "{err}");
}
