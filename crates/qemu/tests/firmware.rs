//! Firmware boot against a real guest under TCG: SeaBIOS and OVMF boot the test guest's
//! firmware-bootable images (`boot-cd.iso` from a `sata` CD-ROM, `boot-disk.img` from a virtio
//! disk), the boot order changed at run time decides the next boot (guest-initiated reset and
//! host reset alike), the EFI variable store belongs to the run dir, and a QEMU started paused
//! runs nothing until resumed. Every assertion about what booted is the guest's own line,
//! `VP-BOOT medium=<cd|disk|kernel> firmware=<bios|efi>` (tests/guest/init).
//!
//! Needs QEMU, OVMF and the test guest (`scripts/install-deps.sh`, `scripts/build-test-guest.sh`).
//! Every QEMU this file starts is killed by PID when its test ends, pass or fail.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qemu::accel::Resolved;
use qemu::cmdline::{BootDisk, CdromDrive, KernelBoot, LaunchSpec};
use qemu::console::Console;
use qemu::firmware::{Firmware, OVMF_VARS_TEMPLATE};
use qemu::process::{self, Process};
use qemu::qmp::Qmp;
use qemu::Machine;
use serde_json::json;

/// From launch to the guest's VP-BOOT line. OVMF under TCG on a loaded 2-core machine takes
/// longer than SeaBIOS; the deadline only matters when the boot is really stuck.
const BOOT: Duration = Duration::from_secs(120);

fn guest_dir() -> PathBuf {
    let dir = std::env::var_os("VIRTPLUG_GUEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/guest"), PathBuf::from);
    assert!(dir.join("boot-cd.iso").is_file(), "no firmware-bootable test guest in {}: run scripts/build-test-guest.sh", dir.display());
    dir
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fw {
    Bios,
    Efi,
}

/// A VM with no boot device yet, under `fw`, its run dir in `dir`.
fn spec(dir: &Path, fw: Fw) -> LaunchSpec {
    let run_dir = dir.join("run");
    LaunchSpec {
        name: "fw".into(),
        // GRUB 2.06's EFI loader runs out of memory for the guest's kernel and initrd at 256 MiB
        // under OVMF ("error: out of memory."); 512 MiB boots (see qemu::firmware).
        memory_mib: if fw == Fw::Efi { 512 } else { 256 },
        vcpus: 1,
        accel: Resolved::Tcg,
        kernel: None,
        boot_disks: vec![],
        cdrom_drives: vec![],
        nics: Vec::new(),
        own_mount_namespace: false,
        sandbox: true,
        run_as: None,
        firmware: if fw == Fw::Efi { Firmware::efi(&run_dir) } else { Firmware::Bios },
        start_paused: false,
        run_dir,
    }
}

fn cd(medium: &str, bootindex: u32) -> CdromDrive {
    CdromDrive { id: "cd0".into(), bootindex: Some(bootindex), medium: Some(guest_dir().join(medium).into()) }
}

/// `boot-disk.img`, copied (a disk is writable; the cached image stays pristine).
fn disk(dir: &Path, bootindex: u32) -> BootDisk {
    let path = dir.join("boot-disk.img");
    std::fs::copy(guest_dir().join("boot-disk.img"), &path).unwrap();
    BootDisk { id: "disk0".into(), source: path.into(), readonly: false, sata: false, bootindex: Some(bootindex), serial: None }
}

/// A running QEMU; killed by PID on drop.
struct Vm {
    process: Process,
    machine: Machine,
    console: Console,
    started: Instant,
}

