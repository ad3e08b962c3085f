//! Bind-mount mode's privileged effects as values ([`Request`]), the trait that carries them out
//! ([`Privileged`]), and a fake that records them ([`Recorder`]).

use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::devprog::{BlockRule, DeviceNumber};

/// One privileged effect: exactly what the fake records and what the helper carries out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// In `pid`'s mount namespace: create `target` (an empty file) and attach the volume's
    /// detached mount onto it.
    BindMount { pid: i32, target: PathBuf, readonly: bool },
    /// In `pid`'s mount namespace: create a block device node `target` for `device`.
    MakeNode { pid: i32, target: PathBuf, device: DeviceNumber },
    /// In `pid`'s mount namespace: unmount `target` if it is a mount point, then remove it.
    /// Each part is skipped when already done.
    RemoveTarget { pid: i32, target: PathBuf },
    /// Create `cgroup` allowing every character device and no block device, and move `pid` in.
    JoinCgroup { cgroup: PathBuf, pid: i32 },
    /// Allow `device` (`rw`, or `r` for a read-only disk) in `cgroup`. `allowed` is the whole
    /// block-device allowlist after the change (cgroup v2 replaces its program with it; v1 adds
    /// the one rule).
    AllowDevice { cgroup: PathBuf, device: DeviceNumber, readonly: bool, allowed: Vec<BlockRule> },
    /// Withdraw `device` from `cgroup`; `allowed` is the allowlist after the change.
    DenyDevice { cgroup: PathBuf, device: DeviceNumber, allowed: Vec<BlockRule> },
    /// Make the mount at `path` shared, so the VMs' namespaces hold downstream copies of it
    /// that go when the host unmounts it.
    ShareMount { path: PathBuf },
}

/// Carries out privileged effects.
pub trait Privileged: Send + Sync {
    /// Carries out `req`. `source` is the volume's opened file for `BindMount` (else `None`).
    ///
    /// # Errors
    /// The system's error, with what failed in the message.
    fn apply(&self, req: &Request, source: Option<BorrowedFd<'_>>) -> io::Result<()>;
}

/// Which requests the [`Recorder`] fails.
pub type FailWhen = fn(&Request) -> bool;

/// A fake [`Privileged`] that records every request (and the source's path for bind mounts);
/// `fail_on` makes requests matching it fail, to test error paths.
#[derive(Default)]
pub struct Recorder {
    pub calls: Mutex<Vec<Request>>,
    pub fail_on: Mutex<Option<FailWhen>>,
}

impl Recorder {
    /// The requests so far, emptied.
    pub fn take(&self) -> Vec<Request> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl Privileged for Recorder {
    fn apply(&self, req: &Request, source: Option<BorrowedFd<'_>>) -> io::Result<()> {
        if matches!(req, Request::BindMount { .. }) != source.is_some() {
            return Err(io::Error::other("a source is given with, and only with, a bind mount"));
        }
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(req.clone());
        let fail = *self.fail_on.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if fail.is_some_and(|f| f(req)) {
            return Err(io::Error::other("injected failure"));
        }
        Ok(())
    }
}
