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

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use kube::api::{Api, Patch, PatchParams, PostParams};
use qemu::console::Console;
use serde_json::{json, Value};

use api::VirtualMachineInstance;

mod cputime;
use cputime::cpu_seconds;

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
}

struct Up {
    dir: tempfile::TempDir,
    child: Child,
    client: kube::Client,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Kill, by PID, the QEMUs of this data dir only.
        for d in std::fs::read_dir(self.dir.path().join("node/vmis")).into_iter().flatten().flatten() {
            if let Ok(p) = qemu::process::adopt(&d.path()) {
                if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }
}

async fn start_up(binary: &Path) -> anyhow::Result<Up> {
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(binary)
        .args(["up", "--listen", "127.0.0.1:0", "--node-name", "bench", "--accel", "tcg", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    loop {
        let l = lines.next().context("up exited before serving")??;
        if l.contains("is serving the Kubernetes API at") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let client = client::connect(Some(&dir.path().join("kubeconfig"))).await?;
    Ok(Up { dir, child, client })
}

impl Up {
    async fn claim(&self, name: &str, size: &str) -> anyhow::Result<()> {
        let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(self.client.clone(), "default");
        let pvc = serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}))?;
        pvcs.create(&PostParams::default(), &pvc).await?;
        Ok(())
    }

    async fn vm(&self, name: &str, guest: &Path) -> anyhow::Result<()> {
        let g = guest.canonicalize()?;
        let vms: Api<api::VirtualMachine> = Api::namespaced(self.client.clone(), "default");
        let vm = serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
            "spec": {"runStrategy": "Always", "template": {"spec": {"terminationGracePeriodSeconds": 1,
                "domain": {"resources": {"requests": {"memory": "160Mi"}}, "devices": {"disks": [{"name": "cd0", "cdrom": {"bus": "sata"}}]},
                           "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 quiet panic=-1 mitigations=off",
                               "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}}}}}}))?;
        vms.create(&PostParams::default(), &vm).await?;
        Ok(())
    }

    /// Waits until VMI `name` runs; connects its console; waits for `VP-READY`.
    async fn console(&self, name: &str) -> anyhow::Result<Console> {
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), "default");
        let end = Instant::now() + Duration::from_secs(600);
        let uid = loop {
            if let Some(v) = vmis.get_opt(name).await? {
                if v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                    break v.metadata.uid.unwrap_or_default();
                }
            }
            if Instant::now() > end {
                bail!("VMI {name} did not start");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let run = self.dir.path().join("node/vmis").join(uid);
        let mut c = Console::connect(&run.join("serial.sock"), Duration::from_secs(10)).await?;
        // The ready line may have been printed before we connected: the log has it then.
        let logged = std::fs::read_to_string(run.join("serial.log")).unwrap_or_default().contains("VP-READY");
        if !logged {
            c.wait_for(Duration::from_secs(600), |l| l.starts_with("VP-READY")).await.context("no VP-READY")?;
        }
        Ok(c)
    }

    async fn set_volumes(&self, vm: &str, claims: &[String]) -> anyhow::Result<()> {
        let vms: Api<api::VirtualMachine> = Api::namespaced(self.client.clone(), "default");
        let mut disks = vec![json!({"name": "cd0", "cdrom": {"bus": "sata"}})];
        disks.extend(claims.iter().map(|c| json!({"name": c, "disk": {"bus": "scsi"}, "serial": c})));
        let volumes: Vec<Value> =
            claims.iter().map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c, "hotpluggable": true}})).collect();
        let p = json!({"spec": {"template": {"spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}}}});
        vms.patch(vm, &PatchParams::default(), &Patch::Merge(p)).await?;
        Ok(())
    }
}

#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn pct(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

async fn p1(args: &Args) -> anyhow::Result<()> {
    let up = start_up(&args.virtplug).await?;
    up.claim("p1", "8Mi").await?;
    up.vm("p1", &args.guest).await?;
    let mut con = up.console("p1").await?;
    let (mut seen, mut block, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    // Where the time goes: each phase's `phaseTransitionTimestamps` entry (wall clock, ms,
    // taken by the writer just before its write) relative to the edit.
    let phases = ["Pending", "Bound", "AttachedToNode", "MountedToPod", "Ready"];
    let mut stages: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(up.client.clone(), "default");
    for _ in 0..args.p1 {
        let t = Instant::now();
        let wall = jiff::Timestamp::now();
        up.set_volumes("p1", &["p1".to_owned()]).await?;
        let s = con.wait_for(Duration::from_secs(30), |l| l.starts_with("SEEN ")).await.context("no SEEN")?;
        seen.push(s.at.duration_since(t).as_secs_f64() * 1000.0);
        let b =
            con.wait_for(Duration::from_secs(30), |l| l.starts_with("BLOCK+") && l.contains("id=serial.p1")).await.context("no BLOCK+")?;
        block.push(b.at.duration_since(t).as_secs_f64() * 1000.0);
        let dev = b.text.split_whitespace().nth(1).unwrap_or("sda").to_owned();
        let end = Instant::now() + Duration::from_secs(30);
        let entry = loop {
            let e = vmis.get("p1").await?.status.and_then(|s| s.volume_status.into_iter().find(|e| e.name == "p1"));
            if let Some(e) = e.filter(|e| e.phase.as_deref() == Some("Ready")) {
                break e;
            }
            if Instant::now() > end {
                bail!("volume p1 not Ready 30 s after the guest saw it");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        for (i, ph) in phases.iter().enumerate() {
            if let Some(at) = entry.entered(ph) {
                stages[i].push((at - wall).as_secs_f64() * 1000.0);
            }
        }
        let t = Instant::now();
        up.set_volumes("p1", &[]).await?;
        let g = con.wait_for(Duration::from_secs(30), |l| l.starts_with(&format!("BLOCK- {dev} "))).await.context("no BLOCK-")?;
        gone.push(g.at.duration_since(t).as_secs_f64() * 1000.0);
        // The next plug starts once the previous unplug has left volumeStatus (declarative
        // hot-plug waits for that before re-adding a name): wait for it, so each sample is one
        // plug and not plug-after-pending-unplug.
        let end = Instant::now() + Duration::from_secs(30);
        while vmis.get("p1").await?.status.is_some_and(|s| !s.volume_status.is_empty()) {
            if Instant::now() > end {
                bail!("volumeStatus did not empty after an unplug");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
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
    println!("\nfloor (same invocation): {} --runs {} --boots 1", args.floor.display(), args.p1);
    let out = Command::new(&args.floor).args(["--runs", &args.p1.to_string(), "--boots", "1", "--guest"]).arg(&args.guest).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines().filter(|l| l.contains("SEEN") || l.contains("BLOCK")) {
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
    let up = start_up(&args.virtplug).await?;
    let names: Vec<String> = (0..args.p2_vms).map(|i| format!("p2-{i}")).collect();
    for n in &names {
        for j in 0..args.p2_volumes {
            up.claim(&format!("{n}-{j}"), "4Mi").await?;
        }
        up.vm(n, &args.guest).await?;
    }
    let boot = Instant::now();
    let mut consoles = Vec::new();
    for n in &names {
        consoles.push(up.console(n).await?);
    }
    println!("P2: {} VMs running and ready after {:.1} s", names.len(), boot.elapsed().as_secs_f64());
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
        let waits = consoles.iter_mut().map(|c| async move {
            let mut count = 0;
            while count < args.p2_volumes {
                let l =
                    c.wait_for(Duration::from_secs(120), |l| if plug { l.starts_with("BLOCK+") } else { l.starts_with("BLOCK-") }).await;
                l.context("a guest did not converge within 120 s")?;
                count += 1;
            }
            anyhow::Ok(t.elapsed().as_secs_f64())
        });
        let (api, done) = tokio::join!(api_converged(&up.client, &names, args.p2_volumes, plug, t), futures::future::join_all(waits));
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
    println!("\nP2 floor (same invocation): {} --fleet-vms {vms} --fleet-volumes {k}", args.floor.display());
    let out = Command::new(&args.floor).args(["--fleet-vms", &vms, "--fleet-volumes", &k, "--guest"]).arg(&args.guest).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("the P2 floor failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    let mut floors = Vec::new();
    for l in text.lines().filter(|l| l.starts_with("fleet")) {
        println!("{l}");
        let f = l.split("every guest converged ").nth(1).and_then(|r| r.split(' ').next()).and_then(|x| x.parse::<f64>().ok());
        floors.extend(f);
    }
    for ((label, v), f) in ["plug", "unplug"].iter().zip(&converged).zip(&floors) {
        println!("P2 {label} / floor: {:.2}", v / f);
    }
    Ok(())
}

/// The API's view of convergence, on a VMI watch (no polling): every VMI of `names` has `k`
/// hot-plug volumes `Ready` (plug) or none left (unplug). Seconds since `t`.
async fn api_converged(client: &kube::Client, names: &[String], k: usize, plug: bool, t: Instant) -> anyhow::Result<f64> {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
    let mut ok: std::collections::HashMap<String, bool> = std::collections::HashMap::new();
    let mut events = kube::runtime::watcher(api, kube::runtime::watcher::Config::default()).applied_objects().boxed();
    while let Some(v) = events.next().await {
        let v = v?;
        let entries = v.status.as_ref().map_or(0, |s| {
            s.volume_status.iter().filter(|e| e.hotplug_volume.is_some() && (!plug || e.phase.as_deref() == Some("Ready"))).count()
        });
        ok.insert(v.metadata.name.clone().unwrap_or_default(), if plug { entries == k } else { entries == 0 });
        if names.iter().all(|n| ok.get(n) == Some(&true)) {
            return Ok(t.elapsed().as_secs_f64());
        }
    }
    bail!("the VMI watch ended")
}

/// CPU time of this process's waited-for children (cutime + cstime), in seconds.
fn children_cpu() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    Ok((f[13].parse::<f64>()? + f[14].parse::<f64>()?) / 100.0)
}

async fn p3(args: &Args) -> anyhow::Result<()> {
    let up = start_up(&args.virtplug).await?;
    up.vm("p3", &args.guest).await?;
    let _con = up.console("p3").await?;
    let claims: Vec<String> = (0..args.p3_volumes).map(|i| format!("never-{i}")).collect();
    up.set_volumes("p3", &claims).await?;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(up.client.clone(), "default");
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let n = vmis.get("p3").await?.status.map_or(0, |s| s.volume_status.len());
        if n == claims.len() {
            break;
        }
        if Instant::now() > end {
            bail!("only {n} of {} volumes reported Pending", claims.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = up.child.id();
    let c0 = cpu_seconds(pid)?;
    tokio::time::sleep(Duration::from_secs(args.p3_seconds)).await;
    let agent = cpu_seconds(pid)? - c0;

    // The poller: KubeVirt's lookup, once per second per volume, for the same time.
    let storage = up.dir.path().join("storage");
    let q = std::fs::read_dir(up.dir.path().join("node/vmis"))?
        .flatten()
        .find_map(|d| qemu::process::adopt(&d.path()).ok())
        .context("no QEMU")?;
    let before = children_cpu()?;
    let start = Instant::now();
    let mut spawned = 0u64;
    for second in 0..args.p3_seconds {
        for c in &claims {
            let target = storage.join(c);
            let _ = Command::new("findmnt")
                .arg("-T")
                .arg(&target)
                .arg("-N")
                .arg(q.pid.to_string())
                .arg("-J")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if args.p1 > 0 {
        p1(&args).await?;
    }
    if args.p2_vms > 0 {
        p2(&args).await?;
    }
    if args.p3_volumes > 0 {
        p3(&args).await?;
    }
    Ok(())
}
