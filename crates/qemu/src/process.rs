//! The QEMU process: launched in a session of its own (so it survives a restart of whoever
//! launched it), identified by its QMP socket's peer credentials (or its pidfile), adopted again
//! after a restart, stopped by PID.
//!
//! # PIDs across PID namespaces
//! A QEMU started by a launcher pod ([`crate::launcher`]) may live in the pod's PID namespace:
//! the PID it writes into its pidfile (and the one the launcher reports) is its PID *there*,
//! meaningless to the node agent. The kernel translates the PID of a unix socket's peer
//! (`SO_PEERCRED`) into the namespace of the process that asks, and QEMU itself listens on
//! `qmp.sock`: the peer of a connection to it is QEMU, as the agent sees it. That PID is what a
//! [`Process`] holds; a PID, from either source, is used only once `/proc/PID/cmdline` names this
//! run dir's pidfile (so a reused PID, or a PID from another namespace, is never taken for it).

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
    #[error("cannot prepare the firmware of {name}")]
    Firmware {
        name: String,
        #[source]
        source: crate::firmware::VarsError,
    },
    #[error("no running QEMU for run dir {run_dir}: {why}")]
    NotRunning { run_dir: PathBuf, why: String },
}

/// A running QEMU, by PID.
#[derive(Debug, Clone)]
pub struct Process {
    pub pid: i32,
    pub run_dir: PathBuf,
}

/// How long QEMU may take from exec to answering on QMP.
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

/// How long a QEMU told to quit (QMP `quit`, or SIGTERM) gets before SIGKILL, once the guest's
/// grace is over: the node agent's stop and the launcher's use the same.
pub const QUIT_DEADLINE: Duration = Duration::from_secs(5);

/// Starts QEMU for `spec` and returns once it answers on its QMP socket.
///
/// QEMU is not started with `-daemonize`: that forks and calls `setsid` after the seccomp
/// filter is in place, which `-sandbox spawn=deny,elevateprivileges=deny` forbids. Instead the
/// child gets its own session here (so it survives whoever launched it, like a daemon: no
/// controlling terminal, no signal to our process group reaches it), `/` as its directory,
/// and its stdout/stderr in `RUN_DIR/qemu.log` (never a pipe, which would break when the agent
/// that reads it dies). Once it runs, the child handle is dropped: tokio reaps it if it exits
/// while we live; after that, init does.
///
/// # Errors
/// `RunDir`, `Firmware` (the EFI variable store cannot be created), `Spawn`, or `Failed` with
/// QEMU's own message (from `qemu.log`) when it exits
/// before answering, or does not answer within a minute.
pub async fn launch(spec: &LaunchSpec) -> Result<Process, ProcessError> {
    launch_with(spec, Starter::Own).await
}

/// Who starts the QEMU process.
#[derive(Debug)]
pub enum Starter {
    /// This process, in a session of its own ([`launch`]); every disk is a path.
    Own,
    /// The VMI's launcher (its pod's main process), connected ([`crate::launcher`]): QEMU is its
    /// child, in the pod's cgroup, and inherits `inherited` — the fd of the spec's
    /// [`crate::cmdline::DiskSource::Inherited`]`(n)` is `inherited[n]` (opened by the caller
    /// inside the pod, through the connection's
    /// [`launcher_pid`](crate::launcher::Connection::launcher_pid)).
    Launcher { connection: crate::launcher::Connection, inherited: Vec<std::os::fd::OwnedFd> },
}

