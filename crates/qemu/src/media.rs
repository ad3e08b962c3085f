//! CD-ROM media on a drive the VM was started with (no device is hot-plugged):
//!
//! - insert: a read-only block node for the medium (as a disk's stage: `add-fd`,
//!   `blockdev-add`, `remove-fd`), then open tray → remove the old medium and delete its node →
//!   insert → close tray.
//! - eject: open tray → remove medium → `blockdev-del` → close tray.
//!
//! Both are idempotent: the same medium already in, or an empty drive, is left as it is.

use serde_json::{json, Value};

use crate::hotplug::{inspect, step, OpError, Source};
use crate::machine::Machine;
use crate::names::node_name;

impl Machine {
    /// One tray or medium command of `op` on `what` (the volume, or the drive for an eject).
    async fn tray(&self, op: &'static str, what: &str, command: &'static str, args: Value) -> Result<(), OpError> {
        self.command(command, args).await.map(|_| ()).map_err(step(op, what, command))
    }

    /// Puts the medium of `volume` into CD-ROM `drive` (swapping out what is there).
    /// Idempotent: the same medium already in is left.
    ///
    /// # Errors
    /// `FdMode` (media are read-only: open the fd read-only; before any QMP command),
    /// `NoSuchDrive`, `Qmp`.
    #[tracing::instrument(level = "debug", skip_all, fields(drive = %drive, volume = %volume))]
    pub async fn insert_medium(&self, drive: &str, volume: &str, source: Source) -> Result<(), OpError> {
        let block = inspect(volume, &source, true)?;
        let node = node_name(volume);
        let drives = self.drives().await.map_err(step("insert", volume, "query-block"))?;
        let Some(d) = drives.iter().find(|d| d.id == drive) else { return Err(OpError::NoSuchDrive { drive: drive.to_owned() }) };
        if d.medium_node.as_deref() == Some(node.as_str()) {
            return Ok(());
        }
        if !self.node_exists(&node).await.map_err(step("insert", volume, "query-named-block-nodes"))? {
            self.add_node("insert", volume, &node, source, true, block).await?;
        }
        self.tray("insert", volume, "blockdev-open-tray", json!({"id": drive, "force": true})).await?;
        if let Some(old) = &d.medium_node {
            self.tray("insert", volume, "blockdev-remove-medium", json!({"id": drive})).await?;
            self.tray("insert", volume, "blockdev-del", json!({"node-name": old})).await?;
        }
        self.tray("insert", volume, "blockdev-insert-medium", json!({"id": drive, "node-name": node})).await?;
        self.tray("insert", volume, "blockdev-close-tray", json!({"id": drive})).await
    }

