//! CDI's DataVolume, the parts the embedded deployment needs: `blank` and `http(s)` import.
//!
//! # Flow
//! The DataVolume's claim (same name, owned by the DataVolume so it is garbage-collected with
//! it) is created from `spec.storage` or `spec.pvc`; the provisioner binds it. Then:
//! - `blank`: `Succeeded` at once (the provisioner's image is already zeros);
//! - `http`: `ImportScheduled` → `ImportInProgress` with `status.progress` ("42.17%", from
//!   Content-Length) → `Succeeded` "100.0%". The body is streamed into the claim's `disk.img` or
//!   loop device, never buffered whole.
//!
//! # Failures
//! Permanent (phase `Failed` at once, reason in the `Running` condition and an `ImportFailed`
//! Event): a scheme other than http/https, a source larger than the claim or than
//! [`ImportConfig::max_bytes`], a qcow2 image (raw and ISO only). Transient (a non-2xx answer,
//! a connection error, a body that ends before its Content-Length): `restartCount` + 1 and a new
//! attempt after a capped exponential backoff with jitter; past
//! [`ImportConfig::max_retries`] the phase is `Failed`. Editing the DataVolume's source does not
//! restart a finished import (as CDI); delete and re-create it.

use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::{Resource, ResourceExt};

use api::cdi::DataVolumeStatus;
use api::kubevirt::Condition;
use api::DataVolume;
use client::events::{self, EventType};

use super::{data_path, parse_bytes};

const COMPONENT: &str = "virtplug-importer";

/// Import limits and retry policy.
#[derive(Clone, Debug)]
pub struct ImportConfig {
    /// Transient failures retried before the phase becomes `Failed` (default 3).
    pub max_retries: i32,
    /// First retry delay (default 2 s); doubles per attempt, with ±25 % jitter.
    pub backoff_base: Duration,
    /// Longest retry delay (default 60 s).
    pub backoff_cap: Duration,
    /// Largest source accepted, whatever the claim's size (default 64 GiB).
    pub max_bytes: u64,
    /// Shortest interval between two `status.progress` writes (default 500 ms).
    pub progress_interval: Duration,
}

impl Default for ImportConfig {
    fn default() -> Self {
        ImportConfig {
            max_retries: 3,
            backoff_base: Duration::from_secs(2),
            backoff_cap: Duration::from_secs(60),
            max_bytes: 64 << 30,
            progress_interval: Duration::from_millis(500),
        }
    }
}

/// Why an import attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{0}")]
    Permanent(String),
    #[error("{0}")]
    Transient(String),
}

struct Ctx {
    client: kube::Client,
    root: PathBuf,
    config: ImportConfig,
    http: reqwest::Client,
    /// DataVolume UID → when its next attempt may start (absent: may start now). A running
    /// import holds `Instant` far in the future.
    gates: Mutex<HashMap<String, Instant>>,
}

fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_transition_time: Some(jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        ..Condition::default()
    }
}

fn set_condition(conds: &mut Vec<Condition>, c: Condition) {
    match conds.iter_mut().find(|x| x.type_ == c.type_) {
        Some(x) if x.status == c.status && x.reason == c.reason && x.message == c.message => {}
        Some(x) => *x = c,
        None => conds.push(c),
    }
}

/// Writes the DataVolume's status through `client::update_status`.
async fn set_status(api: &Api<DataVolume>, name: &str, f: impl Fn(&mut DataVolumeStatus)) -> Result<(), ImportError> {
    client::update_status(api, name, |dv: &mut DataVolume| f(dv.status.get_or_insert_with(Default::default)))
        .await
        .map(|_| ())
        .map_err(|e| ImportError::Transient(format!("cannot write the DataVolume's status: {}", client::error_chain(&e))))
}

