//! Hot-plug operations on a running VM, each a small idempotent state machine:
//!
//! - attach: fd → `add-fd` → `blockdev-add` (on `/dev/fdset/N`) → `remove-fd` ([`Machine::stage`])
//!   → `device_add` (`scsi-hd` or `scsi-block` on the hot-plug bus, with `serial`; [`Machine::plug`]). A step already done (node or
//!   device present) is skipped, so an attach interrupted by a crash resumes.
//! - detach: `device_del` → `DEVICE_DELETED` (deadline) → `blockdev-del`. The fdset was removed
//!   right after `blockdev-add`, so QEMU closes the image when the node goes.
//! - CD-ROM media: a read-only node, then open tray → remove old medium → insert → close tray;
//!   eject: open tray → remove medium → `blockdev-del` → close tray.
//!
//! QEMU is the truth: [`Machine::attached`] rebuilds the view from `qom-list` and `query-block`.
//! Names: a volume `v` is device `vp-v` and node `n-v` (hashed when QEMU's 31-byte node-name
//! limit would be exceeded).

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cmdline::HOTPLUG_BUS;
use crate::qmp::{Qmp, QmpError};

/// How long `device_del` may take to be confirmed by `DEVICE_DELETED` (QEMU needs ~51 ms).
pub const UNPLUG_DEADLINE: Duration = Duration::from_secs(10);

/// What kind of SCSI device a volume becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// `scsi-hd`: an emulated disk over any file or block device.
    Disk,
    /// `scsi-block`: SCSI passthrough; needs a block device that speaks SG_IO.
    Lun,
}

/// Where a volume's bytes come from.
#[derive(Debug)]
pub enum Source {
    /// An open file or block device, handed to QEMU (the default).
    Fd(OwnedFd),
    /// A path QEMU opens itself (bind-mount mode).
    Path(PathBuf),
}

/// An attach request.
#[derive(Debug)]
pub struct Attach {
    /// The volume name (KubeVirt's), from which the device and node names derive.
    pub volume: String,
    pub serial: String,
    pub kind: DeviceKind,
    pub readonly: bool,
    pub source: Source,
}

/// A volume whose block node is in QEMU, waiting for its device ([`Machine::plug`]).
#[derive(Debug)]
pub struct Staged {
    pub volume: String,
    serial: String,
    kind: DeviceKind,
    /// The node was added by this stage (a failed plug removes it).
    added: bool,
    /// The device was already there: nothing to plug.
    present: bool,
}

/// Errors of the operations.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{op} of volume {volume} failed at {step}")]
    Qmp {
        op: &'static str,
        volume: String,
        step: &'static str,
        #[source]
        source: QmpError,
    },
    #[error("volume {volume}: the fd is open {have} but the disk is {want}; open it {want}")]
    FdMode { volume: String, have: &'static str, want: &'static str },
    #[error("volume {volume}: cannot inspect its fd")]
    Fd {
        volume: String,
        #[source]
        source: std::io::Error,
    },
    #[error("volume {volume}: a LUN needs a block device (got a regular file); attach it as a disk")]
    LunNeedsBlock { volume: String },
    #[error("CD-ROM drive {drive} does not exist; declare it in the VM spec (cdrom, bus sata)")]
    NoSuchDrive { drive: String },
}

