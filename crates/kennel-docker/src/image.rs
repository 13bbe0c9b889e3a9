//! The container's root as a Docker image, made once and found by tag after that: the host's
//! system view as a skeleton (its directories and links, with the directories bound read-only
//! over them), or a Kennel image, its whole root imported under its digest.
//!
//! Both are handed to the engine as a `docker save` tarball (`/images/load`, streamed): one
//! layer, a config naming it by digest, and the tag.

use std::io::{self, Read, Write};
use std::path::Path;

use bollard::image::ImportImageOptions;
use bollard::Docker;
use futures_util::StreamExt;
use kennel_sandbox::kit::Node;
use kennel_sandbox::Error;
use kennel_sandbox::Store;
use sha2::{Digest, Sha256};

use crate::steps::fail;
use kennel_sandbox::kit::DockerStep as Step;

/// The tag of the host view's skeleton with these nodes.
pub fn view_tag(nodes: &[Node]) -> String {
    let mut h = Sha256::new();
    for n in nodes {
        h.update(format!("{n:?}\n"));
    }
    format!("kennel-view:{}", &hex::encode(h.finalize())[..16])
}

/// The tag a Kennel image with `digest` (`sha256:HEX`) is imported under.
pub fn image_tag(digest: &str) -> String {
    format!("kennel-image:{}", digest.trim_start_matches("sha256:"))
}

/// Whether the engine has `tag` already.
async fn has(docker: &Docker, tag: &str) -> bool {
    docker.inspect_image(tag).await.is_ok()
}

/// The skeleton layer: the nodes as directories and symlinks, owned by root.
fn skeleton(nodes: &[Node]) -> io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for node in nodes {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        match node {
            Node::Dir(d) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, d, io::empty())?;
            }
            Node::File(f) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(0);
                b.append_data(&mut h, f, io::empty())?;
            }
            Node::Symlink { target, link } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, link, target)?;
            }
        }
    }
    b.into_inner()
}

/// Makes sure the host view's skeleton is in the engine; returns its tag.
pub async fn ensure_view(docker: &Docker, nodes: &[Node]) -> Result<String, Error> {
    let tag = view_tag(nodes);
    if has(docker, &tag).await {
        return Ok(tag);
    }
    let layer = skeleton(nodes).map_err(|e| fail(Step::Image, e))?;
    // A staging directory of the image store: removed when dropped, and swept after a crash.
    let staging = Store::from_env().staging()?;
    let path = staging.scratch().join("layer.tar");
    std::fs::write(&path, &layer).map_err(|e| fail(Step::Image, e))?;
    load(docker, &tag, &path).await.map(|()| tag)
}

/// Makes sure the Kennel image whose root is `rootfs` is in the engine; returns its tag.
pub async fn ensure_image(docker: &Docker, digest: &str, rootfs: &Path) -> Result<String, Error> {
    let tag = image_tag(digest);
    if has(docker, &tag).await {
        return Ok(tag);
    }
    let staging = Store::from_env().staging()?;
    let path = staging.scratch().join("layer.tar");
    let written = (|| -> io::Result<()> {
        let file = std::fs::File::create(&path)?;
        let mut b = tar::Builder::new(io::BufWriter::new(file));
        b.follow_symlinks(false);
        b.append_dir_all(".", rootfs)?;
        b.into_inner()?.flush()
    })();
    match written {
        Ok(()) => load(docker, &tag, &path).await.map(|()| tag),
        Err(e) => Err(fail(
            Step::Image,
            format!("packing {}: {e}", rootfs.display()),
        )),
    }
}

fn sha256_file(path: &Path) -> io::Result<String> {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path)?;
    io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// Loads a one-layer image from the layer tarball at `layer`, tagged `tag`.
async fn load(docker: &Docker, tag: &str, layer: &Path) -> Result<(), Error> {
    let failed = |e: io::Error| fail(Step::Image, e);
    let diff_id = sha256_file(layer).map_err(failed)?;
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    })
    .to_string();
    let config_name = format!("{:x}.json", Sha256::digest(config.as_bytes()));
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": ["layer.tar"],
    }])
    .to_string();
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let layer = layer.to_path_buf();
    // The tarball is written by a thread into a pipe and streamed to the engine as it comes.
    let writer = std::thread::spawn(move || -> io::Result<()> {
        let (mut reader, pipe) = io::pipe()?;
        let packer = std::thread::spawn(move || -> io::Result<()> {
            let mut b = tar::Builder::new(pipe);
            for (name, data) in [
                ("manifest.json", manifest.as_bytes()),
                (config_name.as_str(), config.as_bytes()),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, name, data)?;
            }
            let mut f = std::fs::File::open(&layer)?;
            b.append_file("layer.tar", &mut f)?;
            b.finish()
        });
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0
                || tx
                    .blocking_send(bytes::Bytes::copy_from_slice(&buf[..n]))
                    .is_err()
            {
                break;
            }
        }
        drop(tx);
        packer
            .join()
            .map_err(|_| io::Error::other("the packer panicked"))?
    });
    let body =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut answers = docker.import_image_stream(ImportImageOptions { quiet: true }, body, None);
    let mut failure = None;
    while let Some(answer) = answers.next().await {
        match answer {
            Ok(info) => {
                if let Some(e) = info.error {
                    failure = Some(e);
                }
            }
            Err(e) => failure = Some(e.to_string()),
        }
    }
    let packed = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| fail(Step::Image, e))?
        .map_err(|_| fail(Step::Image, "the tarball's writer panicked"))?;
    if let Some(e) = failure {
        return Err(fail(
            Step::Image,
            format!("the engine refused the image {tag}: {e}"),
        ));
    }
    packed.map_err(failed)?;
    if has(docker, tag).await {
        Ok(())
    } else {
        Err(fail(
            Step::Image,
            format!("the engine loaded no image {tag}"),
        ))
    }
}
