//! `virtplug up` and `virtplug apiserver`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use apiserver::health::Health;
use clap::Args;

use crate::mode_flags::{AccelFlag, AttachModeFlag};
use tokio_util::sync::CancellationToken;

/// Limits on the HTTPS listener's connections (what a client without the token can hold).
#[derive(Args)]
pub struct ConnectionArgs {
    /// Most connections served at once; beyond it a few at a time are answered 503 with
    /// Retry-After and the rest closed [default: half the open-files limit, which virtplug raises
    /// to its hard limit, between 64 and 16384].
    #[arg(long)]
    max_connections: Option<usize>,
    /// How long a client may take to complete the TLS handshake.
    #[arg(long, default_value = "10s", value_parser = crate::cli::humantime)]
    tls_handshake_timeout: Duration,
    /// How long an HTTP/1 client may take to send a request's headers (also the longest wait for
    /// the next request on a kept-alive connection).
    #[arg(long, default_value = "32s", value_parser = crate::cli::humantime)]
    header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/2: GOAWAY).
    #[arg(long, default_value = "90s", value_parser = crate::cli::humantime)]
    idle_timeout: Duration,
}

impl ConnectionArgs {
    fn limits(&self) -> anyhow::Result<apiserver::conn::Limits> {
        for (flag, d) in [
            ("--tls-handshake-timeout", self.tls_handshake_timeout),
            ("--header-read-timeout", self.header_read_timeout),
            ("--idle-timeout", self.idle_timeout),
        ] {
            anyhow::ensure!(!d.is_zero(), "{flag} 0 would close every connection at once: give a duration such as 10s");
        }
        anyhow::ensure!(self.max_connections != Some(0), "--max-connections 0 would refuse every client: give at least 1, or leave it out");
        Ok(apiserver::conn::Limits {
            max_connections: self.max_connections,
            tls_handshake_timeout: self.tls_handshake_timeout,
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
        })
    }
}

/// The audit log's flags (`apiserver`, `up`).
#[derive(Args)]
pub struct AuditArgs {
    /// Log every request to this file, one JSON line each: the client's user agent, the verb,
    /// API group, resource, subresource, namespace and name as RBAC names them, and the status
    /// code (kube-apiserver's --audit-log-path, for checking what a component's role must grant;
    /// with `up`, its own controller's and node agent's requests too).
    #[arg(long)]
    audit_log: Option<PathBuf>,
    /// Rotate the audit log to PATH.1 at this size, in MiB (one backup is kept).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    audit_log_max_size: u64,
}

impl AuditArgs {
    /// The server's audit setting.
    fn config(self) -> Option<apiserver::audit::AuditConfig> {
        self.audit_log.map(|path| apiserver::audit::AuditConfig { path, max_bytes: self.audit_log_max_size << 20 })
    }
}

/// Arguments of `virtplug apiserver`.
#[derive(Args)]
pub struct ApiserverArgs {
    /// Where the store, credentials and kubeconfig live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Address of the HTTPS listener.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// How many changes the watch changelog keeps (older resourceVersions answer 410 Expired).
    #[arg(long, default_value_t = 10_000)]
    watch_window: usize,
    /// Serve no `subresources.kubevirt.io` API, as a kube-apiserver with KubeVirt's CRDs but no
    /// virt-api would (what the CLI's fallback to editing the VM is tested against).
    #[arg(long)]
    without_kubevirt_subresources: bool,
    #[command(flatten)]
    audit: AuditArgs,
    /// Admit VMs whose template breaks virtplug's invariants (a CD-ROM volume without its drive,
    /// ...), as a Kubernetes API server with virtplug's CRDs does: no webhook checks VM specs
    /// there, and the controller's self-heal repairs or reports them. For testing that.
    #[arg(long)]
    admit_invalid_vms: bool,
    #[command(flatten)]
    connections: ConnectionArgs,
    #[command(flatten)]
    store: crate::growth_flags::StoreArgs,
}

