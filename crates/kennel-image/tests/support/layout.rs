//! OCI image layouts written to disk with oci-spec's types, as an exporter would.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::str::FromStr;

use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, Os, PlatformBuilder, RootFsBuilder,
};
use sha2::{Digest as _, Sha256};

use kennel_image::oci::ImageConfig;

pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes `bytes` as a blob and describes it.
pub fn blob(layout: &Path, media_type: MediaType, bytes: &[u8]) -> Descriptor {
    let hex = sha256(bytes);
    let dir = layout.join("blobs/sha256");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(&hex), bytes).unwrap();
    let digest = Digest::from_str(&format!("sha256:{hex}")).unwrap();
    Descriptor::new(media_type, bytes.len() as u64, digest)
}

/// An image's layers (each: bytes and whether they are gzip), its config and its manifest,
/// written as blobs; returns the manifest's descriptor, for an index.
pub fn image(layout: &Path, layers: &[(Vec<u8>, bool)], config: &ImageConfig) -> Descriptor {
    let mut descriptors = Vec::new();
    let mut diff_ids = Vec::new();
    for (bytes, gzipped) in layers {
        let (media_type, uncompressed) = if *gzipped {
            let mut plain = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut plain)
                .unwrap();
            (MediaType::ImageLayerGzip, plain)
        } else {
            (MediaType::ImageLayer, bytes.clone())
        };
        diff_ids.push(format!("sha256:{}", sha256(&uncompressed)));
        descriptors.push(blob(layout, media_type, bytes));
    }
    let mut run = ConfigBuilder::default()
        .env(config.env.clone())
        .cmd(config.cmd.clone())
        .entrypoint(config.entrypoint.clone());
    if let Some(dir) = &config.workdir {
        run = run.working_dir(dir.clone());
    }
    if let Some(user) = &config.user {
        run = run.user(user.clone());
    }
    let image_config = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(run.build().unwrap())
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(diff_ids)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let config_json = serde_json::to_vec(&image_config).unwrap();
    let config_desc = blob(layout, MediaType::ImageConfig, &config_json);
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_desc)
        .layers(descriptors)
        .build()
        .unwrap();
    blob(
        layout,
        MediaType::ImageManifest,
        &serde_json::to_vec(&manifest).unwrap(),
    )
}

/// The manifest descriptor with a tag (and optionally a platform), as an index lists it.
pub fn tagged(manifest: &Descriptor, tag: &str, platform: Option<(Os, Arch)>) -> Descriptor {
    let mut builder = DescriptorBuilder::default()
        .media_type(manifest.media_type().clone())
        .digest(manifest.digest().clone())
        .size(manifest.size())
        .annotations(HashMap::from([(
            "org.opencontainers.image.ref.name".to_owned(),
            tag.to_owned(),
        )]));
    if let Some((os, arch)) = platform {
        builder = builder.platform(
            PlatformBuilder::default()
                .os(os)
                .architecture(arch)
                .build()
                .unwrap(),
        );
    }
    builder.build().unwrap()
}

/// Writes oci-layout and an index.json listing `manifests`.
pub fn index(layout: &Path, manifests: Vec<Descriptor>) {
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(manifests)
        .build()
        .unwrap();
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
}

/// A tarball of the directory `dir`'s contents, names starting with `prefix` (such as "./").
pub fn tar_dir(dir: &Path, prefix: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.append_dir_all(prefix, dir).unwrap();
    builder.into_inner().unwrap()
}

/// Two layers with a bit of everything: a file and a directory whited out, an opaque
/// directory, hard links within and across layers, an absolute symlink, setuid, owners, a
/// read-only directory with children. The first is gzip, the second plain.
pub fn sample_layers() -> Vec<(Vec<u8>, bool)> {
    use crate::support::tarball::{gzip, Tarball};
    use tar::EntryType;
    let first = Tarball::new()
        .dir("./", 0o755)
        .dir("./etc/", 0o755)
        .file("./etc/hostname", 0o644, b"kennel\n")
        .file("./etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .dir("./usr/", 0o755)
        .dir("./usr/bin/", 0o755)
        .file("./usr/bin/busybox", 0o755, b"busybox")
        .hardlink("./usr/bin/sh", "./usr/bin/busybox")
        .symlink("./usr/bin/python", "/usr/bin/python3")
        .dir("./opt/", 0o755)
        .dir("./opt/old/", 0o755)
        .file("./opt/old/a", 0o644, b"a")
        .dir("./opt/old/sub/", 0o755)
        .file("./opt/old/sub/b", 0o644, b"b")
        .file("./opt/kept", 0o644, b"kept")
        .dir("./var/", 0o755)
        .dir("./var/cache/", 0o755)
        .file("./var/cache/junk", 0o644, b"junk")
        .dir("./var/cache/junkdir/", 0o755)
        .file("./var/cache/junkdir/x", 0o644, b"x")
        .dir("./tmp/", 0o1777)
        .dir("./home/", 0o755)
        .owned(
            EntryType::Directory,
            b"./home/user/",
            b"",
            0o700,
            (1000, 1000),
            b"",
        )
        .owned(
            EntryType::Regular,
            b"./home/user/.profile",
            b"",
            0o600,
            (1000, 1000),
            b"PS1=$\n",
        )
        .finish();
    let second = Tarball::new()
        .dir("./etc/", 0o755)
        .whiteout("./etc/hostname")
        .dir("./opt/", 0o755)
        .whiteout("./opt/old")
        .dir("./var/cache/", 0o750)
        .opaque("./var/cache")
        .file("./var/cache/fresh", 0o644, b"fresh")
        .hardlink("./usr/bin/ls", "./usr/bin/busybox")
        .file("./usr/bin/sudo", 0o4755, b"sudo")
        .owned(
            EntryType::Regular,
            b"./usr/bin/newgrp",
            b"",
            0o2755,
            (0, 42),
            b"ng",
        )
        .dir("./usr/local/", 0o755)
        .file("./usr/local/tool", 0o755, b"tool")
        .hardlink("./usr/local/tool2", "./usr/local/tool")
        .dir("./ro/", 0o555)
        .file("./ro/child", 0o444, b"c")
        .dir("./ro/sub/", 0o555)
        .file("./ro/sub/x", 0o444, b"x")
        .finish();
    vec![(gzip(&first), true), (second, false)]
}

/// What the sample image's root holds after both layers.
pub const SAMPLE_LISTING: &[&str] = &[
    "etc/",
    "etc/passwd",
    "home/",
    "home/user/",
    "home/user/.profile",
    "opt/",
    "opt/kept",
    "ro/",
    "ro/child",
    "ro/sub/",
    "ro/sub/x",
    "tmp/",
    "usr/",
    "usr/bin/",
    "usr/bin/busybox",
    "usr/bin/ls",
    "usr/bin/newgrp",
    "usr/bin/python -> /usr/bin/python3",
    "usr/bin/sh",
    "usr/bin/sudo",
    "usr/local/",
    "usr/local/tool",
    "usr/local/tool2",
    "var/",
    "var/cache/",
    "var/cache/fresh",
];

pub fn sample_config() -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/bin".into(), "LANG=C.UTF-8".into()],
        cmd: vec!["-c".into(), "echo hi".into()],
        entrypoint: vec!["/usr/bin/sh".into()],
        workdir: Some("/home/user".into()),
        user: Some("1000:1000".into()),
    }
}
