//! `kennel vm`: the microVM tier's guest (`kennel vm prepare`).

use std::io::IsTerminal;

use clap::Subcommand;
use kennel_image::builder::Builder;
use kennel_image::{NoProgress, Progress};
use kennel_sandbox::StateDir;
use kennel_sandbox::Store;
use kennel_sandbox::VmDir;
use kennel_vm::{Options, Prepared};

use crate::image::Terminal;
use crate::out::{out, outln};

#[derive(Subcommand)]
pub enum VmCmd {
    /// Download and unpack what a microVM boots: QEMU and the Debian cloud kernel (from the
    /// host's apt, not installed), the kernel's modules, and the base image microvm-base.
    ///
    /// Into $KENNEL_VM_DIR, else <state dir>/vm. Does nothing when it is up to date.
    Prepare {
        /// Print what was prepared as JSON.
        #[arg(long)]
        json: bool,
        /// Also boot a guest on this image once and snapshot it, so that runs on it restore
        /// instead of boot (repeatable; microvm-base always is).
        #[arg(long = "image", value_name = "NAME")]
        images: Vec<String>,
    },
}

pub fn main(cmd: VmCmd) -> anyhow::Result<()> {
    match cmd {
        VmCmd::Prepare { json, images } => prepare(json, &images),
    }
}

fn prepare(json: bool, images: &[String]) -> anyhow::Result<()> {
    let store = Store::from_env();
    let vm = VmDir::from_env();
    // Before any download: QEMU runs in a sandbox, and the base image's build runs in one.
    StateDir::Vm.check(&vm.root)?;
    StateDir::Images.check(store.root())?;
    let engine = crate::engine::engine()?;
    let tty = std::io::stderr().is_terminal();
    let terminal = Terminal {
        tty,
        prefix: "kennel vm",
    };
    let progress: &dyn Progress = if json && !tty { &NoProgress } else { &terminal };
    let builder = Builder {
        store: &store,
        engine: &engine,
        progress,
        live: None,
    };
    let prepared = kennel_vm::prepare(
        &vm,
        &Options {
            builder: &builder,
            progress,
        },
    )?;
    let warmed = warm(&engine, images)?;
    if json {
        let mut out = serde_json::to_value(&prepared)?;
        out["snapshots"] = warmed
            .iter()
            .map(|w| serde_json::json!({ "image": w.image, "ms": w.ms }))
            .collect();
        outln!("{}", serde_json::to_string_pretty(&out)?)?;
    } else {
        out!("{}", human(&vm, &prepared))?;
        for w in &warmed {
            outln!(
                "  snapshot {}: ready ({:.1} s)",
                w.image,
                w.ms as f64 / 1000.0
            )?;
        }
    }
    Ok(())
}

/// A guest booted once and saved, per image, for runs to restore.
struct Warmed {
    image: String,
    ms: u64,
}

fn warm(engine: &kennel_sandbox::Engine, images: &[String]) -> anyhow::Result<Vec<Warmed>> {
    let base = kennel_sandbox::BASE_IMAGE;
    let mut names = vec![base.to_string()];
    names.extend(images.iter().filter(|n| *n != base).cloned());
    let mut warmed = vec![];
    for image in names {
        let started = std::time::Instant::now();
        engine
            .warm_microvm(Some(&image))
            .map_err(|e| anyhow::anyhow!("the snapshot of {image}: {e}"))?;
        let ms = kennel_types::millis(started.elapsed());
        warmed.push(Warmed { image, ms });
    }
    Ok(warmed)
}

/// Where each piece is and what it cost.
fn human(vm: &VmDir, p: &Prepared) -> String {
    let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20));
    let mut out = if p.warning.is_some() {
        format!(
            "kept the microVM guest in {} as it is ({})\n",
            p.dir.display(),
            secs(p.elapsed_ms)
        )
    } else if p.up_to_date {
        format!(
            "the microVM guest in {} is up to date ({})\n",
            p.dir.display(),
            secs(p.elapsed_ms)
        )
    } else {
        format!(
            "prepared the microVM guest in {} in {} (packages {}, base image {})\n",
            p.dir.display(),
            secs(p.elapsed_ms),
            secs(p.artifacts_ms),
            secs(p.base_image_ms)
        )
    };
    let m = &p.manifest;
    let rows = [
        (
            "qemu",
            vm.qemu_binary().display().to_string(),
            m.qemu_version.clone(),
            mib(p.sizes.qemu_bytes),
        ),
        (
            "kernel",
            vm.vmlinux().display().to_string(),
            m.kernel_release.clone(),
            mib(p.sizes.vmlinux_bytes),
        ),
        (
            "modules",
            vm.modules_dir().display().to_string(),
            format!("{} in load order", m.modules.len()),
            mib(p.sizes.modules_bytes),
        ),
        (
            "image",
            p.base_image.name.clone(),
            format!(
                "{}{}",
                p.base_image.digest,
                if p.base_image.reused { " (reused)" } else { "" }
            ),
            mib(p.base_image.bytes),
        ),
    ];
    for (what, place, detail, size) in rows {
        out.push_str(&format!(
            "  {what:<8} {place}\n  {:<8} {detail}, {size}\n",
            ""
        ));
    }
    if let Some(w) = &p.warning {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}