/// Arguments of `virtplug up`.
#[derive(Args)]
pub struct UpArgs {
    /// Where the store, credentials, kubeconfig and VM state live [default: $XDG_DATA_HOME/virtplug
    /// or ~/.local/share/virtplug].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address of the API's HTTPS listener.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// This machine's node name [default: the host name].
    #[arg(long)]
    node_name: Option<String>,
    /// QEMU accelerator: auto (KVM where it can run guests, else TCG), kvm or tcg.
    #[arg(long, value_enum, default_value_t = AccelFlag::Auto)]
    accel: AccelFlag,
    /// On SIGINT/SIGTERM also stop the running VMs. By default they keep running and the next
    /// `up` on the same data dir adopts them.
    #[arg(long)]
    stop_vms_on_exit: bool,
    /// Nice value of the VMs' QEMU processes: they yield the CPU to the control plane on an
    /// oversubscribed host. 0 runs them at virtplug's own priority.
    #[arg(long, default_value_t = 5)]
    vm_nice: i32,
    /// How hot-plugged volumes reach QEMU: `fd` (the agent opens the volume and passes the fd;
    /// nothing is mounted) or `bind-mount` (KubeVirt's way: bind mounts and device nodes in the
    /// VM's own mount namespace, block devices allowed in its cgroup v1 devices cgroup; root).
    #[arg(long, value_enum, default_value_t = AttachModeFlag::Fd)]
    attach_mode: AttachModeFlag,
    #[command(flatten)]
    connections: ConnectionArgs,
    #[command(flatten)]
    import: crate::import_flags::ImportArgs,
    #[command(flatten)]
    store: crate::growth_flags::StoreArgs,
    #[command(flatten)]
    caps: crate::growth_flags::CapsArgs,
    #[command(flatten)]
    qemu: crate::qemu_flags::QemuArgs,
    #[command(flatten)]
    audit: AuditArgs,
    /// Address of the Redfish service's HTTPS listener (a BMC per VM) [default: 127.0.0.1:8443;
    /// an ephemeral port when --listen has port 0].
    #[arg(long)]
    redfish_listen: Option<SocketAddr>,
}

/// What `up` runs besides the API server.
struct UpOptions {
    redfish_listen: SocketAddr,
    node_name: String,
    accel: qemu::accel::Accel,
    stop_vms_on_exit: bool,
    vm_nice: i32,
    attach_mode: node::bindmount::AttachMode,
    import: controller::storage::import::ImportConfig,
    caps: node::caps::Caps,
    qemu: crate::qemu_flags::QemuArgs,
}

/// Checks what `up` needs and says what is missing and how to fix it. Errors only for what makes
/// VMs impossible (no QEMU); the rest is reported.
fn preflight(accel: qemu::accel::Accel, mode: node::bindmount::AttachMode) -> anyhow::Result<()> {
    let binary = qemu::process::qemu_binary();
    let found = if binary.components().count() > 1 {
        binary.is_file().then(|| binary.clone())
    } else {
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(&binary)).find(|c| c.is_file()))
    };
    match found {
        Some(path) => println!("  QEMU:        {}", path.display()),
        None => anyhow::bail!(
            "QEMU ({}) is not installed or not on PATH: run ./scripts/install-deps.sh (installs QEMU 10 from bookworm-backports), \
             or point VIRTPLUG_QEMU at a qemu-system-x86_64",
            binary.display()
        ),
    }
    let choice = qemu::accel::resolve(accel);
    println!("  accelerator: {:?} ({})", choice.accel, choice.reason);
    let loop_ok = std::fs::OpenOptions::new().read(true).write(true).open("/dev/loop-control").is_ok();
    if loop_ok {
        println!("  Block claims: yes (/dev/loop-control is writable)");
    } else {
        println!("  Block claims: NO — /dev/loop-control is not writable (run as root, or with CAP_SYS_ADMIN); Filesystem claims work");
    }
    if mode == node::bindmount::AttachMode::BindMount {
        if !rustix::process::geteuid().is_root() {
            anyhow::bail!(
                "--attach-mode bind-mount needs root (mount namespaces, mounts, device nodes); run as root or use --attach-mode fd"
            );
        }
        let Some(root) = node::bindmount::default_cgroup_root() else {
            anyhow::bail!(
                "--attach-mode bind-mount needs a device cgroup: neither cgroup v1's devices controller ({}) nor cgroup v2 \
                 (/sys/fs/cgroup/cgroup.controllers) is mounted; mount one or use --attach-mode fd",
                node::bindmount::DEVICES_CGROUP
            );
        };
        println!("  attach mode: bind-mount (VM mount namespaces, devices cgroups under {})", root.display());
    } else {
        println!("  attach mode: fd (nothing is mounted into VMs)");
    }
    Ok(())
}

