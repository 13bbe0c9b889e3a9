//! The VMM seam: what boots a guest, behind one trait, and QEMU's `microvm` machine as the one
//! implementation shipped. Firecracker or Cloud Hypervisor would be further implementations,
//! each a translator from [`Boot`] to its own command line or API (see ARCHITECTURE.md for
//! what each would need); none is shipped until a test can run it.

use std::io;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::artifacts::{VmDir, MICROVM_FIRMWARE, QEMU_DATA, QEMU_LIBRARIES};

/// How the guest's CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's software emulation: works anywhere, and QEMU's security policy gives it no
    /// isolation guarantee.
    Tcg,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// One guest to boot, with every path as the VMM sees it inside its jail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Boot {
    pub accel: Accel,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub kernel: String,
    pub initrd: String,
    /// The read-only root disk.
    pub root_disk: String,
    /// The unix socket the host listens on for the agent port.
    pub agent_socket: String,
    /// QEMU's QMP socket, a server in the relay's private directory.
    pub qmp: String,
    /// A pair of FIFOs (`PATH.in`, `PATH.out`) for the guest's console, which the host reads
    /// into a bounded buffer: a console written to a file could fill the host's disk.
    pub console: String,
    /// The VMM's own directory (QEMU's firmware under `usr/share`).
    pub prefix: String,
    /// The host's TSC rate, which a TCG guest cannot calibrate by itself.
    pub tsc_khz: Option<u64>,
    /// The volumes' disks, after the root disk.
    pub disks: Vec<Disk>,
}

/// A volume's disk: a raw ext4 image the guest alone mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// The image as the VMM's jail shows it.
    pub file: String,
    /// The serial the guest finds it by.
    pub serial: String,
    pub read_only: bool,
}