/// The claim a DataVolume asks for.
fn claim_for(dv: &DataVolume) -> Result<PersistentVolumeClaim, String> {
    let (modes, mode, size, class) = match (&dv.spec.storage, &dv.spec.pvc) {
        (Some(s), _) => (
            s.access_modes.clone(),
            s.volume_mode.clone(),
            s.resources.as_ref().and_then(|r| r.requests.get("storage")).cloned(),
            s.storage_class_name.clone(),
        ),
        (None, Some(p)) => (
            p.access_modes.clone().unwrap_or_default(),
            p.volume_mode.clone(),
            p.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).cloned(),
            p.storage_class_name.clone(),
        ),
        (None, None) => return Err("spec.storage is required: give its size, e.g. storage: {resources: {requests: {storage: 1Gi}}}".into()),
    };
    let size = size.ok_or_else(|| "spec.storage.resources.requests.storage is required: the claim's size, e.g. 1Gi".to_owned())?;
    parse_bytes(&size.0).map_err(|e| format!("spec.storage.resources.requests.storage: {e}"))?;
    let owner = OwnerReference {
        api_version: DataVolume::api_version(&()).into_owned(),
        kind: DataVolume::kind(&()).into_owned(),
        name: dv.name_any(),
        uid: dv.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    Ok(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(dv.name_any()),
            namespace: dv.namespace(),
            owner_references: Some(vec![owner]),
            labels: Some([("app".to_owned(), "containerized-data-importer".to_owned())].into_iter().collect()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(if modes.is_empty() { vec!["ReadWriteOnce".to_owned()] } else { modes }),
            volume_mode: mode,
            storage_class_name: class,
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_owned(), size)].into_iter().collect()),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    })
}

fn backoff(config: &ImportConfig, restarts: i32) -> Duration {
    let exp = config.backoff_base.saturating_mul(1u32 << restarts.clamp(0, 16));
    let d = exp.min(config.backoff_cap);
    d.mul_f64(rand::random_range(0.75..1.25))
}

async fn reconcile(dv: Arc<DataVolume>, ctx: Arc<Ctx>) -> Result<Action, ImportError> {
    let r = reconcile_once(dv, ctx).await;
    crate::metrics::count("datavolume", r.is_ok());
    r
}

async fn reconcile_once(dv: Arc<DataVolume>, ctx: Arc<Ctx>) -> Result<Action, ImportError> {
    if dv.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = dv.namespace().unwrap_or_default();
    let name = dv.name_any();
    let uid = dv.uid().unwrap_or_default();
    let dvs: Api<DataVolume> = Api::namespaced(ctx.client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let status = dv.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_default();
    if matches!(phase.as_str(), "Succeeded" | "Failed") {
        return Ok(Action::await_change());
    }
    let source = dv.spec.source.clone().unwrap_or_default();
    if source.http.is_none() && source.blank.is_none() {
        let msg = if source.pvc.is_some() {
            "cloning a claim (source.pvc) is not supported; use source.http or source.blank"
        } else {
            "spec.source needs one of http {url} or blank {}"
        };
        fail(&ctx, &dvs, &dv, msg).await?;
        return Ok(Action::await_change());
    }

    let existing = pvcs.get_opt(&name).await.map_err(|e| ImportError::Transient(format!("cannot read claim {ns}/{name}: {e}")))?;
    let Some(pvc) = existing else {
        match claim_for(&dv) {
            Ok(claim) => {
                pvcs.create(&PostParams::default(), &claim)
                    .await
                    .map_err(|e| ImportError::Transient(format!("cannot create claim {ns}/{name}: {e}")))?;
                set_status(&dvs, &name, |s| {
                    s.phase = Some("Pending".into());
                    s.progress = Some("N/A".into());
                    s.claim_name = Some(name.clone());
                    set_condition(&mut s.conditions, condition("Bound", false, "Pending", &format!("claim {name} is waiting to be bound")));
                })
                .await?;
            }
            Err(msg) => fail(&ctx, &dvs, &dv, &msg).await?,
        }
        return Ok(Action::await_change());
    };
    if !pvc.owner_references().iter().any(|o| o.uid == uid) {
        fail(
            &ctx,
            &dvs,
            &dv,
            &format!("claim {name} already exists and does not belong to this DataVolume; delete it or name the DataVolume differently"),
        )
        .await?;
        return Ok(Action::await_change());
    }
    if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Ok(Action::await_change()); // the claim's binding wakes us
    }
    let bound_cond = condition("Bound", true, "Bound", &format!("claim {name} bound"));

    if source.blank.is_some() {
        set_status(&dvs, &name, |s| {
            s.phase = Some("Succeeded".into());
            s.progress = Some("100.0%".into());
            s.claim_name = Some(name.clone());
            set_condition(&mut s.conditions, bound_cond.clone());
            set_condition(&mut s.conditions, condition("Ready", true, "Completed", "blank image ready"));
        })
        .await?;
        return Ok(Action::await_change());
    }

    // http: one attempt at a time per DataVolume, after its backoff.
    {
        let mut gates = ctx.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = gates.get(&uid) {
            let now = Instant::now();
            if *at > now {
                return Ok(Action::requeue((*at - now).min(Duration::from_secs(3600))));
            }
        }
        gates.insert(uid.clone(), Instant::now() + Duration::from_secs(365 * 86400));
    }
    set_status(&dvs, &name, |s| {
        s.phase = Some("ImportScheduled".into());
        s.claim_name = Some(name.clone());
        set_condition(&mut s.conditions, bound_cond.clone());
    })
    .await?;
    let url = source.http.map(|h| h.url).unwrap_or_default();
    let ctx2 = Arc::clone(&ctx);
    tokio::spawn(async move {
        let result = import(&ctx2, &dvs, &name, &pvc, &url).await;
        let restarts = status.restart_count.unwrap_or(0);
        let retry = match &result {
            Err(ImportError::Transient(msg)) if restarts < ctx2.config.max_retries => Some((msg.clone(), backoff(&ctx2.config, restarts))),
            _ => None,
        };
        // A retry's gate is set before its status write (which wakes the reconcile, and that
        // must see the delay); any other outcome's gate is lifted only after the final status
        // is written, so no reconcile can start another attempt in between.
        if let Some((_, delay)) = &retry {
            ctx2.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(uid.clone(), Instant::now() + *delay);
        }
        match (&result, retry) {
            (Ok(()), _) => {}
            (_, Some((msg, delay))) => {
                events::publish(
                    &ctx2.client,
                    COMPONENT,
                    dv.as_ref(),
                    EventType::Warning,
                    "ImportRetry",
                    &format!("{msg}; retrying in {delay:.1?}"),
                )
                .await;
                let _ = set_status(&dvs, &name, |s| {
                    s.phase = Some("ImportScheduled".into());
                    s.restart_count = Some(restarts + 1);
                    set_condition(&mut s.conditions, condition("Running", false, "Error", &msg));
                })
                .await;
                return;
            }
            (Err(ImportError::Permanent(msg)), None) => {
                let _ = fail(&ctx2, &dvs, &dv, msg).await;
            }
            (Err(ImportError::Transient(msg)), None) => {
                let _ = fail(&ctx2, &dvs, &dv, &format!("{msg} (gave up after {} attempts)", restarts + 1)).await;
            }
        }
        ctx2.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&uid);
    });
    Ok(Action::await_change())
}

