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
//! An existing `disk.img` is never touched (`O_EXCL` create). A created one is fsynced with its
//! directory before the socket is listened on, so the agent never opens a half-made image.
//!
//! # Errors
//! A `--disk` that cannot be created, or a socket that cannot be bound: exit 1 (the pod fails
//! and the controller's status shows it; the agent keeps waiting for the volume).

use std::io::Write as _;
use std::path::{Path, PathBuf};
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
    #[arg(long = "disk", value_parser = parse_disk)]
    disks: Vec<(PathBuf, u64)>,
}

fn parse_disk(s: &str) -> Result<(PathBuf, u64), String> {
    let (path, bytes) = s.rsplit_once('=').ok_or_else(|| format!("{s:?}: expected PATH=BYTES"))?;
    let bytes = bytes.parse().map_err(|e| format!("{s:?}: size {bytes:?}: {e}"))?;
    Ok((PathBuf::from(path), bytes))
}

/// Creates `path` sparse with `bytes` unless it exists; returns whether it created it.
///
/// # Errors
/// When the file cannot be created, sized or synced (the message names the path).
pub fn ensure_image(path: &Path, bytes: u64) -> anyhow::Result<bool> {
    let file = match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    };
    file.set_len(bytes).with_context(|| format!("cannot size {} to {bytes} bytes", path.display()))?;
    file.sync_all().with_context(|| format!("cannot sync {}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(true)
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
    for (path, bytes) in &args.disks {
        if ensure_image(path, *bytes)? {
            println!("created {} ({bytes} bytes, sparse)", path.display());
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_claim_gets_a_sparse_image_and_an_existing_one_is_left_alone() {
        let dir = std::env::temp_dir().join(format!("holder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("disk.img");
        let _ = std::fs::remove_file(&img);
        assert!(ensure_image(&img, 64 << 20).unwrap());
        let md = std::fs::metadata(&img).unwrap();
        assert_eq!(md.len(), 64 << 20);
        assert!(std::os::unix::fs::MetadataExt::blocks(&md) < 64, "sparse: no data blocks written");
        std::fs::write(&img, b"data").unwrap();
        assert!(!ensure_image(&img, 64 << 20).unwrap(), "an existing image is never recreated");
        assert_eq!(std::fs::read(&img).unwrap(), b"data");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn disk_arguments_are_path_equals_bytes() {
        assert_eq!(parse_disk("/a=b/disk.img=10").unwrap(), (PathBuf::from("/a=b/disk.img"), 10));
        assert!(parse_disk("/x/disk.img").is_err());
    }
}