/// How a guest's RAM is backed around a snapshot (paths as the VMM's jail shows them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ram<'a> {
    /// Taking one: RAM is `file`, written through, so that stopping the guest leaves its memory
    /// there and the saved state needs only the devices.
    Save { file: &'a str },
    /// Restoring one: RAM is `file` opened read-only and mapped private, copy-on-write, so
    /// every clone shares its unwritten pages and none can change it; the VMM then waits for
    /// the device state.
    Restore { file: &'a str },
}

/// A virtual machine monitor: how to start one guest.
pub trait Vmm: Send + Sync {
    fn name(&self) -> &'static str;
    /// The command line that boots `boot` and exits when the guest powers off.
    fn argv(&self, boot: &Boot) -> Vec<String>;
    /// What `argv` gains to save or restore a guest of `memory_mib` with its RAM in a file.
    fn snapshot_args(&self, memory_mib: u64, ram: Ram<'_>) -> Vec<String>;
    /// What `argv` gains to restore a saved guest of `memory_mib` whose whole RAM comes in the
    /// migration stream: RAM of the VMM's own, under a snapshot's backend id when the saved
    /// guest had been restored from one (`backend`), and the VMM waiting for the stream.
    fn incoming_args(&self, memory_mib: u64, backend: bool) -> Vec<String>;
    /// Extra environment (libraries of a private install).
    fn env(&self, boot: &Boot) -> Vec<(String, String)>;
}

/// QEMU's `microvm` machine: no PCI, no firmware tables beyond ACPI, virtio-mmio devices only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Qemu;

/// The agent port's name, which the guest looks up under /sys/class/virtio-ports.
pub const AGENT_PORT: &str = "kennel.agent";

impl Vmm for Qemu {
    fn name(&self) -> &'static str {
        "qemu-microvm"
    }

    fn argv(&self, b: &Boot) -> Vec<String> {
        let p = &b.prefix;
        let (accel, cpu) = match b.accel {
            // The translation cache is 1 GiB by default: 64 MiB keeps QEMU within its cgroup.
            Accel::Tcg => ("tcg,tb-size=64", "max"),
            Accel::Kvm => ("kvm", "host"),
        };
        // Probes the microvm machine has nothing for (PCI, the i8042 controller, serial
        // ports) and the crypto self-tests are skipped: about 0.4 s of a 1.5 s boot under TCG
        // (bench/microvm.sh). RDRAND seeds the CRNG at once, so code that asks for random bytes
        // early does not wait.
        let mut cmdline = "console=hvc0 quiet panic=-1 reboot=t pci=off 8250.nr_uarts=0 \
                           i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd \
                           cryptomgr.notests random.trust_cpu=on no_timer_check"
            .to_string();
        if let (Accel::Tcg, Some(khz)) = (b.accel, b.tsc_khz) {
            // Without it, TCG boots hang at TSC calibration about half the time.
            cmdline.push_str(&format!(" tsc_early_khz={khz} tsc=reliable"));
        }
        let mut args: Vec<String> = vec![
            format!("{p}/usr/bin/qemu-system-x86_64"),
            "-L".into(),
            format!("{p}/{QEMU_DATA}"),
            "-bios".into(),
            format!("{p}/{MICROVM_FIRMWARE}"),
            "-M".into(),
            "microvm,x-option-roms=off,isa-serial=off,rtc=on".into(),
            "-accel".into(),
            accel.into(),
            "-cpu".into(),
            cpu.into(),
            "-m".into(),
            b.memory_mib.to_string(),
            "-smp".into(),
            b.vcpus.to_string(),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-display".into(),
            "none".into(),
            "-no-reboot".into(),
            "-kernel".into(),
            b.kernel.clone(),
            "-initrd".into(),
            b.initrd.clone(),
            "-append".into(),
            cmdline,
            "-device".into(),
            "virtio-serial-device".into(),
            "-chardev".into(),
            format!("pipe,id=con,path={}", b.console),
            "-device".into(),
            "virtconsole,chardev=con".into(),
            "-chardev".into(),
            format!("socket,id=agent,path={}", b.agent_socket),
            "-device".into(),
            format!("virtserialport,chardev=agent,name={AGENT_PORT}"),
            "-drive".into(),
            format!(
                "id=root,file={},format=raw,if=none,readonly=on",
                b.root_disk
            ),
            "-device".into(),
            "virtio-blk-device,drive=root".into(),
            "-device".into(),
            "virtio-rng-device".into(),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", b.qmp),
            // QEMU's own seccomp filter, inside Kennel's: no exec, no privilege changes.
            "-sandbox".into(),
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
        ];
        for (i, d) in b.disks.iter().enumerate() {
            args.extend(disk_args(i, d));
        }
        args
    }

    fn snapshot_args(&self, memory_mib: u64, ram: Ram<'_>) -> Vec<String> {
        // `readonly=on,rom=off` (QEMU 8.2) opens the file O_RDONLY and maps it MAP_PRIVATE:
        // guest RAM that is writable to the guest, never to the file. Saving migrates with
        // `x-ignore-shared` (set over QMP), so the shared RAM is not streamed again.
        let (file, how) = match ram {
            Ram::Save { file } => (file, "share=on"),
            Ram::Restore { file } => (file, "share=off,readonly=on,rom=off"),
        };
        let mut args: Vec<String> = vec![
            "-object".into(),
            format!("memory-backend-file,id=ram,size={memory_mib}M,mem-path={file},{how}"),
            "-machine".into(),
            "memory-backend=ram".into(),
        ];
        if let Ram::Restore { .. } = ram {
            args.extend(["-incoming".into(), "defer".into()]);
        }
        args
    }

    fn incoming_args(&self, memory_mib: u64, backend: bool) -> Vec<String> {
        let mut args: Vec<String> = vec![];
        if backend {
            // The stream's RAM block is named after the backend's id, `ram` as a snapshot's;
            // anonymous memory, which the stream fills (zero pages are left untouched).
            args.extend([
                "-object".into(),
                format!("memory-backend-ram,id=ram,size={memory_mib}M"),
                "-machine".into(),
                "memory-backend=ram".into(),
            ]);
        }
        args.extend(["-incoming".into(), "defer".into()]);
        args
    }

    fn env(&self, b: &Boot) -> Vec<(String, String)> {
        let dirs = QEMU_LIBRARIES.map(|d| format!("{}/{d}", b.prefix));
        vec![("LD_LIBRARY_PATH".into(), dirs.join(":"))]
    }
}

/// A volume's drive and its virtio-blk device. The image is raw (no format the host would
/// parse), opened read-only where asked, and its writes reach the host's file when the guest
/// flushes (an `fsync` in the guest is one on the image).
fn disk_args(index: usize, d: &Disk) -> Vec<String> {
    let ro = if d.read_only { "on" } else { "off" };
    vec![
        "-drive".into(),
        format!(
            "id=volume{index},file={},format=raw,if=none,readonly={ro}",
            d.file
        ),
        "-device".into(),
        format!("virtio-blk-device,drive=volume{index},serial={}", d.serial),
    ]
}

/// The host's TSC rate in kHz, from /proc/cpuinfo's `cpu MHz` (the TSC on the VMs this runs
/// on; a guest told a wrong rate only keeps time worse).
pub fn host_tsc_khz() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = text
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Some((mhz * 1000.0).round() as u64)
}

