//! A volume's source on this node, opened safely for handoff to QEMU.
//!
//! # Guarantees
//! - A claim's data is looked up from the claim's UID under the node's storage root — never
//!   from a name or an annotation — and names from the API are checked to be DNS-1123 before
//!   anything else ([`check_name`]): a `..` never reaches a path.
//! - `disk.img` is opened with `openat2` relative to the claim's directory with
//!   `RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: a symlink (even one that
//!   points inside) is refused, so nothing outside the volume can be opened through it.
//! - A Block claim's device is opened only if sysfs says its backing file is the claim's
//!   `block.img`, and `fstat` says it is a block device.
//! - Every fd is `O_CLOEXEC`, read-only when the disk is (QEMU's open mode must match).
//!
//! In cluster mode a volume lives in a pod — a hot-plugged claim in its attachment pod
//! ([`attachment_pod_pid`]), a boot claim in the VMI's launcher pod (the launcher's PID from its
//! socket) — and is opened through the pod process's root ([`open_in_pod`]) with the same
//! resolve rules.
//!
//! The device permission check is the `open` itself (the agent's own credentials): no `mknod`,
//! no device-cgroup rule.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Why a source cannot be opened (yet).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Not ready yet: retried (claim not bound, backing not there).
    #[error("{0}")]
    NotReady(String),
    /// Refused for safety or validity: reported, retried only after a change.
    #[error("{0}")]
    Refused(String),
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
}

/// Checks that `name` (a volume, claim or DataVolume name from the API) is a DNS-1123 label or
/// subdomain, so it cannot carry `/` or `..`.
///
/// # Errors
/// `Refused`, naming the field and the value.
pub fn check_name(field: &str, name: &str) -> Result<(), SourceError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(SourceError::Refused(format!(
            "{field} {name:?} is not a DNS-1123 name; refusing to use it (it could name a path outside the volume)"
        )))
    }
}

/// Checks that `uid` (an object's UID from the API) is a UUID, so it can be a path component.
///
/// # Errors
/// `Refused`, naming the field and the value.
pub fn check_uid(field: &str, uid: &str) -> Result<(), SourceError> {
    if uid.is_empty() || !uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(SourceError::Refused(format!("{field} {uid:?} is not a UUID")));
    }
    Ok(())
}

/// An opened source.
#[derive(Debug)]
pub struct Opened {
    pub fd: OwnedFd,
    /// What was opened (for messages).
    pub path: PathBuf,
    pub block: bool,
}

/// Opens `disk.img` inside `claim_dir` without following any symlink.
///
/// # Errors
/// `NotReady` when it does not exist yet; `Refused` for a symlink or a non-regular file.
pub fn open_image(claim_dir: &Path, readonly: bool) -> Result<Opened, SourceError> {
    let path = claim_dir.join("disk.img");
    let dir = match rustix::fs::open(claim_dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(d) => d,
        Err(rustix::io::Errno::NOENT) => return Err(SourceError::NotReady(format!("{} does not exist yet", claim_dir.display()))),
        Err(e) => return Err(SourceError::Open { path: claim_dir.to_owned(), source: e.into() }),
    };
    let access = if readonly { OFlags::RDONLY } else { OFlags::RDWR };
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let fd = match rustix::fs::openat2(&dir, "disk.img", access | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty(), resolve) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Err(SourceError::NotReady(format!("{} does not exist yet", path.display()))),
        Err(rustix::io::Errno::LOOP) => {
            return Err(SourceError::Refused(format!(
                "{} is a symlink; refusing to follow it (it could point outside the volume)",
                path.display()
            )));
        }
        Err(e) => return Err(SourceError::Open { path, source: e.into() }),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| SourceError::Open { path: path.clone(), source: e.into() })?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(SourceError::Refused(format!("{} is not a regular file; refusing it", path.display())));
    }
    Ok(Opened { fd, path, block: false })
}

/// Opens the loop device whose backing file is `backing`.
///
/// # Errors
/// `NotReady` while no device is attached; `Refused` if the node is not a block device.
pub fn open_block(device: Option<PathBuf>, backing: &Path, readonly: bool) -> Result<Opened, SourceError> {
    let Some(dev) = device else {
        return Err(SourceError::NotReady(format!("no loop device is attached to {} yet", backing.display())));
    };
    let access = if readonly { OFlags::RDONLY } else { OFlags::RDWR };
    let fd = rustix::fs::open(&dev, access | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty())
        .map_err(|e| SourceError::Open { path: dev.clone(), source: e.into() })?;
    let st = rustix::fs::fstat(&fd).map_err(|e| SourceError::Open { path: dev.clone(), source: e.into() })?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::BlockDevice {
        return Err(SourceError::Refused(format!("{} is not a block device; refusing it", dev.display())));
    }
    Ok(Opened { fd, path: dev, block: true })
}