    /// Ejects the medium of CD-ROM `drive`, leaving it empty. Idempotent.
    ///
    /// # Errors
    /// `NoSuchDrive`, `Qmp`.
    #[tracing::instrument(level = "debug", skip_all, fields(drive = %drive))]
    pub async fn eject(&self, drive: &str) -> Result<(), OpError> {
        let drives = self.drives().await.map_err(step("eject", drive, "query-block"))?;
        let Some(d) = drives.iter().find(|d| d.id == drive) else { return Err(OpError::NoSuchDrive { drive: drive.to_owned() }) };
        let Some(old) = &d.medium_node else { return Ok(()) };
        self.tray("eject", drive, "blockdev-open-tray", json!({"id": drive, "force": true})).await?;
        self.tray("eject", drive, "blockdev-remove-medium", json!({"id": drive})).await?;
        self.tray("eject", drive, "blockdev-del", json!({"node-name": old})).await?;
        self.tray("eject", drive, "blockdev-close-tray", json!({"id": drive})).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::fd::OwnedFd;
    use std::sync::Arc;

    use super::*;
    use crate::qmp::fake::Fake;

    fn machine(medium: Option<&str>) -> (Arc<Fake>, Machine) {
        let fake = Arc::new(Fake::new());
        let inserted = medium.map(|n| json!({"node-name": n}));
        let mut cd0 = json!({"qdev": "cd0", "removable": true, "tray_open": false});
        if let Some(i) = inserted {
            cd0["inserted"] = i;
        }
        fake.reply("query-block", json!([cd0]));
        (Arc::clone(&fake), Machine::new(fake))
    }

    fn iso(dir: &tempfile::TempDir, write: bool) -> Source {
        let p = dir.path().join("m.iso");
        std::fs::write(&p, [0u8; 2048]).unwrap();
        Source::Fd(OwnedFd::from(std::fs::OpenOptions::new().read(true).write(write).open(&p).unwrap()))
    }

    fn sent(fake: &Fake, from: usize) -> Vec<(String, Value)> {
        fake.calls().into_iter().skip(from).map(|c| (c.command, c.args)).collect()
    }

    fn call(command: &str, args: Value) -> (String, Value) {
        (command.to_owned(), args)
    }

    #[tokio::test(start_paused = true)]
    async fn a_medium_goes_into_an_empty_drive_as_a_read_only_node_between_tray_open_and_close() {
        let (fake, m) = machine(None);
        let dir = tempfile::tempdir().unwrap();
        fake.reply("add-fd", json!({"fdset-id": 2}));
        m.insert_medium("cd0", "iso", iso(&dir, false)).await.unwrap();
        assert_eq!(fake.commands()[..5], ["query-block", "query-named-block-nodes", "add-fd", "blockdev-add", "remove-fd"]);
        let file = json!({"driver": "file", "filename": "/dev/fdset/2", "read-only": true});
        assert_eq!(fake.calls()[3].args, json!({"node-name": "n-iso", "driver": "raw", "read-only": true, "file": file}));
        assert_eq!(
            sent(&fake, 5),
            [
                call("blockdev-open-tray", json!({"id": "cd0", "force": true})),
                call("blockdev-insert-medium", json!({"id": "cd0", "node-name": "n-iso"})),
                call("blockdev-close-tray", json!({"id": "cd0"})),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_swap_removes_the_old_medium_and_deletes_its_node_before_inserting() {
        let (fake, m) = machine(Some("n-old"));
        let dir = tempfile::tempdir().unwrap();
        m.insert_medium("cd0", "new", iso(&dir, false)).await.unwrap();
        assert_eq!(
            sent(&fake, 5),
            [
                call("blockdev-open-tray", json!({"id": "cd0", "force": true})),
                call("blockdev-remove-medium", json!({"id": "cd0"})),
                call("blockdev-del", json!({"node-name": "n-old"})),
                call("blockdev-insert-medium", json!({"id": "cd0", "node-name": "n-new"})),
                call("blockdev-close-tray", json!({"id": "cd0"})),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_medium_already_in_is_left_and_a_missing_drive_is_named() {
        let (fake, m) = machine(Some("n-iso"));
        let dir = tempfile::tempdir().unwrap();
        m.insert_medium("cd0", "iso", iso(&dir, false)).await.unwrap();
        assert_eq!(fake.commands(), ["query-block"]);
        let (fake, m) = machine(None);
        let e = m.insert_medium("cd9", "iso", iso(&dir, false)).await.unwrap_err();
        assert!(matches!(&e, OpError::NoSuchDrive { drive } if drive == "cd9"), "{e:?}");
        assert_eq!(fake.commands(), ["query-block"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_write_fd_for_a_medium_is_refused_before_any_qmp() {
        let (fake, m) = machine(None);
        let dir = tempfile::tempdir().unwrap();
        let e = m.insert_medium("cd0", "iso", iso(&dir, true)).await.unwrap_err();
        assert!(matches!(e, OpError::FdMode { have: "read-write", want: "read-only", .. }), "{e:?}");
        assert!(fake.calls().is_empty(), "QEMU was asked {:?}", fake.commands());
    }

    #[tokio::test(start_paused = true)]
    async fn eject_opens_the_tray_removes_the_medium_deletes_its_node_and_closes_the_tray() {
        let (fake, m) = machine(Some("n-iso"));
        m.eject("cd0").await.unwrap();
        assert_eq!(
            sent(&fake, 1),
            [
                call("blockdev-open-tray", json!({"id": "cd0", "force": true})),
                call("blockdev-remove-medium", json!({"id": "cd0"})),
                call("blockdev-del", json!({"node-name": "n-iso"})),
                call("blockdev-close-tray", json!({"id": "cd0"})),
            ]
        );
        // An empty drive: nothing to do.
        let (fake, m) = machine(None);
        m.eject("cd0").await.unwrap();
        assert_eq!(fake.commands(), ["query-block"]);
    }
}