impl Drop for Vm {
    fn drop(&mut self) {
        if self.process.alive() {
            if let Some(pid) = rustix::process::Pid::from_raw(self.process.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

impl Vm {
    /// Launches `spec` and connects the console (before the firmware prints anything) and QMP.
    async fn launch(spec: &LaunchSpec) -> Vm {
        let started = Instant::now();
        let process = process::launch(spec).await.unwrap();
        let console = Console::connect(&spec.serial_socket(), Duration::from_secs(5)).await.unwrap();
        let qmp = Qmp::connect_within(&spec.qmp_socket(), Duration::from_secs(5)).await.unwrap();
        Vm { process, machine: Machine::new(qmp), console, started }
    }

    /// The next `VP-BOOT` line, as `(medium, firmware)`. GRUB's screen control codes may share
    /// the line, so the report is looked for anywhere in it.
    async fn boot_line(&mut self) -> (String, String) {
        let Some(line) = self.console.wait_for(BOOT, |l| l.contains("VP-BOOT ")).await else {
            let seen: Vec<&String> = self.console.seen.iter().map(|l| &l.text).collect();
            panic!("no VP-BOOT line within {BOOT:?}; the console printed: {seen:?}");
        };
        let report = &line.text[line.text.find("VP-BOOT ").unwrap()..];
        let field = |k: &str| report.split_whitespace().find_map(|w| w.strip_prefix(k)).unwrap_or_default().to_owned();
        (field("medium="), field("firmware="))
    }

    /// Waits for `VP-BOOT medium=<medium> firmware=<fw>` and returns how long it took since
    /// `since`.
    async fn expect_boot(&mut self, medium: &str, fw: Fw, since: Instant) -> Duration {
        let want = (medium.to_owned(), if fw == Fw::Efi { "efi" } else { "bios" }.to_owned());
        assert_eq!(self.boot_line().await, want);
        since.elapsed()
    }
}

/// Boots `spec` and checks the guest's report; prints the time to it (the measurement the
/// Redfish one-time boot budget is based on).
async fn boots(spec: &LaunchSpec, medium: &str, fw: Fw) -> Vm {
    let mut vm = Vm::launch(spec).await;
    let took = vm.expect_boot(medium, fw, vm.started).await;
    eprintln!("BOOT-TIME {fw:?} from {medium}: {:.1} s to VP-BOOT", took.as_secs_f64());
    vm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seabios_boots_the_cd_from_a_sata_cdrom() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), Fw::Bios);
    s.cdrom_drives = vec![cd("boot-cd.iso", 1)];
    boots(&s, "cd", Fw::Bios).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ovmf_boots_the_cd_from_a_sata_cdrom() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), Fw::Efi);
    s.cdrom_drives = vec![cd("boot-cd.iso", 1)];
    boots(&s, "cd", Fw::Efi).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seabios_boots_the_disk_from_virtio() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), Fw::Bios);
    s.boot_disks = vec![disk(dir.path(), 1)];
    boots(&s, "disk", Fw::Bios).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ovmf_boots_the_disk_from_virtio() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), Fw::Efi);
    s.boot_disks = vec![disk(dir.path(), 1)];
    boots(&s, "disk", Fw::Efi).await;
}

/// `bootloader.efi` with `kernelBoot` (admission allows it): QEMU hands the kernel to OVMF
/// through fw_cfg and OVMF starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ovmf_direct_boots_a_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let g = guest_dir();
    let mut s = spec(dir.path(), Fw::Efi);
    s.kernel = Some(KernelBoot {
        kernel: g.join("vmlinuz"),
        initrd: Some(g.join("initramfs.cpio.gz")),
        cmdline: "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable".into(),
    });
    boots(&s, "kernel", Fw::Efi).await;
}

/// Alt+SysRq+B on the guest's keyboard: the guest kernel resets the machine itself (its
/// emergency restart), the way a guest's own `reboot` does. QEMU reports it as a RESET with
/// `guest: true`.
async fn guest_reset(vm: &Vm) {
    let mut events = vm.machine.events();
    let keys = ["alt", "sysrq", "b"].map(|k| json!({"type": "qcode", "data": k}));
    vm.machine.execute("send-key", json!({"keys": keys})).await.unwrap();
    let wait = async {
        loop {
            let e = events.recv().await.unwrap();
            if e.name == "RESET" {
                return e;
            }
        }
    };
    let e = tokio::time::timeout(Duration::from_secs(30), wait).await.expect("the guest reset itself within 30 s");
    assert_eq!(e.data["guest"], json!(true), "a guest-initiated reset: {e:?}");
}

