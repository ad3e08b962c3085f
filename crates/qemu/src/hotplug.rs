//! Hot-plug of disks and LUNs on a running VM, each step idempotent:
//!
//! - attach: the source is checked (fd mode, LUN on a block device) before QEMU is asked
//!   anything; then fd → `add-fd` → `blockdev-add` (on `/dev/fdset/N`) → `remove-fd`
//!   ([`Machine::stage`], [`Machine::stage_with`]) → `device_add` (`scsi-hd` or `scsi-block` on
//!   the hot-plug bus, with `serial`; [`Machine::plug`]). A step already done (node or device
//!   present) is skipped, so an attach interrupted by a crash resumes; a failed `device_add`
//!   removes the node its stage added.
//! - detach: `device_del` ([`Machine::unplug_with`]) → `DEVICE_DELETED` (deadline) →
//!   `blockdev-del` ([`Unplugging::finish`]). The fd set was removed right after `blockdev-add`,
//!   so QEMU closes the image when the node goes.
//!
//! CD-ROM media are in [`crate::media`]; what is attached in [`crate::inventory`]; the names in
//! [`crate::names`].

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::cmdline::HOTPLUG_BUS;
use crate::inventory::Inventory;
use crate::machine::Machine;
use crate::names::{device_id, node_name};
use crate::qmp::{Event, QmpError};

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

impl DeviceKind {
    /// QEMU's driver: what `device_add` is given and `qom-list` reports as the device's type.
    #[must_use]
    pub fn driver(self) -> &'static str {
        match self {
            DeviceKind::Disk => "scsi-hd",
            DeviceKind::Lun => "scsi-block",
        }
    }
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

/// Names the step a QMP error happened at.
pub(crate) fn step(op: &'static str, volume: &str, step: &'static str) -> impl FnOnce(QmpError) -> OpError {
    let volume = volume.to_owned();
    move |source| OpError::Qmp { op, volume, step, source }
}

/// Checks that QEMU can open `source` the way the volume needs, before QEMU is asked anything:
/// an fd's access mode must be the node's (QEMU opens a read-only node with `O_RDONLY` and finds
/// no fd of another mode in the set; a read-write node cannot be served by a read-only fd).
/// Returns whether the source is a block device.
// The operations' own error, returned once per operation: its size does not matter.
#[allow(clippy::result_large_err)]
pub(crate) fn inspect(volume: &str, source: &Source, readonly: bool) -> Result<bool, OpError> {
    let fd_err = |e: rustix::io::Errno| OpError::Fd { volume: volume.to_owned(), source: e.into() };
    match source {
        Source::Fd(fd) => {
            let flags = rustix::fs::fcntl_getfl(fd).map_err(fd_err)?;
            let ro_fd = !flags.contains(rustix::fs::OFlags::RDWR) && !flags.contains(rustix::fs::OFlags::WRONLY);
            if ro_fd != readonly {
                let (have, want) = if ro_fd { ("read-only", "read-write") } else { ("read-write", "read-only") };
                return Err(OpError::FdMode { volume: volume.to_owned(), have, want });
            }
            let st = rustix::fs::fstat(fd).map_err(fd_err)?;
            Ok(rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::BlockDevice)
        }
        // A path that cannot be read is not a block device; QEMU's blockdev-add says why.
        Source::Path(p) => Ok(std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))),
    }
}

/// [`inspect`] for an attach, and a LUN needs a block device. Returns whether it is one.
#[allow(clippy::result_large_err)]
fn check(a: &Attach) -> Result<bool, OpError> {
    let block = inspect(&a.volume, &a.source, a.readonly)?;
    if a.kind == DeviceKind::Lun && !block {
        return Err(OpError::LunNeedsBlock { volume: a.volume.clone() });
    }
    Ok(block)
}