/// Arguments of `virtplug node`.
#[derive(Args)]
pub struct NodeArgs {
    /// This node's name, as the kubelet registered it (in a DaemonSet: `NODE_NAME` from the
    /// downward API's `spec.nodeName`) [default: the host name].
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Create the Node and set it Ready, as a kubelet would, where no kubelet runs (single
    /// machine without `up`). Never on a cluster: the Node is the kubelet's.
    #[arg(long)]
    register_node: bool,
    /// How often to heartbeat on the Node (the controller's --node-heartbeat-timeout must be a
    /// few intervals longer).
    #[arg(long, default_value = "60s", value_parser = crate::cli::humantime)]
    heartbeat_interval: Duration,
    /// The kubelet's pods dir, where attachment pods' volumes are found (cluster mode).
    #[arg(long, default_value = "/var/lib/kubelet/pods")]
    kubelet_pods_dir: PathBuf,
    /// Open the console tunnel to this `virtplug subresources-api` (https://HOST:PORT) with the
    /// kubeconfig's credentials (or --tunnel-token-file's), instead of to the kubeconfig's server (which is right for
    /// `virtplug apiserver`, or for a kube-apiserver with the subresources.virtplug.io
    /// APIService).
    #[arg(long)]
    tunnel_server: Option<http::Uri>,
    /// The CA (PEM) that signed --tunnel-server's certificate [default: the kubeconfig's].
    #[arg(long, requires = "tunnel_server")]
    tunnel_ca: Option<PathBuf>,
    /// Present the bearer token in this file on the console tunnel and its streams, instead of
    /// the kubeconfig's credentials (re-read as it changes). `virtplug subresources-api` accepts
    /// a node's tunnel only from a token bound to that node: in a cluster that is the agent's
    /// in-cluster credential, its pod's projected ServiceAccount token, and this flag is not
    /// needed; out of a cluster (or with stand-ins), point it at a token minted for a pod on this
    /// node (`kubectl create token SA --bound-object-kind Pod --bound-object-name POD`).
    #[arg(long)]
    tunnel_token_file: Option<PathBuf>,
    /// Serve /healthz, /readyz and /metrics (plain HTTP) on this address.
    #[arg(long, default_value = "127.0.0.1:8186")]
    health_listen: SocketAddr,
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, in-cluster].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where VM run dirs live (`DIR/node/vmis/UID`) and claims are found (`DIR/storage`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The claims' storage root, if not `DATA_DIR/storage`.
    #[arg(long)]
    storage_root: Option<PathBuf>,
    /// QEMU accelerator: auto, kvm or tcg.
    #[arg(long, value_enum, default_value_t = AccelFlag::Auto)]
    accel: AccelFlag,
    /// Nice value of the VMs' QEMU processes (see `virtplug up --help`).
    #[arg(long, default_value_t = 5)]
    vm_nice: i32,
    /// How hot-plugged volumes reach QEMU: `fd` (the agent opens the volume and passes the fd;
    /// nothing is mounted) or `bind-mount` (KubeVirt's way: bind mounts and device nodes in the
    /// VM's own mount namespace, block devices allowed in its cgroup v1 devices cgroup; root).
    #[arg(long, value_enum, default_value_t = AttachModeFlag::Fd)]
    attach_mode: AttachModeFlag,
    /// QEMU is started by each VMI's launcher pod (`virtplug launcher`, which the controller's
    /// `--placement pods` creates), not by this agent: VMs live in their pods' cgroups and an
    /// agent rollout leaves them untouched. fd attach mode only.
    #[arg(long)]
    launcher_pods: bool,
    #[command(flatten)]
    caps: crate::growth_flags::CapsArgs,
    #[command(flatten)]
    qemu: crate::qemu_flags::QemuArgs,
}

/// A background task stopped when its owner is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The host name, for the default node name.
pub fn host_name() -> String {
    let n = rustix::system::uname();
    let n = n.nodename().to_string_lossy().into_owned();
    if n.is_empty() {
        "localhost".to_owned()
    } else {
        n.to_lowercase()
    }
}

pub async fn node(args: NodeArgs) -> anyhow::Result<()> {
    let client = crate::migrate::connect(args.kubeconfig.clone(), "node").await?;
    // The tunnel's client: the agent's credentials (in a cluster, its pod's projected token,
    // which names this node), unless --tunnel-token-file names others.
    let tunnel_client = if args.tunnel_server.is_none() && args.tunnel_token_file.is_none() {
        crate::migrate::connect_with(args.kubeconfig, "node", client::Retries::None).await?
    } else {
        let roots = args.tunnel_ca.as_deref().map(read_ca).transpose()?;
        let to = client::Elsewhere { server: args.tunnel_server.clone(), roots, token_file: args.tunnel_token_file.clone() };
        client::connect_to(args.kubeconfig.as_deref(), &client::user_agent("node"), client::Retries::None, to).await.with_context(|| {
            format!(
                "cannot build the console tunnel's client (--tunnel-server {:?}, --tunnel-token-file {:?})",
                args.tunnel_server, args.tunnel_token_file
            )
        })?
    };
    crate::kubevirt_guard::refuse_beside_kubevirt(&client, "node agent").await?;
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    let mut config = node::agent::Config::new(&args.node_name.unwrap_or_else(host_name), &data_dir);
    if let Some(root) = args.storage_root {
        config.storage_root = root;
    }
    config.heartbeat_interval = args.heartbeat_interval;
    config.kubelet_pods_dir = args.kubelet_pods_dir;
    if args.register_node {
        crate::kubelet_standin::register(&client, &config.node_name)
            .await
            .with_context(|| format!("--register-node: cannot register node {}", config.node_name))?;
    }
    config.accel = args.accel.into();
    config.vm_nice = args.vm_nice;
    config.mode = args.attach_mode.into();
    if args.launcher_pods && config.mode != node::bindmount::AttachMode::Fd {
        anyhow::bail!("--launcher-pods needs --attach-mode fd: bind-mount mode enters QEMU's mount namespace, which the launcher pod owns");
    }
    config.launcher_pods = args.launcher_pods;
    config.caps = args.caps.caps();
    args.qemu.check(config.mode)?;
    args.qemu.apply(&mut config, &data_dir);
    let health = Health::new();
    let state = crate::endpoints::State { health: health.clone(), leading: None, registry: component_registry() };
    let endpoints = crate::endpoints::serve(args.health_listen, state).await?;
    eprintln!(
        "virtplug node {}: running VMs from {} (/healthz, /readyz, /metrics on http://{endpoints}; SIGTERM or Ctrl-C stops the agent, VMs keep running)",
        config.node_name,
        config.state_dir.display()
    );
    // Console and VNC streams reach this node through the tunnel it opens to the API server.
    let tunnel = node::tunnel::Tunnel { client: tunnel_client, node: config.node_name.clone(), vmis_dir: config.state_dir.join("vmis") };
    let _tunnel = AbortOnDrop(tokio::spawn(node::tunnel::run(tunnel)));
    health.spawn(NODE_AGENT, node::agent::run(client, config));
    until_death_or_signal(&health).await
}

/// The DER certificates of a PEM file.
fn read_ca(path: &std::path::Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let certs = rustls_pemfile::certs(&mut text.as_slice())
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not PEM", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

/// The metrics of a controller or node process (its component's and its API client's).
fn component_registry() -> apiserver::metrics::SharedRegistry {
    let mut r = prometheus_client::registry::Registry::default();
    client::metrics::register(&mut r);
    controller::metrics::register(&mut r);
    node::metrics::register(&mut r);
    std::sync::Arc::new(std::sync::Mutex::new(r))
}

/// Component names in the health registry (and in `up`'s exit message).
const CONTROLLER: &str = "controller";
const NODE_AGENT: &str = "node-agent";

/// Waits for SIGINT or SIGTERM (`Ok`) or for a component in `health` to die (`Err` naming it
/// and why: the process exits non-zero, so whatever supervises it restarts it).
async fn until_death_or_signal(health: &Health) -> anyhow::Result<()> {
    tokio::select! {
        f = health.first_failure() => Err(anyhow::anyhow!("the {f}")),
        r = signals() => r,
    }
}

/// Arguments of `virtplug controller`.
#[derive(Args)]
pub struct ControllerArgs {
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, in-cluster, then the `up` data dir's].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Provision claims and import DataVolumes into this directory (embedded deployment; leave
    /// out in a cluster, where a CSI driver and CDI do that).
    #[arg(long)]
    storage_root: Option<PathBuf>,
    /// Process legacy `status.volumeRequests` (KubeVirt's HotplugVolumes gate) instead of only
    /// reporting them.
    #[arg(long)]
    legacy_volume_requests: bool,
    #[command(flatten)]
    import: crate::import_flags::ImportArgs,
    /// Take a node out of scheduling when its agent has not heartbeated for this long.
    #[arg(long, default_value = "5m", value_parser = crate::cli::humantime)]
    node_heartbeat_timeout: Duration,
    /// Run only while holding the Lease `virtplug-controller` (several replicas: one works, the
    /// others stand by). `--leader-elect=false` for a single replica.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// The namespace of the Lease [default: $POD_NAMESPACE, else virtplug-system].
    #[arg(long, env = "POD_NAMESPACE", default_value = "virtplug-system")]
    leader_election_namespace: String,
    /// This replica's name in the Lease [default: $POD_NAME, else HOST_PID].
    #[arg(long, env = "POD_NAME")]
    leader_election_identity: Option<String>,
    /// Lease duration; renewals stop working after 2/3 of it, retries every 2/15 of it
    /// (KubeVirt's 15 s / 10 s / 2 s).
    #[arg(long, default_value = "15s", value_parser = crate::cli::humantime)]
    leader_election_lease: Duration,
    /// Serve /healthz, /readyz and /metrics (plain HTTP) on this address.
    #[arg(long, default_value = "127.0.0.1:8185")]
    health_listen: SocketAddr,
    /// How a VMI gets its node: `direct` (this controller picks it; the node agent starts QEMU)
    /// or `pods` (a launcher pod per VMI, placed by the cluster's scheduler; QEMU runs in it —
    /// run the node agents with --launcher-pods).
    #[arg(long, value_enum, default_value_t = PlacementFlag::Direct)]
    placement: PlacementFlag,
    /// The launcher pods' image (with `virtplug` and QEMU), for `--placement pods`.
    #[arg(long, default_value = "virtplug:latest")]
    launcher_image: String,
    /// Where the node agents keep VM run dirs (their `DATA_DIR/node/vmis`): each launcher pod
    /// mounts `RUN_ROOT/UID` from its node, for `--placement pods`.
    #[arg(long, default_value = "/var/lib/virtplug/node/vmis")]
    launcher_run_root: PathBuf,
}

/// `--placement`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementFlag {
    Direct,
    Pods,
}

pub async fn apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    let mut config = apiserver::Config::new(&args.data_dir);
    config.store.watch_window = args.watch_window;
    config.kubevirt_subresources = !args.without_kubevirt_subresources;
    config.connections = args.connections.limits()?;
    config.enforce_invariants = !args.admit_invalid_vms;
    config.audit = args.audit.config();
    args.store.apply(&mut config);
    run(config, args.listen, None).await
}