/// [`launch`], with QEMU started by `starter`. Everything else — the run dir, the firmware's
/// variable store, the arguments and their audit, the wait for QMP — is the same either way.
///
/// # Errors
/// As [`launch`]; `Failed` also when the spec's inherited fds are not exactly the starter's
/// (none for [`Starter::Own`]), and with a launcher when it cannot be reached or refuses.
pub async fn launch_with(spec: &LaunchSpec, starter: Starter) -> Result<Process, ProcessError> {
    let given = match &starter {
        Starter::Own => 0,
        Starter::Launcher { inherited, .. } => inherited.len(),
    };
    let wanted = spec.inherited_fds();
    if !wanted.iter().copied().eq(0..u32::try_from(given).unwrap_or(u32::MAX)) {
        return Err(ProcessError::Failed {
            name: spec.name.clone(),
            stderr: format!("the command line's disks inherit fds {wanted:?}, but {given} fds are given (only a launcher hands QEMU fds)"),
        });
    }
    let log = prepare(spec).await?;
    let firmware = spec.firmware.clone();
    tokio::task::spawn_blocking(move || firmware.prepare_vars())
        .await
        .map_err(|e| ProcessError::RunDir { path: spec.run_dir.clone(), source: std::io::Error::other(e) })?
        .map_err(|source| ProcessError::Firmware { name: spec.name.clone(), source })?;
    let log_path = spec.run_dir.join("qemu.log");
    let args = spec.args();
    crate::cmdline::audit(&args)
        .map_err(|e| ProcessError::Failed { name: spec.name.clone(), stderr: format!("refusing to start QEMU: {e}") })?;
    if let Starter::Launcher { connection, inherited } = starter {
        return hand_over(spec, connection, &inherited, args, &log, &log_path).await;
    }
    let binary = qemu_binary();
    let mut cmd = tokio::process::Command::new(&binary);
    let stdout = log.try_clone().map_err(|source| ProcessError::RunDir { path: spec.run_dir.clone(), source })?;
    cmd.args(args).current_dir("/").stdin(Stdio::null()).stdout(stdout).stderr(log);
    let own_ns = spec.own_mount_namespace;
    // SAFETY: the closure runs in the forked child between fork and exec, where only
    // async-signal-safe work is allowed. It makes raw system calls (setsid, and for bind-mount
    // mode unshare and mount on a static C string), allocates nothing, and returns an error as
    // an errno value. The child has one thread, so `unshare` cannot leave another thread with a
    // different view (the caveat of `unshare_unsafe`, about CLONE_FILES, does not apply to
    // NEWNS). setsid cannot fail here: the child of a fork is never a process group leader.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid()?;
            if own_ns {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
                // A downstream copy: the host's later mounts propagate in, ours never out.
                rustix::mount::mount_change(
                    c"/",
                    rustix::mount::MountPropagationFlags::DOWNSTREAM | rustix::mount::MountPropagationFlags::REC,
                )?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| ProcessError::Spawn { binary: binary.clone(), source })?;
    let qmp_socket = spec.qmp_socket();
    // Its QMP connection once it answers, or why it did not come up.
    let failed = tokio::select! {
        status = child.wait() => {
            Err(status.map_or_else(|e| format!("cannot wait for it ({e}); "), |s| if s.success() { String::new() } else { format!("{s}: ") }))
        }
        qmp = crate::qmp::Qmp::connect_within(&qmp_socket, STARTUP_DEADLINE) => qmp.map_err(|e| {
            let _ = child.start_kill();
            format!("it did not answer on QMP within {STARTUP_DEADLINE:?} ({e}); ")
        }),
    };
    let why = match failed {
        Ok(qmp) => return identify(&qmp, &spec.run_dir).await,
        Err(why) => why,
    };
    // QEMU's own message is the end of its log.
    let log = tokio::fs::read_to_string(&log_path).await.unwrap_or_default();
    Err(ProcessError::Failed { name: spec.name.clone(), stderr: format!("{why}{}", log.trim()) })
}

/// The launcher's half of [`launch_with`]: the arguments and the log's fd to the launcher, then
/// the same wait as for a QEMU of our own (QMP answers, or the process is gone). The PID the
/// launcher answers is QEMU's in the pod's PID namespace; "gone" is watched on the launcher
/// itself (its PID as this process sees it, from `SO_PEERCRED`): it exits with QEMU, and QEMU
/// dies with it (`PDEATHSIG`).
async fn hand_over(
    spec: &LaunchSpec,
    connection: crate::launcher::Connection,
    inherited: &[std::os::fd::OwnedFd],
    args: Vec<String>,
    log: &std::fs::File,
    log_path: &Path,
) -> Result<Process, ProcessError> {
    let failed = |why: String| ProcessError::Failed { name: spec.name.clone(), stderr: why };
    let started = connection
        .hand_over(&crate::launcher::Request { args }, log, inherited)
        .await
        .map_err(|e| failed(format!("the launcher did not start QEMU: {e}")))?;
    tracing::debug!(launcher = started.launcher_pid, qemu_in_pod = started.pid_in_pod, "the launcher started QEMU");
    let launcher = Process { pid: started.launcher_pid, run_dir: spec.run_dir.clone() };
    let qmp_socket = spec.qmp_socket();
    let why = tokio::select! {
        _ = launcher.wait_gone(STARTUP_DEADLINE) => "QEMU exited at once (its launcher is gone): ".to_owned(),
        qmp = crate::qmp::Qmp::connect_within(&qmp_socket, STARTUP_DEADLINE) => match qmp {
            Ok(qmp) => return identify(&qmp, &spec.run_dir).await,
            Err(e) => format!("it did not answer on QMP within {STARTUP_DEADLINE:?} ({e}); "),
        },
    };
    let log = tokio::fs::read_to_string(log_path).await.unwrap_or_default();
    Err(failed(format!("{why}{}", log.trim())))
}

/// Prepares the run dir — private ([`private_run_dir`]), without the sockets and pidfile of an
/// earlier QEMU — and opens a fresh `qemu.log` for QEMU's stdout and stderr. File-system work
/// (the run dir may sit on a slow disk), so on tokio's blocking threads, not the reactor.
async fn prepare(spec: &LaunchSpec) -> Result<std::fs::File, ProcessError> {
    let (run_dir, serial_log) = (spec.run_dir.clone(), spec.serial_log());
    let stale = [spec.qmp_socket(), spec.serial_socket(), spec.pidfile()];
    let work = move || -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        private_run_dir(&run_dir, &serial_log)?;
        for path in stale {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(run_dir.join("qemu.log"))
    };
    tokio::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|source| ProcessError::RunDir { path: spec.run_dir.clone(), source })
}