impl Machine {
    /// Opens the volume's source as block node `node` (read-only or read-write, as checked by
    /// [`inspect`]): `add-fd` with the fd, `blockdev-add` on its fd set, `remove-fd`; or
    /// `blockdev-add` on the path.
    pub(crate) async fn add_node(
        &self,
        op: &'static str,
        volume: &str,
        node: &str,
        source: Source,
        readonly: bool,
        block: bool,
    ) -> Result<(), OpError> {
        let (filename, fdset) = match &source {
            Source::Fd(fd) => {
                let r = self
                    .command_with_fd("add-fd", json!({"opaque": format!("virtplug:{volume}")}), fd.as_fd())
                    .await
                    .map_err(step(op, volume, "add-fd"))?;
                let set = r.get("fdset-id").and_then(Value::as_i64).unwrap_or(-1);
                (format!("/dev/fdset/{set}"), Some(set))
            }
            Source::Path(p) => (p.display().to_string(), None),
        };
        let driver = if block { "host_device" } else { "file" };
        let added = self
            .command(
                "blockdev-add",
                json!({"node-name": node, "driver": "raw", "read-only": readonly,
                       "file": {"driver": driver, "filename": filename, "read-only": readonly}}),
            )
            .await
            .map(|_| ())
            .map_err(step(op, volume, "blockdev-add"));
        if let Some(set) = fdset {
            // Right after blockdev-add, success or not: QEMU keeps its own dup while the node
            // lives and drops the set when the node goes (otherwise the image stays open).
            if let Err(e) = self.command("remove-fd", json!({"fdset-id": set})).await {
                tracing::warn!(fdset = set, error = %e, "cannot remove the fd set; the next takeover removes it");
            }
        }
        drop(source);
        added
    }

    /// Attaches a disk or LUN: [`Machine::stage`] then [`Machine::plug`]. Idempotent: an
    /// attached device is left as it is.
    ///
    /// # Errors
    /// `FdMode` when the fd's access mode does not match `readonly`; `LunNeedsBlock` (both before
    /// any QMP command); `Qmp` naming the failed step (a failed `device_add` removes the node it
    /// just added).
    pub async fn attach(&self, a: Attach) -> Result<(), OpError> {
        let staged = self.stage(a).await?;
        self.plug(staged).await
    }

    /// The first half of an attach: the volume's source becomes a block node in QEMU (add-fd,
    /// blockdev-add, remove-fd) — KubeVirt's `MountedToPod`. Skipped for a device already
    /// attached (the returned [`Staged`] then plugs nothing). Asks QEMU what is there first
    /// ([`Machine::inventory`]); [`Machine::stage_with`] takes what the caller already asked.
    ///
    /// # Errors
    /// As [`Machine::attach`].
    #[tracing::instrument(level = "debug", skip_all, fields(volume = %a.volume))]
    pub async fn stage(&self, a: Attach) -> Result<Staged, OpError> {
        let block = check(&a)?;
        let inventory = self.inventory().await.map_err(step("attach", &a.volume, "inventory"))?;
        self.staged(&inventory, a, block).await
    }

    /// [`Machine::stage`] against `inventory` (what the connection's one owner knows QEMU
    /// holds: from [`Machine::inventory`], or derived since with [`Inventory::plugged`] and
    /// [`Inventory::unplugged`]): no query of its own.
    ///
    /// # Errors
    /// As [`Machine::attach`].
    #[tracing::instrument(level = "debug", skip_all, fields(volume = %a.volume))]
    pub async fn stage_with(&self, inventory: &Inventory, a: Attach) -> Result<Staged, OpError> {
        let block = check(&a)?;
        self.staged(inventory, a, block).await
    }

    async fn staged(&self, inventory: &Inventory, a: Attach, block: bool) -> Result<Staged, OpError> {
        let done = Staged { volume: a.volume.clone(), serial: a.serial.clone(), kind: a.kind, added: false, present: true };
        if inventory.has_device(&a.volume) {
            return Ok(done);
        }
        let node = node_name(&a.volume);
        if inventory.has_node(&node) {
            tracing::debug!(node, "the block node is already there");
            return Ok(Staged { present: false, ..done });
        }
        self.add_node("attach", &a.volume, &node, a.source, a.readonly, block).await?;
        Ok(Staged { added: true, present: false, ..done })
    }

