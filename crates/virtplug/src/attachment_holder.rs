//! `virtplug attachment-holder`: the process of an attachment pod (KubeVirt's `hp-volume-*`
//! pod, created by the controller: `controller::hotplug::attachment_pod`). It does nothing but
//! exist inside the pod's mount namespace, where the kubelet mounted the hot-plugged claims:
//! the node agent finds it by the peer credentials of its `hp.sock` and opens the volumes
//! through `/proc/PID/root`.
//!
//! # Flow
//! 1. Each `--disk PATH=BYTES` (a Filesystem claim's `disk.img`) that does not exist is created
//!    sparse with that size: a fresh CSI Filesystem claim is an empty filesystem, and the
//!    holder is the one process that has it mounted (the agent would need the pod's namespace).
//! 2. Listens on `--socket` and accepts (and closes) every connection.
//! 3. Exits 0 on SIGTERM or SIGINT.
//!
//! # Guarantees
//! An existing `disk.img` is never touched, a created one is synced before the socket is
//! listened on ([`crate::disk_flag`]).
//!
//! # Errors
//! A `--disk` that cannot be created, or a socket that cannot be bound: exit 1 (the pod fails
//! and the controller's status shows it; the agent keeps waiting for the volume).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

/// Arguments of `virtplug attachment-holder` (the controller writes them into the pod).
#[derive(Args)]
pub struct HolderArgs {
    /// The socket the node agent connects to (`/hotplug-disks/hp.sock` in the pod).
    #[arg(long)]
    socket: PathBuf,
    /// `PATH=BYTES`: create the Filesystem claim's image PATH, sparse, BYTES long, if missing.
    #[arg(long = "disk", value_parser = crate::disk_flag::parse)]
    disks: Vec<crate::disk_flag::Disk>,
}

/// Runs the holder (see the module docs).
pub fn main(args: &HolderArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &HolderArgs) -> anyhow::Result<()> {
    crate::disk_flag::ensure_all(&args.disks)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(async {
        // A stale socket of an earlier holder in the same emptyDir (a restarted container).
        let _ = std::fs::remove_file(&args.socket);
        let listener =
            tokio::net::UnixListener::bind(&args.socket).with_context(|| format!("cannot listen on {}", args.socket.display()))?;
        println!("holding; listening on {}", args.socket.display());
        let _ = std::io::stdout().flush();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("SIGTERM handler")?;
        loop {
            tokio::select! {
                // The agent only needs the connection's peer credentials: close it at once.
                accepted = listener.accept() => drop(accepted),
                _ = term.recv() => return Ok(()),
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    })
}
