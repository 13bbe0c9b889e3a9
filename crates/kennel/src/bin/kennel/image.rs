//! `kennel image`: build, list, inspect and remove images.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use kennel_image::builder::{Builder, Built};
use kennel_image::{NoProgress, Progress};
use kennel_sandbox::StateDir;
use kennel_sandbox::Store;
use kennel_sandbox::{OutputSink, Stream};
use kennel_types::image::{Base, ImageSpec};

use crate::out::outln;

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Build an image from a spec (-f), from flags, from an OCI layout or `docker save`
    /// tarball (--from-oci), or from a directory (--from-dir).
    Build(BuildArgs),
    /// List the images.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show an image's record: digest, source, size, env, preloads, pinned pip versions.
    Inspect { name: String },
    /// Remove an image name (and its image, when no other name points at it).
    Rm { name: String },
    /// Give the image SOURCE another name (or move NAME to it).
    Tag { source: String, name: String },
}

#[derive(Args)]
pub struct BuildArgs {
    /// The image's name.
    name: String,
    /// A TOML image spec.
    #[arg(short = 'f', long = "file", value_name = "SPEC", conflicts_with_all = ["from_oci", "from_dir"])]
    spec: Option<PathBuf>,
    /// An OCI image layout (directory or tarball) or a `docker save` tarball.
    #[arg(long, value_name = "PATH", conflicts_with = "from_dir")]
    from_oci: Option<PathBuf>,
    /// A directory to copy as the image's root.
    #[arg(long, value_name = "DIR")]
    from_dir: Option<PathBuf>,
    /// The Debian suite (without -f; default: the host's).
    #[arg(long)]
    suite: Option<String>,
    /// A Debian package (without -f). Repeat for more.
    #[arg(long = "apt", value_name = "PACKAGE")]
    apt: Vec<String>,
    /// A pip requirement (without -f). Repeat for more.
    #[arg(long = "pip", value_name = "REQUIREMENT")]
    pip: Vec<String>,
    /// A Python module pooled sandboxes import ahead (without -f). Repeat for more.
    #[arg(long = "preload", value_name = "MODULE")]
    preload: Vec<String>,
    /// Print the record as JSON when done.
    #[arg(long)]
    json: bool,
}

/// Progress on stderr: one line per step, and a byte count that rewrites itself on a terminal.
pub(crate) struct Terminal {
    pub tty: bool,
    /// What each line starts with (`kennel image`).
    pub prefix: &'static str,
}

// A closed stderr (`2>&1 | head`) must not end a build halfway: eprintln! would panic.
impl Progress for Terminal {
    fn step(&self, what: &str) {
        let clear = if self.tty { "\r\x1b[K" } else { "" };
        let _ = writeln!(std::io::stderr(), "{clear}{}: {what}", self.prefix);
    }
    fn bytes(&self, total: u64) {
        if self.tty {
            let mut err = std::io::stderr();
            let _ = write!(err, "\r\x1b[K  {} MiB written", total >> 20);
            let _ = err.flush();
        }
    }
}

