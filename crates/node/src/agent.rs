//! The node agent's top level: heartbeat on its Node, watch the VMIs assigned to it, run one
//! [`worker`](crate::worker) per VMI, and after a restart adopt the QEMUs it left running.
//!
//! # Flow
//! 1. Every heartbeat interval the agent patches two keys on its Node (KubeVirt's model): the label
//!    [`NODE_SCHEDULABLE`]`=true` and the annotation [`NODE_HEARTBEAT`]`=<now>`. It never creates
//!    the Node nor writes its status: both are the kubelet's (in `up`, its stand-in's). The
//!    controller takes a node whose heartbeat went stale out of scheduling ([`controller::nodes`]
//!    in the controller crate).
//! 2. VMIs are watched with the label `kubevirt.io/nodeName=NODE` (set by the controller with
//!    `status.nodeName`); each VMI UID gets a worker that owns its QEMU and QMP connection and
//!    receives every new version of the VMI.
//! 3. Claims and DataVolumes are watched too, and the mount table (`POLLPRI` on
//!    `/proc/self/mountinfo`): any change wakes every worker, so a volume waiting for its storage
//!    attaches within one wake-up of the storage appearing (no polling).
//! 4. After the first full list, run dirs whose VMI no longer exists are stopped and removed
//!    (their VMI was deleted while the agent was down).
//!
//! # Guarantees
//! Stopping the agent (or `kill -9`) never stops a VM: workers are dropped, QEMUs keep running
//! (a session of their own, not our children once we are gone), and the next agent adopts them from their run dirs.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tokio::sync::watch;
use tracing::Instrument;

use api::annotations::{NODE_HEARTBEAT, NODE_SCHEDULABLE};
use api::{DataVolume, VirtualMachineInstance};
use client::MetaKey;

pub use crate::config::{Config, Shared};
use crate::seen::Seen;

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot create the state dir {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One heartbeat: the schedulable label and the heartbeat annotation on the Node, in one merge
/// patch of two map keys (nothing else on the Node is touched).
///
/// # Errors
/// When the API refuses (404: the Node is not registered).
pub async fn heartbeat(client: &kube::Client, node: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    client::blind_patch_keys(
        &nodes,
        node,
        &[(MetaKey::Label, NODE_SCHEDULABLE, Some("true")), (MetaKey::Annotation, NODE_HEARTBEAT, Some(&now))],
    )
    .await
    .map(|_| ())
}

/// Heartbeats every `interval` until the agent stops. A missing Node is said once per outage
/// (the kubelet registers it; `up` does for its node) and tried again at the next beat.
fn heartbeats(shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let node = shared.config.node_name.clone();
        let mut failing = false;
        let mut tick = tokio::time::interval(shared.config.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match heartbeat(&shared.client, &node).await {
                Ok(()) if failing => {
                    tracing::info!("node {node}: heartbeat sent again");
                    failing = false;
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    let hint = if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                        " (the Node does not exist: the kubelet registers it, `virtplug up` does for its node, `virtplug node --register-node` stands in for a kubelet)"
                    } else {
                        ""
                    };
                    tracing::warn!(
                        "node {node}: cannot send the heartbeat{hint}: {}; retrying every {:?}",
                        client::error_chain(&e),
                        shared.config.heartbeat_interval
                    );
                    failing = true;
                }
                Err(_) => {}
            }
        }
    })
}

