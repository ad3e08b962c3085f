//! QMP, the QEMU Machine Protocol: the seam between the operations and QEMU.
//!
//! - [`Monitor`]: what [`Machine`](crate::Machine) needs of a QMP connection — run a command
//!   (optionally with an fd on the same message), subscribe to events. Every operation goes
//!   through it, so each can be unit-tested against a script.
//! - [`Qmp`] ([`client`]): the real one, an async client over QEMU's unix socket with SCM_RIGHTS
//!   fd passing.
//! - `fake::Fake` (with `cfg(test)` or the `fake` cargo feature): a scripted, recording
//!   [`Monitor`] for unit tests of this crate and of its users.

use std::future::Future;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::broadcast;

pub mod client;
#[cfg(any(test, feature = "fake"))]
pub mod fake;

pub use client::Qmp;

/// Deadline of a command unless the caller gives one.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// Errors of a QMP connection.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP {command}{} failed: {class}: {desc}", target.as_ref().map(|t| format!(" on {t}")).unwrap_or_default())]
    Command { command: String, target: Option<String>, class: String, desc: String },
    #[error("QMP {command} got no reply within {deadline:?}")]
    Timeout { command: String, deadline: Duration },
    #[error("the QMP connection {socket} closed")]
    Disconnected { socket: PathBuf },
    #[error("cannot connect to the QMP socket {socket}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("QMP I/O on {socket} failed")]
    Io {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("QMP protocol error on {socket}: {message}")]
    Protocol { socket: PathBuf, message: String },
}

impl QmpError {
    /// QMP's error class (`GenericError`, `DeviceNotFound`, ...), for command errors.
    #[must_use]
    pub fn class(&self) -> Option<&str> {
        match self {
            QmpError::Command { class, .. } => Some(class),
            _ => None,
        }
    }
    /// QMP's description, for command errors.
    #[must_use]
    pub fn desc(&self) -> Option<&str> {
        match self {
            QmpError::Command { desc, .. } => Some(desc),
            _ => None,
        }
    }
}

/// The device or node a command names, for error messages.
pub(crate) fn target_of(args: &Value) -> Option<String> {
    ["id", "node-name", "device", "fdset-id"]
        .iter()
        .find_map(|k| args.get(*k))
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
}

/// An asynchronous QMP event.
#[derive(Clone, Debug)]
pub struct Event {
    pub name: String,
    pub data: Value,
    /// When this client read it.
    pub received: Instant,
}

/// The reply to one command: QMP's `return` value, or the error.
pub type Reply<'a> = Pin<Box<dyn Future<Output = Result<Value, QmpError>> + Send + 'a>>;

/// A QMP connection, as the operations use it.
///
/// # Guarantees (of every implementation)
/// - Every command has a deadline; a command without a reply within it fails with `Timeout`.
/// - A refused command fails with `Command`, carrying QMP's class and description.
/// - An event is delivered to every receiver subscribed before QEMU sent it; when the
///   connection closes, receivers get a synthetic `DISCONNECTED` event.
pub trait Monitor: Send + Sync {
    /// Runs `command` with `args` (an empty object sends none) and waits up to `deadline` for
    /// its reply.
    fn execute_within<'a>(&'a self, command: &'a str, args: Value, deadline: Duration) -> Reply<'a>;

    /// Runs `command` (`add-fd`, `getfd`) with `fd` attached as SCM_RIGHTS on the same message
    /// (QEMU takes the fd with the command it arrives with), with [`DEFAULT_DEADLINE`].
    fn execute_with_fd<'a>(&'a self, command: &'a str, args: Value, fd: BorrowedFd<'a>) -> Reply<'a>;

    /// Subscribes to events from now on (subscribe before sending the command that causes one).
    fn events(&self) -> broadcast::Receiver<Event>;

    /// Closes the connection now (QEMU then accepts the next client); later commands fail.
    fn close(&self);

    /// The QMP socket, for error messages.
    fn socket(&self) -> &Path;

    /// Runs `command` with [`DEFAULT_DEADLINE`].
    fn execute<'a>(&'a self, command: &'a str, args: Value) -> Reply<'a> {
        self.execute_within(command, args, DEFAULT_DEADLINE)
    }
}

/// A shared monitor is a monitor: a test keeps an `Arc` of its fake to read what was sent.
impl<T: Monitor + ?Sized> Monitor for Arc<T> {
    fn execute_within<'a>(&'a self, command: &'a str, args: Value, deadline: Duration) -> Reply<'a> {
        (**self).execute_within(command, args, deadline)
    }
    fn execute_with_fd<'a>(&'a self, command: &'a str, args: Value, fd: BorrowedFd<'a>) -> Reply<'a> {
        (**self).execute_with_fd(command, args, fd)
    }
    fn events(&self) -> broadcast::Receiver<Event> {
        (**self).events()
    }
    fn close(&self) {
        (**self).close();
    }
    fn socket(&self) -> &Path {
        (**self).socket()
    }
}
