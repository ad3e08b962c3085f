//! One VM's targets in bind-mount mode ([`Vm`]): made in QEMU's namespace from the opened
//! volume, recorded (atomically, before they are made) in `RUN_DIR/mounts.json`, and undone —
//! after an unplug, or when a restarted agent finds records of volumes QEMU does not hold.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::request::{Privileged, Request};
use crate::devprog::{BlockRule, DeviceNumber};
use crate::source::Opened;

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
    use std::path::Path;

    use super::*;
    use crate::bindmount::Recorder;

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
}
