//! The node agent's top level: register the node, watch the VMIs assigned to it, run one
//! [`worker`](crate::worker) per VMI, and after a restart adopt the QEMUs it left running.
//!
//! # Flow
//! 1. The Node object is created (or its status refreshed) with `Ready=True`, so the controller
//!    can schedule onto it.
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
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;
use tokio::sync::watch;

use api::{DataVolume, VirtualMachineInstance};

use crate::backoff::Backoff;

/// The node agent's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    /// Run dirs of the VMs (`STATE/vmis/<uid>/`: QMP socket, serial log, pidfile, record).
    pub state_dir: PathBuf,
    /// Where the local provisioner keeps claims (`ROOT/<claim uid>/`).
    pub storage_root: PathBuf,
    pub accel: qemu::accel::Accel,
    pub backoff: Backoff,
    /// Grace for a guest to power off when its VMI is deleted, unless the VMI sets
    /// `terminationGracePeriodSeconds` (default 30 s); QEMU is then stopped by force.
    pub stop_grace: Duration,
    /// Nice value of the QEMU processes (default 5): the VMs yield the CPU to the control plane
    /// (API server, controller, this agent) when the host is oversubscribed — the role
    /// `kube-reserved` plays for the kubelet. 0 runs them at the agent's own priority.
    pub vm_nice: i32,
    /// How volumes reach QEMU: by fd (default) or by bind mounts (KubeVirt's way).
    pub mode: crate::bindmount::AttachMode,
    /// Bind-mount mode: the binary with the mount helper (default: this executable).
    pub mount_helper: PathBuf,
    /// Bind-mount mode: the directory under which each VM gets its devices cgroup (cgroup v1's
    /// devices controller, or cgroup v2; see [`crate::bindmount::default_cgroup_root`]).
    pub devices_cgroup: PathBuf,
    /// Cluster mode: the kubelet's pods dir, where an attachment pod's `hp.sock` is found.
    pub kubelet_pods_dir: PathBuf,
    /// The directories `kernelBoot`'s `kernelPath`/`initrdPath` may name (default: the data dir
    /// and the test-guest cache): QEMU runs as root and must never be handed any host file.
    pub boot_files: qemu::bootfiles::AllowedDirs,
    /// Run QEMU under its seccomp sandbox ([`qemu::cmdline::SANDBOX`]; default on).
    pub qemu_sandbox: bool,
    /// Drop QEMU to this user after start-up (fd mode only; default: it stays root).
    pub qemu_user: Option<String>,
    /// The largest a guest's serial log may grow before it is rotated
    /// ([`crate::consolelog`]; default 8 MiB).
    pub serial_log_max: u64,
    /// The most one VMI may take: emptyDisk size and guest memory ([`crate::caps`]; default 50 %
    /// of the free space under `state_dir` and 75 % of the RAM).
    pub caps: crate::caps::Caps,
}

impl Config {
    /// Defaults for `node_name` with everything under `data_dir`.
    #[must_use]
    pub fn new(node_name: &str, data_dir: &std::path::Path) -> Config {
        Config {
            node_name: node_name.to_owned(),
            state_dir: data_dir.join("node"),
            storage_root: data_dir.join("storage"),
            accel: qemu::accel::Accel::Auto,
            backoff: Backoff::default(),
            stop_grace: Duration::from_secs(30),
            vm_nice: 5,
            mode: crate::bindmount::AttachMode::Fd,
            boot_files: qemu::bootfiles::AllowedDirs::defaults(data_dir),
            qemu_sandbox: true,
            qemu_user: None,
            serial_log_max: crate::consolelog::DEFAULT_MAX,
            caps: crate::caps::Caps::default(),
            mount_helper: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("virtplug")),
            devices_cgroup: crate::bindmount::default_cgroup_root().unwrap_or_else(|| PathBuf::from(crate::bindmount::DEVICES_CGROUP)),
            kubelet_pods_dir: PathBuf::from("/var/lib/kubelet/pods"),
        }
    }
}

/// What every worker shares.
pub struct Shared {
    pub client: kube::Client,
    pub config: Config,
    pub accel: qemu::accel::Resolved,
    /// Bumped on any claim, DataVolume or mount-table change. A watch channel, not a `Notify`:
    /// a worker busy with a pass when it is bumped still sees it at its next wait (a
    /// `notify_waiters` would be lost then).
    pub storage_changed: watch::Sender<u64>,
    /// Privileged effects of bind-mount mode.
    pub host: Arc<dyn crate::bindmount::Privileged>,
}

