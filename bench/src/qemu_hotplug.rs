//! The floor that end-to-end hot-plug is compared against: QEMU alone, driven by the `qemu`
//! crate, measured from the host against the test guest's own reports (TCG on this machine).
//!
//! - VM start → `VP-READY` (exec of QEMU to the guest's ready line);
//! - QMP round trip (`query-status`);
//! - attach (add-fd, blockdev-add, remove-fd, device_add against an inventory asked before) →
//!   guest `SEEN` (detection, no fork in the guest before it) and → `BLOCK+` (after the guest
//!   read size, first bytes and serial);
//! - detach started (`device_del` against an inventory asked before) → guest `BLOCK-` line, and
//!   → detach complete (DEVICE_DELETED, blockdev-del).
//!
//! Every wait has a deadline: a boot (`--boot-deadline`; a guest that misses it is reported with
//! the last 30 lines of its console and booted once more in a fresh QEMU, a second miss fails
//! the run), each guest report (10 s; fleet mode: `--converge-deadline`), each QMP command (the
//! `qemu` crate's). SIGTERM or SIGINT stops the run and kills its QEMUs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use qemu::accel::Resolved;
use qemu::cmdline::{CdromDrive, KernelBoot, LaunchSpec};
use qemu::console::{Console, Line, Missed};
use qemu::qmp::Qmp;
use qemu::{Attach, DeviceKind, Machine, Source};
use virtplug_bench::cputime::cpu_seconds;
use virtplug_bench::waits::{boot_deadline, console_tail, secs, stop_signal, TAIL_LINES};
use virtplug_bench::{FLEET_MEMORY_MIB, GUEST_KERNEL_ARGS};

#[derive(Parser, Clone)]
struct Args {
    /// The test guest (scripts/build-test-guest.sh).
    #[arg(long, default_value = ".cache/guest")]
    guest: PathBuf,
    #[arg(long, default_value_t = 50)]
    runs: usize,
    #[arg(long, default_value_t = 5)]
    boots: usize,
    #[arg(long, default_value = "tcg")]
    accel: String,
    /// Also measure what an idle guest costs the host: QEMU's CPU time (utime + stime) over this
    /// many seconds after `VP-READY`, with nothing plugged (0 skips it).
    #[arg(long, default_value_t = 0)]
    idle_seconds: u64,
    /// Fleet mode (P2's floor): boot this many VMs and plug `--fleet-volumes` volumes into each
    /// directly over QMP, all VMs at once, then unplug them; no control plane.
    #[arg(long, default_value_t = 0)]
    fleet_vms: usize,
    #[arg(long, default_value_t = 8)]
    fleet_volumes: usize,
    /// The measured VM's memory (MiB); `hotplug-e2e` passes its P1 VM's.
    #[arg(long, default_value_t = 256)]
    memory_mib: u64,
    /// Fleet mode: the guests' memory (MiB), P2's by default.
    #[arg(long, default_value_t = FLEET_MEMORY_MIB)]
    fleet_memory_mib: u64,
    /// Run QEMU under its seccomp sandbox, as the node agent does (`--sandbox false` measures
    /// what the sandbox costs).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    sandbox: bool,
    /// Seconds a guest may take from QEMU's start to `VP-READY`; 0: 120 s + 8 s per guest
    /// booting at once (fleet mode: all of them; else 1). A guest that misses it is reported with
    /// its console tail and booted once more in a fresh QEMU; a second miss fails the run.
    #[arg(long, default_value_t = 0)]
    boot_deadline: u64,
    /// The guest's kernel command line.
    #[arg(long, default_value = GUEST_KERNEL_ARGS)]
    kernel_args: String,
    /// Fleet mode: seconds every guest may take to report every disk of a plug (or unplug).
    #[arg(long, default_value_t = 120)]
    converge_deadline: u64,
}

/// How long the guest may take to report one hot-plug or unplug (one VM, nothing else running).
const SEE: Duration = Duration::from_secs(10);