    /// The second half: `device_add` on the hot-plug bus. A failure removes the node that
    /// [`Machine::stage`] added.
    ///
    /// # Errors
    /// `Qmp` at `device_add`.
    #[tracing::instrument(level = "debug", skip_all, fields(volume = %s.volume))]
    pub async fn plug(&self, s: Staged) -> Result<(), OpError> {
        if s.present {
            return Ok(());
        }
        let (id, node) = (device_id(&s.volume), node_name(&s.volume));
        let mut dev = json!({"driver": s.kind.driver(), "id": id, "bus": HOTPLUG_BUS, "drive": node});
        // scsi-block passes the device's own identity through: it has no `serial` property.
        if s.kind == DeviceKind::Disk {
            dev["serial"] = json!(s.serial);
        }
        if let Err(e) = self.command("device_add", dev).await {
            if s.added {
                if let Err(del) = self.remove_node(&node).await {
                    tracing::warn!(node, error = %del, "cannot remove the node of a failed plug; the next attach reuses it, or the leftover sweep removes it");
                }
            }
            return Err(step("attach", &s.volume, "device_add")(e));
        }
        Ok(())
    }

    /// Detaches a hot-plugged volume. Idempotent: what is already gone is skipped.
    ///
    /// # Errors
    /// `Qmp` naming the step (a `Timeout` when `DEVICE_DELETED` did not come within
    /// [`UNPLUG_DEADLINE`]; the node is then left for the next detach or the leftover sweep).
    #[tracing::instrument(level = "debug", skip_all, fields(volume = %volume))]
    pub async fn detach(&self, volume: &str) -> Result<(), OpError> {
        // Subscribed before `device_del` goes out: its `DEVICE_DELETED` may follow its answer at
        // once.
        let events = self.events();
        let present = self.device_exists(&device_id(volume)).await.map_err(step("detach", volume, "qom-list"))?;
        self.unplug(volume, present, events).await?.finish().await
    }

    /// [`Machine::detach`] against `inventory` (what the connection's one owner knows QEMU
    /// holds, as for [`Machine::stage_with`]): `device_del` goes out without a `qom-list` of its
    /// own first, one QMP round trip less between the caller's decision and the guest's unplug.
    ///
    /// # Errors
    /// As [`Machine::detach`].
    pub async fn detach_with(&self, inventory: &Inventory, volume: &str) -> Result<(), OpError> {
        self.unplug_with(inventory, volume).await?.finish().await
    }

    /// The first half of [`Machine::detach_with`]: `device_del`, answered (QEMU is telling the
    /// guest). [`Unplugging::finish`] is the rest. For a caller that unplugs several volumes at
    /// once, or has work to start as soon as QEMU has taken the unplug.
    ///
    /// # Errors
    /// `Qmp` at `device_del` (a device already gone is no error).
    #[tracing::instrument(level = "debug", skip_all, fields(volume = %volume))]
    pub async fn unplug_with(&self, inventory: &Inventory, volume: &str) -> Result<Unplugging<'_>, OpError> {
        let events = self.events();
        self.unplug(volume, inventory.has_device(volume), events).await
    }

    /// `device_del` if the device is `present`; `events` were subscribed before anything that
    /// decided it.
    async fn unplug(&self, volume: &str, present: bool, events: broadcast::Receiver<Event>) -> Result<Unplugging<'_>, OpError> {
        let deleting = if present {
            match self.command("device_del", json!({"id": device_id(volume)})).await {
                Ok(_) => Some(events),
                // Gone already (the guest ejected it, or an earlier unplug finished): nothing
                // to wait for.
                Err(e) if e.class() == Some("DeviceNotFound") => None,
                Err(e) => return Err(step("detach", volume, "device_del")(e)),
            }
        } else {
            None
        };
        Ok(Unplugging { machine: self, volume: volume.to_owned(), deleting })
    }
}

/// An unplug QEMU has taken ([`Machine::unplug_with`]: `device_del` answered, or no device to
/// delete); [`Unplugging::finish`] completes it.
#[must_use = "the unplug is complete (device gone, node deleted) only once `finish` has returned"]
pub struct Unplugging<'a> {
    machine: &'a Machine,
    volume: String,
    /// QEMU's events, subscribed before `device_del` was sent; `None` when none was.
    deleting: Option<broadcast::Receiver<Event>>,
}