/// A VMI's worker: the channel that hands it every new version of its VMI, and its task.
struct Worker {
    tx: watch::Sender<Option<Arc<VirtualMachineInstance>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Worker {
    /// A worker lives no longer than its agent: when the agent's future is dropped (`up` shutting
    /// down), no worker goes on to report its QEMU's exit or to touch QEMU.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A helper task of the agent, stopped with it.
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the agent until the process stops. Dropping the future stops it and its workers at
/// their next await point; the VMs keep running (the next agent adopts them).
///
/// # Errors
/// When the node cannot be registered or the state dir created.
pub async fn run(client: kube::Client, config: Config) -> Result<(), AgentError> {
    let shared = start(client, config).await?;
    let _heartbeats = Task(heartbeats(Arc::clone(&shared)));
    let _storage = Task(watch_storage(Arc::clone(&shared)));
    let _mounts = Task(watch_mounts(Arc::clone(&shared)));
    let vmis_dir = shared.config.state_dir.join("vmis");
    let _logs = Task(tokio::spawn(crate::consolelog::keep_bounded(vmis_dir, shared.config.serial_log_max)));
    Workers { shared, running: HashMap::new(), listed: HashSet::new() }.follow().await;
    Ok(())
}

/// The agent's start: its state dir, the accelerator, bind-mount mode's shared storage root
/// (off the async threads: files and a mount).
async fn start(client: kube::Client, config: Config) -> Result<Arc<Shared>, AgentError> {
    let host = Arc::new(crate::bindmount::Host { helper: config.mount_helper.clone() });
    let prepared = {
        let (config, host) = (config.clone(), Arc::clone(&host));
        tokio::task::spawn_blocking(move || prepare(&config, host.as_ref())).await
    };
    let choice = match prepared {
        Ok(r) => r?,
        Err(e) => {
            let path = config.state_dir.join("vmis");
            return Err(AgentError::StateDir { path, source: std::io::Error::other(e) });
        }
    };
    tracing::info!("node {}: QEMU accelerator {:?} ({})", config.node_name, choice.accel, choice.reason);
    Ok(Arc::new(Shared { client, config, accel: choice.accel, storage_changed: watch::Sender::new(0), host, seen: Seen::default() }))
}

/// The blocking part of [`start`].
fn prepare(config: &Config, host: &dyn crate::bindmount::Privileged) -> Result<qemu::accel::Choice, AgentError> {
    let vmis_dir = config.state_dir.join("vmis");
    std::fs::create_dir_all(&vmis_dir).map_err(|source| AgentError::StateDir { path: vmis_dir.clone(), source })?;
    if config.mode == crate::bindmount::AttachMode::BindMount {
        match crate::bindmount::share_storage_root(host, &config.storage_root) {
            Ok(true) => tracing::info!("bind-mount mode: the storage root {} is a shared mount", config.storage_root.display()),
            Ok(false) => {}
            Err(e) => tracing::warn!("bind-mount mode: {e}; VMs' namespaces may keep the storage filesystem alive after it is unmounted"),
        }
    }
    Ok(qemu::accel::resolve(config.accel))
}

/// Keeps [`Shared::seen`] and wakes every worker on any change of a claim or DataVolume (after
/// `seen` has it).
fn watch_storage(shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let seen = &shared.seen;
        let pvcs = watcher(Api::<PersistentVolumeClaim>::all(shared.client.clone()), watcher::Config::default())
            .default_backoff()
            .map(|ev| match ev {
                Ok(ev) => seen.claim_event(&ev),
                Err(_) => seen.claims_unknown(),
            })
            .boxed();
        let dvs = watcher(Api::<DataVolume>::all(shared.client.clone()), watcher::Config::default())
            .default_backoff()
            .map(|ev| match ev {
                Ok(ev) => seen.data_volume_event(&ev),
                Err(_) => seen.data_volumes_unknown(),
            })
            .boxed();
        let mut both = futures::stream::select(pvcs, dvs);
        while both.next().await.is_some() {
            shared.storage_changed.send_modify(|n| *n = n.wrapping_add(1));
        }
    })
}

/// The workers of this node's VMIs, fed from the VMI watch.
struct Workers {
    shared: Arc<Shared>,
    running: HashMap<String, Worker>,
    /// The UIDs seen since the watch's last (re)list.
    listed: HashSet<String>,
}

impl Workers {
    /// Follows the VMIs of this node until the watch ends.
    async fn follow(mut self) {
        let selector = format!("kubevirt.io/nodeName={}", self.shared.config.node_name);
        let api: Api<VirtualMachineInstance> = Api::all(self.shared.client.clone());
        let mut events = watcher(api, watcher::Config::default().labels(&selector)).default_backoff().boxed();
        while let Some(ev) = events.next().await {
            match ev {
                Ok(ev) => self.on(ev).await,
                Err(e) => tracing::warn!("node {}: VMI watch error (retrying): {e}", self.shared.config.node_name),
            }
        }
    }

