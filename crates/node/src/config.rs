//! The node agent's settings ([`Config`]) and what its workers share ([`Shared`]): the API
//! client, the settings, the accelerator chosen at start, the storage wake-up, the ready claims
//! the storage watch has seen and the privileged effects of bind-mount mode. Below every module
//! that runs a VMI (agent, worker, hot-plug, claims), so none of them imports another to reach
//! these.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backoff::Backoff;

/// The node agent's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_name: String,
    /// How often the agent heartbeats on its Node (default 60 s, KubeVirt's; the controller's
    /// timeout must be a few intervals longer).
    pub heartbeat_interval: Duration,
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
    /// Let guests open connections out through their user-mode network (default off:
    /// `restrict=on`, the guest reaches only its forwarded ports; see [`qemu::nic`]).
    pub guest_egress: bool,
    /// The largest a guest's serial log may grow before it is rotated
    /// ([`crate::consolelog`]; default 8 MiB).
    pub serial_log_max: u64,
    /// Cluster mode with launcher pods: QEMU is started by the VMI's launcher pod (its
    /// `virtplug launcher`, reached on `RUN_DIR/launcher.sock`), not by the agent, so it lives
    /// in the pod's cgroup ([`qemu::launcher`]). Default off: the agent starts QEMU itself.
    pub launcher_pods: bool,
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
            heartbeat_interval: Duration::from_secs(60),
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
            guest_egress: false,
            serial_log_max: crate::consolelog::DEFAULT_MAX,
            caps: crate::caps::Caps::default(),
            mount_helper: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("virtplug")),
            devices_cgroup: crate::bindmount::default_cgroup_root().unwrap_or_else(|| PathBuf::from(crate::bindmount::DEVICES_CGROUP)),
            kubelet_pods_dir: PathBuf::from("/var/lib/kubelet/pods"),
            launcher_pods: false,
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
    /// The ready claims the storage watch has seen (a hot-plug opens them without a GET).
    pub seen: crate::seen::Seen,
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
