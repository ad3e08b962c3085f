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
//! On cgroup v2 the same policy is a generated eBPF device program ([`crate::devprog`]),
//! replaced as a whole on every change; the hierarchy's version is found from the cgroup path.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::devprog::BlockRule;
use crate::source::Opened;

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

/// The helper subcommand of the `virtplug` binary (hidden): `virtplug mount-helper REQUEST`.
pub const HELPER_SUBCOMMAND: &str = "mount-helper";

/// A device number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNumber {
    pub major: u32,
    pub minor: u32,
}

impl DeviceNumber {
    fn of(fd: BorrowedFd<'_>) -> io::Result<DeviceNumber> {
        let st = rustix::fs::fstat(fd)?;
        Ok(DeviceNumber { major: rustix::fs::major(st.st_rdev), minor: rustix::fs::minor(st.st_rdev) })
    }
}

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
            _ => cgroup_effect(req),
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

fn write_file(path: &Path, text: &str) -> io::Result<()> {
    std::fs::write(path, text).map_err(|e| io::Error::new(e.kind(), format!("cannot write {text:?} to {}: {e}", path.display())))
}

/// The cgroup version of the hierarchy `cgroup` is (to be) in: the nearest existing ancestor
/// holding `devices.allow` is cgroup v1's devices controller, one holding `cgroup.controllers`
/// is cgroup v2.
fn version(cgroup: &Path) -> Option<u8> {
    cgroup.ancestors().skip(1).find_map(|a| {
        if a.join("devices.allow").exists() {
            Some(1)
        } else if a.join("cgroup.controllers").exists() {
            Some(2)
        } else {
            None
        }
    })
}

fn cgroup_effect(req: &Request) -> io::Result<()> {
    let (Request::JoinCgroup { cgroup, .. } | Request::AllowDevice { cgroup, .. } | Request::DenyDevice { cgroup, .. }) = req else {
        return Err(io::Error::other("not a cgroup request"));
    };
    let Some(v) = version(cgroup) else {
        return Err(io::Error::other(format!(
            "{} is in neither a cgroup v1 devices hierarchy nor a cgroup v2 one: bind-mount mode needs one for block volumes; \
             use the default fd mode",
            cgroup.display()
        )));
    };
    match (req, v) {
        (Request::JoinCgroup { pid, .. }, 1) => {
            std::fs::create_dir_all(cgroup).map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", cgroup.display())))?;
            write_file(&cgroup.join("devices.deny"), "a")?;
            write_file(&cgroup.join("devices.allow"), "c *:* rwm")?;
            write_file(&cgroup.join("cgroup.procs"), &pid.to_string())
        }
        (Request::JoinCgroup { pid, .. }, _) => {
            std::fs::create_dir_all(cgroup).map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", cgroup.display())))?;
            crate::devprog::set(cgroup, &[])?;
            write_file(&cgroup.join("cgroup.procs"), &pid.to_string())
        }
        (Request::AllowDevice { device, readonly, .. }, 1) => {
            let access = if *readonly { "r" } else { "rw" };
            write_file(&cgroup.join("devices.allow"), &format!("b {}:{} {access}", device.major, device.minor))
        }
        (Request::DenyDevice { device, .. }, 1) => {
            write_file(&cgroup.join("devices.deny"), &format!("b {}:{} rwm", device.major, device.minor))
        }
        (Request::AllowDevice { allowed, .. } | Request::DenyDevice { allowed, .. }, _) => crate::devprog::set(cgroup, allowed),
        _ => Err(io::Error::other("not a cgroup request")),
    }
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

/// Removes a VM's cgroup once its processes are gone; one that does not exist is fine.
///
/// # Errors
/// When it cannot be removed (a process is still in it).
pub fn remove_cgroup(cgroup: &Path) -> io::Result<()> {
    match std::fs::remove_dir(cgroup) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io::Error::new(e.kind(), format!("cannot remove the cgroup {}: {e}", cgroup.display())))
        }
        _ => Ok(()),
    }
}