impl OpError {
    /// The QMP error underneath, if any.
    #[must_use]
    pub fn qmp(&self) -> Option<&QmpError> {
        match self {
            OpError::Qmp { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The device id of a volume.
#[must_use]
pub fn device_id(volume: &str) -> String {
    format!("vp-{volume}")
}

/// The block node name of a volume (at most 31 bytes, starting with a letter).
#[must_use]
pub fn node_name(volume: &str) -> String {
    let plain = format!("n-{volume}");
    if plain.len() <= 31 {
        return plain;
    }
    // FNV-1a: stable across runs and versions, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in volume.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("n-{h:016x}")
}

/// A hot-plugged device as QEMU reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    /// Volume name (device id without `vp-`).
    pub volume: String,
    pub device_type: String,
    pub node: Option<String>,
    pub readonly: bool,
}

/// A CD-ROM drive and its medium, as QEMU reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drive {
    pub id: String,
    pub medium_node: Option<String>,
    pub tray_open: bool,
}

/// Operations over one VM's QMP connection.
pub struct Machine {
    pub qmp: Qmp,
}

fn step(op: &'static str, volume: &str, step: &'static str) -> impl FnOnce(QmpError) -> OpError {
    let volume = volume.to_owned();
    move |source| OpError::Qmp { op, volume, step, source }
}

impl Machine {
    /// Wraps a connected client.
    #[must_use]
    pub fn new(qmp: Qmp) -> Machine {
        Machine { qmp }
    }

    async fn peripherals(&self) -> Result<Vec<(String, String)>, QmpError> {
        let list = self.qmp.execute("qom-list", json!({"path": "/machine/peripheral"})).await?;
        Ok(list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let name = p.get("name")?.as_str()?.to_owned();
                let ty = p.get("type")?.as_str()?;
                let ty = ty.strip_prefix("child<")?.strip_suffix('>')?.to_owned();
                Some((name, ty))
            })
            .collect())
    }

    async fn nodes(&self) -> Result<Vec<Value>, QmpError> {
        let v = self.qmp.execute("query-named-block-nodes", json!({"flat": true})).await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    async fn node_exists(&self, node: &str) -> Result<bool, QmpError> {
        Ok(self.nodes().await?.iter().any(|n| n.get("node-name").and_then(Value::as_str) == Some(node)))
    }

    async fn device_exists(&self, id: &str) -> Result<bool, QmpError> {
        Ok(self.peripherals().await?.iter().any(|(n, _)| n == id))
    }

    /// Opens the volume's source as a read-only or read-write node (add-fd, blockdev-add,
    /// remove-fd), unless the node is already there.
    async fn add_node(&self, op: &'static str, volume: &str, node: &str, source: Source, readonly: bool) -> Result<bool, OpError> {
        if self.node_exists(node).await.map_err(step(op, volume, "query-named-block-nodes"))? {
            return Ok(false);
        }
        let (filename, block, fdset) = match &source {
            Source::Fd(fd) => {
                let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| OpError::Fd { volume: volume.to_owned(), source: e.into() })?;
                let ro_fd = !flags.contains(rustix::fs::OFlags::RDWR) && !flags.contains(rustix::fs::OFlags::WRONLY);
                if ro_fd && !readonly {
                    return Err(OpError::FdMode { volume: volume.to_owned(), have: "read-only", want: "read-write" });
                }
                if !ro_fd && readonly {
                    // QEMU opens read-only nodes with O_RDONLY and finds no fd of that mode.
                    return Err(OpError::FdMode { volume: volume.to_owned(), have: "read-write", want: "read-only" });
                }
                let st = rustix::fs::fstat(fd).map_err(|e| OpError::Fd { volume: volume.to_owned(), source: e.into() })?;
                let block = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice;
                let r = self
                    .qmp
                    .execute_with_fd("add-fd", json!({"opaque": format!("virtplug:{volume}")}), fd.as_fd())
                    .await
                    .map_err(step(op, volume, "add-fd"))?;
                let set = r.get("fdset-id").and_then(Value::as_i64).unwrap_or(-1);
                (format!("/dev/fdset/{set}"), block, Some(set))
            }
            Source::Path(p) => {
                let block = std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
                (p.display().to_string(), block, None)
            }
        };
        let driver = if block { "host_device" } else { "file" };
        let added = self
            .qmp
            .execute(
                "blockdev-add",
                json!({"node-name": node, "driver": "raw", "read-only": readonly,
                       "file": {"driver": driver, "filename": filename, "read-only": readonly}}),
            )
            .await
            .map_err(step(op, volume, "blockdev-add"));
        if let Some(set) = fdset {
            // Right after blockdev-add, success or not: QEMU keeps its own dup while the node
            // lives and drops the set when the node goes (otherwise the image stays open).
            let _ = self.qmp.execute("remove-fd", json!({"fdset-id": set})).await;
        }
        drop(source);
        added?;
        Ok(true)
    }