/// Whether KVM works here, and if not, why: probed once per process.
pub fn accel(vm: &VmDir) -> &'static (Accel, String) {
    static PROBED: OnceLock<(Accel, String)> = OnceLock::new();
    PROBED.get_or_init(|| match probe_kvm(vm) {
        Ok(detail) => (Accel::Kvm, detail.into()),
        Err(why) => (Accel::Tcg, why.to_string()),
    })
}

/// A KVM guest is usable when /dev/kvm opens and QEMU gets a KVM microvm through its reset
/// (vCPUs stopped) within a bound. On a paravirtual /dev/kvm (`kvm_pvm`) QEMU aborts there, on
/// an MSR it cannot set: such a host is told apart from a working one, not assumed either way.
fn probe_kvm(vm: &VmDir) -> Result<&'static str, NoKvm> {
    let dev = Path::new("/dev/kvm");
    if !dev.exists() {
        return Err(NoKvm::NoDevice);
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .map_err(NoKvm::Open)?;
    let libraries = std::env::join_paths(vm.qemu_library_dirs()).map_err(NoKvm::LibraryPath)?;
    let mut probe = Command::new(vm.qemu_binary());
    // Where QEMU passes its reset it stays up for the whole bound, paused: a supervisor killed
    // meanwhile must not leave it running (the waiting thread is the one that forks it).
    crate::sys::pre_exec_signal_safe(&mut probe, || {
        crate::sys::set_parent_death_signal(libc::SIGKILL)
    });
    let mut child = probe
        .arg("-L")
        .arg(vm.qemu_data_dir())
        .arg("-bios")
        .arg(vm.microvm_firmware())
        .args([
            "-M",
            "microvm,x-option-roms=off",
            "-accel",
            "kvm",
            "-cpu",
            "host",
        ])
        .args([
            "-m",
            "64",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-S",
        ])
        .env("LD_LIBRARY_PATH", libraries)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NoKvm::Spawn)?;
    let bound = Instant::now() + Duration::from_secs(3);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                let first = err.lines().next().unwrap_or("").trim().to_string();
                return Err(NoKvm::GuestFailed { status, first });
            }
            Ok(None) if Instant::now() >= bound => {
                let _ = child.kill();
                let _ = child.wait();
                return open_to_the_jail(dev).map(|()| "a KVM microvm passed its reset");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(NoKvm::Wait(e)),
        }
    }
}

/// QEMU runs as an unprivileged, unmapped uid in its sandbox: only a /dev/kvm that everyone
/// may read and write is one it can open there (Debian's udev rule gives it 0666).
fn open_to_the_jail(dev: &Path) -> Result<(), NoKvm> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dev)
        .map_err(NoKvm::Stat)?
        .permissions()
        .mode();
    if mode & 0o006 == 0o006 {
        Ok(())
    } else {
        Err(NoKvm::ClosedToJail { mode: mode & 0o777 })
    }
}