struct Vm {
    label: String,
    run: PathBuf,
    process: qemu::process::Process,
    machine: Machine,
    console: Console,
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Kill only the QEMU this harness started, by PID (checked against its pidfile).
        if self.process.alive() {
            if let Some(pid) = rustix::process::Pid::from_raw(self.process.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

impl Vm {
    fn tail(&self) -> String {
        console_tail(&self.run.join("serial.log"), TAIL_LINES)
    }

    /// The next console line matching `pred`, within `deadline`; the error names `what` and
    /// shows the console's tail.
    async fn expect(&mut self, deadline: Duration, what: &str, pred: impl Fn(&str) -> bool) -> anyhow::Result<Line> {
        match self.console.next_matching(deadline, pred).await {
            Ok(l) => Ok(l),
            Err(Missed::Deadline(_)) => bail!("{}: the guest printed no {what} within {}\n{}", self.label, secs(deadline), self.tail()),
            Err(Missed::Closed) => bail!("{}: the console closed (QEMU exited) before {what}\n{}", self.label, self.tail()),
        }
    }
}

#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn stats(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "- | - | - | 0".to_owned();
    }
    v.sort_by(f64::total_cmp);
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    format!("{:.1} | {:.1} | {:.1} | {}", p(0.5), p(0.99), v[v.len() - 1], v.len())
}

/// Boots the test guest in `dir` and waits for `VP-READY` (ms since QEMU's start) within
/// `--boot-deadline`; on failure its QEMU is killed and the error carries its console tail.
async fn boot_once(args: &Args, label: &str, dir: &Path, memory_mib: u64) -> anyhow::Result<(Vm, f64)> {
    let spec = LaunchSpec {
        name: "bench".into(),
        run_dir: dir.to_owned(),
        memory_mib,
        vcpus: 1,
        accel: if args.accel == "kvm" { Resolved::Kvm } else { Resolved::Tcg },
        kernel: Some(KernelBoot {
            kernel: args.guest.join("vmlinuz"),
            initrd: Some(args.guest.join("initramfs.cpio.gz")),
            cmdline: args.kernel_args.clone(),
        }),
        boot_disks: vec![],
        cdrom_drives: vec![CdromDrive { id: "cd0".into(), bootindex: None, medium: None }],
        nics: Vec::new(),
        own_mount_namespace: false,
        sandbox: args.sandbox,
        run_as: None,
        firmware: qemu::Firmware::Bios,
        start_paused: false,
    };
    let start = Instant::now();
    let process = qemu::process::launch(&spec).await.with_context(|| format!("{label}: QEMU did not start"))?;
    // From here on a failure drops `vm` (or kills `process`), which kills this QEMU.
    let kill = |p: &qemu::process::Process| {
        if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    };
    let connected = async {
        let console = Console::connect(&spec.serial_socket(), Duration::from_secs(5)).await.context("its serial console")?;
        let qmp = Qmp::connect_within(&spec.qmp_socket(), Duration::from_secs(5)).await.context("QMP")?;
        anyhow::Ok((console, qmp))
    };
    let (console, qmp) = match connected.await {
        Ok(c) => c,
        Err(e) => {
            kill(&process);
            return Err(e.context(format!("{label}: cannot connect to its QEMU")));
        }
    };
    let mut vm = Vm { label: label.to_owned(), run: dir.to_owned(), process, machine: Machine::new(qmp), console };
    let deadline = boot_deadline(args.boot_deadline, args.fleet_vms.max(1));
    let ready = vm.expect(deadline, "VP-READY", |l| l.starts_with("VP-READY")).await?;
    Ok((vm, ready.at.duration_since(start).as_secs_f64() * 1000.0))
}

/// [`boot_once`], and once more in a fresh QEMU (run dir `DIR-retry`) if the first boot fails;
/// the failed attempt is reported (`retry: ...`, with its console tail).
async fn boot(args: &Args, label: &str, dir: &Path, memory_mib: u64) -> anyhow::Result<(Vm, f64)> {
    match boot_once(args, label, dir, memory_mib).await {
        Ok(b) => Ok(b),
        Err(first) => {
            println!("retry: {first:#}\n  → booting {label} once more in a fresh QEMU");
            let again = dir.with_file_name(format!("{}-retry", dir.file_name().and_then(|n| n.to_str()).unwrap_or("vm")));
            boot_once(args, label, &again, memory_mib).await.map_err(|e| anyhow::anyhow!("first attempt: {first:#}\n\nfresh QEMU: {e:#}"))
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    // QEMU runs in `/`: it gets absolute paths.
    let guest =
        args.guest.canonicalize().with_context(|| format!("no test guest at {} (scripts/build-test-guest.sh)", args.guest.display()))?;
    let args = &Args { guest, ..args.clone() };
    let tmp = tempfile::tempdir()?;
    if args.fleet_vms > 0 {
        return fleet(args, tmp.path()).await;
    }
    let mut boots = Vec::new();
    for i in 0..args.boots {
        let (vm, ms) = boot(args, &format!("boot {i}"), &tmp.path().join(format!("boot{i}")), args.memory_mib).await?;
        boots.push(ms);
        drop(vm);
    }
    let (mut vm, _) = boot(args, "the measured VM", &tmp.path().join("main"), args.memory_mib).await?;
    let idle = if args.idle_seconds > 0 {
        let c0 = cpu_seconds(vm.process.pid)?;
        tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
        #[allow(clippy::cast_precision_loss)]
        Some((cpu_seconds(vm.process.pid)? - c0) / args.idle_seconds as f64 * 100.0)
    } else {
        None
    };

    let mut rtt = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        vm.machine.execute("query-status", serde_json::json!({})).await?;
        rtt.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    let img = tmp.path().join("disk.img");
    {
        let mut f = std::fs::File::create(&img)?;
        f.write_all(b"VP-BENCH-DISK-01")?;
        f.set_len(8 << 20)?;
    }
    let (mut detect, mut plug, mut gone, mut detach_done) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut added = Vec::new();
    for i in 0..args.runs {
        let volume = format!("bench-{i}");
        let fd = std::fs::OpenOptions::new().read(true).write(true).open(&img)?;
        // As the node agent plugs: against what it knows QEMU holds (asked before the clock).
        let held = vm.machine.inventory().await?;
        let t = Instant::now();
        let a = Attach {
            volume: volume.clone(),
            serial: volume.clone(),
            kind: DeviceKind::Disk,
            readonly: false,
            source: Source::Fd(fd.into()),
        };
        let staged = vm.machine.stage_with(&held, a).await?;
        vm.machine.plug(staged).await?;
        added.push(t.elapsed().as_secs_f64() * 1000.0);
        let seen = vm.expect(SEE, &format!("SEEN for {volume}"), |l| l.starts_with("SEEN ")).await?;
        detect.push(seen.at.duration_since(t).as_secs_f64() * 1000.0);
        let want = format!("id=serial.{volume}");
        let line = vm.expect(SEE, &format!("BLOCK+ for {volume}"), |l| l.starts_with("BLOCK+") && l.contains(&want)).await?;
        plug.push(line.at.duration_since(t).as_secs_f64() * 1000.0);
        let dev = line.text.split_whitespace().nth(1).unwrap_or("sda").to_owned();

        // As the node agent unplugs: against the inventory it planned from (asked before the clock).
        let held = vm.machine.inventory().await?;
        let t = Instant::now();
        let detach = vm.machine.detach_with(&held, &volume);
        let see = vm.console.next_matching(SEE, |l| l.starts_with(&format!("BLOCK- {dev} ")));
        let (d, seen) = tokio::join!(detach, see);
        d?;
        detach_done.push(t.elapsed().as_secs_f64() * 1000.0);
        let seen = seen.map_err(|m| anyhow::anyhow!("the guest printed no BLOCK- {dev} for {volume} ({m})\n{}", vm.tail()))?;
        gone.push(seen.at.duration_since(t).as_secs_f64() * 1000.0);
    }
    println!("| measure (ms) | p50 | p99 | max | n |");
    println!("|---|---:|---:|---:|---:|");
    println!("| VM start → guest `VP-READY` | {} |", stats(boots));
    println!("| QMP round trip (`query-status`) | {} |", stats(rtt));
    println!("| attach by fd → `device_add` answered (its QMP alone) | {} |", stats(added));
    println!("| attach by fd → guest detects the disk (`SEEN`) | {} |", stats(detect));
    println!("| attach by fd → guest has read size, content, serial (`BLOCK+`) | {} |", stats(plug));
    println!("| detach → guest `BLOCK-` | {} |", stats(gone));
    println!("| detach → complete (DEVICE_DELETED, blockdev-del) | {} |", stats(detach_done));
    if let Some(pct) = idle {
        println!("\nidle guest: QEMU used {pct:.1} % of one host core over {} s (utime + stime)", args.idle_seconds);
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Stopping the harness (the end-to-end harness sends SIGTERM at its deadline) drops the
    // run, and with it every QEMU the run started.
    tokio::select! {
        r = run(&args) => r,
        s = stop_signal() => bail!("stopped by {s}; its QEMUs were killed"),
    }
}

/// P2's floor: the same fleet and volumes as P2, plugged and unplugged straight over QMP (one
/// task per VM attaching its volumes in turn by fd, as the node agent's worker does), timed to
/// the moment every guest has reported every disk.
async fn fleet(args: &Args, dir: &Path) -> anyhow::Result<()> {
    let t = Instant::now();
    let boots = (0..args.fleet_vms).map(|i| async move {
        let (label, run) = (format!("fleet VM {i}"), dir.join(format!("vm{i}")));
        boot(args, &label, &run, args.fleet_memory_mib).await
    });
    let booted = futures::future::join_all(boots).await;
    let failed: Vec<String> = booted.iter().filter_map(|r| r.as_ref().err().map(|e| format!("{e:#}"))).collect();
    if !failed.is_empty() {
        bail!("{} of {} fleet VMs did not boot to VP-READY, twice:\n{}", failed.len(), args.fleet_vms, failed.join("\n\n"));
    }
    let mut vms: Vec<Vm> = booted.into_iter().map(|r| r.map(|(vm, _)| vm)).collect::<anyhow::Result<_>>()?;
    let deadline = secs(boot_deadline(args.boot_deadline, args.fleet_vms));
    println!("fleet: {} VMs ready after {:.1} s (boot deadline {deadline})", vms.len(), t.elapsed().as_secs_f64());

    // QMP round trip with every guest running (20 per VM, all VMs at once).
    let rtts = vms.iter().map(|vm| async move {
        let mut v = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            vm.machine.execute("query-status", serde_json::json!({})).await?;
            v.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        anyhow::Ok(v)
    });
    let rtt: Vec<f64> = futures::future::join_all(rtts).await.into_iter().collect::<anyhow::Result<Vec<_>>>()?.concat();
    println!("| measure (ms) | p50 | p99 | max | n |");
    println!("|---|---:|---:|---:|---:|");
    println!("| QMP round trip, all {} VMs at once | {} |", vms.len(), stats(rtt));

    for i in 0..vms.len() {
        for j in 0..args.fleet_volumes {
            let mut f = std::fs::File::create(dir.join(format!("vm{i}-{j}.img")))?;
            f.write_all(format!("VP-FLEET-{i:03}-{j:03}").as_bytes())?;
            f.set_len(4 << 20)?;
        }
    }
    for plug in [true, false] {
        let t = Instant::now();
        let runs = vms.iter_mut().enumerate().map(|(i, vm)| fleet_vm(args, dir, i, vm, plug, t));
        let done = futures::future::join_all(runs).await;
        let failed: Vec<String> = done.iter().filter_map(|r| r.as_ref().err().map(|e| format!("{e:#}"))).collect();
        if !failed.is_empty() {
            bail!(
                "fleet {}: {} of {} guests did not converge:\n{}",
                if plug { "plug" } else { "unplug" },
                failed.len(),
                vms.len(),
                failed.join("\n\n")
            );
        }
        let done: Vec<(f64, f64)> = done.into_iter().collect::<anyhow::Result<_>>()?;
        let (qmp_last, last) = done.iter().fold((0.0f64, 0.0f64), |(a, b), (q, d)| (a.max(*q), b.max(*d)));
        let first = done.iter().map(|(_, d)| *d).fold(f64::MAX, f64::min);
        println!(
            "fleet {}: {} VMs × {} volumes straight over QMP: every QMP call done {qmp_last:.2} s, every guest converged {last:.2} s (first guest {first:.2} s)",
            if plug { "plug" } else { "unplug" },
            vms.len(),
            args.fleet_volumes
        );
    }
    Ok(())
}

/// One fleet VM's part of a plug (or unplug): its volumes attached in turn (or detached as the
/// node agent detaches a pass's volumes: every `device_del` against one inventory, then QEMU's
/// confirmations awaited together), then its guest's reports awaited until `t +
/// --converge-deadline`. Seconds since `t` to the last QMP call and to the last report.
async fn fleet_vm(args: &Args, dir: &Path, i: usize, vm: &mut Vm, plug: bool, t: Instant) -> anyhow::Result<(f64, f64)> {
    // One inventory for the VM's volumes, as one pass of the agent's has at most.
    let held = vm.machine.inventory().await?;
    if plug {
        for j in 0..args.fleet_volumes {
            let volume = format!("f{j}");
            let fd = std::fs::OpenOptions::new().read(true).write(true).open(dir.join(format!("vm{i}-{j}.img")))?;
            let a =
                Attach { volume: volume.clone(), serial: volume, kind: DeviceKind::Disk, readonly: false, source: Source::Fd(fd.into()) };
            let staged = vm.machine.stage_with(&held, a).await?;
            vm.machine.plug(staged).await?;
        }
    } else {
        let mut unplugging = Vec::with_capacity(args.fleet_volumes);
        for j in 0..args.fleet_volumes {
            unplugging.push(vm.machine.unplug_with(&held, &format!("f{j}")).await?);
        }
        futures::future::try_join_all(unplugging.into_iter().map(qemu::Unplugging::finish)).await?;
    }
    let qmp_done = t.elapsed().as_secs_f64();
    let deadline = Duration::from_secs(args.converge_deadline);
    let end = t + deadline;
    let want = if plug { "BLOCK+" } else { "BLOCK-" };
    for count in 0..args.fleet_volumes {
        if let Err(m) = vm.console.next_matching(end.saturating_duration_since(Instant::now()), |l| l.starts_with(want)).await {
            bail!("{}: {count} of {} `{want}` lines within {} ({m})\n{}", vm.label, args.fleet_volumes, secs(deadline), vm.tail());
        }
    }
    Ok((qmp_done, t.elapsed().as_secs_f64()))
}
