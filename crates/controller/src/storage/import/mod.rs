//! CDI's DataVolume, the parts the embedded deployment needs: `blank`, `http(s)` import of
//! raw, ISO, qcow2 and gzip/xz-compressed images, and `pvc` clone.
//!
//! # Flow
//! The DataVolume's claim (same name, owned by the DataVolume so it is garbage-collected with
//! it) is created from `spec.storage` or `spec.pvc`; the provisioner binds it. Then:
//! - `blank`: `Succeeded` at once (the provisioner's image is already zeros);
//! - `http`: `ImportScheduled` → `ImportInProgress` with `status.progress` ("42.17%", from
//!   Content-Length) → `Succeeded` "100.0%". The body is streamed, never buffered whole, through
//!   the [`sink`]: its format told by magic bytes ([`format`]), gzip and xz decompressed on the
//!   way, a raw image (ISO included) written into a new file beside the claim's `disk.img`,
//!   renamed over it when complete (or into the loop device of a Block claim) ([`target`]); a
//!   qcow2 image downloaded into a scratch file beside it, checked with `qemu-img info` and
//!   converted to raw into the same target with `qemu-img convert` (module `qemu_img`), as CDI
//!   converts. A qcow2 image's download is the first half of its progress, its conversion the
//!   second.
//! - `pvc`: `CloneScheduled` → `CloneInProgress` → `Succeeded`: the source claim's bytes are
//!   reflinked or copied into the same kind of target (module `clone`: same namespace only).
//!
//! Which sources are supported is said in one place, [`api::cdi::DataVolumeSpec::source_kind`]:
//! admission refuses the others (`sourceRef`, registry, s3, upload, ...) with a field error,
//! and the importer fails them with the same message where admission did not run.
//!
//! # The URL is untrusted
//! Whoever may create a DataVolume chooses what the controller fetches from inside the host's
//! network ([`net_policy`]): loopback, link-local (cloud metadata), multicast, broadcast,
//! unspecified and this machine's own addresses are refused unless allowed by
//! [`ImportConfig::allow_hosts`], checked on the address actually connected to and after every
//! redirect. An attempt has a deadline and a minimum transfer rate (module `fetch`). Deleting the
//! DataVolume cancels its transfer: the connection is closed (or `qemu-img` killed, or the copy
//! stopped) and the partial files removed. A controller that stops (a leader that lost its
//! lease) stops its transfers the same way; the next one starts them again.
//!
//! # The image is untrusted
//! Its decompressed size is bounded by the claim and [`ImportConfig::max_bytes`] as it is
//! produced (a decompression bomb stops at the claim's size); `qemu-img` is given only paths
//! the controller created, with `-f qcow2` (never probing), and a qcow2 image with a backing
//! file, an external data file or a virtual size larger than the claim is refused before it
//! is converted.
//!
//! # Failures
//! Permanent (phase `Failed` at once, reason in the `Running` condition and an `ImportFailed`
//! Event; no file left but the blank image): a scheme other than http/https, a refused host or
//! redirect, a source larger than the claim or than [`ImportConfig::max_bytes`] (compressed or
//! decompressed), a corrupt gzip/xz stream, a stream compressed twice, a corrupt qcow2 image,
//! one with a backing or data file or larger than the claim, a symlink where the image goes; a
//! clone from another namespace or of a larger claim. Transient (a non-2xx answer, a connection
//! error, a body that ends before its Content-Length, the deadline, a transfer below the
//! minimum rate, `qemu-img` missing, a clone source missing or not Bound): `restartCount` + 1
//! and a new attempt after a capped exponential backoff with jitter; past
//! [`ImportConfig::max_retries`] the phase is `Failed`. Editing the DataVolume's source does not
//! restart a finished import (as CDI); delete and re-create it.

mod clone;
mod fetch;
pub mod format;
pub mod net_policy;
mod qemu_img;
pub mod sink;
pub mod target;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use api::cdi::{DataVolumeStatus, PvcSource, SourceKind};
use api::kubevirt::Condition;
use api::phases::{ClaimPhase, DataVolumePhase};
use api::DataVolume;
use client::backoff::{Backoff, Jitter};
use client::events::{self, EventType};

pub use net_policy::AllowEntry;
use net_policy::{GuardedResolver, NetPolicy};

use super::parse_bytes;
use crate::runner::{Action, Runner};

const COMPONENT: &str = "virtplug-importer";

