//! The launcher handoff: QEMU started by a launcher process (`virtplug launcher`, the main
//! process of a VMI's launcher pod, as KubeVirt's virt-launcher) instead of by the node agent,
//! so that QEMU lives in the pod's cgroup, is accounted by the kubelet, and survives agent
//! restarts.
//!
//! # Flow
//! 1. The launcher listens on `RUN_DIR/launcher.sock` ([`SOCKET`]); the run dir is a hostPath
//!    both the pod and the node agent see.
//! 2. The agent connects ([`Connection::open`]: the launcher's PID is the socket's peer), opens
//!    the VMI's boot claims inside the pod (through `/proc/PID/root`: they are mounted only
//!    there) and sends one [`Request`]: QEMU's arguments as a JSON line, with the fd of
//!    `qemu.log` (QEMU's stdout and stderr) and then one fd per boot claim as SCM_RIGHTS on the
//!    same `sendmsg`.
//! 3. The launcher checks the arguments ([`crate::cmdline::audit`], and that none names its own
//!    monitor), adds its own QMP monitor ([`MONITOR`]), spawns QEMU as its child (no
//!    `-daemonize`, no new session: it stays in the pod's cgroup, and `PR_SET_PDEATHSIG=SIGKILL`
//!    kills it if the launcher dies) with the boot claims' fds at 3, 4, … (the arguments'
//!    `-add-fd fd=3+i`, [`crate::cmdline::DiskSource::Inherited`]: QEMU inherits them, no
//!    path to a claim is on its command line), and answers `{"pid": N}` or `{"error": "..."}`. N is
//!    QEMU's PID in the launcher's PID namespace, for the logs: the agent learns QEMU's PID as
//!    it sees it from the peer credentials of its QMP connection ([`crate::process`]), and the
//!    launcher's from those of this socket. Adoption after an agent restart
//!    ([`crate::process::adopt`]) works as for a QEMU the agent started.
//! 4. The launcher exits with QEMU's exit status when QEMU exits.
//!
//! # Stopping (the pod deleted: SIGTERM)
//! As KubeVirt's virt-launcher: the guest is asked to power off (ACPI power button, QMP
//! `system_powerdown` on the launcher's own monitor) and gets the VMI's
//! `terminationGracePeriodSeconds` (`--grace-period-seconds`, written into the pod by the
//! controller; 0 skips the request) to do it; then QEMU gets SIGTERM (it quits at once, as
//! QMP `quit`) and [`crate::process::QUIT_DEADLINE`] later SIGKILL — the node agent's stop
//! sequence on VMI deletion, through the same QMP command. The pod's own grace is longer
//! (the controller adds a margin), so the kubelet's SIGKILL comes after all of this.
//!
//! Why a monitor of its own: QEMU serves one client per monitor and the node agent holds
//! `qmp.sock` for as long as the VM runs; asking the agent instead would make stopping a pod
//! depend on the agent being up (it may be restarting: VMs must not care). The launcher's
//! monitor is a second `-chardev socket` + `-mon` pair that only the launcher adds and only it
//! connects to; the agent's arguments may not name it.
//!
//! # Guarantees
//! - One QEMU per launcher: a second request is answered with an error naming the running PID.
//! - A request with unknown fields, or whose fds are not exactly the log's plus one per
//!   `-add-fd` of its arguments (numbered 3, 4, … in order), is refused, not guessed at.
//! - A request whose arguments name the launcher's monitor (its chardev id or socket) is
//!   refused: that monitor is the launcher's way to stop the guest and no one else's.
//!
//! # Caveats
//! The launcher trusts whoever can connect: the socket is in the 0700 run dir, reachable only
//! by root on the node (the agent), like QEMU's own QMP socket next to it.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::{UnixListener, UnixStream};

/// The launcher's socket, in the VMI's run dir.
pub const SOCKET: &str = "launcher.sock";

/// The launcher's own QMP monitor socket, in the VMI's run dir (QEMU listens, the launcher
/// connects when it stops the guest).
pub const MONITOR: &str = "launcher-qmp.sock";

/// The chardev id of the launcher's monitor.
const MONITOR_ID: &str = "launcher-qmp";

