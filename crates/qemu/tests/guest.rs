//! The QEMU layer against a real guest under TCG: every assertion about a device is made from
//! inside the guest (its serial console reports block devices and CD-ROM media).
//!
//! Needs QEMU and the test guest (`scripts/build-test-guest.sh`, which `scripts/test.sh` runs).
//! Every QEMU this file starts is killed by PID when its test ends, pass or fail; loop devices
//! are detached the same way.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use qemu::accel::{self, Accel, Resolved};
use qemu::cmdline::{CdromDrive, KernelBoot, LaunchSpec};
use qemu::console::Console;
use qemu::process::{self, Process};
use qemu::qmp::{Qmp, QmpError};
use qemu::{node_name, Attach, DeviceKind, Inventory, Machine, OpError, Source};
use serde_json::json;

const BOOT: Duration = Duration::from_secs(60);
/// How long a guest report may take. Generous: under TCG on a loaded 2-core machine the guest's
/// forks slow down several-fold; the deadline only matters when something is really missing.
const SEE: Duration = Duration::from_secs(30);

fn guest_dir() -> PathBuf {
    let dir = std::env::var_os("VIRTPLUG_GUEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/guest"), PathBuf::from);
    assert!(dir.join("vmlinuz").is_file(), "no test guest in {}: run scripts/build-test-guest.sh", dir.display());
    dir
}

/// A booted test guest; QEMU is killed by PID on drop.
struct TestVm {
    process: Process,
    machine: Machine,
    console: Console,
    _dir: tempfile::TempDir,
}

