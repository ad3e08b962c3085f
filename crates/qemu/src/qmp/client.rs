//! The QMP client: an async connection to QEMU's socket with file-descriptor passing.
//!
//! # Flow
//! `connect` reads the greeting and negotiates capabilities; a reader task then routes every
//! reply to its command by `id` and fans events out to subscribers. `execute_with_fd` sends the
//! fd as SCM_RIGHTS on the same `sendmsg` as the command (QEMU takes the fd with the command it
//! arrives with, never ahead of it).
//!
//! # Guarantees
//! - Every command has a deadline; a late reply is dropped, not given to the next command.
//! - Errors carry QMP's `class` and `desc`, the command, and the device or node it named.
//! - Dropping the client closes the socket; QEMU keeps running and a new client can attach
//!   to the same socket.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde_json::{json, Value};
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, oneshot};

use super::{target_of, Event, Monitor, QmpError, Reply, DEFAULT_DEADLINE};

/// How long QEMU may take to greet a new client.
pub const GREETING_DEADLINE: Duration = Duration::from_secs(5);

/// Longest QMP line read (QEMU's largest replies here, `query-named-block-nodes` with hundreds
/// of nodes, are well under 1 MiB). A peer that sends more without a newline is cut off rather
/// than buffered without bound.
pub const MAX_LINE: usize = 16 << 20;

/// A reply as read: the `return` value, or QMP's (class, desc).
type Raw = Result<Value, (String, String)>;
type Waiters = HashMap<u64, oneshot::Sender<Raw>>;
type Pending = Arc<Mutex<Waiters>>;

/// A connected QMP client.
pub struct Qmp {
    stream: Arc<UnixStream>,
    socket: PathBuf,
    pending: Pending,
    events: broadcast::Sender<Event>,
    next_id: AtomicU64,
    write: tokio::sync::Mutex<()>,
    reader: tokio::task::JoinHandle<()>,
    /// The greeting (`{"QMP": {"version": ...}}`).
    pub greeting: Value,
}