/// How long the launcher tries to reach its monitor when stopping (QEMU creates it at start-up;
/// a SIGTERM right after the spawn may come before).
const MONITOR_DEADLINE: Duration = Duration::from_secs(10);

/// The stop grace when none is given: KubeVirt's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// How long the agent waits for the launcher's answer (spawning QEMU is quick; its start-up is
/// waited for on QMP afterwards).
const ANSWER_DEADLINE: Duration = Duration::from_secs(30);

/// Longest request read (QEMU's arguments: a few KiB).
const MAX_REQUEST: usize = 1 << 20;

/// Most boot-claim fds one request may carry (a VMI's boot claims; the kernel allows 253 fds
/// per message). More is refused by the agent before sending.
pub const MAX_INHERITED: usize = 64;

/// Errors of the handoff, on either side.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot talk to the launcher at {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the launcher at {path} did not answer within {ANSWER_DEADLINE:?}")]
    Timeout { path: PathBuf },
    #[error("the launcher at {path} refused: {message}")]
    Refused { path: PathBuf, message: String },
    #[error("bad request: {0}")]
    BadRequest(String),
}

/// What the agent asks of the launcher: start QEMU with these arguments (the binary is the
/// launcher's own, [`crate::process::qemu_binary`], from its image).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub args: Vec<String>,
}

/// What the launcher answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// The launcher's PID as the caller sees it (the peer of its socket, `SO_PEERCRED`).
    pub launcher_pid: i32,
    /// QEMU's PID in the launcher's PID namespace (as it reported it; for the logs only).
    pub pid_in_pod: i32,
}

/// A connection to a VMI's launcher, before the request: the launcher's PID is known (for
/// opening the boot claims inside its pod) and the request not sent yet.
#[derive(Debug)]
pub struct Connection {
    socket: PathBuf,
    stream: UnixStream,
    launcher_pid: i32,
}

impl Connection {
    /// Connects to the launcher at `socket`.
    ///
    /// # Errors
    /// `Io` (no launcher listening: the caller waits and retries).
    pub async fn open(socket: &Path) -> Result<Connection, LauncherError> {
        let io_err = |source| LauncherError::Io { path: socket.to_owned(), source };
        let stream = connect(socket).await.map_err(io_err)?;
        let launcher_pid = rustix::net::sockopt::socket_peercred(&stream).map_err(|e| io_err(e.into()))?.pid.as_raw_nonzero().get();
        Ok(Connection { socket: socket.to_owned(), stream, launcher_pid })
    }

    /// The launcher's PID as this process sees it (the socket's peer, `SO_PEERCRED`): its
    /// `/proc/PID/root` is the pod's file system.
    #[must_use]
    pub fn launcher_pid(&self) -> i32 {
        self.launcher_pid
    }

    /// Sends `request` with `log` (QEMU's stdout and stderr) and `inherited` (the boot claims'
    /// fds, the request's `-add-fd fd=3+i` in order) and waits for the answer.
    ///
    /// # Errors
    /// `BadRequest` for more than [`MAX_INHERITED`] fds, `Io`, `Timeout`, `Refused` with the
    /// launcher's reason.
    pub async fn hand_over(self, request: &Request, log: &std::fs::File, inherited: &[OwnedFd]) -> Result<Started, LauncherError> {
        let Connection { socket, stream, launcher_pid } = self;
        if inherited.len() > MAX_INHERITED {
            return Err(LauncherError::BadRequest(format!("{} boot disk fds; a launcher takes at most {MAX_INHERITED}", inherited.len())));
        }
        let io_err = |source| LauncherError::Io { path: socket.clone(), source };
        let mut line = serde_json::to_vec(request).map_err(|e| io_err(io::Error::other(e)))?;
        line.push(b'\n');
        let fds: Vec<_> = std::iter::once(log.as_fd()).chain(inherited.iter().map(AsFd::as_fd)).collect();
        let mut sent = 0;
        while sent < line.len() {
            // The fds travel with the first byte; the rest (if the kernel took only part) follows.
            let n = stream
                .async_io(Interest::WRITABLE, || {
                    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1 + MAX_INHERITED))];
                    let mut anc = SendAncillaryBuffer::new(&mut space);
                    if sent == 0 && !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
                        return Err(io::Error::other("the fds do not fit the control message"));
                    }
                    rustix::net::sendmsg(&stream, &[IoSlice::new(&line[sent..])], &mut anc, SendFlags::NOSIGNAL).map_err(io::Error::from)
                })
                .await
                .map_err(io_err)?;
            sent += n;
        }
        let mut answer = String::new();
        let mut reader = BufReader::new(stream);
        match tokio::time::timeout(ANSWER_DEADLINE, reader.read_line(&mut answer)).await {
            Err(_) => return Err(LauncherError::Timeout { path: socket }),
            Ok(r) => r.map_err(io_err)?,
        };
        let pid_in_pod = parse_answer(&socket, &answer)?;
        Ok(Started { launcher_pid, pid_in_pod })
    }
}

