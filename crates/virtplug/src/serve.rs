//! `virtplug up` and `virtplug apiserver`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

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
    #[arg(long, default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    accel: String,
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
    #[arg(long, default_value = "fd", value_parser = ["fd", "bind-mount"])]
    attach_mode: String,
}

/// What `up` runs besides the API server.
struct UpOptions {
    node_name: String,
    accel: qemu::accel::Accel,
    stop_vms_on_exit: bool,
    vm_nice: i32,
    attach_mode: node::bindmount::AttachMode,
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
    /// This node's name (what VMIs are scheduled onto) [default: the host name].
    #[arg(long)]
    node_name: Option<String>,
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
    #[arg(long, default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    accel: String,
    /// Nice value of the VMs' QEMU processes (see `virtplug up --help`).
    #[arg(long, default_value_t = 5)]
    vm_nice: i32,
    /// How hot-plugged volumes reach QEMU: `fd` (the agent opens the volume and passes the fd;
    /// nothing is mounted) or `bind-mount` (KubeVirt's way: bind mounts and device nodes in the
    /// VM's own mount namespace, block devices allowed in its cgroup v1 devices cgroup; root).
    #[arg(long, default_value = "fd", value_parser = ["fd", "bind-mount"])]
    attach_mode: String,
}

fn attach_mode(s: &str) -> node::bindmount::AttachMode {
    if s == "bind-mount" {
        node::bindmount::AttachMode::BindMount
    } else {
        node::bindmount::AttachMode::Fd
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

fn accel(s: &str) -> qemu::accel::Accel {
    match s {
        "kvm" => qemu::accel::Accel::Kvm,
        "tcg" => qemu::accel::Accel::Tcg,
        _ => qemu::accel::Accel::Auto,
    }
}

pub async fn node(args: NodeArgs) -> anyhow::Result<()> {
    let client = crate::migrate::connect(args.kubeconfig).await?;
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    let mut config = node::agent::Config::new(&args.node_name.unwrap_or_else(host_name), &data_dir);
    if let Some(root) = args.storage_root {
        config.storage_root = root;
    }
    config.accel = accel(&args.accel);
    config.vm_nice = args.vm_nice;
    config.mode = attach_mode(&args.attach_mode);
    eprintln!(
        "virtplug node {}: running VMs from {} (Ctrl-C stops the agent; VMs keep running)",
        config.node_name,
        config.state_dir.display()
    );
    tokio::select! {
        r = node::agent::run(client, config) => r.context("the node agent stopped")?,
        r = tokio::signal::ctrl_c() => r.context("cannot wait for SIGINT")?,
    }
    Ok(())
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
}

pub async fn apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    let mut config = apiserver::Config::new(&args.data_dir);
    config.store.watch_window = args.watch_window;
    run(config, args.listen, None).await
}

/// One registry with every component's metrics, for `/metrics`.
fn registry() -> apiserver::metrics::SharedRegistry {
    let mut r = prometheus_client::registry::Registry::default();
    apiserver::metrics::register(&mut r);
    client::metrics::register(&mut r);
    controller::metrics::register(&mut r);
    node::metrics::register(&mut r);
    std::sync::Arc::new(std::sync::Mutex::new(r))
}

pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir.unwrap_or_else(crate::default_data_dir);
    let mut config = apiserver::Config::new(&data_dir);
    config.metrics = Some(registry());
    println!("virtplug up: checking prerequisites");
    preflight(accel(&args.accel), attach_mode(&args.attach_mode))?;
    let up = UpOptions {
        node_name: args.node_name.unwrap_or_else(host_name),
        accel: accel(&args.accel),
        stop_vms_on_exit: args.stop_vms_on_exit,
        vm_nice: args.vm_nice,
        attach_mode: attach_mode(&args.attach_mode),
    };
    run(config, args.listen, Some(up)).await
}