impl Drop for Qmp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn lock_pending(p: &Pending) -> std::sync::MutexGuard<'_, Waiters> {
    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Qmp {
    /// Connects, reads the greeting and negotiates capabilities.
    ///
    /// # Errors
    /// `Connect` when the socket is not there or refuses; `Protocol` for an unexpected greeting.
    pub async fn connect(socket: &Path) -> Result<Qmp, QmpError> {
        let stream = UnixStream::connect(socket).await.map_err(|source| QmpError::Connect { socket: socket.to_owned(), source })?;
        let stream = Arc::new(stream);
        let mut buf = Vec::new();
        // QEMU serves one QMP client per socket: while another is connected it accepts the
        // connection but sends no greeting, so the wait has a deadline.
        let read_greeting = async {
            loop {
                if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    break serde_json::from_slice::<Value>(&line)
                        .map_err(|e| QmpError::Protocol { socket: socket.to_owned(), message: format!("bad greeting: {e}") });
                }
                read_some(&stream, &mut buf).await.map_err(|source| QmpError::Io { socket: socket.to_owned(), source })?;
            }
        };
        let greeting = tokio::time::timeout(GREETING_DEADLINE, read_greeting).await.map_err(|_| QmpError::Protocol {
            socket: socket.to_owned(),
            message: format!("no greeting within {GREETING_DEADLINE:?}: is another QMP client connected to this VM?"),
        })??;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Protocol { socket: socket.to_owned(), message: format!("expected a QMP greeting, got {greeting}") });
        }
        let pending: Pending = Arc::default();
        let (events, _) = broadcast::channel(1024);
        let reader = tokio::spawn(read_loop(Arc::clone(&stream), buf, Arc::clone(&pending), events.clone()));
        let qmp = Qmp {
            stream,
            socket: socket.to_owned(),
            pending,
            events,
            next_id: AtomicU64::new(1),
            write: tokio::sync::Mutex::new(()),
            reader,
            greeting,
        };
        qmp.execute("qmp_capabilities", json!({})).await?;
        Ok(qmp)
    }

    /// Connects, retrying until `deadline` while the socket does not exist yet or refuses.
    ///
    /// # Errors
    /// The last connect error after the deadline.
    pub async fn connect_within(socket: &Path, deadline: Duration) -> Result<Qmp, QmpError> {
        let end = Instant::now() + deadline;
        loop {
            match Qmp::connect(socket).await {
                Ok(q) => return Ok(q),
                Err(e @ QmpError::Connect { .. }) if Instant::now() < end => {
                    tracing::debug!(error = %e, "QMP not ready yet");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Subscribes to events from now on.
    #[must_use]
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Runs a command with the default deadline.
    ///
    /// # Errors
    /// `Command` with QMP's class and description, `Timeout`, `Disconnected`, `Io`.
    pub async fn execute(&self, command: &str, args: Value) -> Result<Value, QmpError> {
        self.run(command, args, None, DEFAULT_DEADLINE).await
    }

    /// Runs a command with a deadline.
    ///
    /// # Errors
    /// As [`Qmp::execute`].
    pub async fn execute_within(&self, command: &str, args: Value, deadline: Duration) -> Result<Value, QmpError> {
        self.run(command, args, None, deadline).await
    }

    /// Runs a command (`add-fd`, `getfd`) with `fd` attached as SCM_RIGHTS on the same message.
    ///
    /// # Errors
    /// As [`Qmp::execute`].
    pub async fn execute_with_fd(&self, command: &str, args: Value, fd: BorrowedFd<'_>) -> Result<Value, QmpError> {
        self.run(command, args, Some(fd), DEFAULT_DEADLINE).await
    }

    async fn run(&self, command: &str, args: Value, fd: Option<BorrowedFd<'_>>, deadline: Duration) -> Result<Value, QmpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let target = target_of(&args);
        let mut msg = json!({"execute": command, "id": id});
        if args.as_object().is_some_and(|o| !o.is_empty()) {
            msg["arguments"] = args;
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(b'\n');
        let (tx, rx) = oneshot::channel();
        lock_pending(&self.pending).insert(id, tx);
        let io_err = |source| QmpError::Io { socket: self.socket.clone(), source };
        {
            let _w = self.write.lock().await;
            let mut sent = 0;
            let mut fd = fd;
            while sent < bytes.len() {
                let chunk = &bytes[sent..];
                let n = self
                    .stream
                    .async_io(Interest::WRITABLE, || {
                        let iov = [IoSlice::new(chunk)];
                        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
                        let mut control = SendAncillaryBuffer::new(&mut space);
                        let fds;
                        if let Some(f) = fd {
                            fds = [f];
                            control.push(SendAncillaryMessage::ScmRights(&fds));
                        }
                        rustix::net::sendmsg(&*self.stream, &iov, &mut control, SendFlags::NOSIGNAL).map_err(io::Error::from)
                    })
                    .await
                    .map_err(|e| {
                        lock_pending(&self.pending).remove(&id);
                        io_err(e)
                    })?;
                // The fd went with the first byte; never send it twice.
                fd = None;
                sent += n;
            }
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err((class, desc)))) => Err(QmpError::Command { command: command.to_owned(), target, class, desc }),
            Ok(Err(_)) => Err(QmpError::Disconnected { socket: self.socket.clone() }),
            Err(_) => {
                lock_pending(&self.pending).remove(&id);
                Err(QmpError::Timeout { command: command.to_owned(), deadline })
            }
        }
    }

    /// Closes the connection now (QEMU then accepts the next client); later commands fail with
    /// `Disconnected` or `Io`.
    pub fn close(&self) {
        let _ = rustix::net::shutdown(&*self.stream, rustix::net::Shutdown::Both);
    }

    /// The PID of QEMU, the peer of this connection (`SO_PEERCRED`), in this process's PID
    /// namespace — also for a QEMU in a PID namespace of its own, whose pidfile holds its PID
    /// there ([`crate::process`]).
    ///
    /// # Errors
    /// When the kernel cannot say.
    pub fn peer_pid(&self) -> io::Result<i32> {
        Ok(rustix::net::sockopt::socket_peercred(&*self.stream)?.pid.as_raw_nonzero().get())
    }

    /// Whether the connection is still open.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        !self.reader.is_finished()
    }
}

impl Monitor for Qmp {
    fn execute_within<'a>(&'a self, command: &'a str, args: Value, deadline: Duration) -> Reply<'a> {
        Box::pin(self.run(command, args, None, deadline))
    }

    fn execute_with_fd<'a>(&'a self, command: &'a str, args: Value, fd: BorrowedFd<'a>) -> Reply<'a> {
        Box::pin(self.run(command, args, Some(fd), DEFAULT_DEADLINE))
    }

    fn events(&self) -> broadcast::Receiver<Event> {
        Qmp::events(self)
    }

    fn close(&self) {
        Qmp::close(self);
    }

    fn socket(&self) -> &Path {
        &self.socket
    }
}

