//! The floor that end-to-end hot-plug is compared against: QEMU alone, driven by the `qemu`
//! crate, measured from the host against the test guest's own reports (TCG on this machine).
//!
//! - VM start → `VP-READY` (exec of QEMU to the guest's ready line);
//! - QMP round trip (`query-status`);
//! - attach (add-fd, blockdev-add, remove-fd, device_add) → guest `SEEN` (detection, no fork in
//!   the guest before it) and → `BLOCK+` (after the guest read size, first bytes and serial);
//! - detach started → guest `BLOCK-` line, and → detach complete (DEVICE_DELETED, blockdev-del).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use qemu::accel::Resolved;
use qemu::cmdline::{CdromDrive, KernelBoot, LaunchSpec};
use qemu::console::Console;
use qemu::ops::{Attach, DeviceKind, Machine, Source};
use qemu::qmp::Qmp;

mod cputime;
use cputime::cpu_seconds;

#[derive(Parser)]
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
    /// Fleet mode: the guests' memory (P2 uses 160 MiB).
    #[arg(long, default_value_t = 160)]
    fleet_memory_mib: u64,
    /// Run QEMU under its seccomp sandbox, as the node agent does (`--sandbox false` measures
    /// what the sandbox costs).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    sandbox: bool,
}

struct Vm {
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

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    format!("{:.1} | {:.1} | {:.1} | {}", p(0.5), p(0.99), v[v.len() - 1], v.len())
}

async fn boot(args: &Args, dir: &std::path::Path) -> anyhow::Result<(Vm, f64)> {
    boot_with(args, dir, 256, "console=ttyS0 quiet panic=-1 mitigations=off", Duration::from_secs(120)).await
}

async fn boot_with(args: &Args, dir: &std::path::Path, memory_mib: u64, cmdline: &str, deadline: Duration) -> anyhow::Result<(Vm, f64)> {
    let spec = LaunchSpec {
        name: "bench".into(),
        run_dir: dir.to_owned(),
        memory_mib,
        vcpus: 1,
        accel: if args.accel == "kvm" { Resolved::Kvm } else { Resolved::Tcg },
        kernel: Some(KernelBoot {
            kernel: args.guest.join("vmlinuz"),
            initrd: Some(args.guest.join("initramfs.cpio.gz")),
            cmdline: cmdline.into(),
        }),
        boot_disks: vec![],
        cdrom_drives: vec![CdromDrive { id: "cd0".into(), bootindex: None, medium: None }],
        user_net: false,
        own_mount_namespace: false,
        sandbox: args.sandbox,
        run_as: None,
    };
    let start = Instant::now();
    let process = qemu::process::launch(&spec).await?;
    let mut console = Console::connect(&spec.serial_socket(), Duration::from_secs(5)).await?;
    let qmp = Qmp::connect_within(&spec.qmp_socket(), Duration::from_secs(5)).await?;
    let ready = console.wait_for(deadline, |l| l.starts_with("VP-READY")).await.context("no VP-READY")?;
    Ok((Vm { process, machine: Machine::new(qmp), console }, ready.at.duration_since(start).as_secs_f64() * 1000.0))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    if args.fleet_vms > 0 {
        return fleet(&args, tmp.path()).await;
    }
    let mut boots = Vec::new();
    for i in 0..args.boots {
        let (vm, ms) = boot(&args, &tmp.path().join(format!("boot{i}"))).await?;
        boots.push(ms);
        drop(vm);
    }
    let (mut vm, _) = boot(&args, &tmp.path().join("main")).await?;
    let idle = if args.idle_seconds > 0 {
        let c0 = cpu_seconds(vm.process.pid)?;
        tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
        Some((cpu_seconds(vm.process.pid)? - c0) / args.idle_seconds as f64 * 100.0)
    } else {
        None
    };

    let mut rtt = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        vm.machine.qmp.execute("query-status", serde_json::json!({})).await?;
        rtt.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    let img = tmp.path().join("disk.img");
    {
        let mut f = std::fs::File::create(&img)?;
        f.write_all(b"VP-BENCH-DISK-01")?;
        f.set_len(8 << 20)?;
    }
    let (mut detect, mut plug, mut gone, mut detach_done) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.runs {
        let volume = format!("bench-{i}");
        let fd = std::fs::OpenOptions::new().read(true).write(true).open(&img)?;
        let t = Instant::now();
        vm.machine
            .attach(Attach {
                volume: volume.clone(),
                serial: volume.clone(),
                kind: DeviceKind::Disk,
                readonly: false,
                source: Source::Fd(fd.into()),
            })
            .await?;
        let seen = vm.console.wait_for(Duration::from_secs(10), |l| l.starts_with("SEEN ")).await.context("no SEEN")?;
        detect.push(seen.at.duration_since(t).as_secs_f64() * 1000.0);
        let want = format!("id=serial.{volume}");
        let line =
            vm.console.wait_for(Duration::from_secs(10), |l| l.starts_with("BLOCK+") && l.contains(&want)).await.context("no BLOCK+")?;
        plug.push(line.at.duration_since(t).as_secs_f64() * 1000.0);
        let dev = line.text.split_whitespace().nth(1).unwrap_or("sda").to_owned();

        let t = Instant::now();
        let detach = vm.machine.detach(&volume);
        let see = vm.console.wait_for(Duration::from_secs(10), |l| l.starts_with(&format!("BLOCK- {dev} ")));
        let (d, seen) = tokio::join!(detach, see);
        d?;
        detach_done.push(t.elapsed().as_secs_f64() * 1000.0);
        let seen = seen.context("no BLOCK-")?;
        gone.push(seen.at.duration_since(t).as_secs_f64() * 1000.0);
    }
    println!("| measure (ms) | p50 | p99 | max | n |");
    println!("|---|---:|---:|---:|---:|");
    println!("| VM start → guest `VP-READY` | {} |", stats(boots));
    println!("| QMP round trip (`query-status`) | {} |", stats(rtt));
    println!("| attach by fd → guest detects the disk (`SEEN`) | {} |", stats(detect));
    println!("| attach by fd → guest has read size, content, serial (`BLOCK+`) | {} |", stats(plug));
    println!("| detach → guest `BLOCK-` | {} |", stats(gone));
    println!("| detach → complete (DEVICE_DELETED, blockdev-del) | {} |", stats(detach_done));
    if let Some(pct) = idle {
        println!("\nidle guest: QEMU used {pct:.1} % of one host core over {} s (utime + stime)", args.idle_seconds);
    }
    Ok(())
}

