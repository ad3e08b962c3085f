//! The real effects of bind-mount mode: namespace work in a helper process ([`super::helper`]),
//! the mount's propagation, and the devices cgroup ([`super::cgroup`]).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;

use super::cgroup;
use super::helper::HELPER_SUBCOMMAND;
use super::request::{Privileged, Request};

/// The real effects: namespace work in a helper process (`virtplug mount-helper REQUEST`), cgroup
/// files and bpf(2) directly.
#[derive(Clone, Debug)]
pub struct Host {
    /// The `virtplug` binary (it has the helper subcommand).
    pub helper: PathBuf,
}

impl Privileged for Host {
    fn apply(&self, req: &Request, source: Option<BorrowedFd<'_>>) -> io::Result<()> {
        match req {
            Request::BindMount { .. } | Request::MakeNode { .. } | Request::RemoveTarget { .. } => {
                let tree = match (req, source) {
                    (Request::BindMount { .. }, Some(fd)) => Some(detached_mount_of(fd)?),
                    (Request::BindMount { .. }, None) => return Err(io::Error::other("a bind mount needs the opened volume")),
                    _ => None,
                };
                self.run_helper(req, tree)
            }
            Request::ShareMount { path } => rustix::mount::mount_change(path, rustix::mount::MountPropagationFlags::SHARED)
                .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("cannot make {} a shared mount: {e}", path.display()))),
            Request::JoinCgroup { cgroup, pid } => cgroup::join(cgroup, *pid),
            Request::AllowDevice { cgroup, device, readonly, allowed } => cgroup::allow(cgroup, *device, *readonly, allowed),
            Request::DenyDevice { cgroup, device, allowed } => cgroup::deny(cgroup, *device, allowed),
        }
    }
}

impl Host {
    fn run_helper(&self, req: &Request, tree: Option<OwnedFd>) -> io::Result<()> {
        let json = serde_json::to_string(req).map_err(io::Error::other)?;
        let out = std::process::Command::new(&self.helper)
            .arg(HELPER_SUBCOMMAND)
            .arg(&json)
            // The detached mount is the helper's standard input (no fd number to agree on, and
            // no window in which another child could inherit it).
            .stdin(tree.map_or_else(Stdio::null, Stdio::from))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run the mount helper {}: {e}", self.helper.display())))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("mount helper: {}", String::from_utf8_lossy(&out.stderr).trim())))
        }
    }
}

/// A detached copy of the mount holding `fd`'s file, rooted at that file.
fn detached_mount_of(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use rustix::mount::OpenTreeFlags as F;
    rustix::mount::open_tree(fd, "", F::OPEN_TREE_CLONE | F::OPEN_TREE_CLOEXEC | F::AT_EMPTY_PATH)
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("open_tree of the volume: {e}")))
}
