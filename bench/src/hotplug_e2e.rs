//! End-to-end hot-plug benchmarks against a real `virtplug up` (its own process, TCG guests):
//!
//! - **P1** `--p1 N`: VM spec edit (a JSON merge patch through the API, like `kubectl patch`) →
//!   the guest detects the disk (`SEEN`) and → has read it (`BLOCK+`); then the unplug. The raw
//!   floor (`qemu-hotplug`, QEMU driven directly, attach by fd → `SEEN`) is run in the same
//!   invocation for the ratio.
//! - **P2** `--p2-vms V --p2-volumes K`: V running VMs, K volumes each plugged by V spec edits
//!   sent at once; time until every guest reports every disk; then the same for the unplug.
//!   Its floor (the same fleet plugged straight over QMP, `qemu-hotplug --fleet-vms V
//!   --fleet-volumes K`) runs right after in the same invocation, for the ratio.
//! - **P3** `--p3-volumes M --p3-seconds S`: M hot-plug volumes wait for claims that never
//!   appear; CPU time of the whole `up` process (API server, controller and node agent) over S
//!   seconds, next to a poller doing KubeVirt's lookup (`findmnt -T PATH -N PID -J`, once per
//!   second per volume) for the same M volumes for the same S seconds.
//!
//! Guests are observed on their serial consoles (unix sockets), timestamps taken on arrival.
//!
//! Every wait has a deadline and names what it waited for when it expires: a guest's boot
//! (`--boot-deadline`; a guest that misses it is reported with the last 30 lines of its console
//! and restarted once, a second miss fails the run), P2's convergence (`--converge-deadline`,
//! each late guest reported with its console), each API call (60 s), each floor run
//! (`--floor-deadline`). SIGTERM or SIGINT stops the run and kills `up` and its QEMUs.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use kube::api::Api;

use api::VirtualMachineInstance;
use virtplug_bench::cputime::cpu_seconds;
use virtplug_bench::up::{start_up_with, Guest, Up, API};
use virtplug_bench::waits::{boot_deadline, output_within, secs, stop_signal, within};
use virtplug_bench::{pct, FLEET_MEMORY_MIB};

#[derive(Parser)]
struct Args {
    /// The virtplug binary.
    #[arg(long, default_value = "target/release/virtplug")]
    virtplug: PathBuf,
    /// The qemu-hotplug binary (the floor, run in the same invocation for P1).
    #[arg(long, default_value = "target/release/qemu-hotplug")]
    floor: PathBuf,
    #[arg(long, default_value = ".cache/guest")]
    guest: PathBuf,
    /// P1: hot-plugs to time (0 skips P1).
    #[arg(long, default_value_t = 50)]
    p1: usize,
    /// P1: the VM's memory (MiB), passed on to its floor so that both measure the same guest.
    #[arg(long, default_value_t = 256)]
    p1_memory_mib: u64,
    /// P2: VMs (0 skips P2).
    #[arg(long, default_value_t = 0)]
    p2_vms: usize,
    #[arg(long, default_value_t = 8)]
    p2_volumes: usize,
    /// P2: skip its floor (`qemu-hotplug --fleet-vms V --fleet-volumes K`, run after P2 in the
    /// same invocation for the ratio).
    #[arg(long)]
    p2_no_floor: bool,
    /// P3: waiting volumes (0 skips P3).
    #[arg(long, default_value_t = 0)]
    p3_volumes: usize,
    #[arg(long, default_value_t = 60)]
    p3_seconds: u64,
    /// Seconds a guest may take from its VM's creation to `VP-READY`; 0: 120 s + 8 s per VM
    /// booting at once (P2's 32: 376 s; they boot in ~120 s on a quiet 2-core machine). A guest
    /// that misses it is reported with its console tail and restarted once (a fresh VMI and
    /// QEMU); a second miss fails the run. Passed on to the floors when set.
    #[arg(long, default_value_t = 0)]
    boot_deadline: u64,
    /// P2: seconds every guest may take to report every disk of a plug (or unplug), from the
    /// spec edits; a guest that does not is reported with its console tail and fails the run.
    /// Passed on to the P2 floor.
    #[arg(long, default_value_t = 120)]
    converge_deadline: u64,
    /// The guests' kernel command line (passed on to the floors).
    #[arg(long, default_value = virtplug_bench::GUEST_KERNEL_ARGS)]
    kernel_args: String,
    /// Seconds a floor run (`qemu-hotplug`) may take in all; then it is stopped (SIGTERM, on
    /// which it kills its QEMUs) and the run fails.
    #[arg(long, default_value_t = 1800)]
    floor_deadline: u64,
    /// An argument for `virtplug up`, after the bench's own (repeat it for more), e.g.
    /// `--up-arg=--audit-log --up-arg=/tmp/audit.jsonl` to see each request's time.
    #[arg(long = "up-arg", allow_hyphen_values = true)]
    up_arg: Vec<String>,
}