/// Cluster mode: the PID of the process of attachment pod `pod_uid` (KubeVirt's `hp-volume-*`
/// pod) on this node — the peer (`SO_PEERCRED`) of the socket its process listens on,
/// `PODS_DIR/<uid>/volumes/kubernetes.io~empty-dir/hotplug-disks/hp.sock`, as KubeVirt's
/// virt-handler finds it. The socket is reached through the directory's fd, so a long pods dir
/// cannot exceed the 108-byte socket path limit.
///
/// # Errors
/// `Refused` for a UID that is not a UUID; `NotReady` while the pod's socket is not there.
pub fn attachment_pod_pid(pods_dir: &Path, pod_uid: &str) -> Result<i32, SourceError> {
    check_uid("attachment pod UID", pod_uid)?;
    let dir = pods_dir.join(pod_uid).join("volumes/kubernetes.io~empty-dir/hotplug-disks");
    let not_ready = |why: String| SourceError::NotReady(format!("attachment pod {pod_uid} is not ready on this node ({why})"));
    let dfd = rustix::fs::open(&dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| not_ready(format!("{}: {e}", dir.display())))?;
    let via_fd = format!("/proc/self/fd/{}/hp.sock", std::os::fd::AsRawFd::as_raw_fd(&dfd));
    let stream = std::os::unix::net::UnixStream::connect(&via_fd).map_err(|e| not_ready(format!("{}/hp.sock: {e}", dir.display())))?;
    let cred = rustix::net::sockopt::socket_peercred(&stream).map_err(|e| not_ready(format!("SO_PEERCRED: {e}")))?;
    Ok(cred.pid.as_raw_nonzero().get())
}

/// Cluster mode: opens `path` as seen by process `pid` — inside its root and mount namespace,
/// through `/proc/PID/root` — resolving it as if that root were `/` and following no symlink, so
/// neither `..` nor a link can leave the pod. `block` says whether a block device or a regular
/// file is expected.
///
/// # Errors
/// `NotReady` while the path does not exist; `Refused` for a symlink or the wrong file type.
pub fn open_in_pod(pid: i32, path: &Path, readonly: bool, block: bool) -> Result<Opened, SourceError> {
    let root_path = PathBuf::from(format!("/proc/{pid}/root"));
    let shown = PathBuf::from(format!("/proc/{pid}/root{}", path.display()));
    let root = rustix::fs::open(&root_path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| SourceError::NotReady(format!("pod process {pid} is gone: {e}")))?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let access = if readonly { OFlags::RDONLY } else { OFlags::RDWR };
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let fd = match rustix::fs::openat2(&root, rel, access | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty(), resolve) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Err(SourceError::NotReady(format!("{} does not exist yet", shown.display()))),
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::XDEV) => {
            return Err(SourceError::Refused(format!(
                "{} is or passes through a symlink; refusing to follow it (it could point outside the pod)",
                shown.display()
            )));
        }
        Err(e) => return Err(SourceError::Open { path: shown, source: e.into() }),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| SourceError::Open { path: shown.clone(), source: e.into() })?;
    let want = if block { rustix::fs::FileType::BlockDevice } else { rustix::fs::FileType::RegularFile };
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != want {
        return Err(SourceError::Refused(format!(
            "{} is not a {}; refusing it",
            shown.display(),
            if block { "block device" } else { "regular file" }
        )));
    }
    Ok(Opened { fd, path: shown, block })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_dots_slashes_or_capitals_are_refused() {
        for bad in ["..", "../etc", "a/b", "", "A", "-a", "a..b"] {
            assert!(matches!(check_name("volume name", bad), Err(SourceError::Refused(m)) if m.contains("volume name")), "{bad:?}");
        }
        for good in ["data", "disk-1", "a.b"] {
            assert!(check_name("volume name", good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn an_image_opens_with_the_disks_access_mode() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("disk.img"), b"data").unwrap();
        let rw = open_image(dir.path(), false).unwrap();
        let flags = rustix::fs::fcntl_getfl(&rw.fd).unwrap();
        assert!(flags.contains(OFlags::RDWR));
        let ro = open_image(dir.path(), true).unwrap();
        assert!(!rustix::fs::fcntl_getfl(&ro.fd).unwrap().contains(OFlags::RDWR));
        assert!(rustix::io::fcntl_getfd(&ro.fd).unwrap().contains(rustix::io::FdFlags::CLOEXEC));
    }

    /// The path-safety case of the issue: `disk.img` is a symlink to a file outside the volume.
    #[test]
    fn a_symlinked_image_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("disk.img")).unwrap();
        match open_image(dir.path(), true) {
            Err(SourceError::Refused(m)) => assert!(m.contains("symlink"), "{m}"),
            other => panic!("a symlink must be refused, got {other:?}"),
        }
    }

    #[test]
    fn cluster_mode_paths_resolve_inside_the_process_root_without_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("disk.img"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("link.img")).unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        let ok = open_in_pod(me, &dir.path().join("disk.img"), true, false).unwrap();
        assert!(ok.path.starts_with(format!("/proc/{me}/root/")), "{:?}", ok.path);
        assert!(
            matches!(open_in_pod(me, &dir.path().join("link.img"), true, false), Err(SourceError::Refused(m)) if m.contains("symlink"))
        );
        assert!(matches!(open_in_pod(me, &dir.path().join("nope.img"), true, false), Err(SourceError::NotReady(_))));
        assert!(
            matches!(open_in_pod(me, &dir.path().join("disk.img"), true, true), Err(SourceError::Refused(m)) if m.contains("block device"))
        );
        assert!(matches!(attachment_pod_pid(dir.path(), "../x"), Err(SourceError::Refused(_))));
        assert!(matches!(attachment_pod_pid(dir.path(), "0a1b-2c"), Err(SourceError::NotReady(m)) if m.contains("not ready")));
    }

    #[test]
    fn a_missing_image_is_not_ready_and_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(open_image(&dir.path().join("nope"), true), Err(SourceError::NotReady(_))));
        assert!(matches!(open_image(dir.path(), true), Err(SourceError::NotReady(_))));
        std::fs::create_dir(dir.path().join("disk.img")).unwrap();
        assert!(matches!(open_image(dir.path(), true), Err(SourceError::Refused(_)) | Err(SourceError::Open { .. })));
    }
}
