//! The launcher of a launcher pod (`virtplug launcher`, this build's binary) with the node
//! agent's side of it (`qemu::process::launch_with`, `adopt`, `Process::kill`: the calls the
//! agent makes with `--launcher-pods`), real QEMU under TCG and the test guest.
//!
//! STAND-IN (no container runtime here): the pod is `unshare --pid --fork --mount-proc
//! --kill-child virtplug launcher ...`, so the launcher is PID 1 of a PID namespace of its own,
//! as a pod's main process is, and QEMU's PID there (its pidfile) is not its PID here. Killing
//! `unshare` (the test's end, pass or fail) kills the launcher (`--kill-child`) and with it every
//! process of the namespace, QEMU included.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qemu::accel::Resolved;
use qemu::cmdline::{BootDisk, DiskSource, KernelBoot, LaunchSpec};
use qemu::process::{Process, Starter};

/// Boot to the guest's first line, on a loaded 2-core machine under TCG.
const BOOT: Duration = Duration::from_secs(120);
const T: Duration = Duration::from_secs(30);

/// A launcher pod stand-in: the launcher in a PID namespace of its own, its log in `launcher.log`.
struct Pod {
    unshare: Child,
    dir: tempfile::TempDir,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

impl Pod {
    fn start(grace_seconds: u64) -> Pod {
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("launcher.log")).unwrap();
        let run = dir.path().join("run");
        let unshare = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child", env!("CARGO_BIN_EXE_virtplug"), "launcher", "--uid", "u1"])
            .arg("--run-dir")
            .arg(&run)
            .args(["--grace-period-seconds", &grace_seconds.to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("unshare starts");
        Pod { unshare, dir }
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("launcher.log")).unwrap_or_default()
    }

    /// The agent's launch through this pod's launcher, once it listens.
    async fn launch(&self, kernel_args: Option<&str>) -> Process {
        self.launch_spec(&spec(&self.run_dir(), kernel_args), Vec::new()).await
    }

    /// The agent's launch of `spec` through this pod's launcher, once it listens, with
    /// `inherited` (the boot disks' fds) for QEMU.
    async fn launch_spec(&self, spec: &LaunchSpec, inherited: Vec<std::os::fd::OwnedFd>) -> Process {
        let sock = self.run_dir().join(qemu::launcher::SOCKET);
        common::wait_until(T, "the launcher to listen", || {
            let there = sock.exists();
            async move { there.then_some(()) }
        })
        .await;
        let connection = qemu::launcher::Connection::open(&sock).await.unwrap();
        qemu::process::launch_with(spec, Starter::Launcher { connection, inherited }).await.unwrap()
    }

    /// Waits until the pod's process has exited; its exit code.
    async fn exit_code(&mut self, deadline: Duration, what: &str) -> i32 {
        let child = &mut self.unshare;
        common::wait_until(deadline, what, || {
            let status = child.try_wait().unwrap();
            async move { status }
        })
        .await
        .code()
        .unwrap_or(-1)
    }
}

/// The VM: the test guest (`kernel_args` added to its command line), or SeaBIOS alone without
/// them (nothing to boot: no guest to answer the power button, nothing to wait for).
fn spec(run_dir: &Path, kernel_args: Option<&str>) -> LaunchSpec {
    let g = common::guest::guest_dir();
    LaunchSpec {
        name: "default_launched".into(),
        run_dir: run_dir.to_owned(),
        memory_mib: 256,
        vcpus: 1,
        accel: Resolved::Tcg,
        kernel: kernel_args.map(|extra| KernelBoot {
            kernel: g.join("vmlinuz"),
            initrd: Some(g.join("initramfs.cpio.gz")),
            cmdline: format!("console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable {extra}"),
        }),
        boot_disks: vec![],
        cdrom_drives: vec![],
        nics: Vec::new(),
        own_mount_namespace: false,
        sandbox: true,
        run_as: None,
        firmware: qemu::Firmware::Bios,
        start_paused: false,
    }
}

/// The parent PID of `pid` (from `/proc/PID/stat`; comm may hold spaces, so counted from its
/// closing parenthesis).
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 2..].split(' ').nth(1).unwrap().parse().unwrap()
}

fn cmdline(pid: i32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()).replace('\0', " ")
}

async fn console_line(run_dir: &Path, line: &str, deadline: Duration) {
    let log = run_dir.join("serial.log");
    common::wait_until(deadline, &format!("{line:?} on the guest's console"), || {
        let seen = common::guest::console_lines(&log).iter().any(|l| l == line || l.starts_with(&format!("{line} ")));
        async move { seen.then_some(()) }
    })
    .await;
}

