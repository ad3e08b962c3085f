//! `controller-trigger`: from an object's change to its reconcile, for the controller's runner
//! (`controller::runner::Runner`) and kube-runtime's `Controller` (its peer, and what the
//! controller ran on until 2026-12-04), side by side in one invocation.
//!
//! Both run in this process against one `virtplug apiserver` on loopback, each over ConfigMaps
//! of its own label; each round patches one ConfigMap of each in turn (alternating which goes
//! first) and times the patch's start → the reconcile that sees the patched value. The patch's
//! own round trip and the watch event are in both figures; what differs is the controller's
//! path from the event to the reconcile.
//!
//! Every wait has a deadline (`--deadline` seconds per reconcile) and names what it waited for.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;
use tokio::sync::mpsc;
use virtplug_bench::waits::within;
use virtplug_bench::{apiserver, pct};

#[derive(Parser)]
struct Args {
    /// The virtplug binary (its API server is the one both controllers watch).
    #[arg(long, default_value = "target/release/virtplug")]
    virtplug: PathBuf,
    /// Rounds (each times one change for each controller).
    #[arg(long, default_value_t = 300)]
    rounds: usize,
    /// Seconds each reconcile may take to come.
    #[arg(long, default_value_t = 30)]
    deadline: u64,
}

const NS: &str = "default";

/// What a reconcile reports: the `n` label it saw.
type Seen = mpsc::UnboundedSender<u64>;

fn label(cm: &ConfigMap) -> u64 {
    cm.labels().get("n").and_then(|v| v.parse().ok()).unwrap_or(0)
}

async fn reconcile_kube(cm: Arc<ConfigMap>, tx: Arc<Seen>) -> Result<kube::runtime::controller::Action, std::convert::Infallible> {
    let _ = tx.send(label(&cm));
    Ok(kube::runtime::controller::Action::await_change())
}

async fn reconcile_runner(cm: Arc<ConfigMap>, tx: Arc<Seen>) -> Result<controller::runner::Action, std::convert::Infallible> {
    let _ = tx.send(label(&cm));
    Ok(controller::runner::Action::await_change())
}

/// Patches ConfigMap `name` to `n` and waits for the reconcile that sees it; milliseconds.
async fn round(cms: &Api<ConfigMap>, name: &str, n: u64, rx: &mut mpsc::UnboundedReceiver<u64>, deadline: Duration) -> anyhow::Result<f64> {
    let t = Instant::now();
    cms.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"n": n.to_string()}}}))).await?;
    within(deadline, format!("the reconcile of {name} that sees n={n}"), async {
        loop {
            match rx.recv().await {
                Some(seen) if seen >= n => return Ok(t.elapsed().as_secs_f64() * 1000.0),
                Some(_) => {}
                None => anyhow::bail!("the controller of {name} stopped"),
            }
        }
    })
    .await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let deadline = Duration::from_secs(args.deadline);
    let dir = tempfile::tempdir()?;
    let (_server, client) = apiserver::start(&args.virtplug, dir.path()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    for (name, who) in [("kube", "kube-runtime"), ("runner", "runner")] {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name, "labels": {"n": "0", "controller": who}}}))?;
        cms.create(&PostParams::default(), &cm).await.with_context(|| format!("cannot create ConfigMap {name}"))?;
    }
    let (kube_tx, mut kube_rx) = mpsc::unbounded_channel();
    let (runner_tx, mut runner_rx) = mpsc::unbounded_channel();
    let all: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let kube = kube::runtime::Controller::new(all.clone(), watcher::Config::default().labels("controller=kube-runtime"))
        .run(reconcile_kube, |_, _, _| kube::runtime::controller::Action::await_change(), Arc::new(kube_tx))
        .for_each(|_| async {});
    let runner = controller::runner::Runner::new(all, watcher::Config::default().labels("controller=runner")).run(
        reconcile_runner,
        |_, _, _| controller::runner::Action::await_change(),
        Arc::new(runner_tx),
    );
    let (kube, runner) = (tokio::spawn(kube), tokio::spawn(runner));
    // Each controller's first reconcile (its initial list) before the rounds.
    for (rx, who) in [(&mut kube_rx, "kube-runtime"), (&mut runner_rx, "runner")] {
        within(deadline, format!("the {who} controller's first reconcile"), async { rx.recv().await.context("stopped") }).await?;
    }
    let (mut k, mut r) = (Vec::new(), Vec::new());
    for i in 0..args.rounds {
        let n = i as u64 + 1;
        if i % 2 == 0 {
            k.push(round(&cms, "kube", n, &mut kube_rx, deadline).await?);
            r.push(round(&cms, "runner", n, &mut runner_rx, deadline).await?);
        } else {
            r.push(round(&cms, "runner", n, &mut runner_rx, deadline).await?);
            k.push(round(&cms, "kube", n, &mut kube_rx, deadline).await?);
        }
    }
    kube.abort();
    runner.abort();
    println!("change → reconcile that sees it, {} rounds (ms; the patch's round trip included)\n", args.rounds);
    println!("| controller | p50 | p90 | p99 | mean |");
    println!("|---|---:|---:|---:|---:|");
    for (who, v) in [("kube-runtime `Controller`", &k), ("`controller::runner::Runner`", &r)] {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        println!("| {who} | {:.2} | {:.2} | {:.2} | {mean:.2} |", pct(v, 0.5), pct(v, 0.9), pct(v, 0.99));
    }
    println!("\nrunner p50 / kube-runtime p50: {:.2}", pct(&r, 0.5) / pct(&k, 0.5));
    Ok(())
}
