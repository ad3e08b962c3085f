//! `virtplug apiserver` as a benchmark peer: started on a loopback port with its own data dir,
//! reached through a kube-rs client from the kubeconfig it writes, killed (by PID) when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::waits::wait_for_line;

/// A child process killed (by PID) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `bin apiserver` on data dir `dir` and connects to it (60 s deadline for it to serve).
///
/// # Errors
/// When it does not start, does not say it serves within the deadline, or cannot be reached.
pub async fn start(bin: &Path, dir: &Path) -> anyhow::Result<(Proc, kube::Client)> {
    let mut child = Command::new(bin)
        .args(["apiserver", "--data-dir"])
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let out = child.stdout.take().context("stdout")?;
    let proc = Proc(child);
    let what = format!("{} apiserver", bin.display());
    tokio::task::spawn_blocking(move || wait_for_line(out, "serving", Duration::from_secs(60), &what)).await??;
    let client = client::connect(Some(&dir.join("kubeconfig"))).await?;
    Ok((proc, client))
}
