//! `scale`: virtplug's API server (and optionally its controller) holding N VirtualMachines of K
//! hot-plug volumes each — issue 21's figures, measured in one invocation on loopback:
//!
//! - resident memory (`VmRSS` from `/proc`) idle and with the N objects, per KiB of the objects'
//!   own JSON (as a full list returns them);
//! - creates per second (`--concurrency` in flight);
//! - a full list, its Table form, a label-selected list of a tenth, a page of 500: wall time on
//!   the client and the server's CPU per request (utime + stime from `/proc`);
//! - `kubectl get vm` (the kubectl on PATH, or `--kubectl`), paged as kubectl does and as one list;
//! - with `--controller`: the controller's first pass over the N VMs (it writes their status),
//!   then a restart's full resync, which must write nothing (the server's resourceVersion is
//!   unchanged), with its CPU seconds; then 1,000 VMs with `runStrategy: Always` created beside
//!   the running controller, creates per second.
//!
//! Every wait has a deadline and names what it waited for.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use serde_json::{json, Value};
use virtplug_bench::apiserver::{self, Proc};
use virtplug_bench::cputime::cpu_seconds;
use virtplug_bench::waits::{output_within, within};

#[derive(Parser)]
struct Args {
    /// The virtplug binary to benchmark.
    #[arg(long, default_value = "target/release/virtplug")]
    virtplug: PathBuf,
    /// How many VirtualMachines.
    #[arg(long, default_value_t = 10_000)]
    vms: usize,
    /// Hot-plug disks and volumes per VM (4 makes a VM of ~870 bytes of JSON).
    #[arg(long, default_value_t = 4)]
    volumes: usize,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Repetitions of each list (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// The kubectl to time `get vm` with.
    #[arg(long, default_value = "kubectl")]
    kubectl: PathBuf,
    /// Also measure the controller: its first pass, a restart's no-op resync, creates beside it.
    #[arg(long)]
    controller: bool,
}

const NS: &str = "default";
const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

fn vm(name: &str, volumes: usize, tenth: bool, run_strategy: &str) -> Value {
    let disks: Vec<Value> = (0..volumes).map(|i| json!({"name": format!("hp-{i}"), "disk": {"bus": "scsi"}})).collect();
    let vols: Vec<Value> = (0..volumes)
        .map(|i| json!({"name": format!("hp-{i}"), "persistentVolumeClaim": {"claimName": format!("{name}-data-{i}"), "hotpluggable": true}}))
        .collect();
    let labels = if tenth { json!({"app": "scale", "tenth": "yes"}) } else { json!({"app": "scale"}) };
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": NS, "labels": labels},
           "spec": {"runStrategy": run_strategy, "template": {"spec": {"domain": {"devices": {"disks": disks}, "resources": {"requests": {"memory": "64Mi"}}},
                    "volumes": vols}}}})
}

/// Resident memory of `pid` in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS in /proc/PID/status")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

async fn request(client: &kube::Client, method: http::Method, path: &str, accept: &str, body: Option<&Value>) -> anyhow::Result<String> {
    let mut req = http::Request::builder().method(method).uri(path).header(http::header::ACCEPT, accept);
    let bytes = match body {
        Some(b) => {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
            serde_json::to_vec(b)?
        }
        None => Vec::new(),
    };
    Ok(client.request_text(req.body(bytes)?).await?)
}

