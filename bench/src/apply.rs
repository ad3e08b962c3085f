//! Server-side apply beside client-side apply, on the same virtplug API server in one run:
//! requests/s and latency of applying a VM (create, then a no-op re-apply, then a changed
//! re-apply) and of a 100-object manifest, and what `metadata.managedFields` costs in stored
//! bytes per object.
//!
//! Client-side apply is what `kubectl apply` does without `--server-side`: GET the object, then
//! POST it with the `last-applied-configuration` annotation when it is missing, or send the
//! three-way merge patch when it changed (nothing when it did not). Server-side apply is one
//! PATCH with `application/apply-patch+yaml` per object. Both go through kube-rs over HTTPS on
//! loopback, sequentially (as kubectl applies a manifest).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use virtplug_bench::apiserver;
use virtplug_bench::waits::within;

#[derive(Parser)]
struct Args {
    /// The virtplug binary to benchmark.
    #[arg(long, default_value = "target/release/virtplug")]
    virtplug: PathBuf,
    /// VMs applied one by one in each phase.
    #[arg(long, default_value_t = 200)]
    vms: usize,
    /// Times the 100-object manifest is applied (each time with new names, then again unchanged).
    #[arg(long, default_value_t = 5)]
    manifests: usize,
}

fn vm(name: &str, strategy: &str) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"runStrategy": strategy, "template": {"metadata": {"labels": {"vm": name}}, "spec": {
            "domain": {"cpu": {"cores": 1}, "memory": {"guest": "256Mi"}, "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": format!("{name}-root")}}]}}}})
}

fn config_map(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"key": value, "other": "x"}})
}

/// Latencies of one phase.
struct Phase {
    name: String,
    ms: Vec<f64>,
    wall: Duration,
}

impl Phase {
    fn row(&self) -> String {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
        format!("| {} | {:.0} | {:.2} | {:.2} |", self.name, self.ms.len() as f64 / self.wall.as_secs_f64(), q(0.5), q(0.99))
    }
}

/// Server-side apply of each object (one PATCH each).
async fn ssa(api: &Api<DynamicObject>, objs: &[Value], name: &str) -> anyhow::Result<Phase> {
    let pp = PatchParams::apply("bench").force();
    let (mut ms, start) = (Vec::new(), Instant::now());
    for o in objs {
        let n = o.pointer("/metadata/name").and_then(Value::as_str).context("name")?;
        let t = Instant::now();
        within(Duration::from_secs(30), format!("server-side apply of {n}"), async { Ok(api.patch(n, &pp, &Patch::Apply(o)).await?) })
            .await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Phase { name: name.to_owned(), ms, wall: start.elapsed() })
}

/// The field manager kubectl's client-side apply names.
const CSA_MANAGER: &str = "kubectl-client-side-apply";

/// Client-side apply of each object, as kubectl does it.
async fn csa(api: &Api<DynamicObject>, objs: &[Value], name: &str) -> anyhow::Result<Phase> {
    let (mut ms, start) = (Vec::new(), Instant::now());
    for o in objs {
        let n = o.pointer("/metadata/name").and_then(Value::as_str).context("name")?.to_owned();
        let t = Instant::now();
        within(Duration::from_secs(30), format!("client-side apply of {n}"), async {
            let applied = o.to_string();
            match api.get_opt(&n).await? {
                None => {
                    let mut obj = o.clone();
                    obj["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/last-applied-configuration": applied});
                    let pp = PostParams { field_manager: Some(CSA_MANAGER.to_owned()), ..PostParams::default() };
                    api.create(&pp, &serde_json::from_value(obj)?).await?;
                }
                Some(live) => {
                    let last = live.metadata.annotations.as_ref().and_then(|a| a.get("kubectl.kubernetes.io/last-applied-configuration"));
                    if last.map(String::as_str) != Some(applied.as_str()) {
                        // The three-way patch of a changed config: the new config plus the annotation.
                        let mut patch = o.clone();
                        patch["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/last-applied-configuration": applied});
                        let pp = PatchParams { field_manager: Some(CSA_MANAGER.to_owned()), ..PatchParams::default() };
                        api.patch(&n, &pp, &Patch::Merge(&patch)).await?;
                    }
                }
            }
            Ok(())
        })
        .await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Phase { name: name.to_owned(), ms, wall: start.elapsed() })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let (_server, client) = apiserver::start(&args.virtplug, dir.path()).await?;
    let vm_ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"), "virtualmachines");
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &vm_ar);
    let cm_ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps");
    let cms: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &cm_ar);

    let mut rows = Vec::new();
    for (how, prefix) in [("server-side", "s"), ("client-side", "c")] {
        let created: Vec<Value> = (0..args.vms).map(|i| vm(&format!("{prefix}{i}"), "Halted")).collect();
        let changed: Vec<Value> = (0..args.vms).map(|i| vm(&format!("{prefix}{i}"), "Always")).collect();
        for (phase, objs) in [("create", &created), ("no-op re-apply", &created), ("changed re-apply", &changed)] {
            let name = format!("VM, {how}, {phase}");
            rows.push(if how == "server-side" { ssa(&vms, objs, &name).await? } else { csa(&vms, objs, &name).await? });
        }
    }
    let mut manifest_rows = Vec::new();
    for (how, prefix) in [("server-side", "ms"), ("client-side", "mc")] {
        let (mut create_ms, mut noop_ms) = (Vec::new(), Vec::new());
        for round in 0..args.manifests {
            let objs: Vec<Value> = (0..100).map(|i| config_map(&format!("{prefix}{round}-{i}"), "v")).collect();
            for (out, label) in [(&mut create_ms, "create"), (&mut noop_ms, "no-op")] {
                let p = if how == "server-side" { ssa(&cms, &objs, label).await? } else { csa(&cms, &objs, label).await? };
                out.push(p.wall.as_secs_f64() * 1e3);
            }
        }
        manifest_rows.push((how, create_ms, noop_ms));
    }

    // managedFields' share of a stored VM.
    let with = vms.get("s0").await?;
    let full = serde_json::to_vec(&with)?.len();
    let mut bare = with.clone();
    bare.metadata.managed_fields = None;
    let without = serde_json::to_vec(&bare)?.len();

    println!("| phase | requests/s | p50 ms | p99 ms |\n|---|---:|---:|---:|");
    for r in &rows {
        println!("{}", r.row());
    }
    println!("\n| 100-object manifest | create, median ms | no-op re-apply, median ms |\n|---|---:|---:|");
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    for (how, c, n) in &manifest_rows {
        println!("| {how} | {:.0} | {:.0} |", median(c), median(n));
    }
    println!(
        "\nmanagedFields of a VM applied server-side: {} of {full} bytes ({:.0} %)",
        full - without,
        100.0 * (full - without) as f64 / full as f64
    );
    let c0 = vms.get("c0").await?;
    let mut c0_bare = c0.clone();
    c0_bare.metadata.managed_fields = None;
    println!(
        "managedFields of a VM applied client-side (Update entries, plus the last-applied annotation in the object): {} of {} bytes",
        serde_json::to_vec(&c0)?.len() - serde_json::to_vec(&c0_bare)?.len(),
        serde_json::to_vec(&c0)?.len()
    );
    Ok(())
}
