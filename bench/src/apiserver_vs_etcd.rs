//! RV-checked single-object updates per second (1, 8, 64 concurrent writers) and watch fan-out
//! latency (1 change to 100 watchers), for virtplug's API server and for etcd doing the
//! equivalent compare-and-swap transactions, side by side in one run on loopback.
//!
//! Both stores fsync every acknowledged write (virtplug: SQLite WAL with `synchronous=FULL`;
//! etcd: its WAL). virtplug is reached over HTTPS through kube-rs with a JSON merge patch that
//! carries `metadata.resourceVersion`; etcd over its HTTP JSON gateway (`/v3/kv/txn` comparing
//! `mod_revision`, `/v3/watch`), without TLS.
//!
//! After the update levels, the disk's own floor for one writer: 4 KiB written in place and
//! `fdatasync`ed in turn, in the servers' directory, as syncs/s, with the share of it each server
//! reached at one writer (how far a one-writer rate is from what the disk allows).
//!
//! With `--against OTHER` (another virtplug build), last: both builds serve side by side and one
//! writer updates each in turn, one-second slices alternating (`--slices` of each), so that
//! both see the same machine; their medians and the ratio are printed. On this VM the
//! one-writer rate moves ±50 % between runs seconds apart, more than most changes to measure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine;
use clap::Parser;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use virtplug_bench::apiserver::{self, Proc};
use virtplug_bench::cputime;
use virtplug_bench::waits::within;

#[derive(Parser)]
struct Args {
    /// The virtplug binary to benchmark.
    #[arg(long, default_value = "target/release/virtplug")]
    virtplug: PathBuf,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    /// Seconds per writer-count level.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Watch rounds (one change each, fanned out to every watcher).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// Another virtplug build to compare with at one writer, in alternating one-second slices.
    #[arg(long)]
    against: Option<PathBuf>,
    /// One-second slices of each build with `--against`.
    #[arg(long, default_value_t = 20)]
    slices: usize,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// An HTTP client for etcd whose every connect and read has a deadline (a watch stream's
/// reads included: etcd sends progress on them well within it).
fn http_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).read_timeout(Duration::from_secs(60)).build()?)
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

async fn start_etcd(bin: &Path, dir: &Path) -> anyhow::Result<(Proc, String)> {
    let (c, p) = (free_port()?, free_port()?);
    let url = format!("http://127.0.0.1:{c}");
    let child = Command::new(bin)
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{p}"), "--initial-advertise-peer-urls", &format!("http://127.0.0.1:{p}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{p}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let proc = Proc(child);
    let http = http_client()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.post(format!("{url}/v3/kv/range")).json(&json!({"key": b64("x")})).send().await.is_err() {
        if Instant::now() > deadline {
            bail!("etcd did not answer within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((proc, url))
}

fn vm(name: &str) -> api::VirtualMachine {
    serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}}))
    .expect("valid VM")
}