pub fn main(cmd: ImageCmd) -> anyhow::Result<()> {
    let store = Store::from_env();
    match cmd {
        ImageCmd::Build(args) => build(&store, args),
        ImageCmd::Ls { json } => {
            let all = store.list();
            if json {
                let rows: Vec<_> = all
                    .iter()
                    .map(|r| serde_json::json!({"name": r.info.name, "record": r.record}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&rows)?)?;
                return Ok(());
            }
            outln!("{:<24} {:<20} {:>10}  SOURCE", "NAME", "DIGEST", "SIZE")?;
            for r in all {
                let short = r.info.digest.get(..19).unwrap_or(&r.info.digest);
                let source = match &r.record.source {
                    kennel_types::image::ImageSource::Spec { suite, .. } => {
                        format!("debian {suite}")
                    }
                    kennel_types::image::ImageSource::Oci { path, .. } => format!("oci {path}"),
                    kennel_types::image::ImageSource::Dir { path } => format!("dir {path}"),
                };
                outln!(
                    "{:<24} {:<20} {:>7} MiB  {source}",
                    r.info.name,
                    short,
                    r.record.bytes >> 20
                )?;
            }
            Ok(())
        }
        ImageCmd::Inspect { name } => {
            let r = store.resolve(&name)?;
            let out = serde_json::json!({"name": name, "rootfs": r.rootfs, "record": r.record});
            outln!("{}", serde_json::to_string_pretty(&out)?)?;
            Ok(())
        }
        ImageCmd::Tag { source, name } => {
            let digest = store.resolve(&source)?.info.digest;
            store.tag(&name, &digest)?;
            outln!("{name} {digest}")?;
            Ok(())
        }
        ImageCmd::Rm { name } => {
            let (info, deleted) = store.remove(&name)?;
            outln!("removed {} ({})", info.name, info.digest)?;
            if !deleted && !store.list().iter().any(|r| r.info.digest == info.digest) {
                outln!(
                    "its root is still in use by running sandboxes: it is deleted at the next \
                     `kennel image rm` or build after they end"
                )?;
            }
            Ok(())
        }
    }
}

fn build(store: &Store, args: BuildArgs) -> anyhow::Result<()> {
    // Before any work: no sandbox could show an image under /tmp.
    StateDir::Images.check(store.root())?;
    let engine = crate::engine::engine()?;
    let tty = std::io::stderr().is_terminal();
    let terminal = Terminal {
        tty,
        prefix: "kennel image",
    };
    let progress: &dyn Progress = if args.json && !tty {
        &NoProgress
    } else {
        &terminal
    };
    let live: OutputSink = Arc::new(|_: Stream, chunk: &[u8]| {
        let _ = std::io::stderr().lock().write_all(chunk);
    });
    let builder = Builder {
        store,
        engine: &engine,
        progress,
        live: Some(live),
    };
    let flags = args.suite.is_some()
        || !args.apt.is_empty()
        || !args.pip.is_empty()
        || !args.preload.is_empty();
    let built: Built = if let Some(path) = &args.from_oci {
        no_flags(flags, "--from-oci")?;
        builder.from_oci(&args.name, path)?
    } else if let Some(dir) = &args.from_dir {
        no_flags(flags, "--from-dir")?;
        builder.from_dir(&args.name, dir)?
    } else if let Some(path) = &args.spec {
        no_flags(flags, "-f")?;
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let spec = ImageSpec::from_toml(&text).with_context(|| format!("in {}", path.display()))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        builder.from_spec(&args.name, &spec, dir)?
    } else if flags {
        let spec = ImageSpec {
            base: Base {
                suite: args.suite.clone().unwrap_or_else(host_suite),
                variant: Default::default(),
            },
            apt: args.apt.clone(),
            pip: args.pip.clone(),
            files: vec![],
            env: Default::default(),
            preload: args.preload.clone(),
        };
        builder.from_spec(&args.name, &spec, Path::new("."))?
    } else {
        bail!("say what to build from: -f SPEC.toml, --apt/--pip/--preload, --from-oci PATH or --from-dir DIR");
    };
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"name": args.name, "reused": built.reused, "record": built.record})
            )?
        )?;
    } else {
        outln!(
            "{} {}{}",
            args.name,
            built.record.digest,
            if built.reused { " (reused)" } else { "" }
        )?;
    }
    Ok(())
}

fn no_flags(flags: bool, with: &str) -> anyhow::Result<()> {
    if flags {
        bail!(
            "--suite, --apt, --pip and --preload build a Debian image; they do not go with {with}"
        );
    }
    Ok(())
}

/// The host's own Debian suite, from os-release.
fn host_suite() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
                .map(|s| s.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "bookworm".into())
}