    /// Attaches a disk or LUN: [`Machine::stage`] then [`Machine::plug`]. Idempotent: an
    /// attached device is left as it is.
    ///
    /// # Errors
    /// `FdMode` when the fd's access mode does not match `readonly`; `LunNeedsBlock`; `Qmp` naming
    /// the failed step (a failed `device_add` removes the node it just added).
    pub async fn attach(&self, a: Attach) -> Result<(), OpError> {
        let staged = self.stage(a).await?;
        self.plug(staged).await
    }

    /// The first half of an attach: the volume's source becomes a block node in QEMU (add-fd,
    /// blockdev-add, remove-fd) — KubeVirt's `MountedToPod`. Skipped for a device already
    /// attached (the returned [`Staged`] then plugs nothing).
    ///
    /// # Errors
    /// As [`Machine::attach`].
    pub async fn stage(&self, a: Attach) -> Result<Staged, OpError> {
        let id = device_id(&a.volume);
        let node = node_name(&a.volume);
        let done = Staged { volume: a.volume.clone(), serial: a.serial.clone(), kind: a.kind, added: false, present: true };
        if self.device_exists(&id).await.map_err(step("attach", &a.volume, "qom-list"))? {
            return Ok(done);
        }
        if a.kind == DeviceKind::Lun {
            let is_block = match &a.source {
                Source::Fd(fd) => {
                    rustix::fs::fstat(fd).map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice)
                }
                Source::Path(p) => Ok(std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))),
            }
            .map_err(|e| OpError::Fd { volume: a.volume.clone(), source: e.into() })?;
            if !is_block {
                return Err(OpError::LunNeedsBlock { volume: a.volume });
            }
        }
        let added = self.add_node("attach", &a.volume, &node, a.source, a.readonly).await?;
        Ok(Staged { added, present: false, ..done })
    }

    /// The second half: `device_add` on the hot-plug bus. A failure removes the node that
    /// [`Machine::stage`] added.
    ///
    /// # Errors
    /// `Qmp` at `device_add`.
    pub async fn plug(&self, s: Staged) -> Result<(), OpError> {
        if s.present {
            return Ok(());
        }
        let (id, node) = (device_id(&s.volume), node_name(&s.volume));
        let driver = match s.kind {
            DeviceKind::Disk => "scsi-hd",
            DeviceKind::Lun => "scsi-block",
        };
        let mut dev = json!({"driver": driver, "id": id, "bus": HOTPLUG_BUS, "drive": node});
        // scsi-block passes the device's own identity through: it has no `serial` property.
        if s.kind == DeviceKind::Disk {
            dev["serial"] = json!(s.serial);
        }
        let r = self.qmp.execute("device_add", dev).await;
        if let Err(e) = r {
            if s.added {
                let _ = self.qmp.execute("blockdev-del", json!({"node-name": node})).await;
            }
            return Err(step("attach", &s.volume, "device_add")(e));
        }
        Ok(())
    }

    /// Detaches a hot-plugged volume. Idempotent: what is already gone is skipped.
    ///
    /// # Errors
    /// `Qmp` naming the step (a `Timeout` when `DEVICE_DELETED` did not come).
    pub async fn detach(&self, volume: &str) -> Result<(), OpError> {
        let (id, node) = (device_id(volume), node_name(volume));
        let mut events = self.qmp.events();
        if self.device_exists(&id).await.map_err(step("detach", volume, "qom-list"))? {
            match self.qmp.execute("device_del", json!({"id": id})).await {
                Ok(_) => {}
                Err(e) if e.class() == Some("DeviceNotFound") => {}
                Err(e) => return Err(step("detach", volume, "device_del")(e)),
            }
            let want = id.clone();
            self.qmp
                .wait_event(&mut events, "DEVICE_DELETED", UNPLUG_DEADLINE, move |e| {
                    e.name == "DEVICE_DELETED" && e.data.get("device").and_then(Value::as_str) == Some(want.as_str())
                })
                .await
                .map_err(step("detach", volume, "wait for DEVICE_DELETED"))?;
        }
        if self.node_exists(&node).await.map_err(step("detach", volume, "query-named-block-nodes"))? {
            self.qmp.execute("blockdev-del", json!({"node-name": node})).await.map_err(step("detach", volume, "blockdev-del"))?;
        }
        Ok(())
    }

    /// The CD-ROM drives and their media.
    ///
    /// # Errors
    /// The QMP error.
    pub async fn drives(&self) -> Result<Vec<Drive>, QmpError> {
        let blocks = self.qmp.execute("query-block", json!({})).await?;
        Ok(blocks
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b.get("removable") == Some(&Value::Bool(true)))
            .filter_map(|b| {
                let qdev = b.get("qdev")?.as_str()?;
                let id = qdev.rsplit('/').find(|s| !s.is_empty() && *s != "virtio-backend").unwrap_or(qdev).to_owned();
                Some(Drive {
                    id,
                    medium_node: b.pointer("/inserted/node-name").and_then(Value::as_str).map(str::to_owned),
                    tray_open: b.get("tray_open").and_then(Value::as_bool).unwrap_or(false),
                })
            })
            .collect())
    }

    /// Puts the medium of `volume` into CD-ROM `drive` (swapping out what is there).
    /// Idempotent: the same medium already in is left.
    ///
    /// # Errors
    /// `NoSuchDrive`, `FdMode` (media are read-only: open the fd read-only), `Qmp`.
    pub async fn insert_medium(&self, drive: &str, volume: &str, source: Source) -> Result<(), OpError> {
        let node = node_name(volume);
        let drives = self.drives().await.map_err(step("insert", volume, "query-block"))?;
        let Some(d) = drives.iter().find(|d| d.id == drive) else { return Err(OpError::NoSuchDrive { drive: drive.to_owned() }) };
        if d.medium_node.as_deref() == Some(node.as_str()) {
            return Ok(());
        }
        self.add_node("insert", volume, &node, source, true).await?;
        let q = |cmd: &'static str, args: Value| {
            let volume = volume.to_owned();
            async move { self.qmp.execute(cmd, args).await.map_err(step("insert", &volume, cmd)) }
        };
        q("blockdev-open-tray", json!({"id": drive, "force": true})).await?;
        if let Some(old) = &d.medium_node {
            q("blockdev-remove-medium", json!({"id": drive})).await?;
            q("blockdev-del", json!({"node-name": old})).await?;
        }
        q("blockdev-insert-medium", json!({"id": drive, "node-name": node})).await?;
        q("blockdev-close-tray", json!({"id": drive})).await?;
        Ok(())
    }

    /// Ejects the medium of CD-ROM `drive`, leaving it empty. Idempotent.
    ///
    /// # Errors
    /// `NoSuchDrive`, `Qmp`.
    pub async fn eject(&self, drive: &str) -> Result<(), OpError> {
        let drives = self.drives().await.map_err(step("eject", drive, "query-block"))?;
        let Some(d) = drives.iter().find(|d| d.id == drive) else { return Err(OpError::NoSuchDrive { drive: drive.to_owned() }) };
        let Some(old) = &d.medium_node else { return Ok(()) };
        let q = |cmd: &'static str, args: Value| async move { self.qmp.execute(cmd, args).await.map_err(step("eject", drive, cmd)) };
        q("blockdev-open-tray", json!({"id": drive, "force": true})).await?;
        q("blockdev-remove-medium", json!({"id": drive})).await?;
        q("blockdev-del", json!({"node-name": old})).await?;
        q("blockdev-close-tray", json!({"id": drive})).await?;
        Ok(())
    }

    /// The hot-plugged volumes, as QEMU reports them (after any restart of the caller).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn attached(&self) -> Result<Vec<Attached>, QmpError> {
        Ok(self.inventory().await?.0)
    }

    /// [`Machine::attached`], and the names of every block node this crate named (`n-…`),
    /// whether a device uses it or not — a node without its device is what an unplug
    /// interrupted after `device_del` leaves (the caller decides whether it is still wanted).
    /// The same two QMP queries as `attached`.
    ///
    /// # Errors
    /// The QMP error.
    pub async fn inventory(&self) -> Result<(Vec<Attached>, Vec<String>), QmpError> {
        let nodes = self.nodes().await?;
        let mut out = Vec::new();
        for (name, ty) in self.peripherals().await? {
            let Some(volume) = name.strip_prefix("vp-") else { continue };
            let node = node_name(volume);
            let n = nodes.iter().find(|n| n.get("node-name").and_then(Value::as_str) == Some(node.as_str()));
            out.push(Attached {
                volume: volume.to_owned(),
                device_type: ty,
                node: n.map(|_| node.clone()),
                readonly: n.and_then(|n| n.get("ro")).and_then(Value::as_bool).unwrap_or(false),
            });
        }
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        let mut ours: Vec<String> = nodes
            .iter()
            .filter_map(|n| n.get("node-name").and_then(Value::as_str))
            .filter(|n| n.starts_with("n-"))
            .map(str::to_owned)
            .collect();
        ours.sort();
        ours.dedup();
        Ok((out, ours))
    }

    /// Removes the fd sets this crate added (`virtplug:` opaque) that were never removed: what
    /// an attach interrupted between `add-fd` and `remove-fd` leaves (a caller killed between two
    /// QMP commands). Such a set keeps the volume's image open in QEMU — its storage could never
    /// be unmounted — and nothing else lists it. A set whose node lives on stays open through
    /// QEMU's own dup until the node goes, as after a normal `remove-fd`. (A node left without
    /// its device is listed by [`Machine::inventory`]; the caller removes it.)
    ///
    /// Call it when taking over a running QEMU, before the first reconcile: within one owner of
    /// the connection no fd set outlives [`Machine::stage`], so every one found then is stale.
    /// Returns the ids removed.
    ///
    /// # Errors
    /// The QMP error of `query-fdsets`; a failed removal is skipped (the next takeover retries).
    pub async fn remove_stale_fdsets(&self) -> Result<Vec<i64>, QmpError> {
        let mut removed = Vec::new();
        for set in self.qmp.execute("query-fdsets", json!({})).await?.as_array().into_iter().flatten() {
            let ours = set
                .get("fds")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|fd| fd.get("opaque").and_then(Value::as_str).is_some_and(|o| o.starts_with("virtplug:")));
            let Some(id) = set.get("fdset-id").and_then(Value::as_i64).filter(|_| ours) else { continue };
            if self.qmp.execute("remove-fd", json!({"fdset-id": id})).await.is_ok() {
                removed.push(id);
            }
        }
        Ok(removed)
    }

    /// Deletes block node `node` (`blockdev-del`): a node [`Machine::inventory`] lists that no
    /// device uses any more. QEMU refuses while a backend still holds it (the ~50 ms between
    /// `device_del` and `DEVICE_DELETED`).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn remove_node(&self, node: &str) -> Result<(), QmpError> {
        self.qmp.execute("blockdev-del", json!({"node-name": node})).await.map(|_| ())
    }

    /// Sets the boot index of device `id` for the next boot.
    ///
    /// # Errors
    /// The QMP error (e.g. a duplicate boot index).
    pub async fn set_bootindex(&self, id: &str, index: i32) -> Result<(), QmpError> {
        self.qmp
            .execute("qom-set", json!({"path": format!("/machine/peripheral/{id}"), "property": "bootindex", "value": index}))
            .await
            .map(|_| ())
    }

    /// Asks the guest to power off (ACPI) and waits up to `deadline` for QEMU to shut down.
    /// Returns whether it did; the caller then stops QEMU by force.
    ///
    /// # Errors
    /// The QMP error of `system_powerdown`.
    pub async fn powerdown(&self, deadline: Duration) -> Result<bool, QmpError> {
        let mut events = self.qmp.events();
        self.qmp.execute("system_powerdown", json!({})).await?;
        Ok(self.qmp.wait_event(&mut events, "SHUTDOWN", deadline, |e| e.name == "SHUTDOWN" || e.name == "DISCONNECTED").await.is_ok())
    }

    /// Stops QEMU at once (`quit`).
    pub async fn quit(&self) {
        let _ = self.qmp.execute_within("quit", json!({}), Duration::from_secs(2)).await;
    }
}
