//! Bind-mount mode: KubeVirt's way of giving a running VM its hot-plugged volumes, kept for
//! hypervisors that need a path instead of an fd ([`AttachMode::BindMount`]).
//!
//! # How
//! - QEMU runs in a mount namespace of its own, a downstream copy of the host's
//!   (`LaunchSpec::own_mount_namespace`), and in a devices cgroup of its own
//!   (`DEVICES_CGROUP/<vmi uid>` on cgroup v1, `/sys/fs/cgroup/virtplug/<vmi uid>` on v2) that
//!   allows every character device and no block device.
//! - Filesystem volume: the agent opens `disk.img` as in fd mode (`openat2`, no symlinks), clones
//!   the opened file into a detached mount (`open_tree(OPEN_TREE_CLONE)`: the mount source is the
//!   file already checked, never a path resolved again) and a helper process joins QEMU's mount
//!   namespace and attaches it onto `RUN_DIR/hotplug/<volume>` (`move_mount`), read-only when
//!   the disk is. QEMU then opens that path. The helper is a fresh process because `setns` into
//!   a mount namespace refuses a multi-threaded caller.
//! - Block volume: the cgroup allows the loop device (`devices.allow`), then the helper creates
//!   a node with its number at the target inside the namespace (`mknodat`).
//! - Every target is recorded in `RUN_DIR/mounts.json` (written atomically) *before* it is made,
//!   and the record goes only after the target is gone: an agent killed at any point finds
//!   every mount and node it made. After a restart, records of volumes QEMU does not hold are
//!   undone (stale targets).
//! - When QEMU exits, its mount namespace and every bind mount in it go with it, whether or not
//!   the agent is alive; the storage can be unmounted at once (the seed bug cannot happen).
//!
//! # Effects
//! Every privileged effect is a [`Request`] carried out by a [`Privileged`] implementation:
//! [`Host`] on the machine (helper process, cgroup files), [`Recorder`] in unit tests (a fake
//! that records the requests; no root needed).
//!
//! # Files
//! - [`targets`]: one VM's targets and their records ([`Vm`]);
//! - [`request`]: the effects as values, the trait, the recording fake;
//! - [`host`]: the real effects; [`helper`]: the helper process's side; [`cgroup`]: the devices
//!   cgroup (v1 files, or v2's program from [`crate::devprog`]).
//!
//! On cgroup v2 the same policy is a generated eBPF device program ([`crate::devprog`]),
//! replaced as a whole on every change; the hierarchy's version is found from the cgroup path.

pub mod cgroup;
pub mod helper;
pub mod host;
pub mod request;
pub mod targets;

use std::io;
use std::path::{Path, PathBuf};

pub use crate::devprog::DeviceNumber;
pub use cgroup::remove_cgroup;
pub use helper::{helper_main, HELPER_SUBCOMMAND};
pub use host::Host;
pub use request::{FailWhen, Privileged, Recorder, Request};
pub use targets::{BindError, MountRecord, Vm};

/// How volumes reach QEMU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachMode {
    /// The agent opens the volume and passes the fd (`add-fd`): nothing is mounted (default).
    #[default]
    Fd,
    /// KubeVirt's way: bind mounts and device nodes inside QEMU's mount namespace.
    BindMount,
}

/// The cgroup v1 devices hierarchy under which each VM gets its cgroup.
pub const DEVICES_CGROUP: &str = "/sys/fs/cgroup/devices/virtplug";
/// The same on a cgroup v2 (unified) host.
pub const UNIFIED_CGROUP: &str = "/sys/fs/cgroup/virtplug";

/// Where VMs' devices cgroups go on this host: under the v1 devices controller when it is
/// mounted, else in the v2 hierarchy at `/sys/fs/cgroup`; `None` when neither exists.
#[must_use]
pub fn default_cgroup_root() -> Option<PathBuf> {
    let v1 = Path::new(DEVICES_CGROUP);
    if v1.parent().is_some_and(|p| p.join("devices.allow").exists()) {
        return Some(v1.to_owned());
    }
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists().then(|| PathBuf::from(UNIFIED_CGROUP))
}

/// Bind-mount mode's one host-wide step, at agent start: a storage root that is a filesystem
/// of its own becomes a shared mount. Each VM's namespace is a copy of the host's mounts; on a
/// host whose mounts are private (containers often are), that copy would keep the storage
/// filesystem alive after the host unmounts it — KubeVirt's leak by another road. As a shared
/// mount, the VMs' copies are its downstream peers and the host's unmount reaches them.
///
/// # Errors
/// When `/proc/self/mountinfo` cannot be read or the change is refused.
pub fn share_storage_root(host: &dyn Privileged, storage_root: &Path) -> io::Result<bool> {
    let root = storage_root.canonicalize()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mounts = crate::mountinfo::parse(&text).map_err(|e| io::Error::other(e.to_string()))?;
    let Some(m) = mounts.iter().rev().find(|m| m.mount_point == root) else { return Ok(false) };
    if m.optional.iter().any(|o| o.starts_with("shared:")) {
        return Ok(true);
    }
    host.apply(&Request::ShareMount { path: root }, None)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storage_root_that_is_no_mount_point_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::default();
        assert!(!share_storage_root(&rec, dir.path()).unwrap());
        assert!(rec.take().is_empty());
        // "/" is a mount point: it is made shared unless it already is.
        let mounts = crate::mountinfo::parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap()).unwrap();
        let root = mounts.iter().rev().find(|m| m.mount_point == Path::new("/")).unwrap();
        let shared = root.optional.iter().any(|o| o.starts_with("shared:"));
        assert!(share_storage_root(&rec, Path::new("/")).unwrap());
        assert_eq!(rec.take(), if shared { vec![] } else { vec![Request::ShareMount { path: "/".into() }] });
    }
}