/// Connects to `socket`; a socket that exists but refuses (bound, not yet listening: the
/// launcher is between the two calls) is tried again for a moment.
async fn connect(socket: &Path) -> io::Result<UnixStream> {
    let mut delay = Duration::from_millis(10);
    loop {
        match UnixStream::connect(socket).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && delay < Duration::from_secs(1) => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            r => return r,
        }
    }
}

fn parse_answer(socket: &Path, answer: &str) -> Result<i32, LauncherError> {
    let v: Value = serde_json::from_str(answer)
        .map_err(|e| LauncherError::Refused { path: socket.to_owned(), message: format!("unreadable answer {answer:?}: {e}") })?;
    if let Some(pid) = v.get("pid").and_then(Value::as_i64).and_then(|p| i32::try_from(p).ok()) {
        return Ok(pid);
    }
    let message = v.get("error").and_then(Value::as_str).unwrap_or("no pid in the answer").to_owned();
    Err(LauncherError::Refused { path: socket.to_owned(), message })
}

/// A request as read: the arguments, QEMU's log, and the boot claims' fds in `-add-fd` order.
#[derive(Debug)]
struct Received {
    request: Request,
    log: OwnedFd,
    inherited: Vec<OwnedFd>,
}

/// Reads one request and its fds from a connection (the fds come with the first bytes), and
/// checks that the fds are the log's plus exactly one per `-add-fd` of the arguments, which
/// number them 3, 4, … in order (where [`spawn_qemu`] puts them).
async fn read_request(stream: &UnixStream) -> Result<Received, LauncherError> {
    let mut buf = vec![0u8; 64 << 10];
    let mut data = Vec::new();
    let mut fds: Vec<OwnedFd> = Vec::new();
    loop {
        let (n, got, truncated) = stream
            .async_io(Interest::READABLE, || {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1 + MAX_INHERITED))];
                let mut anc = RecvAncillaryBuffer::new(&mut space);
                let r = rustix::net::recvmsg(stream, &mut [IoSliceMut::new(&mut buf)], &mut anc, RecvFlags::CMSG_CLOEXEC)?;
                let mut got = Vec::new();
                for m in anc.drain() {
                    if let RecvAncillaryMessage::ScmRights(fds) = m {
                        got.extend(fds);
                    }
                }
                Ok((r.bytes, got, r.flags.contains(rustix::net::ReturnFlags::CTRUNC)))
            })
            .await
            .map_err(|e| LauncherError::BadRequest(format!("cannot read the request: {e}")))?;
        if truncated {
            return Err(LauncherError::BadRequest(format!("more fds than QEMU's log and {MAX_INHERITED} boot disks were sent")));
        }
        if !got.is_empty() && !fds.is_empty() {
            return Err(LauncherError::BadRequest("fds came in two messages: all belong with the request's first bytes".to_owned()));
        }
        fds.extend(got);
        if n == 0 {
            return Err(LauncherError::BadRequest("the connection closed before a whole request".to_owned()));
        }
        data.extend_from_slice(&buf[..n]);
        if data.len() > MAX_REQUEST {
            return Err(LauncherError::BadRequest(format!("request over {MAX_REQUEST} bytes")));
        }
        if let Some(end) = data.iter().position(|b| *b == b'\n') {
            let request: Request =
                serde_json::from_slice(&data[..end]).map_err(|e| LauncherError::BadRequest(format!("not a launch request: {e}")))?;
            let mut fds = fds.into_iter();
            let log = fds.next().ok_or_else(|| LauncherError::BadRequest("no fd for QEMU's log came with the request".to_owned()))?;
            let inherited: Vec<OwnedFd> = fds.collect();
            let numbers = crate::cmdline::add_fd_numbers(&request.args);
            let want: Vec<u32> = (crate::cmdline::FIRST_INHERITED_FD..).take(numbers.len()).collect();
            if numbers != want || inherited.len() != numbers.len() {
                return Err(LauncherError::BadRequest(format!(
                    "{} boot disk fds came with the request, and its -add-fd name fds {numbers:?}: expected one fd per -add-fd, \
                     numbered from {} in order",
                    inherited.len(),
                    crate::cmdline::FIRST_INHERITED_FD
                )));
            }
            return Ok(Received { request, log, inherited });
        }
    }
}