/// Makes the run dir private before QEMU runs: the dir 0700 (its QMP socket controls QEMU), the
/// serial log 0600 (the guest's console may print secrets). QEMU opens the log with `O_CREAT`
/// and would create it with its umask's mode, so it is created (or tightened) here first;
/// `logappend=on` keeps what is in it.
fn private_run_dir(run_dir: &Path, serial_log: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(run_dir)?;
    tighten(run_dir, 0o700)?;
    match std::fs::OpenOptions::new().append(true).create_new(true).mode(0o600).open(serial_log) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => tighten(serial_log, 0o600),
        Err(e) => Err(e),
    }
}

/// Removes group and other permissions from `path` (to `mode`) if it has any (a run dir made
/// by an older version).
fn tighten(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if std::fs::metadata(path)?.mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// The QEMU answering on `qmp` (a fresh connection to the QMP socket of `run_dir`), by its
/// peer credentials (see the module docs), checked against `/proc`.
async fn identify(qmp: &crate::qmp::Qmp, run_dir: &Path) -> Result<Process, ProcessError> {
    let not = |why: String| ProcessError::NotRunning { run_dir: run_dir.to_owned(), why };
    let pid = qmp.peer_pid().map_err(|e| not(format!("cannot read the QMP socket's peer credentials: {e}")))?;
    let (dir, pidfile) = (run_dir.to_owned(), run_dir.join("qemu.pid"));
    let ours = tokio::task::spawn_blocking(move || is_qemu_of(pid, &pidfile)).await.map_err(|e| not(e.to_string()))?;
    ours.map_err(not)?;
    Ok(Process { pid, run_dir: dir })
}

/// Checks that process `pid` (in this process's PID namespace) is the QEMU whose `-pidfile` is
/// `pidfile`; the reason when it is not.
fn is_qemu_of(pid: i32, pidfile: &Path) -> Result<(), String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|_| format!("process {pid} is gone"))?;
    let needle = pidfile.display().to_string();
    if String::from_utf8_lossy(&cmdline).split('\0').any(|a| a == needle) {
        Ok(())
    } else {
        Err(format!("process {pid} is not this VM's QEMU"))
    }
}

/// The PID (in this process's namespace) of whoever listens on `socket`: the peer credentials
/// of a connection made for that and closed at once. The connect does not block: while another
/// client holds QEMU's one QMP connection, a connect that finds QEMU's backlog full fails
/// (`EAGAIN`) instead of waiting for that client to leave.
///
/// # Errors
/// When the socket cannot be reached.
pub fn listener_pid(socket: &Path) -> std::io::Result<i32> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, None)?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(socket)?)?;
    Ok(rustix::net::sockopt::socket_peercred(&fd)?.pid.as_raw_nonzero().get())
}

/// Finds the QEMU of `run_dir`: the PID in its pidfile (right when QEMU shares this process's
/// PID namespace), else the peer of its QMP socket ([`listener_pid`]: a launcher pod's QEMU in a
/// PID namespace of its own). Either is checked to be that QEMU (its command line names the
/// run dir's pidfile), so a reused PID, or a PID of another namespace, is never taken for it.
///
/// # Errors
/// `NotRunning` with the reasons.
pub fn adopt(run_dir: &Path) -> Result<Process, ProcessError> {
    let not = |why: String| ProcessError::NotRunning { run_dir: run_dir.to_owned(), why };
    let pidfile = run_dir.join("qemu.pid");
    let by_pidfile = std::fs::read_to_string(&pidfile)
        .map_err(|e| format!("no pidfile ({e})"))
        .and_then(|t| t.trim().parse::<i32>().map_err(|_| format!("pidfile holds {t:?}")))
        .and_then(|pid| is_qemu_of(pid, &pidfile).map(|()| pid));
    let why_pidfile = match by_pidfile {
        Ok(pid) => return Ok(Process { pid, run_dir: run_dir.to_owned() }),
        Err(why) => why,
    };
    let by_peer = listener_pid(&run_dir.join("qmp.sock"))
        .map_err(|e| format!("QMP socket: {e}"))
        .and_then(|pid| is_qemu_of(pid, &pidfile).map(|()| pid));
    match by_peer {
        Ok(pid) => Ok(Process { pid, run_dir: run_dir.to_owned() }),
        Err(why_peer) => Err(not(format!("{why_pidfile}; {why_peer}"))),
    }
}

impl Process {
    /// Whether the process is still this QEMU.
    #[must_use]
    pub fn alive(&self) -> bool {
        is_qemu_of(self.pid, &self.run_dir.join("qemu.pid")).is_ok()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn the_run_dir_and_serial_log_are_private_and_the_log_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let run = t.path().join("vmis/u1");
        let log = run.join("serial.log");
        private_run_dir(&run, &log).unwrap();
        assert_eq!((mode(&run), mode(&log)), (0o700, 0o600));
        // A run dir and log from an older version: tightened, the log's content kept.
        std::fs::write(&log, "boot 1\n").unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
        private_run_dir(&run, &log).unwrap();
        assert_eq!((mode(&run), mode(&log)), (0o700, 0o600));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "boot 1\n");
    }
}