/// The helper: carries out one namespace request given as JSON, in this (single-threaded)
/// process. The `virtplug` binary calls it for `virtplug mount-helper REQUEST` before it starts
/// any thread.
///
/// # Errors
/// What failed, for the agent to report.
pub fn helper_main(request: &str) -> Result<(), String> {
    let req: Request = serde_json::from_str(request).map_err(|e| format!("bad request {request:?}: {e}"))?;
    let pid = match &req {
        Request::BindMount { pid, .. } | Request::MakeNode { pid, .. } | Request::RemoveTarget { pid, .. } => *pid,
        _ => return Err(format!("not a namespace request: {request}")),
    };
    let ns = format!("/proc/{pid}/ns/mnt");
    let nsfd = rustix::fs::open(&ns, rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| format!("cannot open {ns} (is QEMU {pid} running?): {e}"))?;
    rustix::thread::move_into_link_name_space(nsfd.as_fd(), Some(rustix::thread::LinkNameSpaceType::Mount))
        .map_err(|e| format!("cannot join the mount namespace of {pid}: {e}"))?;
    let mkdirs = |t: &Path| match t.parent() {
        Some(p) => std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display())),
        None => Ok(()),
    };
    match req {
        Request::BindMount { target, readonly, .. } => {
            mkdirs(&target)?;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&target)
                .map_err(|e| format!("cannot create the target {}: {e}", target.display()))?;
            let tree = std::io::stdin();
            rustix::mount::move_mount(tree.as_fd(), "", rustix::fs::CWD, &target, rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH)
                .map_err(|e| format!("cannot mount the volume on {}: {e}", target.display()))?;
            if readonly {
                use rustix::mount::MountFlags as M;
                rustix::mount::mount_remount(&target, M::BIND | M::RDONLY, "")
                    .map_err(|e| format!("cannot make {} read-only: {e}", target.display()))?;
            }
            Ok(())
        }
        Request::MakeNode { target, device, .. } => {
            mkdirs(&target)?;
            let _ = std::fs::remove_file(&target);
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &target,
                rustix::fs::FileType::BlockDevice,
                rustix::fs::Mode::from_raw_mode(0o600),
                rustix::fs::makedev(device.major, device.minor),
            )
            .map_err(|e| format!("cannot create the device node {}: {e}", target.display()))
        }
        Request::RemoveTarget { target, .. } => {
            // Lazily: QEMU may still hold the file open (it closes it on blockdev-del).
            // Stacked mounts (an attach retried by hand) are unmounted one by one, up to a bound.
            for _ in 0..64 {
                match rustix::mount::unmount(&target, rustix::mount::UnmountFlags::DETACH) {
                    Ok(()) => {}
                    Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => break,
                    Err(e) => return Err(format!("cannot unmount {}: {e}", target.display())),
                }
            }
            match std::fs::remove_file(&target) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(format!("cannot remove {}: {e}", target.display())),
                _ => Ok(()),
            }
        }
        other => Err(format!("not a namespace request: {other:?}")),
    }
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

/// A record of a target the agent made (or was about to make) inside a VM's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountRecord {
    pub volume: String,
    pub target: PathBuf,
    /// For a block volume: the device node's number (allowed in the cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceNumber>,
    /// Whether the device is allowed read-only.
    #[serde(default)]
    pub readonly: bool,
}

/// The block-device allowlist the records make.
fn allowlist(records: &[MountRecord]) -> Vec<BlockRule> {
    records.iter().filter_map(|r| r.device.map(|device| BlockRule { device, readonly: r.readonly })).collect()
}

