//! The QEMU process: launched with `-daemonize` (its own session, so it survives a restart of
//! whoever launched it), identified by its pidfile, adopted again after a restart, stopped by PID.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rustix::process::{Pid, Signal};

use crate::cmdline::LaunchSpec;

/// The QEMU binary: `$VIRTPLUG_QEMU`, else `qemu-system-x86_64` on PATH.
#[must_use]
pub fn qemu_binary() -> PathBuf {
    std::env::var_os("VIRTPLUG_QEMU").map_or_else(|| PathBuf::from("qemu-system-x86_64"), PathBuf::from)
}

/// Errors of the process layer.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot prepare the run dir {path}")]
    RunDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {binary}: is QEMU installed? (scripts/install-deps.sh installs it)")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("QEMU for {name} failed to start: {stderr}")]
    Failed { name: String, stderr: String },
    #[error("no running QEMU for run dir {run_dir}: {why}")]
    NotRunning { run_dir: PathBuf, why: String },
}

/// A running QEMU, by PID.
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: i32,
    pub run_dir: PathBuf,
}

/// Starts QEMU for `spec` and returns once it runs in the background (QMP socket ready).
///
/// # Errors
/// `RunDir`, `Spawn`, or `Failed` with QEMU's own message.
pub async fn launch(spec: &LaunchSpec) -> Result<Process, ProcessError> {
    let run_err = |source| ProcessError::RunDir { path: spec.run_dir.clone(), source };
    std::fs::create_dir_all(&spec.run_dir).map_err(run_err)?;
    for stale in [spec.qmp_socket(), spec.serial_socket(), spec.pidfile()] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(run_err(e)),
        }
    }
    let binary = qemu_binary();
    let mut cmd = tokio::process::Command::new(&binary);
    cmd.args(spec.args()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if spec.own_mount_namespace {
        // SAFETY: the closure runs in the forked child between fork and exec, where only
        // async-signal-safe work is allowed. It makes two raw system calls (unshare, mount) on a
        // static C string and allocates nothing; an error is returned as an errno value. The
        // child has one thread, so `unshare` cannot leave another thread with a different view
        // (the caveat of `unshare_unsafe`, which is about CLONE_FILES, does not apply to NEWNS).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
                // A downstream copy: the host's later mounts propagate in, ours never out.
                rustix::mount::mount_change(
                    c"/",
                    rustix::mount::MountPropagationFlags::DOWNSTREAM | rustix::mount::MountPropagationFlags::REC,
                )?;
                Ok(())
            });
        }
    }
    let out = cmd.output().await.map_err(|source| ProcessError::Spawn { binary: binary.clone(), source })?;
    // With -daemonize the first process exits once QEMU is initialised (or has failed).
    if !out.status.success() {
        return Err(ProcessError::Failed { name: spec.name.clone(), stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned() });
    }
    adopt(&spec.run_dir)
}

/// Finds the QEMU of `run_dir` from its pidfile, checking that the PID still is that QEMU
/// (its command line names the run dir), so a reused PID is never taken for it.
///
/// # Errors
/// `NotRunning` with the reason.
pub fn adopt(run_dir: &Path) -> Result<Process, ProcessError> {
    let not = |why: String| ProcessError::NotRunning { run_dir: run_dir.to_owned(), why };
    let text = std::fs::read_to_string(run_dir.join("qemu.pid")).map_err(|e| not(format!("no pidfile ({e})")))?;
    let pid: i32 = text.trim().parse().map_err(|_| not(format!("pidfile holds {text:?}")))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|_| not(format!("process {pid} is gone")))?;
    let needle = run_dir.join("qemu.pid").display().to_string();
    if !String::from_utf8_lossy(&cmdline).split('\0').any(|a| a == needle) {
        return Err(not(format!("process {pid} is not this VM's QEMU")));
    }
    Ok(Process { pid, run_dir: run_dir.to_owned() })
}

impl Process {
    /// Whether the process is still this QEMU.
    #[must_use]
    pub fn alive(&self) -> bool {
        adopt(&self.run_dir).is_ok_and(|p| p.pid == self.pid)
    }

    /// SIGKILL, by PID (checked to still be this QEMU), then wait until it is gone.
    pub async fn kill(&self) {
        if !self.alive() {
            return;
        }
        if let Some(pid) = Pid::from_raw(self.pid) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        self.wait_gone(Duration::from_secs(10)).await;
    }

    /// Sets the scheduling priority (nice value) of every thread of this QEMU — Linux keeps it
    /// per thread, and the vCPU threads exist once `launch` returns; threads QEMU creates later
    /// inherit it from the thread that creates them. Threads that exit meanwhile are skipped.
    ///
    /// # Errors
    /// When the task list cannot be read (QEMU gone).
    pub fn renice(&self, nice: i32) -> std::io::Result<()> {
        for t in std::fs::read_dir(format!("/proc/{}/task", self.pid))?.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()).and_then(Pid::from_raw) else { continue };
            let _ = rustix::process::setpriority_process(Some(tid), nice);
        }
        Ok(())
    }

    /// Waits until the process has exited (poll on a pidfd, no busy polling), up to `deadline`.
    /// Returns whether it is gone.
    pub async fn wait_gone(&self, deadline: Duration) -> bool {
        let Some(pid) = Pid::from_raw(self.pid) else { return true };
        let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else { return true };
        tokio::task::spawn_blocking(move || {
            let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
            let timeout = rustix::event::Timespec::try_from(deadline).unwrap_or(rustix::event::Timespec { tv_sec: 10, tv_nsec: 0 });
            matches!(rustix::event::poll(&mut fds, Some(&timeout)), Ok(n) if n > 0)
        })
        .await
        .unwrap_or(false)
    }
}
