//! `qemu-img info` and `qemu-img convert` on a downloaded qcow2 image, as CDI converts.
//!
//! # Contract
//! - Only paths the controller created (the [`Scratch`](super::target::Scratch) file, the
//!   target's temp file or the claim's loop device) go on the command line, each as its own
//!   argv entry; nothing from the DataVolume's spec does.
//! - The format is always given (`-f qcow2`, `-O raw`): QEMU never probes untrusted bytes.
//! - The child is killed when the import is dropped (the DataVolume was deleted).
//! - Status messages quote `qemu-img`'s error with the scratch path replaced by "the image".
//!
//! # Assumes
//! `qemu-img` (qemu-utils) at [`QEMU_IMG`] or on `PATH`; `scripts/install-deps.sh` installs it.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::ImportError;

/// Where Debian's qemu-utils puts it.
pub const QEMU_IMG: &str = "/usr/bin/qemu-img";

fn program() -> &'static str {
    if Path::new(QEMU_IMG).exists() {
        QEMU_IMG
    } else {
        "qemu-img"
    }
}

/// `qemu-img`'s message: its stderr's last line, with `path` replaced by "the image".
fn message(stderr: &[u8], path: &Path) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
    let line = line.trim().strip_prefix("qemu-img: ").unwrap_or(line.trim());
    line.replace(&format!("'{}'", path.display()), "the image").replace(&path.display().to_string(), "the image")
}

fn spawn_error(e: &std::io::Error) -> ImportError {
    ImportError::Transient(format!("cannot run {}: {e} (install qemu-utils)", program()))
}

/// `qemu-img info -f qcow2 --output=json PATH`: its JSON.
///
/// # Errors
/// Permanent when qemu-img cannot read the image as qcow2 (a corrupt image), naming why.
pub async fn info(path: &Path) -> Result<String, ImportError> {
    let out = Command::new(program())
        .args(["info", "-f", "qcow2", "--output=json"])
        .arg(path)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| spawn_error(&e))?;
    if !out.status.success() {
        return Err(ImportError::Permanent(format!("the source is not a valid qcow2 image: {}", message(&out.stderr, path))));
    }
    String::from_utf8(out.stdout).map_err(|_| ImportError::Permanent("qemu-img info answered with bytes that are not UTF-8".into()))
}

/// Parses the progress lines `qemu-img convert -p` prints (`    (42.00/100%)\r`): the last
/// complete one in `buf`, as a fraction.
fn last_progress(buf: &str) -> Option<f64> {
    buf.split(['\r', '\n']).rev().find_map(|l| {
        let l = l.trim().strip_prefix('(')?.strip_suffix("/100%)")?;
        l.parse::<f64>().ok().map(|p| (p / 100.0).clamp(0.0, 1.0))
    })
}

/// `qemu-img convert -p -n -f qcow2 -O raw SRC DST`, calling `progress` with the fraction done.
/// `fresh` says `DST` is a new sparse file (`--target-is-zero`: zero clusters stay holes); a
/// device is written whole.
///
/// # Errors
/// Permanent when the conversion fails (the image is corrupt past its header), naming why.
pub async fn convert(src: &Path, dst: &Path, fresh: bool, mut progress: impl FnMut(f64)) -> Result<(), ImportError> {
    let mut cmd = Command::new(program());
    cmd.args(["convert", "-p", "-n", "-f", "qcow2", "-O", "raw"]);
    if fresh {
        cmd.arg("--target-is-zero");
    }
    cmd.arg(src).arg(dst).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| spawn_error(&e))?;
    let mut stdout = child.stdout.take().ok_or_else(|| ImportError::Transient("qemu-img's stdout is missing".into()))?;
    let mut stderr = child.stderr.take().ok_or_else(|| ImportError::Transient("qemu-img's stderr is missing".into()))?;
    let errors = tokio::spawn(async move {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf).await;
        buf
    });
    let mut buf = [0u8; 256];
    loop {
        match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(p) = last_progress(&String::from_utf8_lossy(&buf[..n])) {
                    progress(p);
                }
            }
        }
    }
    let status = child.wait().await.map_err(|e| ImportError::Transient(format!("cannot wait for qemu-img: {e}")))?;
    let stderr = errors.await.unwrap_or_default();
    if !status.success() {
        return Err(ImportError::Permanent(format!("the qcow2 image could not be converted: {}", message(&stderr, src))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_read_from_the_last_complete_line() {
        assert_eq!(last_progress("    (0.00/100%)\r    (42.50/100%)\r"), Some(0.425));
        assert_eq!(last_progress("    (100.00/100%)\r\n"), Some(1.0));
        assert_eq!(last_progress("    (42.5"), None);
    }

    #[test]
    fn messages_do_not_name_the_scratch_path() {
        let p = Path::new("/var/lib/x/.disk.img.import-1.qcow2");
        let m = message(b"qemu-img: Could not open '/var/lib/x/.disk.img.import-1.qcow2': Unsupported qcow2 version 2608113959\n", p);
        assert_eq!(m, "Could not open the image: Unsupported qcow2 version 2608113959");
    }
}