/// P2's floor: the same fleet and volumes as P2, plugged and unplugged straight over QMP (one
/// task per VM attaching its volumes in turn by fd, as the node agent's worker does), timed to
/// the moment every guest has reported every disk.
async fn fleet(args: &Args, dir: &std::path::Path) -> anyhow::Result<()> {
    let cmdline = "console=ttyS0 quiet panic=-1 mitigations=off".to_owned();
    let t = Instant::now();
    let boots = (0..args.fleet_vms).map(|i| {
        let cmdline = cmdline.clone();
        async move { boot_with(args, &dir.join(format!("vm{i}")), args.fleet_memory_mib, &cmdline, Duration::from_secs(900)).await }
    });
    let mut vms: Vec<Vm> =
        futures::future::join_all(boots).await.into_iter().map(|r| r.map(|(vm, _)| vm)).collect::<anyhow::Result<_>>()?;
    println!("fleet: {} VMs ready after {:.1} s", vms.len(), t.elapsed().as_secs_f64());

    // QMP round trip with every guest running (20 per VM, all VMs at once).
    let rtts = vms.iter().map(|vm| async move {
        let mut v = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            vm.machine.qmp.execute("query-status", serde_json::json!({})).await?;
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
        let runs = vms.iter_mut().enumerate().map(|(i, vm)| async move {
            for j in 0..args.fleet_volumes {
                let volume = format!("f{j}");
                if plug {
                    let fd = std::fs::OpenOptions::new().read(true).write(true).open(dir.join(format!("vm{i}-{j}.img")))?;
                    let a = Attach {
                        volume: volume.clone(),
                        serial: volume,
                        kind: DeviceKind::Disk,
                        readonly: false,
                        source: Source::Fd(fd.into()),
                    };
                    vm.machine.attach(a).await?;
                } else {
                    vm.machine.detach(&volume).await?;
                }
            }
            let qmp_done = t.elapsed().as_secs_f64();
            for _ in 0..args.fleet_volumes {
                let want = if plug { "BLOCK+" } else { "BLOCK-" };
                vm.console.wait_for(Duration::from_secs(600), |l| l.starts_with(want)).await.context("a guest did not converge")?;
            }
            anyhow::Ok((qmp_done, t.elapsed().as_secs_f64()))
        });
        let done: Vec<(f64, f64)> = futures::future::join_all(runs).await.into_iter().collect::<anyhow::Result<_>>()?;
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