/// The launched QEMU as the agent knows it: its PID here, not the pidfile's (the pod's PID
/// namespace), its parent the launcher; adoption (an agent restarted) finds the same PID.
fn assert_agent_sees_qemu(p: &Process, run_dir: &Path) -> i32 {
    let in_pod: i32 = std::fs::read_to_string(run_dir.join("qemu.pid")).unwrap().trim().parse().unwrap();
    assert_ne!(in_pod, p.pid, "the pidfile holds QEMU's PID in the pod's namespace, the agent uses its own");
    assert!(cmdline(p.pid).contains(&run_dir.join("qemu.pid").display().to_string()), "PID {} is this VM's QEMU", p.pid);
    let launcher = parent_of(p.pid);
    assert!(cmdline(launcher).contains(" launcher --uid u1 "), "QEMU's parent is the launcher: {}", cmdline(launcher));
    let adopted = qemu::process::adopt(run_dir).unwrap();
    assert_eq!(adopted.pid, p.pid, "adoption finds QEMU by its QMP socket's peer, not by the pidfile");
    assert!(adopted.alive());
    launcher
}

fn sigterm(pid: i32) {
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), rustix::process::Signal::TERM).unwrap();
}

/// The pod deleted (SIGTERM to the launcher): the guest is asked through the ACPI power button,
/// powers itself off (its own line on the console), QEMU exits 0, and the launcher with it —
/// long before the grace period (60 s) is over.
#[tokio::test(flavor = "current_thread")]
async fn sigterm_powers_the_guest_off_through_its_power_button() {
    if !common::guest::is_root() {
        eprintln!("skipped: a PID namespace needs root");
        return;
    }
    let grace = Duration::from_secs(60);
    let mut pod = Pod::start(grace.as_secs());
    let p = pod.launch(Some("vp.acpi=1")).await;
    let run = pod.run_dir();
    let launcher = assert_agent_sees_qemu(&p, &run);
    console_line(&run, "VP-ACPI armed", BOOT).await;
    let asked = Instant::now();
    sigterm(launcher);
    console_line(&run, "VP-POWERDOWN", T).await;
    let code = pod.exit_code(T, "the launcher to exit with QEMU").await;
    assert_eq!(code, 0, "QEMU exits 0 when its guest powers off: {}", pod.log());
    assert!(asked.elapsed() < grace, "the guest's own power-off, not the grace's end");
    assert!(!p.alive());
    let log = pod.log();
    assert!(log.contains("asking the guest of QEMU") && !log.contains("did not power off"), "{log}");
}

/// A guest that ignores the power button (the test guest without `vp.acpi=1`) is stopped once
/// the grace period is over — not before, and promptly after (measured against deadlines).
#[tokio::test(flavor = "current_thread")]
async fn a_guest_ignoring_the_button_is_stopped_after_the_grace_period() {
    if !common::guest::is_root() {
        eprintln!("skipped: a PID namespace needs root");
        return;
    }
    let grace = Duration::from_secs(3);
    let mut pod = Pod::start(grace.as_secs());
    let p = pod.launch(Some("")).await;
    let run = pod.run_dir();
    let launcher = assert_agent_sees_qemu(&p, &run);
    console_line(&run, "VP-READY", BOOT).await;
    let asked = Instant::now();
    sigterm(launcher);
    let code = pod.exit_code(grace + T, "the launcher to stop QEMU after the grace period").await;
    let took = asked.elapsed();
    assert!(took >= grace, "QEMU was stopped after {took:?}, before the grace period ({grace:?}) was over");
    assert!(took < grace + qemu::process::QUIT_DEADLINE, "QEMU quit on SIGTERM, no SIGKILL needed ({took:?})");
    assert_eq!(code, 0, "QEMU quits cleanly on SIGTERM: {}", pod.log());
    let log = pod.log();
    assert!(log.contains("did not power off within its grace period"), "{log}");
    let console = common::guest::console_lines(&run.join("serial.log"));
    assert!(!console.iter().any(|l| l.contains("VP-POWERDOWN")), "this guest ignores the button");
}

/// The agent restarted finds a launcher pod's QEMU by its QMP socket's peer (its pidfile names a
/// PID of the pod's namespace) and stops it by that PID; the launcher exits with QEMU's status
/// (killed: 128 + 9).
#[tokio::test(flavor = "current_thread")]
async fn the_agent_adopts_and_kills_qemu_in_a_pid_namespace() {
    if !common::guest::is_root() {
        eprintln!("skipped: a PID namespace needs root");
        return;
    }
    let mut pod = Pod::start(30);
    let launched = pod.launch(None).await;
    let run = pod.run_dir();
    assert_agent_sees_qemu(&launched, &run);
    let adopted = qemu::process::adopt(&run).unwrap();
    adopted.kill().await;
    assert!(!launched.alive(), "QEMU is gone");
    assert_eq!(pod.exit_code(T, "the launcher to exit with QEMU").await, 137, "{}", pod.log());
}