/// The CD and the disk both attached; swapping their boot indexes at run time (what a Redfish
/// one-time boot does) decides what the next boot starts from, whether the guest resets
/// itself or the host resets it. QEMU refuses a boot index another device holds, so one is
/// cleared (-1) first.
async fn boot_order_swap(fw: Fw) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), fw);
    s.cdrom_drives = vec![cd("boot-cd.iso", 1)];
    s.boot_disks = vec![disk(dir.path(), 2)];
    let mut vm = boots(&s, "cd", fw).await;
    let e = vm.machine.set_bootindex("disk0", 1).await.unwrap_err();
    assert!(e.to_string().contains("already"), "a duplicate boot index is refused: {e}");

    for (first, second, medium) in [("cd0", "disk0", "disk"), ("disk0", "cd0", "cd")] {
        vm.machine.set_bootindex(first, -1).await.unwrap();
        vm.machine.set_bootindex(second, 1).await.unwrap();
        vm.machine.set_bootindex(first, 2).await.unwrap();
        let t = Instant::now();
        if medium == "disk" {
            guest_reset(&vm).await;
        } else {
            vm.machine.execute("system_reset", json!({})).await.unwrap();
        }
        let took = vm.expect_boot(medium, fw, t).await;
        eprintln!("BOOT-TIME {fw:?} reset to {medium}: {:.1} s to VP-BOOT", took.as_secs_f64());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seabios_boots_the_other_medium_after_a_boot_order_swap_and_reset() {
    boot_order_swap(Fw::Bios).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ovmf_boots_the_other_medium_after_a_boot_order_swap_and_reset() {
    boot_order_swap(Fw::Efi).await;
}

/// The variable store is created from the template at the first launch, written by OVMF, and
/// the next launch with the same run dir starts from what it wrote, not from a fresh copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_efi_variable_store_belongs_to_the_run_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), Fw::Efi);
    s.cdrom_drives = vec![cd("boot-cd.iso", 1)];
    let Firmware::Efi { vars, .. } = s.firmware.clone() else { unreachable!() };
    assert!(!vars.exists());
    let vm = boots(&s, "cd", Fw::Efi).await;
    vm.machine.quit().await;
    assert!(vm.process.wait_gone(Duration::from_secs(10)).await);
    drop(vm);
    let written = std::fs::read(&vars).unwrap();
    assert_ne!(written, std::fs::read(OVMF_VARS_TEMPLATE).unwrap(), "OVMF wrote its boot entries into the VM's store");

    // Paused, so the store is read before OVMF could touch it again.
    s.start_paused = true;
    let mut vm = Vm::launch(&s).await;
    assert_eq!(std::fs::read(&vars).unwrap(), written, "the second launch kept the store");
    vm.machine.resume().await.unwrap();
    vm.expect_boot("cd", Fw::Efi, Instant::now()).await;
}

/// `start_paused`: QEMU answers on QMP but runs no guest code (the firmware included: not a
/// byte on the console) until `resume`; then the guest boots as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qemu_started_paused_runs_nothing_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path(), Fw::Bios);
    s.cdrom_drives = vec![cd("boot-cd.iso", 1)];
    s.start_paused = true;
    let mut vm = Vm::launch(&s).await;
    let status = vm.machine.execute("query-status", json!({})).await.unwrap();
    assert_eq!((status["running"].clone(), status["status"].clone()), (json!(false), json!("prelaunch")));
    // A bounded wait for something that must not happen: SeaBIOS prints within a second of
    // running, and GRUB soon after.
    assert!(vm.console.wait_for(Duration::from_secs(3), |_| true).await.is_none(), "the paused guest printed");
    assert_eq!(std::fs::metadata(s.serial_log()).unwrap().len(), 0, "nothing reached the serial log");
    let t = Instant::now();
    vm.machine.resume().await.unwrap();
    vm.expect_boot("cd", Fw::Bios, t).await;
    let status = vm.machine.execute("query-status", json!({})).await.unwrap();
    assert_eq!(status["status"], json!("running"));
}