/// Why a KVM guest is not usable here: the microvm tier then runs under TCG, and says why.
#[derive(Debug, thiserror::Error)]
pub enum NoKvm {
    #[error("no /dev/kvm")]
    NoDevice,
    #[error("/dev/kvm does not open: {0}")]
    Open(io::Error),
    #[error("QEMU's library path: {0}")]
    LibraryPath(std::env::JoinPathsError),
    #[error("cannot start QEMU to probe KVM: {0}")]
    Spawn(io::Error),
    /// QEMU exited before the probe's bound: `first` is the first line it printed.
    #[error("QEMU cannot start a KVM guest ({status}): {first}")]
    GuestFailed { status: ExitStatus, first: String },
    #[error("waiting for the KVM probe: {0}")]
    Wait(io::Error),
    #[error("/dev/kvm: {0}")]
    Stat(io::Error),
    /// QEMU runs as an unmapped uid in its jail, which only a world-usable /dev/kvm admits.
    #[error(
        "/dev/kvm (mode {mode:o}) is not open to the unprivileged uid QEMU runs as in its \
         sandbox; a udev rule KERNEL==\"kvm\", MODE=\"0666\" makes it usable"
    )]
    ClosedToJail { mode: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(accel: Accel) -> Boot {
        Boot {
            accel,
            vcpus: 1,
            memory_mib: 512,
            kernel: "/vm/kernel/vmlinux".into(),
            initrd: "/vm/initrd/x.cpio".into(),
            root_disk: "/vm/roots/d.erofs".into(),
            agent_socket: "/io/agent.sock".into(),
            qmp: "/io/qmp.sock".into(),
            console: "/io/console".into(),
            prefix: "/vm/qemu".into(),
            tsc_khz: Some(2_596_000),
            disks: vec![],
        }
    }

    /// Each volume is a raw virtio-blk disk of its own, after the root, found by its serial,
    /// and read-only to QEMU where the mount is.
    #[test]
    fn volumes_are_raw_disks_named_by_serial_after_the_root() {
        let mut b = boot(Accel::Tcg);
        b.disks = vec![
            Disk {
                file: "/volume-0".into(),
                serial: "kennel-volume-0".into(),
                read_only: false,
            },
            Disk {
                file: "/volume-1".into(),
                serial: "kennel-volume-1".into(),
                read_only: true,
            },
        ];
        let argv = Qemu.argv(&b).join(" ");
        let root = argv.find("drive=root").unwrap();
        let first = argv
            .find("-drive id=volume0,file=/volume-0,format=raw,if=none,readonly=off -device virtio-blk-device,drive=volume0,serial=kennel-volume-0")
            .unwrap();
        assert!(root < first, "{argv}");
        assert!(argv.contains(
            "-drive id=volume1,file=/volume-1,format=raw,if=none,readonly=on -device virtio-blk-device,drive=volume1,serial=kennel-volume-1"
        ));
    }

    #[test]
    fn qemu_boots_with_its_own_sandbox_and_no_network_device() {
        let argv = Qemu.argv(&boot(Accel::Tcg)).join(" ");
        assert!(argv.starts_with("/vm/qemu/usr/bin/qemu-system-x86_64 "));
        assert!(argv.contains("-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny"));
        assert!(argv.contains("-accel tcg,tb-size=64 -cpu max"));
        assert!(argv.contains("tsc_early_khz=2596000 tsc=reliable"));
        assert!(argv.contains("-nodefaults"));
        assert!(!argv.contains("netdev") && !argv.contains("-nic"));
        assert!(argv.contains("readonly=on"));
        let kvm = Qemu.argv(&boot(Accel::Kvm)).join(" ");
        assert!(kvm.contains("-accel kvm -cpu host") && !kvm.contains("tsc_early_khz"));
    }

    #[test]
    fn a_restored_guest_maps_its_ram_file_read_only_and_private() {
        let save = Qemu
            .snapshot_args(512, Ram::Save { file: "/snap/ram" })
            .join(" ");
        assert_eq!(
            save,
            "-object memory-backend-file,id=ram,size=512M,mem-path=/snap/ram,share=on \
             -machine memory-backend=ram"
        );
        let restore = Qemu
            .snapshot_args(512, Ram::Restore { file: "/vm/s/ram" })
            .join(" ");
        assert!(restore.contains("mem-path=/vm/s/ram,share=off,readonly=on,rom=off"));
        assert!(restore.ends_with("-incoming defer"));
    }

    /// A saved guest comes back in RAM of its own, never a file's: under the snapshot's
    /// backend id when it had been restored from one, else QEMU's default RAM.
    #[test]
    fn a_saved_guest_is_restored_into_anonymous_ram_under_its_backend_id() {
        assert_eq!(
            Qemu.incoming_args(512, true).join(" "),
            "-object memory-backend-ram,id=ram,size=512M -machine memory-backend=ram \
             -incoming defer"
        );
        assert_eq!(Qemu.incoming_args(512, false).join(" "), "-incoming defer");
    }
}