/// The arguments of the launcher's own QMP monitor, on `RUN_DIR/launcher-qmp.sock`.
fn monitor_args(run_dir: &Path) -> Vec<String> {
    let path = run_dir.join(MONITOR).display().to_string();
    let chardev = crate::opts::Opts::implied("socket").set("id", MONITOR_ID).set("path", &path).set("server", "on").set("wait", "off");
    vec!["-chardev".to_owned(), chardev.build(), "-mon".to_owned(), format!("chardev={MONITOR_ID},mode=control")]
}

/// Refuses arguments that name the launcher's monitor: a `-chardev` with its id or a socket of
/// its name, a `-mon` on its chardev.
fn refuse_own_monitor(args: &[String]) -> Result<(), String> {
    for w in args.windows(2) {
        let (flag, arg) = (w[0].as_str(), w[1].as_str());
        let named = match flag {
            "-chardev" => crate::opts::parse(arg).into_iter().any(|(k, v)| match k.as_deref() {
                Some("id") => v == MONITOR_ID,
                Some("path") => Path::new(&v).file_name().is_some_and(|n| n == MONITOR),
                _ => false,
            }),
            "-mon" => crate::opts::parse(arg).into_iter().any(|(k, v)| k.as_deref() == Some("chardev") && v == MONITOR_ID),
            _ => false,
        };
        if named {
            return Err(format!(
                "{flag} {arg}: names the launcher's own monitor ({MONITOR_ID}, {MONITOR}), which the launcher adds itself"
            ));
        }
    }
    Ok(())
}

/// Spawns QEMU as a child of this process, its stdout and stderr on `log`, the boot claims'
/// fds (`inherited`, checked by [`read_request`]) at 3, 4, …, with the launcher's monitor
/// added to the agent's arguments.
fn spawn_qemu(received: Received, run_dir: &Path) -> Result<tokio::process::Child, String> {
    let Received { request: req, log, inherited } = received;
    crate::cmdline::audit(&req.args).map_err(|e| format!("refusing to start QEMU: {e}"))?;
    refuse_own_monitor(&req.args).map_err(|e| format!("refusing to start QEMU: {e}"))?;
    // Each fd moved above the range it goes to (CLOEXEC: these copies end at exec), so the
    // child's dup2 to 3+i never overwrites a source it has yet to place.
    // `read_request` took at most MAX_INHERITED fds: the numbers fit an i32.
    let first = i32::try_from(crate::cmdline::FIRST_INHERITED_FD).map_err(|e| e.to_string())?;
    let above = i32::try_from(inherited.len()).map_err(|e| e.to_string())? + first;
    let high: Vec<OwnedFd> = inherited
        .iter()
        .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, above))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot duplicate a boot disk fd: {e}"))?;
    drop(inherited);
    let places: Vec<(i32, i32)> = high.iter().map(std::os::fd::AsRawFd::as_raw_fd).zip(first..).collect();
    let log = std::fs::File::from(log);
    let stdout = log.try_clone().map_err(|e| format!("cannot duplicate the log fd: {e}"))?;
    let binary = crate::process::qemu_binary();
    let mut cmd = tokio::process::Command::new(&binary);
    cmd.args(&req.args).args(monitor_args(run_dir)).current_dir("/").stdin(std::process::Stdio::null()).stdout(stdout).stderr(log);
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child between fork and exec, where only
    // async-signal-safe work is allowed: raw system calls (prctl, getppid, dup2), no
    // allocation (`places` was built before the fork and is only read). The death signal is
    // tied to the thread that forked; the launcher runs a current-thread runtime, so that
    // thread is its main thread, which lives as long as the launcher. `dup2` takes plain fd
    // numbers: each source is open in the child (a copy of the parent's table, `high` alive
    // until after the spawn) and above every target, so no source is overwritten before it is
    // placed; the target (3+i) comes without CLOEXEC, which is how QEMU inherits it. Any fd the
    // child had at a target was CLOEXEC (every fd of the launcher is), so nothing QEMU should
    // keep is replaced.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The launcher died between fork and prctl: no signal will come, so stop here.
            // ESRCH, not a message: an `io::Error` with a message allocates, and the child of a
            // multi-threaded fork must not (the allocator's locks may be held by a thread that
            // is not there).
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            for &(from, to) in &places {
                if libc::dup2(from, to) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.kill_on_drop(false).spawn().map_err(|e| format!("cannot start {}: {e}", binary.display()));
    // QEMU has its copies (or failed to start): the launcher keeps none.
    drop(high);
    child
}