impl Args {
    fn up_args(&self) -> Vec<&str> {
        self.up_arg.iter().map(String::as_str).collect()
    }
    /// The boot deadline of `vms` VMs booting at once.
    fn boot(&self, vms: usize) -> Duration {
        boot_deadline(self.boot_deadline, vms)
    }
    fn converge(&self) -> Duration {
        Duration::from_secs(self.converge_deadline)
    }

    /// Runs the floor with `extra` arguments (and this run's guest and deadlines), within
    /// `--floor-deadline`; its stdout.
    async fn run_floor(&self, extra: &[String]) -> anyhow::Result<String> {
        let mut cmd = tokio::process::Command::new(&self.floor);
        cmd.args(extra).arg("--guest").arg(&self.guest).args(["--boot-deadline", &self.boot_deadline.to_string()]);
        cmd.args(["--kernel-args", &self.kernel_args]);
        cmd.stdin(Stdio::null());
        let what = format!("the floor ({} {})", self.floor.display(), extra.join(" "));
        let out = output_within(cmd, Duration::from_secs(self.floor_deadline), &what).await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!("{what} failed ({}):\n{text}{}", out.status, String::from_utf8_lossy(&out.stderr));
        }
        Ok(text)
    }
}

/// Boots VM `name` (created just before `start`), retrying once; reports a retry.
async fn boot_one(up: &Up, name: &str, start: Instant, args: &Args) -> anyhow::Result<Guest> {
    let (mut guests, _) = up.boot_all(&[name.to_owned()], start, args.boot(1)).await?;
    guests.pop().context("no guest")
}

/// How long a guest may take to report one hot-plug or unplug in P1.
const SEE: Duration = Duration::from_secs(30);