/// One registry with every component's metrics, for `/metrics`.
fn registry() -> apiserver::metrics::SharedRegistry {
    let mut r = prometheus_client::registry::Registry::default();
    apiserver::metrics::register(&mut r);
    client::metrics::register(&mut r);
    controller::metrics::register(&mut r);
    node::metrics::register(&mut r);
    redfish::metrics::register(&mut r);
    std::sync::Arc::new(std::sync::Mutex::new(r))
}

pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    let mut config = apiserver::Config::new(&data_dir);
    config.metrics = Some(registry());
    config.connections = args.connections.limits()?;
    config.audit = args.audit.config();
    args.store.apply(&mut config);
    println!("virtplug up: checking prerequisites");
    preflight(args.accel.into(), args.attach_mode.into())?;
    args.qemu.check(args.attach_mode.into())?;
    let up = UpOptions {
        redfish_listen: args.redfish_listen.unwrap_or_else(|| crate::redfish_cmd::default_listen(args.listen)),
        node_name: args.node_name.unwrap_or_else(host_name),
        accel: args.accel.into(),
        stop_vms_on_exit: args.stop_vms_on_exit,
        vm_nice: args.vm_nice,
        attach_mode: args.attach_mode.into(),
        import: args.import.config()?,
        caps: args.caps.caps(),
        qemu: args.qemu,
    };
    run(config, args.listen, Some(up)).await
}