    async fn on(&mut self, ev: watcher::Event<VirtualMachineInstance>) {
        self.running.retain(|_, w| !w.task.is_finished());
        match ev {
            watcher::Event::Init => self.listed.clear(),
            watcher::Event::InitApply(vmi) | watcher::Event::Apply(vmi) => self.apply(vmi),
            watcher::Event::Delete(vmi) => {
                if let Some(w) = vmi.uid().and_then(|u| self.running.get(&u)) {
                    let _ = w.tx.send(None);
                }
            }
            watcher::Event::InitDone => self.stop_unlisted().await,
        }
    }

    /// Hands a new version of a VMI to its worker, starting the worker for a new VMI.
    fn apply(&mut self, vmi: VirtualMachineInstance) {
        let Some(uid) = vmi.uid() else { return };
        self.listed.insert(uid.clone());
        let vmi = Arc::new(vmi);
        if let Some(w) = self.running.get(&uid) {
            let _ = w.tx.send(Some(vmi));
            return;
        }
        let vmi_ns_name = (vmi.namespace().unwrap_or_default(), vmi.name_any());
        let span = crate::spans::vmi(&vmi_ns_name.0, &vmi_ns_name.1);
        let (tx, rx) = watch::channel(Some(vmi));
        let (shared, id) = (Arc::clone(&self.shared), uid.clone());
        let object = format!("{}/{}", vmi_ns_name.0, vmi_ns_name.1);
        // A worker that panics is logged and started again ([`crate::supervise`]).
        let work = crate::supervise::run(object, move || crate::worker::run(Arc::clone(&shared), id.clone(), rx.clone()));
        let task = tokio::spawn(work.instrument(span));
        self.running.insert(uid, Worker { tx, task });
    }

    /// Run dirs of VMIs that are gone (deleted while no agent ran): their QEMU is stopped, the
    /// dir removed.
    async fn stop_unlisted(&self) {
        let vmis_dir = self.shared.config.state_dir.join("vmis");
        let records = tokio::task::spawn_blocking(move || crate::checkpoint::records(&vmis_dir)).await.unwrap_or_default();
        for (dir, record) in records {
            if !self.listed.contains(&record.uid) && !self.running.contains_key(&record.uid) {
                let span = crate::spans::vmi(&record.namespace, &record.name);
                async {
                    tracing::info!(uid = %record.uid, "the VMI is gone: stopping its QEMU");
                    crate::worker::stop_orphan(&dir).await;
                }
                .instrument(span)
                .await;
            }
        }
    }
}

/// Wakes every worker when this node's mount table changes (`POLLPRI` on
/// `/proc/self/mountinfo`, through the runtime's epoll; no thread, no polling): storage that
/// becomes reachable by a mount (a filesystem mounted under the storage root, an attachment's
/// mount in cluster mode) is retried at once instead of at the next backoff.
fn watch_mounts(shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // `with_interest` is deprecated for fds the AsyncFd does not own (they could be closed
        // while registered); this one owns its File, which closes only when it is dropped.
        #[allow(deprecated)]
        let watched = std::fs::File::open("/proc/self/mountinfo")
            .and_then(|f| tokio::io::unix::AsyncFd::with_interest(f, tokio::io::Interest::PRIORITY));
        let afd = match watched {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("cannot watch /proc/self/mountinfo ({e}); mounts are noticed at the next backoff");
                return;
            }
        };
        loop {
            match afd.ready(tokio::io::Interest::PRIORITY).await {
                Ok(mut g) => {
                    g.clear_ready();
                    shared.storage_changed.send_modify(|n| *n = n.wrapping_add(1));
                }
                Err(e) => {
                    tracing::warn!("watching /proc/self/mountinfo failed ({e}); mounts are noticed at the next backoff");
                    return;
                }
            }
        }
    })
}