pub async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    let client = crate::migrate::connect(args.kubeconfig).await?;
    let config = controller::run::Config {
        legacy_volume_requests: args.legacy_volume_requests,
        storage_root: args.storage_root.clone(),
        ..controller::run::Config::default()
    };
    match &args.storage_root {
        Some(root) => eprintln!("virtplug controller: running (local storage under {}; Ctrl-C to stop)", root.display()),
        None => eprintln!("virtplug controller: running (no local storage; Ctrl-C to stop)"),
    }
    tokio::select! {
        () = controller::run::run_with(client, config) => {}
        r = tokio::signal::ctrl_c() => r.context("cannot wait for SIGINT")?,
    }
    Ok(())
}

async fn run(config: apiserver::Config, listen: SocketAddr, up: Option<UpOptions>) -> anyhow::Result<()> {
    let what = if up.is_some() { "up" } else { "apiserver" };
    let server = apiserver::Server::open(&config, Some(listen))
        .await
        .with_context(|| format!("cannot open the data dir {}", config.data_dir.display()))?;
    // `up`: the in-process client and the controller's and node agent's tasks.
    let mut components: Option<(kube::Client, Vec<tokio::task::JoinHandle<()>>)> = None;
    if let Some(up) = &up {
        // In-process client: the controller and the node agent reach the API without a socket.
        let client = client::in_process(server.local_router());
        let ctl = controller::run::Config { storage_root: Some(config.data_dir.join("storage")), ..controller::run::Config::default() };
        let controller = tokio::spawn(controller::run::run_with(client.clone(), ctl));
        let mut node_config = node::agent::Config::new(&up.node_name, &config.data_dir);
        node_config.accel = up.accel;
        node_config.vm_nice = up.vm_nice;
        node_config.mode = up.attach_mode;
        let agent_client = client.clone();
        let agent = tokio::spawn(async move {
            if let Err(e) = node::agent::run(agent_client, node_config).await {
                tracing::error!("the node agent stopped: {e:#}");
            }
        });
        components = Some((client, vec![controller, agent]));
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}: is another virtplug running? choose another address with --listen"))?;
    let addr = listener.local_addr().context("cannot read the listen address")?;
    let host = if addr.ip().is_unspecified() { "127.0.0.1".to_owned() } else { addr.ip().to_string() };
    let url = if addr.is_ipv6() { format!("https://[{host}]:{}", addr.port()) } else { format!("https://{host}:{}", addr.port()) };
    let kubeconfig = server.write_kubeconfig(&url).context("cannot write the kubeconfig")?;
    println!("virtplug {what} is serving the Kubernetes API at {url}");
    println!("  data dir:   {}", config.data_dir.display());
    println!("  kubeconfig: {}", kubeconfig.display());
    println!();
    println!("Next:");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get vm");
    if up.is_some() {
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

    let shutdown = CancellationToken::new();
    let serving = {
        let shutdown = shutdown.clone();
        async move { server.serve_tls(listener, shutdown).await }
    };
    let signals = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("cannot wait for SIGINT")?,
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    };
    tokio::select! {
        r = serving => r.context("the API server stopped")?,
        r = signals => {
            r?;
            eprintln!("virtplug {what}: shutting down");
            if let (Some(up), Some((client, tasks))) = (&up, components) {
                // The controller and the agent stop first: nothing acts on a VM (or reports a VM
                // stopped below as crashed) while `up` shuts down. The API serves until the end.
                for t in &tasks {
                    t.abort();
                }
                for t in tasks {
                    let _ = t.await;
                }
                let records = node::checkpoint::records(&config.data_dir.join("node").join("vmis"));
                if up.stop_vms_on_exit {
                    for (dir, r) in &records {
                        eprintln!("virtplug up: stopping VM {}/{}", r.namespace, r.name);
                        node::worker::stop_for_shutdown(&client, dir, r).await;
                    }
                } else if !records.is_empty() {
                    eprintln!(
                        "virtplug up: {} VM(s) keep running; the next `virtplug up --data-dir {}` adopts them \
                         (use --stop-vms-on-exit to stop them with up)",
                        records.len(),
                        config.data_dir.display()
                    );
                }
            }
            shutdown.cancel();
        }
    }
    Ok(())
}