/// Boot disks as fds (issue 19): the agent's fds of two images (one read-write, one read-only
/// with a read-only fd) go to the launcher with the request; QEMU inherits them at 3 and 4, in
/// fd sets 0 and 1 (`virtplug-boot:` opaque) that an agent's stale-set cleanup leaves alone; no
/// image path is on QEMU's command line, and the guest reads each disk's first bytes.
#[tokio::test(flavor = "current_thread")]
async fn boot_disks_reach_qemu_as_fds_the_launcher_hands_it() {
    if !common::guest::is_root() {
        eprintln!("skipped: a PID namespace needs root");
        return;
    }
    let pod = Pod::start(1);
    let images = tempfile::tempdir().unwrap();
    let image = |name: &str, head: &[u8; 16], mib: u64| {
        let path = images.path().join(name);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(mib << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, head, 0).unwrap();
        path
    };
    let (a, b) = (image("a.img", b"VP-BOOT-DISK-A-1", 4), image("b.img", b"VP-BOOT-DISK-B-2", 2));
    let rw: std::os::fd::OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open(&a).unwrap().into();
    let ro: std::os::fd::OwnedFd = std::fs::File::open(&b).unwrap().into();
    let mut spec = spec(&pod.run_dir(), Some(""));
    let disk = |id: &str, n: u32, readonly: bool| BootDisk {
        id: id.into(),
        source: DiskSource::Inherited { index: n, block: false },
        readonly,
        sata: false,
        bootindex: None,
        serial: None,
    };
    spec.boot_disks = vec![disk("a", 0, false), disk("b", 1, true)];
    let p = pod.launch_spec(&spec, vec![rw, ro]).await;
    let run = pod.run_dir();

    let args = cmdline(p.pid);
    assert!(!args.contains(&images.path().display().to_string()), "no image path on QEMU's command line: {args}");
    assert!(
        args.contains("-add-fd fd=3,set=0,opaque=virtplug-boot:a") && args.contains("-add-fd fd=4,set=1,opaque=virtplug-boot:b"),
        "{args}"
    );
    let inode = |path: &Path| {
        let m = std::fs::metadata(path).unwrap();
        (std::os::unix::fs::MetadataExt::dev(&m), std::os::unix::fs::MetadataExt::ino(&m))
    };
    let held: Vec<(u64, u64)> = std::fs::read_dir(format!("/proc/{}/fd", p.pid)).unwrap().flatten().map(|fd| inode(&fd.path())).collect();
    assert!(held.contains(&inode(&a)) && held.contains(&inode(&b)), "QEMU holds both images");

    let log = run.join("serial.log");
    let disks = common::wait_until(BOOT, "the guest to report both disks (BLOCK+ on its console)", || {
        let disks: Vec<String> = common::guest::console_lines(&log).into_iter().filter(|l| l.starts_with("BLOCK+ ")).collect();
        async move { (disks.len() >= 2).then_some(disks) }
    })
    .await;
    let hex = |h: &[u8]| h.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for (sectors, head) in [("8192", hex(b"VP-BOOT-DISK-A-1")), ("4096", hex(b"VP-BOOT-DISK-B-2"))] {
        assert!(
            disks.iter().any(|l| l.split_whitespace().nth(2) == Some(sectors) && l.split_whitespace().nth(3) == Some(head.as_str())),
            "a {sectors}-sector disk starting {head}: {disks:?}"
        );
    }

    // QEMU's fd sets: the two boot sets; an agent's cleanup after a takeover removes neither.
    let machine = qemu::Machine::new(qemu::qmp::Qmp::connect_within(&run.join("qmp.sock"), T).await.unwrap());
    assert!(machine.remove_stale_fdsets().await.unwrap().is_empty(), "boot sets are not stale hot-plug sets");
    let sets = machine.execute("query-fdsets", serde_json::json!({})).await.unwrap();
    let mut opaques: Vec<(i64, String)> = sets
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            let id = s["fdset-id"].as_i64().unwrap();
            s["fds"].as_array().cloned().unwrap_or_default().into_iter().filter_map(move |f| Some((id, f["opaque"].as_str()?.to_owned())))
        })
        .collect();
    opaques.sort();
    assert_eq!(opaques, [(0, "virtplug-boot:a".to_owned()), (1, "virtplug-boot:b".to_owned())], "set n holds inherited fd n: {sets}");
}