impl Shared {
    /// The bind-mount view of a running VM, in bind-mount mode.
    #[must_use]
    pub fn bind_vm(&self, uid: &str, pid: i32, run_dir: &std::path::Path) -> Option<crate::bindmount::Vm> {
        (self.config.mode == crate::bindmount::AttachMode::BindMount).then(|| crate::bindmount::Vm {
            host: Arc::clone(&self.host),
            pid,
            run_dir: run_dir.to_owned(),
            cgroup: self.config.devices_cgroup.join(uid),
        })
    }
}

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot register node {node}")]
    Register {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot create the state dir {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Creates or refreshes the Node object with `Ready=True`.
///
/// # Errors
/// When the API refuses.
pub async fn register(client: &kube::Client, name: &str, accel: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(name).await?.is_none() {
        let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubevirt.io/schedulable": "true", "kubernetes.io/hostname": name}}}))
        .map_err(kube::Error::SerdeError)?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    // A status-only merge patch of fields only the agent writes (no array is shared).
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "NodeAgentReady", "message": format!("virtplug node agent is running ({accel})"),
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": format!("virtplug-{}", env!("CARGO_PKG_VERSION")), "architecture": "amd64", "operatingSystem": "linux"}}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await?;
    Ok(())
}

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
    let vmis_dir = config.state_dir.join("vmis");
    std::fs::create_dir_all(&vmis_dir).map_err(|source| AgentError::StateDir { path: vmis_dir.clone(), source })?;
    let choice = qemu::accel::resolve(config.accel);
    tracing::info!("node {}: QEMU accelerator {:?} ({})", config.node_name, choice.accel, choice.reason);
    register(&client, &config.node_name, &choice.reason)
        .await
        .map_err(|source| AgentError::Register { node: config.node_name.clone(), source })?;
    let host = Arc::new(crate::bindmount::Host { helper: config.mount_helper.clone() });
    if config.mode == crate::bindmount::AttachMode::BindMount {
        match crate::bindmount::share_storage_root(host.as_ref(), &config.storage_root) {
            Ok(true) => tracing::info!("bind-mount mode: the storage root {} is a shared mount", config.storage_root.display()),
            Ok(false) => {}
            Err(e) => tracing::warn!("bind-mount mode: {e}; VMs' namespaces may keep the storage filesystem alive after it is unmounted"),
        }
    }
    let shared = Arc::new(Shared {
        client: client.clone(),
        config: config.clone(),
        accel: choice.accel,
        storage_changed: watch::Sender::new(0),
        host,
    });

    // Storage changes wake every worker.
    let _storage = {
        let shared = Arc::clone(&shared);
        Task(tokio::spawn(async move {
            let pvcs = watcher(Api::<PersistentVolumeClaim>::all(shared.client.clone()), watcher::Config::default())
                .default_backoff()
                .map(|_| ())
                .boxed();
            let dvs =
                watcher(Api::<DataVolume>::all(shared.client.clone()), watcher::Config::default()).default_backoff().map(|_| ()).boxed();
            let mut both = futures::stream::select(pvcs, dvs);
            while both.next().await.is_some() {
                shared.storage_changed.send_modify(|n| *n = n.wrapping_add(1));
            }
        }))
    };

    let _mounts = Task(watch_mounts(Arc::clone(&shared)));
    let _logs = Task(tokio::spawn(crate::consolelog::keep_bounded(vmis_dir.clone(), config.serial_log_max)));

    let mut workers: HashMap<String, Worker> = HashMap::new();
    let mut listed: HashSet<String> = HashSet::new();
    let selector = format!("kubevirt.io/nodeName={}", config.node_name);
    let api: Api<VirtualMachineInstance> = Api::all(client.clone());
    let mut events = watcher(api, watcher::Config::default().labels(&selector)).default_backoff().boxed();
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!("node {}: VMI watch error (retrying): {e}", config.node_name);
                continue;
            }
        };
        workers.retain(|_, w| !w.task.is_finished());
        match ev {
            watcher::Event::Init => listed.clear(),
            watcher::Event::InitApply(vmi) | watcher::Event::Apply(vmi) => {
                let Some(uid) = vmi.uid() else { continue };
                listed.insert(uid.clone());
                let vmi = Arc::new(vmi);
                match workers.get(&uid) {
                    Some(w) => {
                        let _ = w.tx.send(Some(vmi));
                    }
                    None => {
                        let (tx, rx) = watch::channel(Some(vmi));
                        let task = tokio::spawn(crate::worker::run(Arc::clone(&shared), uid.clone(), rx));
                        workers.insert(uid, Worker { tx, task });
                    }
                }
            }
            watcher::Event::Delete(vmi) => {
                if let Some(w) = vmi.uid().and_then(|u| workers.get(&u)) {
                    let _ = w.tx.send(None);
                }
            }
            watcher::Event::InitDone => {
                // Run dirs of VMIs that are gone: their QEMU is stopped, the dir removed.
                for (dir, record) in crate::checkpoint::records(&vmis_dir) {
                    if !listed.contains(&record.uid) && !workers.contains_key(&record.uid) {
                        tracing::info!("VMI {}/{} ({}) is gone: stopping its QEMU", record.namespace, record.name, record.uid);
                        crate::worker::stop_orphan(&dir).await;
                    }
                }
            }
        }
    }
    Ok(())
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