async fn virtplug_updates(client: &kube::Client, writers: usize, secs: u64) -> anyhow::Result<f64> {
    let api: Api<api::VirtualMachine> = Api::namespaced(client.clone(), "default");
    let count = Arc::new(AtomicU64::new(0));
    // Every writer's object first, then the clock starts for all of them at once.
    let mut objects = Vec::new();
    // A name of its own per call: `--against` measures the same writer count many times.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    for w in 0..writers {
        let name = format!("bench-{writers}-{w}-{call}");
        let created = api.create(&PostParams::default(), &vm(&name)).await?;
        objects.push((name, created.metadata.resource_version.context("rv")?));
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for (name, mut rv) in objects {
        let api = api.clone();
        let count = Arc::clone(&count);
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                n += 1;
                let p = json!({"metadata": {"resourceVersion": rv, "annotations": {"n": n.to_string()}}});
                let out = api.patch(&name, &PatchParams::default(), &Patch::Merge(p)).await?;
                rv = out.metadata.resource_version.unwrap_or_default();
                count.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

async fn etcd_updates(url: &str, writers: usize, secs: u64) -> anyhow::Result<f64> {
    let count = Arc::new(AtomicU64::new(0));
    // Every writer's key first, then the clock starts for all of them at once.
    let mut keys = Vec::new();
    for w in 0..writers {
        let key = b64(&format!("/registry/kubevirt.io/virtualmachines/default/bench-{writers}-{w}"));
        let http = http_client()?;
        let r: serde_json::Value =
            http.post(format!("{url}/v3/kv/put")).json(&json!({"key": key, "value": b64("{}")})).send().await?.json().await?;
        let rev = r["header"]["revision"].as_str().context("revision")?.to_owned();
        keys.push((key, http, rev));
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for (key, http, mut rev) in keys {
        let url = url.to_owned();
        let count = Arc::clone(&count);
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                n += 1;
                let body = json!({"compare": [{"key": key, "target": "MOD", "mod_revision": rev, "result": "EQUAL"}],
                    "success": [{"request_put": {"key": key, "value": b64(&format!("{{\"n\":{n}}}"))}}]});
                let r: serde_json::Value = http.post(format!("{url}/v3/kv/txn")).json(&body).send().await?.json().await?;
                if r["succeeded"] != json!(true) {
                    bail!("etcd compare failed: {r}");
                }
                rev = r["header"]["revision"].as_str().context("revision")?.to_owned();
                count.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// The disk's floor for one writer: 4 KiB written in place and `fdatasync`ed, in turn, for
/// `secs` (over a 1 MiB region, as a write-ahead log reused after a checkpoint), in `dir` (the
/// servers' file system). No store that syncs every acknowledged write before answering it can
/// acknowledge more writes per second than this with one writer (each needs its own sync);
/// only concurrent writers can share one (group commit).
fn disk_syncs_per_second(dir: &Path, secs: u64) -> anyhow::Result<f64> {
    use std::os::unix::fs::FileExt;
    let path = dir.join("sync-floor");
    let f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path)?;
    let page = [0x5a_u8; 4096];
    for i in 0..256_u64 {
        f.write_all_at(&page, i * 4096)?;
    }
    f.sync_all()?;
    let (start, mut n) = (Instant::now(), 0_u64);
    while start.elapsed() < Duration::from_secs(secs) {
        f.write_all_at(&page, (n % 256) * 4096)?;
        f.sync_data()?;
        n += 1;
    }
    std::fs::remove_file(&path)?;
    #[allow(clippy::cast_precision_loss)]
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Latencies (ms) from "write sent" to "event received", over every watcher and round.
async fn virtplug_watch(client: &kube::Client, watchers: usize, rounds: usize) -> anyhow::Result<Vec<f64>> {
    let api: Api<api::VirtualMachine> = Api::namespaced(client.clone(), "default");
    let created = api.create(&PostParams::default(), &vm("watched")).await?;
    let rv = created.metadata.resource_version.context("rv")?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    for _ in 0..watchers {
        let mut stream = api.watch(&WatchParams::default().fields("metadata.name=watched").timeout(290), &rv).await?.boxed();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(Ok(ev)) = stream.next().await {
                if let WatchEvent::Modified(v) = ev {
                    let round: usize = v.metadata.annotations.and_then(|a| a.get("round").and_then(|r| r.parse().ok())).unwrap_or(0);
                    let _ = tx.send((round, Instant::now()));
                }
            }
        });
    }
    let mut lat = Vec::new();
    for round in 1..=rounds {
        let sent = Instant::now();
        api.patch("watched", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"round": round.to_string()}}})))
            .await?;
        let mut got = 0;
        while got < watchers {
            let what = format!("round {round}'s event at {} of {watchers} watchers", got + 1);
            let (r, at) = within(Duration::from_secs(10), what, async { rx.recv().await.context("the watchers ended") }).await?;
            if r == round {
                lat.push(at.duration_since(sent).as_secs_f64() * 1000.0);
                got += 1;
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

async fn etcd_watch(url: &str, watchers: usize, rounds: usize) -> anyhow::Result<Vec<f64>> {
    let key = b64("/registry/kubevirt.io/virtualmachines/default/watched");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    for _ in 0..watchers {
        let http = http_client()?;
        let resp = http.post(format!("{url}/v3/watch")).json(&json!({"create_request": {"key": key}})).send().await?;
        let tx = tx.clone();
        let ready = ready_tx.clone();
        tokio::spawn(async move {
            let mut stream = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = stream.next().await {
                let at = Instant::now();
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else { continue };
                    if v["result"]["created"] == json!(true) {
                        let _ = ready.send(());
                    }
                    for e in v["result"]["events"].as_array().into_iter().flatten() {
                        let val = e["kv"]["value"].as_str().unwrap_or("");
                        let decoded = base64::engine::general_purpose::STANDARD.decode(val).unwrap_or_default();
                        let round = String::from_utf8_lossy(&decoded).parse().unwrap_or(0);
                        let _ = tx.send((round, at));
                    }
                }
            }
        });
    }
    for n in 1..=watchers {
        let what = format!("etcd to create watch {n} of {watchers}");
        within(Duration::from_secs(10), what, async { ready_rx.recv().await.context("the watcher ended") }).await?;
    }
    let http = http_client()?;
    let mut lat = Vec::new();
    for round in 1..=rounds {
        let sent = Instant::now();
        http.post(format!("{url}/v3/kv/put")).json(&json!({"key": key, "value": b64(&round.to_string())})).send().await?;
        let mut got = 0;
        while got < watchers {
            let what = format!("round {round}'s event at {} of {watchers} watchers", got + 1);
            let (r, at) = within(Duration::from_secs(10), what, async { rx.recv().await.context("the watchers ended") }).await?;
            if r == round {
                lat.push(at.duration_since(sent).as_secs_f64() * 1000.0);
                got += 1;
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir()?;
    let (vp_dir, etcd_dir) = (dir.path().join("virtplug"), dir.path().join("etcd"));
    let (_vp, client) = apiserver::start(&args.virtplug, &vp_dir).await?;
    let (_etcd, etcd) = start_etcd(&args.etcd, &etcd_dir).await?;

    // Throughput on this 2-core machine moves with whatever else runs; the server's own CPU time
    // per update (utime + stime from /proc, 10 ms ticks over thousands of updates) moves much
    // less, so both are printed, with the bytes each server sent to the disk per update (on a
    // slow disk the fsync'd bytes set the rate at one writer).
    let (vp_pid, etcd_pid) = (_vp.0.id(), _etcd.0.id());
    println!(
        "| writers | virtplug updates/s | etcd txn/s | virtplug / etcd | virtplug CPU µs/update | etcd CPU µs/txn | CPU etcd / virtplug | virtplug disk KiB/update | etcd disk KiB/txn |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut one = (0.0, 0.0);
    for writers in [1, 8, 64] {
        let (c0, w0) = (cputime::cpu_seconds(vp_pid)?, cputime::write_bytes(vp_pid)?);
        let v = virtplug_updates(&client, writers, args.seconds).await?;
        let (c1, w1) = (cputime::cpu_seconds(vp_pid)?, cputime::write_bytes(vp_pid)?);
        let (e0, x0) = (cputime::cpu_seconds(etcd_pid)?, cputime::write_bytes(etcd_pid)?);
        let e = etcd_updates(&etcd, writers, args.seconds).await?;
        let (e1, x1) = (cputime::cpu_seconds(etcd_pid)?, cputime::write_bytes(etcd_pid)?);
        #[allow(clippy::cast_precision_loss)]
        let per = |total: f64, rate: f64| total / (rate * args.seconds as f64).max(1.0);
        let (vc, ec) = (per((c1 - c0) * 1e6, v), per((e1 - e0) * 1e6, e));
        #[allow(clippy::cast_precision_loss)]
        let (vw, ew) = (per(w1.saturating_sub(w0) as f64 / 1024.0, v), per(x1.saturating_sub(x0) as f64 / 1024.0, e));
        println!("| {writers} | {v:.0} | {e:.0} | {:.2} | {vc:.0} | {ec:.0} | {:.2} | {vw:.1} | {ew:.1} |", v / e, ec / vc);
        if writers == 1 {
            one = (v, e);
        }
    }
    let floor = disk_syncs_per_second(dir.path(), args.seconds)?;
    println!();
    println!(
        "Disk floor, one writer (4 KiB written in place + fdatasync, in turn, same file system): {floor:.0} syncs/s; \
         at 1 writer virtplug reached {:.0} % of it, etcd {:.0} %",
        one.0 / floor * 100.0,
        one.1 / floor * 100.0
    );
    println!();
    let v = virtplug_watch(&client, args.watchers, args.rounds).await?;
    let e = etcd_watch(&etcd, args.watchers, args.rounds).await?;
    println!("Watch fan-out: 1 change to {} watchers, {} rounds (ms from write sent to event received)", args.watchers, args.rounds);
    println!();
    println!("| | p50 | p99 | max |");
    println!("|---|---:|---:|---:|");
    for (name, l) in [("virtplug", &v), ("etcd", &e)] {
        println!("| {name} | {:.2} | {:.2} | {:.2} |", percentile(l, 0.5), percentile(l, 0.99), percentile(l, 1.0));
    }
    println!();
    println!("p50 ratio virtplug / etcd: {:.2}", percentile(&v, 0.5) / percentile(&e, 0.5));
    if let Some(other) = &args.against {
        // Two fresh servers: the one above still has the watch fan-out's watchers.
        let (this_proc, this_client) = apiserver::start(&args.virtplug, &dir.path().join("this")).await?;
        let (other_proc, other_client) = apiserver::start(other, &dir.path().join("against")).await?;
        let pids = [this_proc.0.id(), other_proc.0.id()];
        let mut rates = [Vec::new(), Vec::new()];
        let mut cpu = [Vec::new(), Vec::new()];
        for _ in 0..args.slices {
            for (i, c) in [&this_client, &other_client].into_iter().enumerate() {
                let c0 = cputime::cpu_seconds(pids[i])?;
                let r = virtplug_updates(c, 1, 1).await?;
                let c1 = cputime::cpu_seconds(pids[i])?;
                rates[i].push(r);
                cpu[i].push((c1 - c0) * 1e6 / r.max(1.0));
            }
        }
        for v in rates.iter_mut().chain(cpu.iter_mut()) {
            v.sort_by(f64::total_cmp);
        }
        println!();
        println!("One writer, this build vs {}, {} alternating one-second slices each:", other.display(), args.slices);
        println!();
        println!("| build | updates/s p25 / p50 / p75 | CPU µs/update p50 |");
        println!("|---|---:|---:|");
        for (i, name) in [args.virtplug.display(), other.display()].iter().enumerate() {
            let r = &rates[i];
            println!(
                "| {name} | {:.0} / {:.0} / {:.0} | {:.0} |",
                percentile(r, 0.25),
                percentile(r, 0.5),
                percentile(r, 0.75),
                percentile(&cpu[i], 0.5)
            );
        }
        println!();
        println!("p50 ratio this build / other: {:.2}", percentile(&rates[0], 0.5) / percentile(&rates[1], 0.5));
    }
    Ok(())
}