async fn read_some(stream: &UnixStream, buf: &mut Vec<u8>) -> io::Result<()> {
    if buf.len() > MAX_LINE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a QMP line longer than {MAX_LINE} bytes")));
    }
    let mut chunk = [0u8; 8192];
    loop {
        stream.readable().await?;
        match stream.try_read(&mut chunk) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "QMP socket closed")),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

async fn read_loop(stream: Arc<UnixStream>, mut buf: Vec<u8>, pending: Pending, events: broadcast::Sender<Event>) {
    // How much of `buf` is known to hold no newline: each byte is searched once, so a long
    // line costs linear time, not quadratic.
    let mut searched = 0;
    loop {
        while let Some(pos) = buf[searched..].iter().position(|b| *b == b'\n').map(|p| p + searched) {
            searched = 0;
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                tracing::warn!(line = %String::from_utf8_lossy(&line), "unparseable QMP line");
                continue;
            };
            if let Some(name) = v.get("event").and_then(Value::as_str) {
                let _ = events.send(Event {
                    name: name.to_owned(),
                    data: v.get("data").cloned().unwrap_or(Value::Null),
                    received: Instant::now(),
                });
                continue;
            }
            let Some(id) = v.get("id").and_then(Value::as_u64) else { continue };
            let Some(tx) = lock_pending(&pending).remove(&id) else { continue };
            let reply = match v.get("error") {
                Some(e) => Err((
                    e.get("class").and_then(Value::as_str).unwrap_or("GenericError").to_owned(),
                    e.get("desc").and_then(Value::as_str).unwrap_or("").to_owned(),
                )),
                None => Ok(v.get("return").cloned().unwrap_or(Value::Null)),
            };
            let _ = tx.send(reply);
        }
        searched = buf.len();
        if read_some(&stream, &mut buf).await.is_err() {
            // Pending commands see Disconnected when their senders drop here; event waiters get a
            // synthetic DISCONNECTED (QEMU exited or closed the socket).
            lock_pending(&pending).clear();
            let _ = events.send(Event { name: "DISCONNECTED".to_owned(), data: Value::Null, received: Instant::now() });
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A peer that greets, then answers the first command with `reply` (written in pieces).
    async fn fake_qemu(dir: &Path, reply: Vec<u8>) -> tokio::task::JoinHandle<()> {
        let listener = tokio::net::UnixListener::bind(dir.join("qmp.sock")).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n").await.unwrap();
            let mut buf = [0u8; 4096];
            // qmp_capabilities is answered; the next command gets `reply`.
            let n = s.read(&mut buf).await.unwrap();
            let cmd: Value = serde_json::from_slice(buf[..n].trim_ascii_end()).unwrap();
            s.write_all(format!("{{\"return\": {{}}, \"id\": {}}}\n", cmd["id"]).as_bytes()).await.unwrap();
            let _ = s.read(&mut buf).await.unwrap();
            for chunk in reply.chunks(1 << 20) {
                if s.write_all(chunk).await.is_err() {
                    return;
                }
            }
            let _ = s.read(&mut buf).await;
        })
    }

    #[tokio::test]
    async fn a_line_without_end_is_cut_off_not_buffered_without_bound() {
        let dir = tempfile::tempdir().unwrap();
        let server = fake_qemu(dir.path(), vec![b'x'; MAX_LINE + (4 << 20)]).await;
        let qmp = Qmp::connect(&dir.path().join("qmp.sock")).await.unwrap();
        let r = qmp.execute("query-status", json!({})).await;
        assert!(matches!(r, Err(QmpError::Disconnected { .. })), "{r:?}");
        assert!(!qmp.is_connected());
        server.abort();
    }
}