/// Polls VMI `name` (every 5 ms: the timings are ms) until `done` holds on it, for at most
/// `deadline`; returns what `done` returned.
async fn poll_vmi<T>(
    up: &Up,
    name: &str,
    deadline: Duration,
    what: &str,
    done: impl Fn(&VirtualMachineInstance) -> Option<T>,
) -> anyhow::Result<T> {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(up.client.clone(), "default");
    let end = Instant::now() + deadline;
    loop {
        let v = within(API, format!("the API to get VMI {name}"), async { Ok(vmis.get(name).await?) }).await?;
        if let Some(r) = done(&v) {
            return Ok(r);
        }
        if Instant::now() > end {
            bail!("timed out after {} waiting for {what}", secs(deadline));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn p1(args: &Args) -> anyhow::Result<()> {
    let up = start_up_with(&args.virtplug, &args.up_args()).await?;
    up.claim("p1", "8Mi").await?;
    let start = Instant::now();
    up.vm("p1", &args.guest, &args.kernel_args, args.p1_memory_mib).await?;
    let mut g = boot_one(&up, "p1", start, args).await?;
    let (mut seen, mut block, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    // Where the time goes: each phase's `phaseTransitionTimestamps` entry (wall clock, ms,
    // taken by the writer just before its write) relative to the edit.
    let phases = ["Pending", "Bound", "AttachedToNode", "MountedToPod", "Ready"];
    let mut stages: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    for round in 1..=args.p1 {
        let t = Instant::now();
        let wall = jiff::Timestamp::now();
        up.set_volumes("p1", &["p1".to_owned()]).await?;
        let s = g.expect(SEE, &format!("SEEN (plug {round})"), |l| l.starts_with("SEEN ")).await?;
        seen.push(s.at.duration_since(t).as_secs_f64() * 1000.0);
        let b = g.expect(SEE, &format!("BLOCK+ (plug {round})"), |l| l.starts_with("BLOCK+") && l.contains("id=serial.p1")).await?;
        block.push(b.at.duration_since(t).as_secs_f64() * 1000.0);
        let dev = b.text.split_whitespace().nth(1).unwrap_or("sda").to_owned();
        let ready = |v: &VirtualMachineInstance| {
            v.status.as_ref()?.volume_status.iter().find(|e| e.name == "p1" && e.phase == Some(api::phases::VolumePhase::Ready)).cloned()
        };
        let entry = poll_vmi(&up, "p1", SEE, "volume p1 to be Ready after the guest saw it", ready).await?;
        for (i, ph) in phases.iter().enumerate() {
            if let Some(at) = entry.entered(&api::phases::VolumePhase::parse(ph)) {
                stages[i].push((at - wall).as_secs_f64() * 1000.0);
            }
        }
        let t = Instant::now();
        up.set_volumes("p1", &[]).await?;
        let u = g.expect(SEE, &format!("BLOCK- {dev} (unplug {round})"), |l| l.starts_with(&format!("BLOCK- {dev} "))).await?;
        gone.push(u.at.duration_since(t).as_secs_f64() * 1000.0);
        // The next plug starts once the previous unplug has left volumeStatus (declarative
        // hot-plug waits for that before re-adding a name): wait for it, so each sample is one
        // plug and not plug-after-pending-unplug.
        let empty = |v: &VirtualMachineInstance| v.status.as_ref().is_none_or(|s| s.volume_status.is_empty()).then_some(());
        poll_vmi(&up, "p1", SEE, "volumeStatus to empty after an unplug", empty).await?;
    }
    drop(up);
    println!("P1: VM spec edit → guest, {} hot-plugs (ms)\n", args.p1);
    println!("| measure (ms) | p50 | p99 | max |");
    println!("|---|---:|---:|---:|");
    for (name, v) in [
        ("spec edit → guest detects the disk (`SEEN`)", &seen),
        ("spec edit → guest has read it (`BLOCK+`)", &block),
        ("spec edit (removal) → guest `BLOCK-`", &gone),
    ] {
        println!("| {name} | {:.1} | {:.1} | {:.1} |", pct(v, 0.5), pct(v, 0.99), pct(v, 1.0));
    }
    println!("\nwhere the time goes: spec edit → the volume's phase written (`phaseTransitionTimestamps`, ms resolution)\n");
    println!("| phase | writer | p50 | p99 |");
    println!("|---|---|---:|---:|");
    for ((ph, v), who) in phases.iter().zip(&stages).zip(["controller", "controller", "node agent", "node agent", "node agent"]) {
        if !v.is_empty() {
            println!("| `{ph}` | {who} | {:.1} | {:.1} |", pct(v, 0.5), pct(v, 0.99));
        }
    }
    println!("\nfloor (same invocation): {} --runs {} --boots 1 --memory-mib {}", args.floor.display(), args.p1, args.p1_memory_mib);
    let text = args
        .run_floor(&[
            "--runs".into(),
            args.p1.to_string(),
            "--boots".into(),
            "1".into(),
            "--memory-mib".into(),
            args.p1_memory_mib.to_string(),
        ])
        .await?;
    for l in text.lines().filter(|l| l.contains("SEEN") || l.contains("BLOCK") || l.contains("`device_add`") || l.starts_with("retry")) {
        println!("{l}");
    }
    let floor_p50 =
        text.lines().find(|l| l.contains("(`SEEN`)")).and_then(|l| l.split('|').nth(2)).and_then(|s| s.trim().parse::<f64>().ok());
    if let Some(f) = floor_p50 {
        println!("\nP1 p50 / floor p50 (detect): {:.2}", pct(&seen, 0.5) / f);
    }
    Ok(())
}

async fn p2(args: &Args) -> anyhow::Result<()> {
    let up = start_up_with(&args.virtplug, &args.up_args()).await?;
    let names: Vec<String> = (0..args.p2_vms).map(|i| format!("p2-{i}")).collect();
    for n in &names {
        for j in 0..args.p2_volumes {
            up.claim(&format!("{n}-{j}"), "4Mi").await?;
        }
    }
    let boot = Instant::now();
    for n in &names {
        up.vm(n, &args.guest, &args.kernel_args, FLEET_MEMORY_MIB).await?;
    }
    let (mut guests, retried) = up.boot_all(&names, boot, args.boot(names.len())).await?;
    let retried: Vec<&str> = retried.iter().map(|r| r.name.as_str()).collect();
    println!(
        "P2: {} VMs running and ready after {:.1} s (boot deadline {}; {} retried{}{})",
        names.len(),
        boot.elapsed().as_secs_f64(),
        secs(args.boot(names.len())),
        retried.len(),
        if retried.is_empty() { "" } else { ": " },
        retried.join(", ")
    );
    let mut converged = Vec::new();
    for (label, plug) in [("plug", true), ("unplug", false)] {
        let t = Instant::now();
        let sends = names.iter().map(|n| {
            let claims: Vec<String> = if plug { (0..args.p2_volumes).map(|j| format!("{n}-{j}")).collect() } else { Vec::new() };
            let up = &up;
            async move { up.set_volumes(n, &claims).await }
        });
        for r in futures::future::join_all(sends).await {
            r?;
        }
        let want = if plug { "BLOCK+" } else { "BLOCK-" };
        let waits = guests.iter_mut().map(|g| guest_converged(g, want, args.p2_volumes, t, args.converge()));
        let (api, done) =
            tokio::join!(api_converged(&up.client, &names, args.p2_volumes, plug, t, args.converge()), futures::future::join_all(waits));
        let failed: Vec<String> = done.iter().filter_map(|r| r.as_ref().err().map(|e| format!("{e:#}"))).collect();
        if !failed.is_empty() {
            bail!("P2 {label}: {} of {} guests did not converge:\n{}", failed.len(), names.len(), failed.join("\n\n"));
        }
        let done: Vec<f64> = done.into_iter().collect::<anyhow::Result<_>>()?;
        let last = done.iter().copied().fold(0.0, f64::max);
        converged.push(last);
        println!(
            "P2 {label}: {} VMs × {} volumes converged in {last:.2} s (first guest {:.2} s); every volumeStatus converged in {:.2} s",
            names.len(),
            args.p2_volumes,
            done.iter().copied().fold(f64::MAX, f64::min),
            api?
        );
    }
    drop(up);
    if args.p2_no_floor {
        return Ok(());
    }
    // The floor, in the same invocation: the same fleet plugged straight over QMP.
    let (vms, k) = (args.p2_vms.to_string(), args.p2_volumes.to_string());
    println!(
        "\nP2 floor (same invocation): {} --fleet-vms {vms} --fleet-volumes {k} --fleet-memory-mib {FLEET_MEMORY_MIB}",
        args.floor.display()
    );
    let c = args.converge_deadline.to_string();
    let mem = FLEET_MEMORY_MIB.to_string();
    let text = args
        .run_floor(&[
            "--fleet-vms".into(),
            vms,
            "--fleet-volumes".into(),
            k,
            "--fleet-memory-mib".into(),
            mem,
            "--converge-deadline".into(),
            c,
        ])
        .await?;
    let mut floors = Vec::new();
    for l in text.lines().filter(|l| l.starts_with("fleet") || l.starts_with("retry")) {
        println!("{l}");
        let f = l.split("every guest converged ").nth(1).and_then(|r| r.split(' ').next()).and_then(|x| x.parse::<f64>().ok());
        floors.extend(f);
    }
    for ((label, v), f) in ["plug", "unplug"].iter().zip(&converged).zip(&floors) {
        println!("P2 {label} / floor: {:.2}", v / f);
    }
    Ok(())
}

/// Waits until guest `g` has printed `k` lines starting with `want` (one per disk), by
/// `t + deadline`; seconds since `t`.
async fn guest_converged(g: &mut Guest, want: &str, k: usize, t: Instant, deadline: Duration) -> anyhow::Result<f64> {
    let end = t + deadline;
    for count in 0..k {
        let left = end.saturating_duration_since(Instant::now());
        if let Err(m) = g.console.next_matching(left, |l| l.starts_with(want)).await {
            bail!("VM {}: {count} of {k} `{want}` lines within {} of the spec edits ({m})\n{}", g.name, secs(deadline), g.tail());
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The API's view of convergence, on a VMI watch (no polling): every VMI of `names` has `k`
/// hot-plug volumes `Ready` (plug) or none left (unplug), by `t + deadline`. Seconds since `t`.
async fn api_converged(
    client: &kube::Client,
    names: &[String],
    k: usize,
    plug: bool,
    t: Instant,
    deadline: Duration,
) -> anyhow::Result<f64> {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
    let mut ok: std::collections::HashMap<String, bool> = std::collections::HashMap::new();
    let mut events = kube::runtime::watcher(api, kube::runtime::watcher::Config::default()).applied_objects().boxed();
    let end = tokio::time::Instant::from_std(t + deadline);
    let watched = tokio::time::timeout_at(end, async {
        while let Some(v) = events.next().await {
            let v = v?;
            let entries = v.status.as_ref().map_or(0, |s| {
                s.volume_status
                    .iter()
                    .filter(|e| e.hotplug_volume.is_some() && (!plug || e.phase == Some(api::phases::VolumePhase::Ready)))
                    .count()
            });
            ok.insert(v.metadata.name.clone().unwrap_or_default(), if plug { entries == k } else { entries == 0 });
            if names.iter().all(|n| ok.get(n) == Some(&true)) {
                return Ok(t.elapsed().as_secs_f64());
            }
        }
        bail!("the VMI watch ended")
    })
    .await;
    if let Ok(r) = watched {
        return r;
    }
    let behind: Vec<&str> = names.iter().filter(|n| ok.get(*n) != Some(&true)).map(String::as_str).collect();
    let state = if plug { format!("{k} hot-plug volumes Ready") } else { "no hot-plug volume left".to_owned() };
    bail!("timed out after {} waiting for every VMI to have {state}; not yet: {}", secs(deadline), behind.join(", "))
}

/// CPU time of this process's waited-for children (cutime + cstime), in seconds.
fn children_cpu() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).context("no ')' in /proc/self/stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    let (cu, cs) = (f.get(13).context("no cutime in /proc/self/stat")?, f.get(14).context("no cstime in /proc/self/stat")?);
    Ok((cu.parse::<f64>()? + cs.parse::<f64>()?) / 100.0)
}

async fn p3(args: &Args) -> anyhow::Result<()> {
    let up = start_up_with(&args.virtplug, &args.up_args()).await?;
    let start = Instant::now();
    up.vm("p3", &args.guest, &args.kernel_args, FLEET_MEMORY_MIB).await?;
    let guest = boot_one(&up, "p3", start, args).await?;
    let claims: Vec<String> = (0..args.p3_volumes).map(|i| format!("never-{i}")).collect();
    up.set_volumes("p3", &claims).await?;
    let all = |v: &VirtualMachineInstance| (v.status.as_ref().map_or(0, |s| s.volume_status.len()) == claims.len()).then_some(());
    poll_vmi(&up, "p3", Duration::from_secs(120), &format!("all {} volumes to be reported Pending", claims.len()), all).await?;
    let pid = up.child.id();
    let c0 = cpu_seconds(pid)?;
    tokio::time::sleep(Duration::from_secs(args.p3_seconds)).await;
    let agent = cpu_seconds(pid)? - c0;

    // The poller: KubeVirt's lookup, once per second per volume, for the same time.
    let storage = up.dir.path().join("storage");
    let q = qemu::process::adopt(&guest.run).with_context(|| format!("the QEMU of VM p3 ({})", guest.run.display()))?;
    let before = children_cpu()?;
    let start = Instant::now();
    let mut spawned = 0u64;
    for second in 0..args.p3_seconds {
        for c in &claims {
            let mut findmnt = tokio::process::Command::new("findmnt");
            findmnt.arg("-T").arg(storage.join(c)).arg("-N").arg(q.pid.to_string()).arg("-J");
            findmnt.stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true);
            within(Duration::from_secs(10), "findmnt (the poller)", async { Ok(findmnt.status().await?) }).await?;
            spawned += 1;
        }
        let next = Duration::from_secs(second + 1);
        if let Some(rest) = next.checked_sub(start.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let poller = children_cpu()? - before;
    drop(up);
    println!("P3: {} hot-plug volumes waiting for storage that never arrives, {} s", args.p3_volumes, args.p3_seconds);
    println!();
    println!("| | CPU seconds | processes spawned |");
    println!("|---|---:|---:|");
    println!("| `virtplug up` (API server + controller + node agent), whole process | {agent:.3} | 0 |");
    println!("| poller: `findmnt -T PATH -N PID -J` per volume per second ({wall:.1} s wall) | {poller:.3} | {spawned} |");
    println!("\nratio poller / virtplug: {:.0}×", poller / agent.max(0.01));
    if agent < 0.01 {
        println!("(virtplug's CPU time is below the 10 ms tick resolution of /proc/PID/stat; the ratio uses 0.01 s)");
    }
    Ok(())
}

async fn run(args: &Args) -> anyhow::Result<()> {
    if args.p1 > 0 {
        p1(args).await?;
    }
    if args.p2_vms > 0 {
        p2(args).await?;
    }
    if args.p3_volumes > 0 {
        p3(args).await?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    // Stopping the harness drops the run: `up` and every QEMU it started are killed.
    tokio::select! {
        r = run(&args) => r,
        s = stop_signal() => bail!("stopped by {s}; `virtplug up` and its QEMUs were killed"),
    }
}