/// Import limits, retry policy and the hosts imports may reach.
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
    /// Hosts and networks an import may reach although they are refused by default (loopback,
    /// link-local, this machine's addresses, ...). Default: none.
    pub allow_hosts: Vec<AllowEntry>,
    /// Longest time one attempt may take, connect to final sync (default 1 h).
    pub deadline: Duration,
    /// Slowest transfer accepted, in bytes per second averaged over [`Self::min_rate_window`]
    /// (default 16 KiB/s; 0 turns the check off).
    pub min_rate: u64,
    /// The window of [`Self::min_rate`] (default 60 s).
    pub min_rate_window: Duration,
    /// Redirects followed before giving up (default 10).
    pub max_redirects: usize,
}

impl Default for ImportConfig {
    fn default() -> Self {
        ImportConfig {
            max_retries: 3,
            backoff_base: Duration::from_secs(2),
            backoff_cap: Duration::from_secs(60),
            max_bytes: 64 << 30,
            progress_interval: Duration::from_millis(500),
            allow_hosts: Vec::new(),
            deadline: Duration::from_secs(3600),
            min_rate: 16 << 10,
            min_rate_window: Duration::from_secs(60),
            max_redirects: 10,
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
    /// The DataVolume was deleted during the attempt.
    #[error("cancelled: the DataVolume was deleted")]
    Cancelled,
}

struct Ctx {
    client: kube::Client,
    root: PathBuf,
    config: ImportConfig,
    policy: Arc<NetPolicy>,
    http: reqwest::Client,
    /// DataVolume UID → when its next attempt may start (absent: may start now). A running
    /// import holds `Instant` far in the future.
    gates: Mutex<HashMap<String, Instant>>,
    /// Closed when [`run`] ends or is dropped (a leader that lost its lease, a controller
    /// stopped): the attempts it spawned stop with it, as if their DataVolume were deleted,
    /// rather than race the next leader's attempt on the same claim.
    running: tokio::sync::watch::Receiver<()>,
}

impl Ctx {
    fn new(
        client: kube::Client,
        root: PathBuf,
        config: ImportConfig,
        running: tokio::sync::watch::Receiver<()>,
    ) -> Result<Ctx, reqwest::Error> {
        let policy = Arc::new(NetPolicy::new(config.allow_hosts.clone()));
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            // A proxy would resolve and connect out of the policy's sight.
            .no_proxy()
            .dns_resolver(GuardedResolver(Arc::clone(&policy)))
            .redirect(net_policy::redirect_policy(Arc::clone(&policy), config.max_redirects))
            .build()?;
        Ok(Ctx { client, root, config, policy, http, gates: Mutex::new(HashMap::new()), running })
    }
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
/// A gate held by a running attempt (lifted, or set to its retry's time, when it ends).
const HELD: Duration = Duration::from_secs(365 * 86400);

async fn set_status(api: &Api<DataVolume>, name: &str, f: impl Fn(&mut DataVolumeStatus)) -> Result<(), ImportError> {
    client::update_status(api, name, |dv: &mut DataVolume| f(dv.status.get_or_insert_with(Default::default)))
        .await
        .map(|_| ())
        .map_err(|e| status_error(&e))
}

/// A failed status write: transient (the reconcile runs again).
fn status_error(e: &dyn std::error::Error) -> ImportError {
    ImportError::Transient(format!("cannot write the DataVolume's status: {}", client::error_chain(e)))
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

/// The delay before the retry that follows `restarts` earlier ones: capped exponential, ±25 %.
fn backoff(config: &ImportConfig, restarts: i32) -> Duration {
    let retry = u32::try_from(restarts).unwrap_or(0).saturating_add(1);
    Backoff { base: config.backoff_base, cap: config.backoff_cap, jitter: Jitter::Proportional(0.25) }.delay(retry)
}

async fn reconcile(dv: Arc<DataVolume>, ctx: Arc<Ctx>) -> Result<Action, ImportError> {
    // Every log line of the import, its background attempt's included, names the DataVolume.
    let span = tracing::info_span!("datavolume", datavolume = %format!("{}/{}", dv.namespace().unwrap_or_default(), dv.name_any()));
    let r = reconcile_once(dv, ctx).instrument(span).await;
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
    if matches!(status.phase, Some(DataVolumePhase::Succeeded | DataVolumePhase::Failed)) {
        return Ok(Action::await_change());
    }
    // Admission refused these already; a cluster without virtplug's admission gets the same
    // message here.
    let job = match dv.spec.source_kind() {
        Err((field, msg)) => {
            fail(&ctx, &dvs, &dv, &format!("{field}: {msg}")).await?;
            return Ok(Action::await_change());
        }
        Ok(SourceKind::Blank) => None,
        Ok(SourceKind::Http(h)) => Some(Job::Http(h.url.clone())),
        Ok(SourceKind::Pvc(p)) => Some(Job::Clone(p.clone())),
    };

    let existing = pvcs.get_opt(&name).await.map_err(|e| ImportError::Transient(format!("cannot read claim {ns}/{name}: {e}")))?;
    let Some(pvc) = existing else {
        match claim_for(&dv) {
            Ok(claim) => {
                pvcs.create(&PostParams::default(), &claim)
                    .await
                    .map_err(|e| ImportError::Transient(format!("cannot create claim {ns}/{name}: {e}")))?;
                set_status(&dvs, &name, |s| {
                    s.phase = Some(DataVolumePhase::Pending);
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
    if !ClaimPhase::is_bound(&pvc) {
        return Ok(Action::await_change()); // the claim's binding wakes us
    }
    let bound_cond = condition("Bound", true, "Bound", &format!("claim {name} bound"));

    let Some(job) = job else {
        set_status(&dvs, &name, |s| {
            s.phase = Some(DataVolumePhase::Succeeded);
            s.progress = Some("100.0%".into());
            s.claim_name = Some(name.clone());
            set_condition(&mut s.conditions, bound_cond.clone());
            set_condition(&mut s.conditions, condition("Ready", true, "Completed", "blank image ready"));
        })
        .await?;
        return Ok(Action::await_change());
    };

    // http or clone: one attempt at a time per DataVolume, after its backoff.
    {
        let mut gates = ctx.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = gates.get(&uid) {
            let now = Instant::now();
            if *at > now {
                return Ok(Action::requeue((*at - now).min(Duration::from_secs(3600))));
            }
        }
        gates.insert(uid.clone(), Instant::now() + HELD);
    }
    let scheduled = if matches!(job, Job::Clone(_)) { DataVolumePhase::CloneScheduled } else { DataVolumePhase::ImportScheduled };
    // `dv` may be older than the last attempt's outcome: the attempt lifts the gate once its
    // `Succeeded` or `Failed` is written, and a reconcile woken before that write reached the
    // watch still holds the copy from before it. The decision is taken on the fresh copy the
    // write reads, so a finished import is never scheduled again (its phase overwritten and the
    // source fetched anew), and the restart count is the last attempt's.
    let mut restarts = 0;
    let scheduling = client::try_update_status(&dvs, &name, &client::UpdateOptions::default(), |fresh: &mut DataVolume| {
        if fresh.uid() != dv.uid() {
            return Err(NotScheduled::Replaced);
        }
        let s = fresh.status.get_or_insert_with(Default::default);
        if let Some(phase @ (DataVolumePhase::Succeeded | DataVolumePhase::Failed)) = &s.phase {
            return Err(NotScheduled::Finished(phase.clone()));
        }
        restarts = s.restart_count.unwrap_or(0);
        s.phase = Some(scheduled.clone());
        s.claim_name = Some(name.clone());
        set_condition(&mut s.conditions, bound_cond.clone());
        Ok(())
    })
    .await;
    if let Err(e) = scheduling {
        ctx.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&uid);
        return match e {
            // Its own watch event wakes the reconcile with the fresh copy.
            client::UpdateError::Mutate { source, .. } => {
                tracing::debug!("no new attempt: {source}");
                Ok(Action::await_change())
            }
            e => Err(status_error(&e)),
        };
    }
    tokio::spawn(run_attempt(ctx, dvs, dv, pvc, job, restarts).in_current_span());
    Ok(Action::await_change())
}

/// Why a reconcile holding an older copy of the DataVolume starts no attempt (or an attempt's
/// outcome is not written).
#[derive(Debug, thiserror::Error)]
enum NotScheduled {
    #[error("the import has finished (phase {0:?})")]
    Finished(DataVolumePhase),
    #[error("the DataVolume was replaced by another of the same name")]
    Replaced,
}

/// Resolves when the DataVolume `name` with `uid` is deleted (gone, replaced by another of
/// the same name, or marked for deletion). Watch errors are retried with kube's backoff.
async fn deleted(dvs: Api<DataVolume>, name: String, uid: String) {
    let stream = watcher::watch_object(dvs, &name).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Some(dv)) if dv.uid().as_deref() == Some(uid.as_str()) && dv.metadata.deletion_timestamp.is_none() => {}
            Ok(_) => return,
            Err(e) => tracing::debug!("watching DataVolume {name} for its deletion: {e}"),
        }
    }
    // The stream never ends with a backoff; if it did, the import just runs to its end.
    std::future::pending::<()>().await;
}

/// What fills the claim.
enum Job {
    /// `source.http.url`.
    Http(String),
    /// `source.pvc`.
    Clone(PvcSource),
}

/// One import attempt in the background, cancelled when the DataVolume is deleted, then its
/// outcome: success, a retry after the backoff, or `Failed`.
async fn run_attempt(ctx: Arc<Ctx>, dvs: Api<DataVolume>, dv: Arc<DataVolume>, pvc: PersistentVolumeClaim, job: Job, restarts: i32) {
    let (name, uid) = (dv.name_any(), dv.uid().unwrap_or_default());
    let work = async {
        match &job {
            Job::Http(url) => fetch::attempt(&ctx, &dvs, &name, &pvc, url).await,
            Job::Clone(src) => clone::attempt(&ctx, &dvs, &dv, &pvc, src).await,
        }
    };
    // Dropping the attempt closes its connection (or kills its qemu-img, or stops its copy) and
    // removes its partial files.
    let mut running = ctx.running.clone();
    let result = tokio::select! {
        r = work => r,
        () = deleted(dvs.clone(), name.clone(), uid.clone()) => Err(ImportError::Cancelled),
        // Only closes: nothing is ever sent.
        _ = running.changed() => {
            tracing::info!("the DataVolume controller stopped: its import stopped, for the next one to start again");
            return;
        }
    };
    let retry = match &result {
        Err(ImportError::Transient(msg)) if restarts < ctx.config.max_retries => Some((msg.clone(), backoff(&ctx.config, restarts))),
        _ => None,
    };
    // The gate stays held until the outcome is written, so that no reconcile starts another
    // attempt in between (a retry's write, sent again while the API is away, could otherwise
    // land over that attempt). A retry's delay starts as its write is sent (`write_outcome`):
    // the write wakes the reconcile, which must see the delay.
    match (&result, retry) {
        (Ok(done), _) => {
            write_outcome(&ctx, &dvs, &dv, "record the import's success", None, |s| succeeded(s, done)).await;
        }
        (Err(ImportError::Cancelled), _) => {
            tracing::info!("the DataVolume was deleted: its import stopped");
        }
        (_, Some((msg, delay))) => {
            let msg_delay = format!("{msg}; retrying in {delay:.1?}");
            events::publish(&ctx.client, COMPONENT, dv.as_ref(), EventType::Warning, "ImportRetry", &msg_delay).await;
            let scheduled = if matches!(job, Job::Clone(_)) { DataVolumePhase::CloneScheduled } else { DataVolumePhase::ImportScheduled };
            let written = write_outcome(&ctx, &dvs, &dv, "record the import's retry", Some(delay), |s| {
                s.phase = Some(scheduled.clone());
                s.restart_count = Some(restarts + 1);
                set_condition(&mut s.conditions, condition("Running", false, "Error", &msg));
            })
            .await;
            if written {
                // The gate now says when the next attempt may start.
                return;
            }
        }
        (Err(ImportError::Permanent(msg)), None) => {
            announce_failure(&ctx, &dv, msg).await;
            write_outcome(&ctx, &dvs, &dv, "record the import's failure", None, |s| failed(s, msg)).await;
        }
        (Err(ImportError::Transient(msg)), None) => {
            let msg = format!("{msg} (gave up after {} attempts)", restarts + 1);
            announce_failure(&ctx, &dv, &msg).await;
            write_outcome(&ctx, &dvs, &dv, "record the import's failure", None, |s| failed(s, &msg)).await;
        }
    }
    ctx.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&uid);
}

/// Writes an attempt's outcome to its DataVolume, again until it is written
/// ([`client::persist`]): nothing else writes it, and a lost one would leave the DataVolume
/// `ImportInProgress` (or its retry uncounted) until the next resync, up to an hour. Whether it
/// was written; nothing is written when the DataVolume is gone, is another one of the same
/// name, or has finished (`Succeeded`/`Failed`: an outcome is never written over another), nor
/// once the controller stops (the next one finds the attempt unfinished and starts it again).
///
/// `retry_in`: the gate opens that long after the write is sent (set right before each send,
/// and held again when a send fails), so the reconcile the write wakes sees the delay, and no
/// attempt starts while the write is still being retried.
async fn write_outcome(
    ctx: &Ctx,
    dvs: &Api<DataVolume>,
    dv: &DataVolume,
    what: &str,
    retry_in: Option<Duration>,
    f: impl Fn(&mut DataVolumeStatus),
) -> bool {
    let (name, uid, opts) = (dv.name_any(), dv.uid(), client::UpdateOptions::default());
    let (name, uid, opts, f) = (&name, &uid, &opts, &f);
    let gate = |at: Instant| {
        let key = uid.clone().unwrap_or_default();
        ctx.gates.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, at);
    };
    let write = client::persist(what, || async {
        let r = client::try_update_status(dvs, name, opts, |fresh: &mut DataVolume| {
            if fresh.uid() != *uid {
                return Err(NotScheduled::Replaced);
            }
            let s = fresh.status.get_or_insert_with(Default::default);
            if let Some(phase @ (DataVolumePhase::Succeeded | DataVolumePhase::Failed)) = &s.phase {
                return Err(NotScheduled::Finished(phase.clone()));
            }
            f(s);
            if let Some(delay) = retry_in {
                gate(Instant::now() + delay);
            }
            Ok(())
        })
        .await;
        if r.is_err() && retry_in.is_some() {
            gate(Instant::now() + HELD);
        }
        r
    });
    let mut running = ctx.running.clone();
    tokio::select! {
        r = write => match r {
            Ok(_) => true,
            Err(e) if e.is_not_found() || matches!(e, client::UpdateError::Mutate { .. }) => {
                tracing::info!("the DataVolume is gone, replaced or finished: this outcome is not recorded ({e})");
                false
            }
            Err(e) => {
                tracing::warn!("{}", status_error(&e));
                false
            }
        },
        // Only closes: nothing is ever sent.
        _ = running.changed() => false,
    }
}

/// What a finished attempt says in its `Succeeded` status.
pub(super) struct Done {
    /// The `Running` condition's message ("import done").
    pub(super) running: &'static str,
    /// The `Ready` condition's message (what was written).
    pub(super) ready: String,
}

/// A finished import's status.
fn succeeded(s: &mut DataVolumeStatus, done: &Done) {
    s.phase = Some(DataVolumePhase::Succeeded);
    s.progress = Some("100.0%".into());
    set_condition(&mut s.conditions, condition("Running", false, "Completed", done.running));
    set_condition(&mut s.conditions, condition("Ready", true, "Completed", &done.ready));
}

/// A progress write: best effort, since the next one or the outcome writes over it. A refused
/// one used to fail the attempt, and the whole image was fetched again.
pub(super) async fn report_progress(dvs: &Api<DataVolume>, name: &str, pct: &str) {
    if let Err(e) = set_status(dvs, name, |s| s.progress = Some(pct.to_owned())).await {
        tracing::debug!("progress {pct} not recorded: {e}");
    }
}

/// A failed import's status.
fn failed(s: &mut DataVolumeStatus, msg: &str) {
    s.phase = Some(DataVolumePhase::Failed);
    set_condition(&mut s.conditions, condition("Running", false, "Error", msg));
    set_condition(&mut s.conditions, condition("Ready", false, "Error", msg));
}

/// The Event and log line of a failed import.
async fn announce_failure(ctx: &Ctx, dv: &DataVolume, msg: &str) {
    events::publish(&ctx.client, COMPONENT, dv, EventType::Warning, "ImportFailed", msg).await;
    tracing::warn!("{msg}");
}

async fn fail(ctx: &Ctx, dvs: &Api<DataVolume>, dv: &DataVolume, msg: &str) -> Result<(), ImportError> {
    announce_failure(ctx, dv, msg).await;
    set_status(dvs, &dv.name_any(), |s| failed(s, msg)).await
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(dv: Arc<DataVolume>, err: &ImportError, _: Arc<Ctx>) -> Action {
    tracing::warn!(datavolume = %format!("{}/{}", dv.namespace().unwrap_or_default(), dv.name_any()), "{err}");
    Action::requeue(Duration::from_secs(2))
}

/// Runs the DataVolume controller for claims under `root` until the process stops.
///
/// # Errors
/// When the HTTP client cannot be built (no TLS roots).
pub async fn run(client: kube::Client, root: PathBuf, config: ImportConfig) -> Result<(), reqwest::Error> {
    let dvs: Api<DataVolume> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    // Held until this function returns or is dropped: see `Ctx::running`.
    let (_running, running) = tokio::sync::watch::channel(());
    let ctx = Arc::new(Ctx::new(client, root, config, running)?);
    Runner::new(dvs, watcher::Config::default())
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
        .await;
    Ok(())
}

#[cfg(test)]
mod tests;