async fn fail(ctx: &Ctx, dvs: &Api<DataVolume>, dv: &DataVolume, msg: &str) -> Result<(), ImportError> {
    events::publish(&ctx.client, COMPONENT, dv, EventType::Warning, "ImportFailed", msg).await;
    tracing::warn!("DataVolume {}/{}: {msg}", dv.namespace().unwrap_or_default(), dv.name_any());
    set_status(dvs, &dv.name_any(), |s| {
        s.phase = Some("Failed".into());
        set_condition(&mut s.conditions, condition("Running", false, "Error", msg));
        set_condition(&mut s.conditions, condition("Ready", false, "Error", msg));
    })
    .await
}

/// One attempt: stream `url` into the claim.
async fn import(ctx: &Ctx, dvs: &Api<DataVolume>, name: &str, pvc: &PersistentVolumeClaim, url: &str) -> Result<(), ImportError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| ImportError::Permanent(format!("spec.source.http.url {url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ImportError::Permanent(format!(
            "spec.source.http.url uses the scheme {:?}; only http and https sources are imported (no local files)",
            parsed.scheme()
        )));
    }
    let capacity = super::requested_bytes(pvc).map_err(ImportError::Permanent)?;
    let limit = capacity.min(ctx.config.max_bytes);
    let target = {
        let (root, pvc) = (ctx.root.clone(), pvc.clone());
        tokio::task::spawn_blocking(move || data_path(&root, &pvc))
            .await
            .map_err(|e| ImportError::Transient(e.to_string()))?
            .ok_or_else(|| ImportError::Transient(format!("claim {name} has no backing on this node yet")))?
    };
    let resp = ctx
        .http
        .get(parsed)
        .send()
        .await
        .map_err(|e| ImportError::Transient(format!("cannot fetch {url}: {}", client::error_chain(&e))))?;
    if !resp.status().is_success() {
        return Err(ImportError::Transient(format!("{url} answered HTTP {}", resp.status())));
    }
    let total = resp.content_length();
    if let Some(len) = total {
        if len > limit {
            return Err(ImportError::Permanent(too_large(len, capacity, ctx.config.max_bytes)));
        }
    }
    set_status(dvs, name, |s| {
        s.phase = Some("ImportInProgress".into());
        s.progress = Some("0.00%".into());
        set_condition(&mut s.conditions, condition("Running", true, "Pod is running", "importing"));
    })
    .await?;

    let mut file = {
        let target_c = target.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            let mut f = std::fs::OpenOptions::new().write(true).open(&target_c)?;
            f.seek(SeekFrom::Start(0))?;
            Ok(f)
        })
        .await
        .map_err(|e| ImportError::Transient(e.to_string()))?
        .map_err(|e| ImportError::Transient(format!("cannot open {}: {e}", target.display())))?
    };
    let mut written: u64 = 0;
    let mut last_report = Instant::now();
    let mut stream = resp.bytes_stream();
    let mut first = true;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ImportError::Transient(match total {
                Some(t) => {
                    format!("the transfer from {url} broke off after {written} of {t} bytes: {}", client::error_chain(&e))
                }
                None => format!("the transfer from {url} broke off after {written} bytes: {}", client::error_chain(&e)),
            })
        })?;
        if first && chunk.starts_with(b"QFI\xfb") {
            return Err(ImportError::Permanent(format!(
                "{url} is a qcow2 image; only raw and ISO images are imported (convert with: qemu-img convert -O raw IN OUT)"
            )));
        }
        first = false;
        written += chunk.len() as u64;
        if written > limit {
            return Err(ImportError::Permanent(too_large(written, capacity, ctx.config.max_bytes)));
        }
        // Blocking write of one chunk (at most a few hundred KiB): on the blocking pool.
        file = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
            file.write_all(&chunk)?;
            Ok(file)
        })
        .await
        .map_err(|e| ImportError::Transient(e.to_string()))?
        .map_err(|e| ImportError::Transient(format!("cannot write {}: {e}", target.display())))?;
        if let Some(t) = total {
            if last_report.elapsed() >= ctx.config.progress_interval && t > 0 {
                last_report = Instant::now();
                #[allow(clippy::cast_precision_loss)]
                let pct = format!("{:.2}%", written as f64 * 100.0 / t as f64);
                set_status(dvs, name, |s| s.progress = Some(pct.clone())).await?;
            }
        }
    }
    if let Some(t) = total {
        if written != t {
            return Err(ImportError::Transient(format!("the transfer from {url} ended after {written} of {t} bytes (truncated)")));
        }
    }
    tokio::task::spawn_blocking(move || file.sync_all())
        .await
        .map_err(|e| ImportError::Transient(e.to_string()))?
        .map_err(|e| ImportError::Transient(format!("cannot sync {}: {e}", target.display())))?;
    set_status(dvs, name, |s| {
        s.phase = Some("Succeeded".into());
        s.progress = Some("100.0%".into());
        set_condition(&mut s.conditions, condition("Running", false, "Completed", "import done"));
        set_condition(&mut s.conditions, condition("Ready", true, "Completed", &format!("imported {written} bytes")));
    })
    .await?;
    tracing::info!("imported {written} bytes from {url} into claim {name}");
    Ok(())
}