pub async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    let client = crate::migrate::connect(args.kubeconfig.clone(), "controller").await?;
    crate::kubevirt_guard::refuse_beside_kubevirt(&client, "controller").await?;
    // The embedded storage's requests carry their own User-Agent: a cluster's controller role
    // grants none of them (see deploy/20-rbac.yaml).
    let storage = match &args.storage_root {
        Some(_) => crate::migrate::connect(args.kubeconfig.clone(), "local-storage").await?,
        None => client.clone(),
    };
    let config = controller::run::Config {
        legacy_volume_requests: args.legacy_volume_requests,
        storage_root: args.storage_root.clone(),
        import: args.import.config()?,
        node_heartbeat_timeout: Some(args.node_heartbeat_timeout),
        placement: match args.placement {
            PlacementFlag::Direct => controller::lifecycle::Placement::Direct,
            PlacementFlag::Pods => controller::lifecycle::Placement::Pods(controller::lifecycle::LauncherPods {
                image: args.launcher_image.clone(),
                run_root: args.launcher_run_root.clone(),
            }),
        },
    };
    let health = Health::new();
    let (leading_tx, leading_rx) = tokio::sync::watch::channel(false);
    let state = crate::endpoints::State {
        health: health.clone(),
        leading: args.leader_elect.then_some(leading_rx),
        registry: component_registry(),
    };
    let endpoints = crate::endpoints::serve(args.health_listen, state).await?;
    let storage_note = args.storage_root.as_ref().map_or("no local storage".to_owned(), |r| format!("local storage under {}", r.display()));
    eprintln!(
        "virtplug controller: running ({storage_note}; /healthz, /readyz, /metrics on http://{endpoints}; SIGTERM or Ctrl-C stops it)"
    );
    let elector = args.leader_elect.then(|| {
        let identity = args.leader_election_identity.clone().unwrap_or_else(|| format!("{}_{}", host_name(), std::process::id()));
        let lease = args.leader_election_lease;
        let timings = controller::leader::Timings { lease_duration: lease, renew_deadline: lease * 2 / 3, retry_period: lease * 2 / 15 };
        eprintln!(
            "virtplug controller: leader election on Lease {}/{} as {identity}",
            args.leader_election_namespace,
            controller::leader::LEASE_NAME
        );
        std::sync::Arc::new(controller::leader::Elector::new(
            client.clone(),
            &args.leader_election_namespace,
            controller::leader::LEASE_NAME,
            &identity,
            timings,
        ))
    });
    let task_elector = elector.clone();
    health.spawn(CONTROLLER, async move {
        match task_elector {
            Some(elector) => {
                controller::leader::run_while_leading(&elector, &leading_tx, || {
                    let (client, storage, config) = (client.clone(), storage.clone(), config.clone());
                    async move { controller::run::run_with_storage_client(client, storage, config).await }
                })
                .await;
            }
            None => {
                controller::metrics::leader().set(1);
                controller::run::run_with_storage_client(client, storage, config).await;
            }
        }
        Ok::<(), Infallible>(())
    });
    let r = until_death_or_signal(&health).await;
    if let Some(e) = elector {
        // Hand over at once instead of after the lease expires.
        e.release().await;
    }
    r
}