/// Creates `names` with `concurrency` in flight; returns creates per second.
async fn create_all(client: &kube::Client, names: Vec<(String, Value)>, concurrency: usize) -> anyhow::Result<f64> {
    let n = names.len();
    let start = Instant::now();
    futures::stream::iter(names)
        .map(|(name, body)| async move {
            request(client, http::Method::POST, VMS, "application/json", Some(&body)).await.with_context(|| format!("creating {name}"))
        })
        .buffer_unordered(concurrency.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await?;
    #[allow(clippy::cast_precision_loss)]
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

struct Timed {
    wall_ms: f64,
    server_cpu_ms: f64,
    bytes: usize,
    items: usize,
}

/// `repeat` GETs of `path` with `accept`: the median wall time and server CPU per request.
async fn time_get(client: &kube::Client, server: u32, path: &str, accept: &str, repeat: usize) -> anyhow::Result<Timed> {
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    let mut last = String::new();
    for _ in 0..repeat.max(1) {
        let c0 = cpu_seconds(server)?;
        let t = Instant::now();
        last = within(Duration::from_secs(120), format!("GET {path}"), request(client, http::Method::GET, path, accept, None)).await?;
        walls.push(t.elapsed().as_secs_f64() * 1e3);
        cpus.push((cpu_seconds(server)? - c0) * 1e3);
    }
    let parsed: Value = serde_json::from_str(&last).with_context(|| format!("GET {path}: not JSON"))?;
    let items = parsed.get("items").or_else(|| parsed.get("rows")).and_then(Value::as_array).map_or(0, Vec::len);
    Ok(Timed { wall_ms: median(&mut walls), server_cpu_ms: median(&mut cpus), bytes: last.len(), items })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The list's resourceVersion: unchanged means nothing was written in between.
async fn list_rv(client: &kube::Client) -> anyhow::Result<String> {
    let body = request(client, http::Method::GET, &format!("{VMS}?limit=1"), "application/json", None).await?;
    let v: Value = serde_json::from_str(&body)?;
    Ok(v.pointer("/metadata/resourceVersion").and_then(Value::as_str).context("list without resourceVersion")?.to_owned())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `virtplug controller` against the server, its /metrics on a free loopback port.
fn start_controller(bin: &Path, kubeconfig: &Path) -> anyhow::Result<(Proc, u16)> {
    let port = free_port()?;
    let child = Command::new(bin)
        .args(["controller", "--leader-elect=false", "--health-listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {} controller", bin.display()))?;
    Ok((Proc(child), port))
}

/// The controller's VM reconciles so far (`virtplug_controller_reconciles_total{controller="vm"}`).
async fn vm_reconciles(http: &reqwest::Client, port: u16) -> anyhow::Result<f64> {
    let text = http.get(format!("http://127.0.0.1:{port}/metrics")).send().await?.text().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("virtplug_controller_reconciles_total{") && l.contains("controller=\"vm\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Waits (polling /metrics every 100 ms, within `deadline`) until the controller has reconciled
/// `n` VMs; returns its CPU seconds at that point.
async fn until_reconciled(http: &reqwest::Client, pid: u32, port: u16, n: usize, deadline: Duration) -> anyhow::Result<f64> {
    #[allow(clippy::cast_precision_loss)]
    let want = n as f64;
    within(deadline, format!("the controller to reconcile {n} VMs"), async {
        loop {
            if vm_reconciles(http, port).await.unwrap_or(0.0) >= want {
                return cpu_seconds(pid);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("virtplug");
    let (server, client) = apiserver::start(&args.virtplug, &data).await?;
    let pid = server.0.id();
    let idle = rss_kib(pid)?;

    let bodies: Vec<(String, Value)> = (0..args.vms)
        .map(|i| {
            let name = format!("vm-{i:06}");
            let body = vm(&name, args.volumes, i % 10 == 0, "Halted");
            (name, body)
        })
        .collect();
    let deadline = Duration::from_secs(600);
    let rate = within(deadline, format!("creating {} VMs", args.vms), create_all(&client, bodies, args.concurrency)).await?;

    // Before any list: a list's response (9 MB at 10,000 VMs) is garbage the moment it is sent,
    // and glibc keeps what it frees; the figure after the lists shows that apart.
    let held = rss_kib(pid)?;
    let full = time_get(&client, pid, VMS, "application/json", args.repeat).await?;
    if full.items != args.vms {
        bail!("the full list returned {} VMs, not {}", full.items, args.vms);
    }
    // The objects' own JSON: the list's bytes less its envelope, as stored objects serialize.
    #[allow(clippy::cast_precision_loss)]
    let json_kib = full.bytes as f64 / 1024.0;
    let table = time_get(&client, pid, VMS, TABLE, args.repeat).await?;
    let selected = time_get(&client, pid, &format!("{VMS}?labelSelector=tenth%3Dyes"), "application/json", args.repeat).await?;
    let page = time_get(&client, pid, &format!("{VMS}?limit=500"), "application/json", args.repeat).await?;
    // What kube-rs's `watch_object` and `kubectl wait` list before they watch one VM.
    let one = format!("vm-{:06}", args.vms / 2);
    let by_name = time_get(&client, pid, &format!("{VMS}?fieldSelector=metadata.name%3D{one}"), "application/json", args.repeat).await?;
    if by_name.items != 1 {
        bail!("the list by metadata.name={one} returned {} VMs, not 1", by_name.items);
    }

    // kubectl pages by 500 and its client (client-go: 5 requests/s, bursts of 10) lets request
    // n > 10 go no sooner than (n - 10) / 5 s after the first: a floor the server cannot move. `--chunk-size=0` asks for
    // one list, which shows kubectl's own time and the server's without that wait.
    let mut kubectl_ms = Vec::new();
    let mut kubectl_one_ms = Vec::new();
    for _ in 0..3 {
        for (extra, times) in [(None, &mut kubectl_ms), (Some("--chunk-size=0"), &mut kubectl_one_ms)] {
            let mut cmd = tokio::process::Command::new(&args.kubectl);
            cmd.arg("--kubeconfig").arg(data.join("kubeconfig")).args(["get", "vm", "-n", NS, "--no-headers"]).args(extra);
            let t = Instant::now();
            let out = output_within(cmd, Duration::from_secs(300), "kubectl get vm").await?;
            if !out.status.success() {
                bail!("kubectl get vm failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
            let rows = out.stdout.iter().filter(|b| **b == b'\n').count();
            if rows != args.vms {
                bail!("kubectl get vm printed {rows} rows, not {}", args.vms);
            }
        }
    }
    let pages = args.vms.div_ceil(500);
    #[allow(clippy::cast_precision_loss)]
    let throttle_ms = pages.saturating_sub(10) as f64 * 200.0;

    // The server trims its heap a second after a burst of writes ends (apiserver::heap); the
    // lists and kubectl runs above take longer than that, so this is the memory once settled.
    let settled = rss_kib(pid)?;
    #[allow(clippy::cast_precision_loss)]
    let per_kib = (held.saturating_sub(idle)) as f64 / json_kib;
    #[allow(clippy::cast_precision_loss)]
    let settled_per_kib = (settled.saturating_sub(idle)) as f64 / json_kib;
    println!("## scale: {} VMs of {} volumes (`{}`)", args.vms, args.volumes, args.virtplug.display());
    println!();
    println!("| figure | value |");
    println!("|---|---:|");
    println!("| RSS idle | {:.1} MiB |", mib(idle));
    println!("| RSS holding the VMs, right after the creates (before any list) | {:.1} MiB |", mib(held));
    println!("| RSS holding the VMs, after the lists and kubectl | {:.1} MiB |", mib(settled));
    #[allow(clippy::cast_precision_loss)]
    let per_obj = full.bytes as f64 / args.vms as f64;
    println!("| JSON per VM (in a list) | {per_obj:.0} bytes |");
    println!("| RSS growth per KiB of JSON, right after the creates | {per_kib:.1} KiB |");
    println!("| RSS growth per KiB of JSON, after the lists and kubectl | {settled_per_kib:.1} KiB |");
    println!("| creates/s ({} in flight) | {rate:.0} |", args.concurrency);
    for (what, t) in [
        ("full list", &full),
        ("full list as Table", &table),
        ("label-selected list (a tenth)", &selected),
        ("page of 500", &page),
        ("list by `metadata.name=` (one VM)", &by_name),
    ] {
        println!(
            "| {what}: {} items, {:.1} MB | {:.0} ms wall, {:.0} ms server CPU |",
            t.items,
            t.bytes as f64 / 1e6,
            t.wall_ms,
            t.server_cpu_ms
        );
    }
    println!(
        "| `kubectl get vm` ({}): {pages} pages of 500, which client-go's limiter (5/s, burst 10) spreads over at least {:.0} ms | {:.0} ms |",
        args.kubectl.display(),
        throttle_ms,
        median(&mut kubectl_ms)
    );
    println!("| `kubectl get vm --chunk-size=0` (one list) | {:.0} ms |", median(&mut kubectl_one_ms));

    if args.controller {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        let kubeconfig = data.join("kubeconfig");
        let (first, port) = start_controller(&args.virtplug, &kubeconfig)?;
        let first_cpu = until_reconciled(&http, first.0.id(), port, args.vms, Duration::from_secs(600)).await?;
        // The first pass writes each VM's status; wait until those writes have stopped: the
        // resourceVersion unchanged over a second, within a deadline.
        within(Duration::from_secs(300), "the controller's first-pass writes to end", async {
            let mut last = list_rv(&client).await?;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = list_rv(&client).await?;
                if now == last {
                    return Ok(());
                }
                last = now;
            }
        })
        .await?;
        drop(first);
        let before = list_rv(&client).await?;
        let (second, port) = start_controller(&args.virtplug, &kubeconfig)?;
        let resync_cpu = until_reconciled(&http, second.0.id(), port, args.vms, Duration::from_secs(600)).await?;
        let after = list_rv(&client).await?;
        println!("| controller first pass over {} VMs | {first_cpu:.1} s CPU |", args.vms);
        println!(
            "| controller restart, full resync | {resync_cpu:.1} s CPU, {} |",
            if before == after { "no writes".to_owned() } else { format!("WROTE (resourceVersion {before} -> {after})") }
        );
        let always: Vec<(String, Value)> = (0..1000)
            .map(|i| {
                let name = format!("always-{i:04}");
                let body = vm(&name, args.volumes, false, "Always");
                (name, body)
            })
            .collect();
        let rate = within(deadline, "creating 1,000 Always VMs", create_all(&client, always, args.concurrency)).await?;
        println!("| creates/s of 1,000 `Always` VMs beside the controller | {rate:.0} |");
        drop(second);
    }
    drop(server);
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