fn too_large(bytes: u64, capacity: u64, max: u64) -> String {
    if bytes > max && max < capacity {
        format!("the source is at least {bytes} bytes, more than the import limit of {max} bytes")
    } else {
        format!("the source is at least {bytes} bytes, larger than the claim's {capacity} bytes; request a larger spec.storage.resources.requests.storage")
    }
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(dv: Arc<DataVolume>, err: &ImportError, _: Arc<Ctx>) -> Action {
    tracing::warn!("DataVolume {}/{}: {err}", dv.namespace().unwrap_or_default(), dv.name_any());
    Action::requeue(Duration::from_secs(2))
}

/// Runs the DataVolume controller for claims under `root` until the process stops.
///
/// # Errors
/// When the HTTP client cannot be built (no TLS roots).
pub async fn run(client: kube::Client, root: PathBuf, config: ImportConfig) -> Result<(), reqwest::Error> {
    let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).read_timeout(Duration::from_secs(60)).build()?;
    let dvs: Api<DataVolume> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let ctx = Arc::new(Ctx { client, root, config, http, gates: Mutex::new(HashMap::new()) });
    Controller::new(dvs, watcher::Config::default())
        // The claim's binding wakes its DataVolume (the claim is named after it).
        .watches(pvcs, watcher::Config::default(), |pvc| {
            let ns = pvc.namespace().unwrap_or_default();
            pvc.owner_references()
                .iter()
                .filter(|o| o.kind == "DataVolume")
                .map(|o| ObjectRef::new(&o.name).within(&ns))
                .collect::<Vec<_>>()
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
    Ok(())
}
