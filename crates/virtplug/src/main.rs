//! `virtplug`: the one binary. `up` runs the embedded stack; the other subcommands run one
//! component or talk to a running one.

mod allocator;
mod attachment_holder;
mod cli;
mod disk_flag;
mod endpoints;
mod growth_flags;
mod import_flags;
mod kubelet_standin;
mod kubevirt_guard;
mod launcher;
mod migrate;
mod mode_flags;
mod qemu_flags;
mod redfish_cmd;
mod serve;
mod subresources_api_cmd;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "virtplug", version, about = "VMs with declarative volume hot-plug behind a Kubernetes-compatible API")]
struct Cli {
    /// Log format (every line carries the object it is about: the VM, claim or DataVolume).
    #[arg(long, global = true, value_enum, default_value_t = mode_flags::LogFormat::Text)]
    log_format: mode_flags::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded stack: API server (HTTPS), controller and node agent, in one process.
    Up(serve::UpArgs),
    /// Run only the embedded API server.
    Apiserver(serve::ApiserverArgs),
    /// Run the controller against an API server (VM lifecycle, hot-plug, local storage).
    Controller(serve::ControllerArgs),
    /// Run the node agent against an API server (this node's VMs under QEMU).
    Node(serve::NodeArgs),
    /// Run one VMI's QEMU as its child: the main process of the VMI's launcher pod (started by
    /// the node agent over RUN_DIR/launcher.sock; exits with QEMU's status).
    Launcher(launcher::LauncherArgs),
    /// The process of a hot-plug attachment pod (`hp-volume-*`): creates an empty Filesystem
    /// claim's disk.img, listens on the hp.sock the node agent finds it by, sleeps until SIGTERM.
    AttachmentHolder(attachment_holder::HolderArgs),
    /// Run KubeVirt's subresources API (console, VNC, start/stop, addvolume, pause, ...) as an
    /// aggregated API server behind a cluster's kube-apiserver (KubeVirt's virt-api).
    SubresourcesApi(subresources_api_cmd::SubresourcesApiArgs),
    /// Run the Redfish service (a BMC per VM) against an API server; manage its accounts.
    Redfish(redfish_cmd::RedfishArgs),
    /// Create, list, start, stop, restart, delete VMs; attach to a console.
    Vm {
        #[command(subcommand)]
        cmd: cli::Vm,
        #[command(flatten)]
        common: cli::Common,
    },
    /// Create claims, import images into DataVolumes.
    Volume {
        #[command(subcommand)]
        cmd: cli::Volume,
        #[command(flatten)]
        common: cli::Common,
    },
    /// Hot-plug a claim or DataVolume into a VM (edits its spec; virtctl's flags).
    Addvolume {
        #[command(flatten)]
        args: cli::AddVolume,
        #[command(flatten)]
        common: cli::Common,
    },
    /// Unplug a volume from a VM (edits its spec).
    Removevolume {
        #[command(flatten)]
        args: cli::RemoveVolume,
        #[command(flatten)]
        common: cli::Common,
    },
    /// Print the CRD manifests for cluster mode (deploy/10-crds-kubevirt.yaml and
    /// deploy/11-crd-datavolume.yaml).
    Crds {
        /// Only this API group's file: kubevirt.io or cdi.kubevirt.io [default: both files].
        #[arg(long)]
        group: Option<String>,
    },
    /// One-off migrations of a cluster's objects.
    #[command(subcommand)]
    Migrate(migrate::Migrate),
}

/// The default data dir of `up`: `$XDG_DATA_HOME/virtplug`, else `~/.local/share/virtplug`.
pub fn default_data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("virtplug");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".local/share/virtplug")
}

fn main() -> std::process::ExitCode {
    // The node agent's mount helper (bind-mount mode): one request, in this process while it
    // is still single-threaded (`setns` into a mount namespace requires it), so before clap,
    // logging or the runtime.
    let mut args = std::env::args();
    if args.nth(1).as_deref() == Some(node::bindmount::HELPER_SUBCOMMAND) {
        return match node::bindmount::helper_main(&args.next().unwrap_or_default()) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // One crypto provider for every rustls user in the process (kube, the TLS listener).
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Command::Launcher(args) = cli.command {
        // Its own runtime, current-thread: QEMU's death signal is tied to the thread that
        // forked it, which must live as long as the launcher (see `qemu::launcher`).
        return launcher::main(&args);
    }
    if let Command::AttachmentHolder(args) = &cli.command {
        return attachment_holder::main(args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Up(args) => serve::up(args).await,
            Command::Apiserver(args) => serve::apiserver(args).await,
            Command::Controller(args) => serve::controller(args).await,
            Command::Node(args) => serve::node(args).await,
            Command::Redfish(args) => redfish_cmd::run(args).await,
            Command::SubresourcesApi(args) => subresources_api_cmd::run(args).await,
            Command::Launcher(_) | Command::AttachmentHolder(_) => unreachable!("run before the runtime"),
            Command::Vm { cmd, common } => cli::vm(cmd, common).await,
            Command::Volume { cmd, common } => cli::volume(cmd, common).await,
            Command::Addvolume { args, common } => cli::addvolume(args, common).await,
            Command::Removevolume { args, common } => cli::removevolume(args, common).await,
            Command::Migrate(m) => match migrate::run(m).await {
                // Fail closed: anything refused or failed is a non-zero exit.
                Ok(true) => Ok(()),
                Ok(false) => std::process::exit(1),
                Err(e) => Err(e),
            },
            Command::Crds { group } => {
                let groups: Vec<&str> = match &group {
                    Some(g) => vec![g.as_str()],
                    None => api::crd::DEPLOY_FILES.iter().map(|f| f.group).collect(),
                };
                for g in groups {
                    let Some(text) = api::crd::manifest(g)? else {
                        anyhow::bail!("virtplug has no CRD in group {g:?}: use kubevirt.io or cdi.kubevirt.io");
                    };
                    print!("{text}");
                }
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(format: mode_flags::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        // The JSON lines carry the spans (`span`, `spans`): the VM, claim or DataVolume.
        mode_flags::LogFormat::Json => builder.json().init(),
        mode_flags::LogFormat::Text => builder.init(),
    }
}