/// The controller's and node agent's tasks of `up`, and their in-process client.
struct Components {
    client: kube::Client,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `up`'s controller and node agent under the server's health registry: if either dies,
/// `/readyz` says so and `up` exits non-zero with the reason.
fn start_components(server: &apiserver::Server, config: &apiserver::Config, up: &UpOptions) -> Components {
    // In-process client: the controller and the node agent reach the API without a socket.
    let client = client::in_process(server.audited_local_router());
    let ctl = controller::run::Config {
        storage_root: Some(config.data_dir.join("storage")),
        import: up.import.clone(),
        ..controller::run::Config::default()
    };
    let ctl_client = client.clone();
    let controller = server.health().spawn(CONTROLLER, async move {
        controller::run::run_with(ctl_client, ctl).await;
        Ok::<(), Infallible>(())
    });
    let mut node_config = node::agent::Config::new(&up.node_name, &config.data_dir);
    let (standin_client, node_name) = (client.clone(), up.node_name.clone());
    node_config.accel = up.accel;
    node_config.vm_nice = up.vm_nice;
    node_config.mode = up.attach_mode;
    node_config.caps = up.caps;
    up.qemu.apply(&mut node_config, &config.data_dir);
    let agent = server.health().spawn(NODE_AGENT, async move {
        // `up` has no kubelet: its stand-in registers the one node before the agent runs there.
        crate::kubelet_standin::register(&standin_client, &node_name)
            .await
            .map_err(|e| std::io::Error::other(format!("cannot register node {node_name}: {}", client::error_chain(&e))))?;
        node::agent::run(standin_client, node_config).await.map_err(std::io::Error::other)
    });
    Components { client, tasks: vec![controller, agent] }
}

/// Stops `up`'s controller and agent first, so nothing acts on a VM (or reports a VM stopped
/// below as crashed) while `up` shuts down; the API serves until the end. Then stops the VMs
/// with --stop-vms-on-exit, else says that they keep running.
async fn stop_components(up: &UpOptions, data_dir: &std::path::Path, components: Components) {
    for t in &components.tasks {
        t.abort();
    }
    for t in components.tasks {
        let _ = t.await;
    }
    let records = node::checkpoint::records(&data_dir.join("node").join("vmis"));
    if up.stop_vms_on_exit {
        for (dir, r) in &records {
            eprintln!("virtplug up: stopping VM {}/{}", r.namespace, r.name);
            node::worker::stop_for_shutdown(&components.client, dir, r).await;
        }
    } else if !records.is_empty() {
        eprintln!(
            "virtplug up: {} VM(s) keep running; the next `virtplug up --data-dir {}` adopts them \
             (use --stop-vms-on-exit to stop them with up)",
            records.len(),
            data_dir.display()
        );
    }
}

fn print_banner(what: &str, url: &str, data_dir: &std::path::Path, kubeconfig: &std::path::Path, up: bool) {
    println!("virtplug {what} is serving the Kubernetes API at {url}");
    println!("  data dir:   {}", data_dir.display());
    println!("  kubeconfig: {}", kubeconfig.display());
    println!();
    println!("Next:");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get vm");
    if up {
        println!("  virtplug vm create demo --kernel .cache/guest/vmlinuz --initrd .cache/guest/initramfs.cpio.gz");
        println!("  virtplug volume create data --size 1Gi --wait");
        println!("  virtplug addvolume demo --volume-name data --claim data --wait");
        println!("  virtplug vm console demo");
        println!();
        println!("Stop with Ctrl-C (SIGINT) or SIGTERM; every acknowledged write is on disk; running VMs keep running");
        println!("(the next `virtplug up` adopts them) unless --stop-vms-on-exit was given.");
    } else {
        println!("  kubectl apply -f my-vm.yaml");
        println!();
        println!("Stop with Ctrl-C (SIGINT) or SIGTERM; every acknowledged write is on disk.");
    }
}

/// Waits for SIGINT or SIGTERM.
pub(crate) async fn signals() -> anyhow::Result<()> {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("cannot wait for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// Serves until a signal, or until a component dies: then stops and returns an error naming it
/// (its reason printed, exit status non-zero) — never a server that says ok with a dead part.
async fn run(config: apiserver::Config, listen: SocketAddr, up: Option<UpOptions>) -> anyhow::Result<()> {
    let what = if up.is_some() { "up" } else { "apiserver" };
    let server = apiserver::Server::open(&config, Some(listen))
        .await
        .with_context(|| format!("cannot open the data dir {}", config.data_dir.display()))?;
    let health = server.health().clone();
    let components = up.as_ref().map(|up| start_components(&server, &config, up));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}: is another virtplug running? choose another address with --listen"))?;
    let addr = listener.local_addr().context("cannot read the listen address")?;
    let host = if addr.ip().is_unspecified() { "127.0.0.1".to_owned() } else { addr.ip().to_string() };
    let url = if addr.is_ipv6() { format!("https://[{host}]:{}", addr.port()) } else { format!("https://{host}:{}", addr.port()) };
    let kubeconfig = server.write_kubeconfig(&url).context("cannot write the kubeconfig")?;
    // `up`'s node agent reaches the API in-process, which cannot upgrade a connection: its
    // console tunnel connects over the network with the kubeconfig, as in cluster mode.
    let _tunnel = match &up {
        Some(up) => {
            let client = client::connect_with(Some(&kubeconfig), &client::user_agent("node"), client::Retries::None)
                .await
                .context("cannot build the node agent's tunnel client from the kubeconfig")?;
            let state_dir = node::agent::Config::new(&up.node_name, &config.data_dir).state_dir;
            let tunnel = node::tunnel::Tunnel { client, node: up.node_name.clone(), vmis_dir: state_dir.join("vmis") };
            Some(AbortOnDrop(tokio::spawn(node::tunnel::run(tunnel))))
        }
        None => None,
    };
    let shutdown = CancellationToken::new();
    let redfish = match (&up, &components) {
        (Some(up), Some(c)) => {
            Some(crate::redfish_cmd::start_in_up(&server, c.client.clone(), &config.data_dir, up.redfish_listen, shutdown.clone()).await?)
        }
        _ => None,
    };
    print_banner(what, &url, &config.data_dir, &kubeconfig, up.is_some());
    if let Some(r) = &redfish {
        println!("Redfish (a BMC per VM) at {}/redfish/v1/", r.url);
        match r.admin_line() {
            Some(line) => println!("  {line}"),
            None => println!("  accounts: virtplug redfish account list"),
        }
        println!("  a VM's BMC address: virtplug vm bmc NAME");
    }
    let serving = {
        let shutdown = shutdown.clone();
        async move { server.serve_tls(listener, shutdown).await }
    };
    let died = tokio::select! {
        r = serving => {
            r.context("the API server stopped")?;
            return Ok(());
        }
        r = signals() => {
            r?;
            eprintln!("virtplug {what}: shutting down");
            None
        }
        f = health.first_failure() => {
            eprintln!("virtplug {what}: the {f}; shutting down");
            Some(f)
        }
    };
    if let (Some(up), Some(components)) = (&up, components) {
        stop_components(up, &config.data_dir, components).await;
    }
    shutdown.cancel();
    match died {
        None => Ok(()),
        Some(f) => Err(anyhow::anyhow!(
            "the {f}: virtplug {what} cannot serve without it and stopped. Every acknowledged write is on disk; \
             start it again (running VMs are adopted) and report the log above if it happens again"
        )),
    }
}