async fn answer(stream: &mut UnixStream, v: &Value) {
    let mut line = v.to_string().into_bytes();
    line.push(b'\n');
    if let Err(e) = stream.write_all(&line).await {
        tracing::warn!("cannot answer the node agent: {e}");
    }
}

/// How a launcher ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// QEMU exited with this status (128 + signal when killed, as a shell reports it).
    Qemu(i32),
    /// Stopped (SIGTERM) before any QEMU was started.
    Stopped,
}

/// Asks the guest to power off through the launcher's monitor (see the module docs).
async fn ask_powerdown(monitor: PathBuf) -> Result<(), crate::qmp::QmpError> {
    let qmp = crate::qmp::Qmp::connect_within(&monitor, MONITOR_DEADLINE).await?;
    qmp.execute("system_powerdown", json!({})).await?;
    Ok(())
}

/// Sends `signal` to the child `child` (by its PID, while it is not reaped).
fn signal_child(child: Option<&tokio::process::Child>, signal: rustix::process::Signal) {
    if let Some(pid) =
        child.and_then(tokio::process::Child::id).and_then(|p| i32::try_from(p).ok()).and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Sleeps until `at`, forever without one.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The launcher's main loop: listens on `RUN_DIR/launcher.sock`, starts QEMU on the first valid
/// request, and returns when QEMU exits (or on SIGTERM/SIGINT before it started). On SIGTERM
/// (or SIGINT) QEMU is stopped as the module docs say, the guest given `grace`. Run it on a
/// current-thread runtime (see [`spawn_qemu`] on PDEATHSIG).
///
/// # Errors
/// `Listen` when the socket cannot be created.
pub async fn serve(run_dir: &Path, grace: Duration) -> Result<Ended, LauncherError> {
    use std::os::unix::fs::DirBuilderExt;
    use tokio::signal::unix::{signal, SignalKind};
    let path = run_dir.join(SOCKET);
    let listen_err = |source| LauncherError::Listen { path: path.clone(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(run_dir).map_err(listen_err)?;
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(listen_err(e)),
        _ => {}
    }
    let mut term = signal(SignalKind::terminate()).map_err(listen_err)?;
    let mut int = signal(SignalKind::interrupt()).map_err(listen_err)?;
    let listener = UnixListener::bind(&path).map_err(listen_err)?;
    tracing::info!("waiting for the node agent on {}", path.display());
    let mut child: Option<tokio::process::Child> = None;
    let mut stopping = false;
    // The stop's steps: the power-off request, SIGTERM to QEMU when the grace is over, SIGKILL.
    let mut powerdown: Option<tokio::task::JoinHandle<Result<(), crate::qmp::QmpError>>> = None;
    let (mut force_at, mut kill_at, mut stop_begun) = (None, None, false);
    let ended = loop {
        let exited = async {
            match child.as_mut() {
                Some(c) => c.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = exited => {
                let code = match status {
                    Ok(s) => s.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0)),
                    Err(e) => {
                        tracing::warn!("cannot wait for QEMU: {e}");
                        1
                    }
                };
                tracing::info!("QEMU exited ({code})");
                break Ended::Qemu(code);
            }
            accepted = listener.accept() => {
                let Ok((mut stream, _)) = accepted else { continue };
                if let Some(pid) = child.as_ref().and_then(tokio::process::Child::id) {
                    answer(&mut stream, &json!({"error": format!("QEMU already runs as PID {pid}")})).await;
                    continue;
                }
                if stopping {
                    answer(&mut stream, &json!({"error": "the launcher is stopping"})).await;
                    continue;
                }
                let reply = match read_request(&stream).await {
                    Err(e) => json!({"error": e.to_string()}),
                    Ok(received) => match spawn_qemu(received, run_dir) {
                        Ok(c) => {
                            let pid = c.id().unwrap_or_default();
                            tracing::info!("QEMU started as PID {pid}");
                            child = Some(c);
                            json!({"pid": pid})
                        }
                        Err(e) => json!({"error": e}),
                    },
                };
                answer(&mut stream, &reply).await;
            }
            asked = async { match powerdown.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                powerdown = None;
                // The request failed (the monitor cannot be reached, QEMU refused): waiting
                // for a guest that was not asked helps no one.
                if let Ok(Err(e)) = asked {
                    tracing::warn!("cannot ask the guest to power off ({e}): stopping QEMU now");
                    force_at = Some(tokio::time::Instant::now());
                }
            }
            () = until(force_at) => {
                tracing::info!("the guest did not power off within its grace period ({grace:?}): stopping QEMU");
                signal_child(child.as_ref(), rustix::process::Signal::TERM);
                force_at = None;
                kill_at = Some(tokio::time::Instant::now() + crate::process::QUIT_DEADLINE);
            }
            () = until(kill_at) => {
                tracing::warn!("QEMU did not quit within {:?} of SIGTERM: killing it", crate::process::QUIT_DEADLINE);
                signal_child(child.as_ref(), rustix::process::Signal::KILL);
                kill_at = None;
            }
            _ = term.recv() => stopping = true,
            _ = int.recv() => stopping = true,
        }
        if stopping && !stop_begun {
            stop_begun = true;
            let Some(pid) = child.as_ref().and_then(tokio::process::Child::id) else { break Ended::Stopped };
            // The pod is deleted: the guest is asked to power off and given its grace; the
            // launcher exits with QEMU.
            if grace.is_zero() {
                tracing::info!("stopping QEMU {pid} (grace period 0)");
                force_at = Some(tokio::time::Instant::now());
            } else {
                tracing::info!("stopping: asking the guest of QEMU {pid} to power off (grace period {grace:?})");
                powerdown = Some(tokio::spawn(ask_powerdown(run_dir.join(MONITOR))));
                force_at = Some(tokio::time::Instant::now() + grace);
            }
        }
    };
    let _ = std::fs::remove_file(&path);
    Ok(ended)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The agent's side against the launcher's: the fd arrives with the request, unknown fields
    /// are refused, and a second request is refused while QEMU runs.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_carries_its_fd_and_unknown_fields_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let sock = t.path().join(SOCKET);
        let listener = UnixListener::bind(&sock).unwrap();
        let log = std::fs::File::create(t.path().join("qemu.log")).unwrap();
        let server = async {
            let (mut s, _) = listener.accept().await.unwrap();
            let got = read_request(&s).await.unwrap();
            // The fd is the same file (same inode) as the agent's.
            let (a, b) = (rustix::fs::fstat(&got.log).unwrap(), rustix::fs::fstat(&log).unwrap());
            assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
            assert!(got.inherited.is_empty());
            answer(&mut s, &json!({"pid": 4242})).await;
            got.request
        };
        let request = Request { args: vec!["-name".into(), "guest=x".into()] };
        let agent = async { Connection::open(&sock).await.unwrap().hand_over(&request, &log, &[]).await };
        let (got, pid) = tokio::join!(server, agent);
        // The launcher's PID is the socket's peer, as this process sees it (here: itself).
        let me = rustix::process::getpid().as_raw_nonzero().get();
        assert_eq!((got, pid.unwrap()), (request, Started { launcher_pid: me, pid_in_pod: 4242 }));
        assert!(serde_json::from_str::<Request>(r#"{"args": [], "binary": "/bin/sh"}"#).is_err(), "unknown fields are refused");
        assert!(
            matches!(parse_answer(&sock, r#"{"error": "QEMU already runs as PID 7"}"#), Err(LauncherError::Refused { message, .. }) if message.contains("PID 7"))
        );
    }

    /// Boot disks (issue 19): their fds follow the log's in the same message, in `-add-fd`
    /// order; a request whose fds and `-add-fd`s do not match one to one (numbered from 3 in
    /// order) is refused, naming both counts.
    #[tokio::test(flavor = "current_thread")]
    async fn boot_disk_fds_come_with_the_request_one_per_add_fd() {
        let t = tempfile::tempdir().unwrap();
        let sock = t.path().join(SOCKET);
        let listener = UnixListener::bind(&sock).unwrap();
        let log = std::fs::File::create(t.path().join("qemu.log")).unwrap();
        let disks: Vec<OwnedFd> = ["a.img", "b.img"].iter().map(|n| std::fs::File::create(t.path().join(n)).unwrap().into()).collect();
        let add_fd = |fd: u32, set: u32| ["-add-fd".to_owned(), format!("fd={fd},set={set},opaque=virtplug-boot:v{set}")];
        let two: Vec<String> = add_fd(3, 0).into_iter().chain(add_fd(4, 1)).collect();
        for (args, sent, ok) in [
            (two.clone(), 2, true),
            (two.clone(), 1, false),
            (add_fd(3, 0).to_vec(), 2, false),
            (add_fd(4, 0).to_vec(), 1, false),
            (Vec::new(), 1, false),
        ] {
            let server = async {
                let (mut s, _) = listener.accept().await.unwrap();
                let got = read_request(&s).await;
                answer(&mut s, &json!({"pid": 1})).await;
                got
            };
            let request = Request { args: args.clone() };
            let agent = async { Connection::open(&sock).await.unwrap().hand_over(&request, &log, &disks[..sent]).await };
            let (got, _) = tokio::join!(server, agent);
            match got {
                Ok(r) if ok => {
                    let same = |a: &OwnedFd, b: &OwnedFd| {
                        let (x, y) = (rustix::fs::fstat(a).unwrap(), rustix::fs::fstat(b).unwrap());
                        (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)
                    };
                    assert_eq!(r.inherited.len(), 2);
                    assert!(same(&r.inherited[0], &disks[0]) && same(&r.inherited[1], &disks[1]), "in order");
                }
                Err(LauncherError::BadRequest(m)) if !ok => assert!(m.contains("expected one fd per -add-fd"), "{args:?} with {sent}: {m}"),
                other => panic!("{args:?} with {sent} fds: {other:?}"),
            }
        }
    }

    /// The launcher's own monitor passes the audit QEMU's other arguments pass, and the agent's
    /// arguments may not name it: not its chardev id, not its socket (under any directory), not
    /// a `-mon` on it. Other chardevs and monitors (the agent's `qmp.sock`) are left alone.
    #[test]
    fn the_launchers_monitor_is_its_own() {
        let own = monitor_args(Path::new("/run/vmis/u1"));
        assert_eq!(own[1], "socket,id=launcher-qmp,path=/run/vmis/u1/launcher-qmp.sock,server=on,wait=off");
        crate::cmdline::audit(&own).unwrap();
        assert!(refuse_own_monitor(&own).is_err(), "the launcher's own arguments are exactly what the agent may not send");
        let agent = |a: &str, b: &str| vec![a.to_owned(), b.to_owned()];
        refuse_own_monitor(&agent("-chardev", "socket,id=qmp0,path=/run/vmis/u1/qmp.sock,server=on,wait=off")).unwrap();
        refuse_own_monitor(&agent("-mon", "chardev=qmp0,mode=control")).unwrap();
        for (flag, arg) in [
            ("-chardev", "socket,id=x,path=/tmp/launcher-qmp.sock,server=on,wait=off"),
            ("-chardev", "socket,id=launcher-qmp,path=/tmp/other.sock,server=on,wait=off"),
            ("-mon", "chardev=launcher-qmp,mode=control"),
        ] {
            let e = refuse_own_monitor(&agent(flag, arg)).unwrap_err();
            assert!(e.contains("the launcher's own monitor"), "{flag} {arg}: {e}");
        }
    }
}