impl Drop for TestVm {
    fn drop(&mut self) {
        if self.process.alive() {
            if let Some(pid) = rustix::process::Pid::from_raw(self.process.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

fn launch_spec(dir: &Path) -> LaunchSpec {
    let g = guest_dir();
    LaunchSpec {
        name: "test".into(),
        run_dir: dir.join("run"),
        memory_mib: 256,
        vcpus: 1,
        accel: Resolved::Tcg,
        kernel: Some(KernelBoot {
            kernel: g.join("vmlinuz"),
            initrd: Some(g.join("initramfs.cpio.gz")),
            cmdline: "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable".into(),
        }),
        boot_disks: vec![],
        cdrom_drives: vec![CdromDrive { id: "cd0".into(), bootindex: None, medium: None }],
        nics: Vec::new(),
        own_mount_namespace: false,
        sandbox: true,
        run_as: None,
        firmware: qemu::Firmware::Bios,
        start_paused: false,
    }
}

impl TestVm {
    async fn boot() -> TestVm {
        let dir = tempfile::tempdir().unwrap();
        let spec = launch_spec(dir.path());
        TestVm::start(&spec, dir).await
    }

    /// Launches `spec`, connects the console (before the guest prints anything: its kernel takes
    /// seconds to get there) and QMP, and waits for the ready line.
    async fn start(spec: &LaunchSpec, dir: tempfile::TempDir) -> TestVm {
        let process = process::launch(spec).await.unwrap();
        let console = Console::connect(&spec.serial_socket(), Duration::from_secs(5)).await.unwrap();
        let qmp = Qmp::connect_within(&spec.qmp_socket(), Duration::from_secs(5)).await.unwrap();
        let mut vm = TestVm { process, machine: Machine::new(qmp), console, _dir: dir };
        vm.console.wait_for(BOOT, |l| l.starts_with("VP-READY")).await.expect("the guest booted to VP-READY");
        vm
    }

    async fn see(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        match self.console.wait_for(SEE, pred).await {
            Some(l) => l.text,
            None => {
                panic!("the guest did not report {what}; it printed: {:?}", self.console.seen.iter().map(|l| &l.text).collect::<Vec<_>>())
            }
        }
    }

    /// How many fds QEMU holds open on `path`.
    fn qemu_fds_on(&self, path: &Path) -> usize {
        let canon = std::fs::canonicalize(path).unwrap();
        std::fs::read_dir(format!("/proc/{}/fd", self.process.pid))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| *t == canon)
            .count()
    }
}

/// A sparse image whose first 16 bytes are `marker`.
fn image(dir: &Path, name: &str, marker: &[u8; 16], size: u64) -> PathBuf {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(marker).unwrap();
    f.set_len(size).unwrap();
    p
}

fn open(path: &Path, write: bool) -> OwnedFd {
    std::fs::OpenOptions::new().read(true).write(write).open(path).unwrap().into()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A loop device over a file, detached on drop.
struct Loop(PathBuf);
impl Loop {
    fn new(file: &Path) -> Loop {
        let out = std::process::Command::new("losetup").args(["--find", "--show"]).arg(file).output().unwrap();
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        Loop(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }
}
impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn disk(volume: &str, fd: OwnedFd) -> Attach {
    Attach { volume: volume.into(), serial: volume.into(), kind: DeviceKind::Disk, readonly: false, source: Source::Fd(fd) }
}

#[test]
fn auto_accelerator_never_picks_kvm_pvm() {
    let choice = accel::resolve(Accel::Auto);
    eprintln!("auto accelerator here: {} ({})", choice.accel, choice.reason);
    // On the project's machines /dev/kvm is kvm_pvm: auto must end up on TCG and say why. On a
    // host with a usable KVM (no kvm_pvm, /dev/kvm opens) it must pick KVM; anything else is TCG.
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    let kvm_opens = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
    let want = if kvm_opens && !pvm { Resolved::Kvm } else { Resolved::Tcg };
    assert_eq!(choice.accel, want, "{}", choice.reason);
    if pvm && kvm_opens {
        assert!(choice.reason.contains("kvm_pvm"), "says why: {}", choice.reason);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boots_to_ready_and_hotplugs_file_and_loop_by_fd() {
    let mut vm = TestVm::boot().await;
    // Hot-plug by fd works with QEMU under its seccomp filter (mode 2) and in its own session.
    let status = std::fs::read_to_string(format!("/proc/{}/status", vm.process.pid)).unwrap();
    assert!(status.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Seccomp:", "2"]), "QEMU is not sandboxed: {status}");
    assert_eq!(
        rustix::process::getsid(rustix::process::Pid::from_raw(vm.process.pid)).ok(),
        rustix::process::Pid::from_raw(vm.process.pid)
    );
    let dir = tempfile::tempdir().unwrap();
    let file = image(dir.path(), "file.img", b"VP-FILE-DISK-001", 8 << 20);
    let backing = image(dir.path(), "loop.img", b"VP-LOOP-DISK-002", 16 << 20);
    let lo = Loop::new(&backing);

    vm.machine.attach(disk("vol-file", open(&file, true))).await.unwrap();
    let plugged = vm.see("the file disk", |l| l.starts_with("BLOCK+") && l.contains("id=serial.vol-file")).await;
    let f: Vec<&str> = plugged.split_whitespace().collect();
    assert_eq!((f[2], f[3]), ("16384", hex(b"VP-FILE-DISK-001").as_str()), "{plugged}");
    assert_eq!(vm.qemu_fds_on(&file), 1, "QEMU holds exactly one fd on the image");

    vm.machine.attach(disk("vol-loop", open(&lo.0, true))).await.unwrap();
    let plugged_loop = vm.see("the loop disk", |l| l.starts_with("BLOCK+") && l.contains("id=serial.vol-loop")).await;
    let l: Vec<&str> = plugged_loop.split_whitespace().collect();
    assert_eq!((l[2], l[3]), ("32768", hex(b"VP-LOOP-DISK-002").as_str()), "{plugged_loop}");

    let attached: Vec<String> = vm.machine.attached().await.unwrap().into_iter().map(|a| a.volume).collect();
    assert_eq!(attached, ["vol-file", "vol-loop"]);

    for (volume, line) in [("vol-file", &plugged), ("vol-loop", &plugged_loop)] {
        let dev = line.split_whitespace().nth(1).unwrap().to_owned();
        vm.machine.detach(volume).await.unwrap();
        vm.see("the unplug", |l| l.starts_with(&format!("BLOCK- {dev} "))).await;
    }
    assert_eq!(vm.qemu_fds_on(&file), 0, "unplug closed QEMU's fd on the image");
    assert!(vm.machine.attached().await.unwrap().is_empty());

    // By path (bind-mount mode): QEMU opens the file itself.
    let by_path = image(dir.path(), "path.img", b"VP-PATH-DISK-003", 4 << 20);
    vm.machine.attach(Attach { source: Source::Path(by_path.clone()), ..disk("vol-path", open(&file, true)) }).await.unwrap();
    let line = vm.see("the disk attached by path", |l| l.starts_with("BLOCK+") && l.contains("id=serial.vol-path")).await;
    assert!(line.contains(&hex(b"VP-PATH-DISK-003")), "{line}");
    // Boot order for the next boot is a property of the device.
    vm.machine.set_bootindex("vp-vol-path", 5).await.unwrap();
    let idx = vm.machine.execute("qom-get", json!({"path": "/machine/peripheral/vp-vol-path", "property": "bootindex"})).await.unwrap();
    assert_eq!(idx, json!(5));
    vm.machine.detach("vol-path").await.unwrap();
    vm.see("the path disk unplugged", |l| l.starts_with("BLOCK- ")).await;

    // Plugging the same volume again proves the unplug cleaned up (node, fdset, device).
    vm.machine.attach(disk("vol-file", open(&file, true))).await.unwrap();
    vm.see("the file disk again", |l| l.starts_with("BLOCK+") && l.contains("id=serial.vol-file")).await;
    vm.machine.detach("vol-file").await.unwrap();
    vm.see("the second unplug", |l| l.starts_with("BLOCK- ")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdrom_insert_swap_eject_on_an_empty_sata_drive() {
    let mut vm = TestVm::boot().await;
    vm.see("the empty drive", |l| l == "MEDIA sr0 out" || l.starts_with("MEDIA sr0 out ")).await;
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.iso", b"VP-CDROM-MEDIUMA", 4 << 20);
    let b = image(dir.path(), "b.iso", b"VP-CDROM-MEDIUMB", 6 << 20);

    vm.machine.insert_medium("cd0", "iso-a", Source::Fd(open(&a, false))).await.unwrap();
    let line = vm.see("medium A", |l| l.starts_with("MEDIA sr0 in ")).await;
    assert!(line.contains(&hex(b"VP-CDROM-MEDIUMA")), "{line}");

    vm.machine.insert_medium("cd0", "iso-b", Source::Fd(open(&b, false))).await.unwrap();
    let line = vm.see("medium B", |l| l.starts_with("MEDIA sr0 in ") && l.contains(&hex(b"VP-CDROM-MEDIUMB"))).await;
    assert!(line.contains(&hex(b"VP-CDROM-MEDIUMB")));
    assert_eq!(vm.qemu_fds_on(&a), 0, "the swapped-out medium is closed");

    vm.machine.eject("cd0").await.unwrap();
    vm.see("the eject", |l| l.starts_with("MEDIA sr0 out")).await;
    assert_eq!(vm.qemu_fds_on(&b), 0);
    let drives = vm.machine.drives().await.unwrap();
    assert_eq!(drives.iter().find(|d| d.id == "cd0").unwrap().medium_node, None);
    // A read-write fd for a medium is refused before QEMU sees it.
    let e = vm.machine.insert_medium("cd0", "iso-a", Source::Fd(open(&a, true))).await.unwrap_err();
    assert!(matches!(e, OpError::FdMode { .. }), "{e}");
    let e = vm.machine.insert_medium("nodrive", "iso-a", Source::Fd(open(&a, false))).await.unwrap_err();
    assert!(e.to_string().contains("CD-ROM drive nodrive does not exist"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_disks_attached_concurrently_then_all_detached() {
    let mut vm = TestVm::boot().await;
    let dir = tempfile::tempdir().unwrap();
    let vols: Vec<(String, PathBuf)> = (0..16)
        .map(|i| {
            let marker: [u8; 16] = *format!("VP-MULTI-DISK-{i:02}").as_bytes().first_chunk().unwrap();
            (format!("multi-{i:02}"), image(dir.path(), &format!("m{i}.img"), &marker, 4 << 20))
        })
        .collect();
    let m = &vm.machine;
    futures::future::try_join_all(vols.iter().map(|(v, p)| m.attach(disk(v, open(p, true))))).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 16 {
        let line = vm.see("16 disks", |l| l.starts_with("BLOCK+")).await;
        seen.insert(line.split("id=serial.").nth(1).unwrap().split_whitespace().next().unwrap().to_owned());
    }
    assert_eq!(seen, vols.iter().map(|(v, _)| v.clone()).collect());
    let m = &vm.machine;
    futures::future::try_join_all(vols.iter().map(|(v, _)| m.detach(v))).await.unwrap();
    for _ in 0..16 {
        vm.see("16 unplugs", |l| l.starts_with("BLOCK-")).await;
    }
    assert!(vm.machine.attached().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_sees_what_was_attached() {
    let mut vm = TestVm::boot().await;
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", b"VP-REATTACH-00A!", 4 << 20);
    let b = image(dir.path(), "b.img", b"VP-REATTACH-00B!", 4 << 20);
    vm.machine.attach(disk("keep-a", open(&a, true))).await.unwrap();
    vm.machine.attach(Attach { readonly: true, ..disk("keep-b", open(&b, false)) }).await.unwrap();
    vm.see("disk b", |l| l.contains("id=serial.keep-b")).await;
    let before = vm.machine.attached().await.unwrap();
    let socket = vm.process.run_dir.join("qmp.sock");
    // A second client gets no greeting while the first is connected (QEMU serves one at a time).
    let e = Qmp::connect(&socket).await.err().expect("a second client is refused");
    assert!(e.to_string().contains("another QMP client"), "{e}");
    // Drop the client (as a restarted agent would have lost it), then attach a new one.
    vm.machine.close();
    vm.machine = Machine::new(Qmp::connect(&socket).await.unwrap());
    let after = vm.machine.attached().await.unwrap();
    assert_eq!(before, after);
    assert_eq!(after.iter().map(|a| (a.volume.as_str(), a.readonly)).collect::<Vec<_>>(), [("keep-a", false), ("keep-b", true)]);
    // Attach is idempotent: re-attaching an attached volume changes nothing.
    vm.machine.attach(disk("keep-a", open(&a, true))).await.unwrap();
    assert_eq!(vm.machine.attached().await.unwrap(), after);
}

/// A caller that keeps the inventory itself (the node agent, between passes) derives it from
/// its successful plugs and unplugs; what it derives is what QEMU answers, field for field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inventory_derived_from_plugs_and_unplugs_is_what_qemu_answers() {
    let vm = TestVm::boot().await;
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", b"VP-DERIVED-DSK-A", 4 << 20);
    let b = image(dir.path(), "b.img", b"VP-DERIVED-DSK-B", 4 << 20);
    let mut derived = vm.machine.inventory().await.unwrap();
    vm.machine.attach(disk("der-a", open(&a, true))).await.unwrap();
    derived.plugged("der-a", DeviceKind::Disk, false);
    vm.machine.attach(Attach { readonly: true, ..disk("der-b", open(&b, false)) }).await.unwrap();
    derived.plugged("der-b", DeviceKind::Disk, true);
    assert_eq!(vm.machine.inventory().await.unwrap(), derived, "after two plugs");
    assert_eq!(derived.attached.len(), 2, "{derived:?}");
    vm.machine.detach("der-a").await.unwrap();
    derived.unplugged("der-a");
    assert_eq!(vm.machine.inventory().await.unwrap(), derived, "after an unplug");
    assert!(!derived.has_device("der-a") && !derived.has_node(&node_name("der-a")) && derived.has_device("der-b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_typed_and_qemu_keeps_running() {
    let vm = TestVm::boot().await;
    let q = &vm.machine;
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "e.img", b"VP-ERRORS-000000", 4 << 20);

    // Detach of an unknown device: the raw command is a typed DeviceNotFound; the operation is
    // idempotent and reports nothing to do.
    let e = q.execute("device_del", json!({"id": "vp-nothing"})).await.unwrap_err();
    assert_eq!(e.class(), Some("DeviceNotFound"), "{e}");
    assert!(e.to_string().contains("device_del on vp-nothing failed"), "{e}");
    vm.machine.detach("nothing").await.unwrap();

    // Duplicate device id.
    vm.machine.attach(disk("dup", open(&img, true))).await.unwrap();
    let e = q
        .execute("device_add", json!({"driver": "scsi-hd", "id": "vp-dup", "bus": "hotplug-scsi.0", "drive": node_name("dup")}))
        .await
        .unwrap_err();
    assert!(matches!(&e, QmpError::Command { class, desc, .. } if class == "GenericError" && desc.contains("Duplicate")), "{e}");

    // A closed fd: the fdset's only fd was removed (closed in QEMU) before blockdev-add.
    let r = q.execute_with_fd("add-fd", json!({}), std::os::fd::AsFd::as_fd(&open(&img, true))).await.unwrap();
    let set = r["fdset-id"].as_i64().unwrap();
    q.execute("remove-fd", json!({"fdset-id": set})).await.unwrap();
    let e = q
        .execute(
            "blockdev-add",
            json!({"node-name": "closed", "driver": "raw", "file": {"driver": "file", "filename": format!("/dev/fdset/{set}")}}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.class(), Some("GenericError"), "{e}");
    assert!(e.to_string().contains("blockdev-add on closed failed"), "{e}");

    // A read-write attach of a read-only fd is refused with the fix in the message.
    let e = vm.machine.attach(disk("ro", open(&img, false))).await.unwrap_err();
    assert!(matches!(e, OpError::FdMode { have: "read-only", want: "read-write", .. }), "{e}");
    assert!(e.to_string().contains("open it read-write"), "{e}");

    // A LUN needs a block device.
    let e = vm.machine.attach(Attach { kind: DeviceKind::Lun, ..disk("lun", open(&img, true)) }).await.unwrap_err();
    assert!(matches!(e, OpError::LunNeedsBlock { .. }), "{e}");

    // A LUN on a block device that does not speak SCSI (a loop device): QEMU's scsi-block
    // refuses it; the error names the step and carries QEMU's reason.
    let lo = Loop::new(&img);
    let e = vm.machine.attach(Attach { kind: DeviceKind::Lun, ..disk("lun-loop", open(&lo.0, true)) }).await.unwrap_err();
    assert!(e.to_string().contains("failed at device_add"), "{e}");
    assert!(e.qmp().and_then(QmpError::desc).is_some_and(|d| d.contains("SG_IO")), "QEMU's reason is kept: {e:?}");
    assert!(vm.machine.attached().await.unwrap().iter().all(|a| a.volume != "lun-loop"), "the failed attach left nothing behind");

    let status = q.execute("query-status", json!({})).await.unwrap();
    assert_eq!(status["status"], "running", "QEMU keeps running after every error");
    assert!(vm.process.alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_has_a_deadline_then_force() {
    let vm = TestVm::boot().await;
    // The test guest has no ACPI power-button handler: the graceful attempt must time out.
    let done = vm.machine.powerdown(Duration::from_secs(2)).await.unwrap();
    assert!(!done);
    vm.machine.quit().await;
    assert!(vm.process.wait_gone(Duration::from_secs(10)).await, "QEMU exited after quit");
    assert!(!vm.process.alive());
}

/// The bootable ISO of the test guest boots from a `sata` CD-ROM with `bootindex` 1 (what
/// Redfish boot-from-virtual-media relies on later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_iso_boots_from_the_sata_cdrom() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = launch_spec(dir.path());
    spec.kernel = None;
    spec.cdrom_drives = vec![CdromDrive { id: "cd0".into(), bootindex: Some(1), medium: Some(guest_dir().join("guest.iso").into()) }];
    let mut vm = TestVm::start(&spec, dir).await;
    let line = vm.see("the boot medium", |l| l.starts_with("MEDIA sr0 in ")).await;
    assert!(line.contains(&"0".repeat(32)), "an ISO 9660 medium starts with a zeroed system area: {line}");
}

/// An attach or detach whose caller died between two QMP commands (a node agent killed
/// mid-way) leaves an fd set or a block node without its device, each holding its image open:
/// `remove_stale_fdsets` removes exactly the stale sets, `inventory` lists the device-less node
/// and `remove_node` lets go of it; the attached volume and its image are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_attach_leaves_nothing_once_its_fd_sets_and_device_less_node_are_removed() {
    let vm = TestVm::boot().await;
    let dir = tempfile::tempdir().unwrap();
    let kept = image(dir.path(), "kept.img", b"VP-SWEEP-KEPT-01", 4 << 20);
    let set_only = image(dir.path(), "set.img", b"VP-SWEEP-FDSET-1", 4 << 20);
    let node_only = image(dir.path(), "node.img", b"VP-SWEEP-NODE-01", 4 << 20);
    let q = &vm.machine;
    vm.machine.attach(disk("kept", open(&kept, true))).await.unwrap();
    // Killed after add-fd, before blockdev-add: an fd set nobody removes.
    let fd = open(&set_only, true);
    q.execute_with_fd("add-fd", json!({"opaque": "virtplug:set"}), std::os::fd::AsFd::as_fd(&fd)).await.unwrap();
    drop(fd);
    // Killed after blockdev-add, before remove-fd and device_add: a node and its fd set.
    let fd = open(&node_only, true);
    let r = q.execute_with_fd("add-fd", json!({"opaque": "virtplug:node"}), std::os::fd::AsFd::as_fd(&fd)).await.unwrap();
    drop(fd);
    let set = r["fdset-id"].as_i64().unwrap();
    q.execute(
        "blockdev-add",
        json!({"node-name": node_name("node"), "driver": "raw", "file": {"driver": "file", "filename": format!("/dev/fdset/{set}")}}),
    )
    .await
    .unwrap();
    assert!(vm.qemu_fds_on(&set_only) >= 1 && vm.qemu_fds_on(&node_only) >= 1, "the leftovers hold their images");

    assert_eq!(vm.machine.remove_stale_fdsets().await.unwrap().len(), 2, "both stale fd sets");
    assert_eq!(vm.qemu_fds_on(&set_only), 0, "QEMU let go of the image of the set alone");
    assert!(vm.qemu_fds_on(&node_only) >= 1, "the node keeps its own dup until it goes");
    let Inventory { attached, nodes } = vm.machine.inventory().await.unwrap();
    assert_eq!(attached.iter().map(|a| a.volume.as_str()).collect::<Vec<_>>(), ["kept"]);
    assert_eq!(nodes, [node_name("kept"), node_name("node")], "the device-less node is listed");
    vm.machine.remove_node(&node_name("node")).await.unwrap();
    assert_eq!(vm.qemu_fds_on(&node_only), 0, "QEMU let go of the node's image");
    assert_eq!(vm.qemu_fds_on(&kept), 1, "the attached volume keeps its image");
    assert!(vm.machine.remove_stale_fdsets().await.unwrap().is_empty(), "nothing stale is left");
}

/// `run_as`: QEMU drops to `nobody` after start-up (its sandbox then allows its own setuid, and
/// still forbids exec), and hot-plug by fd works unchanged: the fd was opened by us, as root.
/// Its restricted user-mode network still forwards a guest port from the loopback port QEMU
/// reports (the guest answers on it, `vp.net`).
#[tokio::test]
async fn a_qemu_dropped_to_nobody_still_hotplugs_by_fd() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: dropping QEMU to another user needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut spec = launch_spec(dir.path());
    spec.run_as = Some("nobody".into());
    let mac = api::network::Mac([2, 0, 0, 0, 0, 0x42]);
    spec.nics = vec![qemu::nic::Nic { device: "virtio-net-pci", mac, forwards: vec![(api::network::Protocol::Tcp, 8022)], restrict: true }];
    if let Some(k) = spec.kernel.as_mut() {
        k.cmdline.push_str(" vp.net=8022");
    }
    let mut vm = TestVm::start(&spec, dir).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", vm.process.pid)).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(uid.split_whitespace().skip(1).all(|u| u != "0"), "QEMU still runs as root: {uid}");
    assert!(status.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Seccomp:", "2"]), "QEMU is not sandboxed");

    let images = tempfile::tempdir().unwrap();
    let file = image(images.path(), "root-only.img", b"VP-NOBODY-DISK-1", 8 << 20);
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    vm.machine.attach(disk("vol-nobody", open(&file, true))).await.unwrap();
    let plugged =
        vm.see("the disk QEMU could not have opened itself", |l| l.starts_with("BLOCK+") && l.contains("id=serial.vol-nobody")).await;
    assert!(plugged.contains(&hex(b"VP-NOBODY-DISK-1")), "{plugged}");

    // Printed before VP-READY, which `start` waited for.
    let seen: Vec<&str> = vm.console.seen.iter().map(|l| l.text.as_str()).collect();
    assert!(seen.contains(&"VP-NET mac=02:00:00:00:00:42"), "the guest's NIC has the MAC: {seen:?}");
    let fw = qemu::nic::host_forwards(&vm.machine).await.unwrap();
    assert_eq!(fw.iter().map(|f| (f.netdev.as_str(), f.guest_port)).collect::<Vec<_>>(), [("net0", 8022)], "{fw:?}");
    let addr = format!("127.0.0.1:{}", fw[0].host_port);
    let deadline = std::time::Instant::now() + SEE;
    let answer = loop {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
            let _ = tokio::time::timeout(Duration::from_secs(1), s.read_to_string(&mut text)).await;
        }
        if !text.is_empty() {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "no answer from the guest on {addr} within {SEE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer.trim_end(), "VP-NET hello mac=02:00:00:00:00:42");
    vm.process.kill().await;
}