impl Unplugging<'_> {
    /// Waits for the device's `DEVICE_DELETED` (within [`UNPLUG_DEADLINE`]), then deletes the
    /// volume's block node if it is there.
    ///
    /// # Errors
    /// As [`Machine::detach`].
    #[tracing::instrument(level = "debug", skip_all, fields(volume = %self.volume))]
    pub async fn finish(self) -> Result<(), OpError> {
        let (volume, m) = (self.volume.as_str(), self.machine);
        if let Some(mut events) = self.deleting {
            let want = device_id(volume);
            m.wait_event(&mut events, "DEVICE_DELETED", UNPLUG_DEADLINE, move |e| {
                e.name == "DEVICE_DELETED" && e.data.get("device").and_then(Value::as_str) == Some(want.as_str())
            })
            .await
            .map_err(step("detach", volume, "wait for DEVICE_DELETED"))?;
        }
        let node = node_name(volume);
        if m.node_exists(&node).await.map_err(step("detach", volume, "query-named-block-nodes"))? {
            m.remove_node(&node).await.map_err(step("detach", volume, "blockdev-del"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::fd::AsFd;
    use std::sync::Arc;

    use super::*;
    use crate::qmp::fake::{Fake, PassedFd};

    fn machine() -> (Arc<Fake>, Machine) {
        let fake = Arc::new(Fake::new());
        (Arc::clone(&fake), Machine::new(Arc::clone(&fake)))
    }

    /// An fd on a fresh image in `dir`, opened read-write or read-only, and its identity.
    fn image(dir: &tempfile::TempDir, write: bool) -> (OwnedFd, PassedFd) {
        let p = dir.path().join("v.img");
        std::fs::write(&p, [0u8; 512]).unwrap();
        let fd: OwnedFd = std::fs::OpenOptions::new().read(true).write(write).open(&p).unwrap().into();
        let id = PassedFd::of(fd.as_fd()).unwrap();
        (fd, id)
    }

    fn disk(fd: OwnedFd) -> Attach {
        Attach { volume: "v".into(), serial: "s-v".into(), kind: DeviceKind::Disk, readonly: false, source: Source::Fd(fd) }
    }

    #[tokio::test(start_paused = true)]
    async fn attach_passes_the_fd_with_add_fd_opens_its_set_removes_it_then_adds_the_device() {
        let (fake, m) = machine();
        let dir = tempfile::tempdir().unwrap();
        let (fd, id) = image(&dir, true);
        fake.reply("add-fd", json!({"fdset-id": 7, "fd": 42}));
        m.attach(disk(fd)).await.unwrap();
        let calls = fake.calls();
        assert_eq!(
            fake.commands(),
            ["query-named-block-nodes", "qom-list", "add-fd", "blockdev-add", "remove-fd", "device_add"],
            "what is there, then the handoff in order"
        );
        assert_eq!(calls[2].fd, Some(id), "the volume's fd travels with add-fd");
        assert!(calls.iter().enumerate().all(|(i, c)| c.fd.is_none() || i == 2), "and with no other command");
        assert_eq!(calls[2].args, json!({"opaque": "virtplug:v"}));
        let file = json!({"driver": "file", "filename": "/dev/fdset/7", "read-only": false});
        assert_eq!(calls[3].args, json!({"node-name": "n-v", "driver": "raw", "read-only": false, "file": file}));
        assert_eq!(calls[4].args, json!({"fdset-id": 7}), "the set add-fd made is removed");
        assert_eq!(calls[5].args, json!({"driver": "scsi-hd", "id": "vp-v", "bus": HOTPLUG_BUS, "drive": "n-v", "serial": "s-v"}));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_blockdev_add_still_removes_the_fd_set_and_adds_no_device() {
        let (fake, m) = machine();
        let dir = tempfile::tempdir().unwrap();
        fake.reply("add-fd", json!({"fdset-id": 3})).refuse("blockdev-add", "GenericError", "Could not open");
        let e = m.attach(disk(image(&dir, true).0)).await.unwrap_err();
        assert!(matches!(&e, OpError::Qmp { step: "blockdev-add", .. }), "{e:?}");
        assert_eq!(fake.commands()[2..], ["add-fd", "blockdev-add", "remove-fd"]);
        assert_eq!(fake.calls()[4].args, json!({"fdset-id": 3}));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_device_add_removes_the_node_its_stage_added() {
        let (fake, m) = machine();
        let dir = tempfile::tempdir().unwrap();
        fake.refuse("device_add", "GenericError", "cannot get SG_IO version number");
        let e = m.attach(disk(image(&dir, true).0)).await.unwrap_err();
        assert!(matches!(&e, OpError::Qmp { step: "device_add", .. }), "{e:?}");
        assert_eq!(e.qmp().and_then(QmpError::desc), Some("cannot get SG_IO version number"), "QEMU's reason is kept");
        let calls = fake.calls();
        assert_eq!(fake.commands()[5..], ["device_add", "blockdev-del"]);
        assert_eq!(calls[6].args, json!({"node-name": "n-v"}));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_device_add_keeps_a_node_the_stage_found_there() {
        let (fake, m) = machine();
        let dir = tempfile::tempdir().unwrap();
        // An attach interrupted after blockdev-add left the node: the stage reuses it.
        let inventory = Inventory { attached: vec![], nodes: vec!["n-v".into()] };
        let staged = m.stage_with(&inventory, disk(image(&dir, true).0)).await.unwrap();
        assert!(fake.commands().is_empty(), "nothing to open");
        fake.refuse("device_add", "GenericError", "Duplicate ID");
        m.plug(staged).await.unwrap_err();
        assert_eq!(fake.commands(), ["device_add"], "the node was not this stage's to remove");
    }

    #[tokio::test(start_paused = true)]
    async fn staging_with_an_inventory_asks_qemu_nothing_but_the_handoff() {
        let (fake, m) = machine();
        let dir = tempfile::tempdir().unwrap();
        let staged = m.stage_with(&Inventory::default(), disk(image(&dir, true).0)).await.unwrap();
        assert_eq!(fake.commands(), ["add-fd", "blockdev-add", "remove-fd"]);
        m.plug(staged).await.unwrap();
        assert_eq!(fake.commands().last().map(String::as_str), Some("device_add"));

        // An attached device: nothing to stage or plug.
        let (fake, m) = machine();
        let attached = crate::Attached { volume: "v".into(), device_type: "scsi-hd".into(), node: Some("n-v".into()), readonly: false };
        let inventory = Inventory { attached: vec![attached], nodes: vec!["n-v".into()] };
        let staged = m.stage_with(&inventory, disk(image(&dir, true).0)).await.unwrap();
        m.plug(staged).await.unwrap();
        assert!(fake.commands().is_empty(), "{:?}", fake.commands());
    }

    #[tokio::test(start_paused = true)]
    async fn an_fd_of_the_wrong_mode_is_refused_before_any_qmp() {
        let (fake, m) = machine();
        let dir = tempfile::tempdir().unwrap();
        let e = m.attach(disk(image(&dir, false).0)).await.unwrap_err();
        assert!(matches!(e, OpError::FdMode { have: "read-only", want: "read-write", .. }), "{e:?}");
        assert!(e.to_string().contains("open it read-write"), "{e}");
        let e = m.attach(Attach { readonly: true, ..disk(image(&dir, true).0) }).await.unwrap_err();
        assert!(matches!(e, OpError::FdMode { have: "read-write", want: "read-only", .. }), "{e:?}");
        let inventory = Inventory::default();
        let e = m.stage_with(&inventory, disk(image(&dir, false).0)).await.unwrap_err();
        assert!(matches!(e, OpError::FdMode { .. }), "{e:?}");
        assert!(fake.calls().is_empty(), "QEMU was asked {:?}", fake.commands());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lun_on_a_regular_file_is_refused_before_any_qmp() {
        let (fake, m) = machine();
        let dir = tempfile::tempdir().unwrap();
        let e = m.attach(Attach { kind: DeviceKind::Lun, ..disk(image(&dir, true).0) }).await.unwrap_err();
        assert!(matches!(e, OpError::LunNeedsBlock { .. }), "{e:?}");
        assert!(fake.calls().is_empty(), "QEMU was asked {:?}", fake.commands());
    }

    #[tokio::test(start_paused = true)]
    async fn detach_deletes_the_device_waits_for_device_deleted_then_deletes_its_node() {
        let (fake, m) = machine();
        fake.reply("qom-list", json!([{"name": "vp-v", "type": "child<scsi-hd>"}]))
            .emit_after("device_del", "DEVICE_DELETED", json!({"device": "vp-v", "path": "/machine/peripheral/vp-v"}))
            .reply("query-named-block-nodes", json!([{"node-name": "n-v"}]));
        m.detach("v").await.unwrap();
        let calls = fake.calls();
        assert_eq!(fake.commands(), ["qom-list", "device_del", "query-named-block-nodes", "blockdev-del"]);
        assert_eq!(calls[1].args, json!({"id": "vp-v"}));
        assert_eq!(calls[3].args, json!({"node-name": "n-v"}));
    }

    /// What a caller's inventory says when volume `v`'s disk is attached.
    fn holding_v() -> Inventory {
        let v = crate::Attached { volume: "v".into(), device_type: "scsi-hd".into(), node: Some("n-v".into()), readonly: false };
        Inventory { attached: vec![v], nodes: vec!["n-v".into()] }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unplug_whose_device_is_already_gone_waits_for_nothing_and_deletes_the_node() {
        let (fake, m) = machine();
        fake.refuse("device_del", "DeviceNotFound", "Device 'vp-v' not found")
            .reply("query-named-block-nodes", json!([{"node-name": "n-v"}]));
        let start = tokio::time::Instant::now();
        m.detach_with(&holding_v(), "v").await.unwrap();
        assert!(start.elapsed() < UNPLUG_DEADLINE, "it waited {:?} for a DEVICE_DELETED that had come before", start.elapsed());
        assert_eq!(fake.commands(), ["device_del", "query-named-block-nodes", "blockdev-del"]);
    }

    #[tokio::test(start_paused = true)]
    async fn detach_with_the_callers_inventory_sends_device_del_without_asking_first() {
        let (fake, m) = machine();
        fake.emit_after("device_del", "DEVICE_DELETED", json!({"device": "vp-v", "path": "/machine/peripheral/vp-v"}))
            .reply("query-named-block-nodes", json!([{"node-name": "n-v"}]));
        m.detach_with(&holding_v(), "v").await.unwrap();
        assert_eq!(fake.commands(), ["device_del", "query-named-block-nodes", "blockdev-del"]);
        assert_eq!(fake.calls()[0].args, json!({"id": "vp-v"}));
    }

    #[tokio::test(start_paused = true)]
    async fn detach_with_an_inventory_without_the_device_only_deletes_a_left_node() {
        let (fake, m) = machine();
        fake.reply("query-named-block-nodes", json!([{"node-name": "n-v"}]));
        m.detach_with(&Inventory { attached: Vec::new(), nodes: vec!["n-v".into()] }, "v").await.unwrap();
        assert_eq!(fake.commands(), ["query-named-block-nodes", "blockdev-del"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_detach_without_its_device_deleted_fails_at_the_deadline_and_keeps_the_node() {
        let (fake, m) = machine();
        // Another device's unplug is no confirmation of this one.
        fake.reply("qom-list", json!([{"name": "vp-v", "type": "child<scsi-hd>"}])).emit_after(
            "device_del",
            "DEVICE_DELETED",
            json!({"device": "vp-other"}),
        );
        let (start, real) = (tokio::time::Instant::now(), std::time::Instant::now());
        let e = tokio::time::timeout(UNPLUG_DEADLINE * 3, m.detach("v")).await.expect("the detach gave up at its deadline").unwrap_err();
        let waited = start.elapsed();
        assert!((UNPLUG_DEADLINE..UNPLUG_DEADLINE + Duration::from_millis(1)).contains(&waited), "waited {waited:?}");
        assert!(real.elapsed() < Duration::from_secs(2), "paused time: no real wait");
        assert!(matches!(&e, OpError::Qmp { step: "wait for DEVICE_DELETED", source: QmpError::Timeout { .. }, .. }), "{e:?}");
        // No blockdev-del while QEMU's backend may still hold the node.
        assert_eq!(fake.commands(), ["qom-list", "device_del"]);
    }
}