/// Errors of bind-mount mode, naming the volume.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("volume {volume}: {source}")]
    Effect {
        volume: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Record(#[from] crate::checkpoint::CheckpointError),
    #[error("cannot read the mount records {path}: {why}")]
    ReadRecords { path: PathBuf, why: String },
}

/// One VM in bind-mount mode: where its targets go and how to reach its namespace and cgroup.
#[derive(Clone)]
pub struct Vm {
    pub host: Arc<dyn Privileged>,
    /// QEMU's PID (its mount namespace).
    pub pid: i32,
    pub run_dir: PathBuf,
    pub cgroup: PathBuf,
}

const RECORDS: &str = "mounts.json";

impl Vm {
    /// The target of `volume` (a checked DNS-1123 name).
    #[must_use]
    pub fn target(&self, volume: &str) -> PathBuf {
        self.run_dir.join("hotplug").join(volume)
    }

    /// The recorded targets.
    ///
    /// # Errors
    /// When the file exists but cannot be read or parsed.
    pub fn records(&self) -> Result<Vec<MountRecord>, BindError> {
        let path = self.run_dir.join(RECORDS);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| BindError::ReadRecords { path, why: e.to_string() }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(BindError::ReadRecords { path, why: e.to_string() }),
        }
    }

    fn save(&self, records: &[MountRecord]) -> Result<(), BindError> {
        let bytes = serde_json::to_vec_pretty(records)
            .map_err(|e| BindError::ReadRecords { path: self.run_dir.join(RECORDS), why: e.to_string() })?;
        crate::checkpoint::write_atomic(&self.run_dir.join(RECORDS), &bytes)?;
        Ok(())
    }

    fn effect(&self, volume: &str, req: &Request, source: Option<BorrowedFd<'_>>) -> Result<(), BindError> {
        self.host.apply(req, source).map_err(|source| BindError::Effect { volume: volume.to_owned(), source })
    }

    /// Makes `volume`'s opened source reachable at its target inside QEMU's namespace and
    /// returns the target (the path QEMU opens). A target left by an interrupted earlier
    /// attempt is undone first.
    ///
    /// # Errors
    /// The failed effect or record write; what was recorded stays recorded, so [`Vm::release`]
    /// or the next attempt undoes it.
    pub fn expose(&self, volume: &str, source: &Opened, readonly: bool) -> Result<PathBuf, BindError> {
        let mut records = self.records()?;
        if let Some(i) = records.iter().position(|r| r.volume == volume) {
            let old = records.remove(i);
            self.undo(&old, &records)?;
            self.save(&records)?;
        }
        let target = self.target(volume);
        let device = if source.block {
            Some(DeviceNumber::of(source.fd.as_fd()).map_err(|e| BindError::Effect { volume: volume.to_owned(), source: e })?)
        } else {
            None
        };
        // Recorded before it is made: a crash in between leaves a record, never an unknown mount.
        records.push(MountRecord { volume: volume.to_owned(), target: target.clone(), device, readonly });
        self.save(&records)?;
        match device {
            Some(device) => {
                let allowed = allowlist(&records);
                self.effect(volume, &Request::AllowDevice { cgroup: self.cgroup.clone(), device, readonly, allowed }, None)?;
                self.effect(volume, &Request::MakeNode { pid: self.pid, target: target.clone(), device }, None)?;
            }
            None => {
                self.effect(volume, &Request::BindMount { pid: self.pid, target: target.clone(), readonly }, Some(source.fd.as_fd()))?;
            }
        }
        Ok(target)
    }

    /// Undoes `r`'s target; `rest` are the records that stay (their devices stay allowed).
    fn undo(&self, r: &MountRecord, rest: &[MountRecord]) -> Result<(), BindError> {
        self.effect(&r.volume, &Request::RemoveTarget { pid: self.pid, target: r.target.clone() }, None)?;
        if let Some(device) = r.device {
            let allowed = allowlist(rest);
            self.effect(&r.volume, &Request::DenyDevice { cgroup: self.cgroup.clone(), device, allowed }, None)?;
        }
        Ok(())
    }

    /// Undoes `volume`'s target (after QEMU let go of it); its record goes last.
    ///
    /// # Errors
    /// The failed effect or record write (the record stays for the next try).
    pub fn release(&self, volume: &str) -> Result<(), BindError> {
        let mut records = self.records()?;
        let Some(i) = records.iter().position(|r| r.volume == volume) else { return Ok(()) };
        let r = records.remove(i);
        self.undo(&r, &records)?;
        self.save(&records)
    }

    /// Undoes every recorded target whose volume is not in `keep` (what QEMU holds): targets
    /// left by an agent that died mid-attach or mid-detach. Returns the volumes released.
    ///
    /// # Errors
    /// The first failure (the rest are tried again on the next pass).
    pub fn release_all_except(&self, keep: &[&str]) -> Result<Vec<String>, BindError> {
        let stale: Vec<String> = self.records()?.into_iter().filter(|r| !keep.contains(&r.volume.as_str())).map(|r| r.volume).collect();
        for v in &stale {
            self.release(v)?;
        }
        Ok(stale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(dir: &Path, rec: &Arc<Recorder>) -> Vm {
        Vm { host: Arc::clone(rec) as Arc<dyn Privileged>, pid: 4242, run_dir: dir.to_owned(), cgroup: PathBuf::from("/cg/vm1") }
    }

    /// A run dir, the recording fake, and a VM over both.
    fn setup() -> (tempfile::TempDir, Arc<Recorder>, Vm) {
        let dir = tempfile::tempdir().unwrap();
        let rec = Arc::new(Recorder::default());
        let v = vm(dir.path(), &rec);
        (dir, rec, v)
    }

    fn image(dir: &Path) -> Opened {
        std::fs::create_dir_all(dir.join("claim")).unwrap();
        std::fs::write(dir.join("claim/disk.img"), b"x").unwrap();
        crate::source::open_image(&dir.join("claim"), true).unwrap()
    }

    /// A block "source": any character device stands in for the loop device in the fake (the
    /// number is what matters); /dev/null is 1:3.
    fn block() -> Opened {
        let fd =
            rustix::fs::open("/dev/null", rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty()).unwrap();
        Opened { fd, path: "/dev/null".into(), block: true }
    }

    #[test]
    fn a_filesystem_volume_is_recorded_then_bind_mounted_read_only_into_the_vms_namespace() {
        let (dir, rec, v) = setup();
        let target = v.expose("data", &image(dir.path()), true).unwrap();
        assert_eq!(target, dir.path().join("hotplug/data"));
        assert_eq!(rec.take(), vec![Request::BindMount { pid: 4242, target: target.clone(), readonly: true }]);
        assert_eq!(v.records().unwrap(), vec![MountRecord { volume: "data".into(), target, device: None, readonly: true }]);
    }

    #[test]
    fn a_block_volume_is_allowed_in_the_cgroup_before_its_node_is_made_and_withdrawn_after_removal() {
        let (_dir, rec, v) = setup();
        let target = v.expose("blk", &block(), false).unwrap();
        let device = DeviceNumber { major: 1, minor: 3 };
        let cgroup = PathBuf::from("/cg/vm1");
        assert_eq!(
            rec.take(),
            vec![
                Request::AllowDevice {
                    cgroup: cgroup.clone(),
                    device,
                    readonly: false,
                    allowed: vec![BlockRule { device, readonly: false }]
                },
                Request::MakeNode { pid: 4242, target: target.clone(), device },
            ]
        );
        v.release("blk").unwrap();
        assert_eq!(rec.take(), vec![Request::RemoveTarget { pid: 4242, target }, Request::DenyDevice { cgroup, device, allowed: vec![] }]);
        assert!(v.records().unwrap().is_empty());
        // Releasing again does nothing.
        v.release("blk").unwrap();
        assert!(rec.take().is_empty());
    }

    /// The record is written before the mount: a crash (here, a failing mount) leaves a record
    /// that the next pass undoes.
    #[test]
    fn a_failed_mount_leaves_a_record_that_release_all_except_undoes() {
        let (dir, rec, v) = setup();
        *rec.fail_on.lock().unwrap() = Some(|r| matches!(r, Request::BindMount { .. }));
        let err = v.expose("data", &image(dir.path()), false).unwrap_err();
        assert!(err.to_string().contains("volume data"), "{err}");
        assert_eq!(v.records().unwrap().len(), 1, "recorded before the mount was tried");
        *rec.fail_on.lock().unwrap() = None;
        rec.take();
        assert_eq!(v.release_all_except(&[]).unwrap(), vec!["data".to_owned()]);
        assert_eq!(rec.take(), vec![Request::RemoveTarget { pid: 4242, target: dir.path().join("hotplug/data") }]);
        assert!(v.records().unwrap().is_empty());
    }

    #[test]
    fn stale_records_are_undone_on_restart_and_held_volumes_are_kept() {
        let (dir, rec, v) = setup();
        v.expose("kept", &image(dir.path()), false).unwrap();
        v.expose("stale", &block(), false).unwrap();
        rec.take();
        // A new agent (a new Vm over the same run dir) finds both records; QEMU holds "kept".
        let again = vm(dir.path(), &rec);
        assert_eq!(again.release_all_except(&["kept"]).unwrap(), vec!["stale".to_owned()]);
        let device = DeviceNumber { major: 1, minor: 3 };
        assert_eq!(
            rec.take(),
            vec![
                Request::RemoveTarget { pid: 4242, target: dir.path().join("hotplug/stale") },
                Request::DenyDevice { cgroup: "/cg/vm1".into(), device, allowed: vec![] },
            ]
        );
        assert_eq!(again.records().unwrap().iter().map(|r| r.volume.as_str()).collect::<Vec<_>>(), ["kept"]);
    }

    #[test]
    fn a_second_expose_of_the_same_volume_first_undoes_the_old_target() {
        let (dir, rec, v) = setup();
        let t = v.expose("data", &image(dir.path()), false).unwrap();
        rec.take();
        v.expose("data", &image(dir.path()), false).unwrap();
        assert_eq!(
            rec.take(),
            vec![Request::RemoveTarget { pid: 4242, target: t.clone() }, Request::BindMount { pid: 4242, target: t, readonly: false }]
        );
        assert_eq!(v.records().unwrap().len(), 1);
    }

    #[test]
    fn a_failed_removal_keeps_the_record_for_the_next_try() {
        let (dir, rec, v) = setup();
        v.expose("data", &image(dir.path()), false).unwrap();
        *rec.fail_on.lock().unwrap() = Some(|r| matches!(r, Request::RemoveTarget { .. }));
        assert!(v.release("data").is_err());
        assert_eq!(v.records().unwrap().len(), 1);
    }

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

    #[test]
    fn requests_round_trip_through_the_helpers_json() {
        let r = Request::MakeNode { pid: 7, target: "/run/x/hotplug/b".into(), device: DeviceNumber { major: 7, minor: 2 } };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""op":"makeNode""#), "{json}");
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), r);
        assert!(helper_main("{\"op\":\"joinCgroup\",\"cgroup\":\"/x\",\"pid\":1}").unwrap_err().contains("not a namespace request"));
        assert!(helper_main("nonsense").unwrap_err().contains("bad request"));
    }

    #[test]
    fn the_cgroup_rules_are_what_v1_expects() {
        // Real files in a temp dir laid out like a devices hierarchy (no root needed).
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("devices.allow"), "").unwrap();
        let cg = dir.path().join("virtplug").join("vm1");
        std::fs::create_dir_all(&cg).unwrap();
        let device = DeviceNumber { major: 7, minor: 4 };
        cgroup_effect(&Request::AllowDevice { cgroup: cg.clone(), device, readonly: true, allowed: vec![] }).unwrap();
        assert_eq!(std::fs::read_to_string(cg.join("devices.allow")).unwrap(), "b 7:4 r");
        cgroup_effect(&Request::DenyDevice { cgroup: cg.clone(), device, allowed: vec![] }).unwrap();
        assert_eq!(std::fs::read_to_string(cg.join("devices.deny")).unwrap(), "b 7:4 rwm");
        let missing = cgroup_effect(&Request::JoinCgroup { cgroup: PathBuf::from("/nonexistent/virtplug/vm1"), pid: 1 }).unwrap_err();
        assert!(missing.to_string().contains("neither a cgroup v1 devices hierarchy nor a cgroup v2"), "{missing}");
    }
}
