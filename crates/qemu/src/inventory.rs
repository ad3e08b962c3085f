//! What QEMU holds: the hot-plugged devices, the block nodes this crate named, the CD-ROM drives
//! and their media — and the leftovers of an operation whose caller died between two commands.
//!
//! QEMU is the truth: after a restart of the caller the view is rebuilt from `qom-list`
//! (devices), `query-named-block-nodes` (nodes), `query-block` (drives) and `query-fdsets`.

use serde_json::{json, Value};

use crate::hotplug::DeviceKind;
use crate::machine::Machine;
use crate::names::node_name;
use crate::qmp::QmpError;

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

/// The hot-plugged volumes and this crate's block nodes, from one `qom-list` and one
/// `query-named-block-nodes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The hot-plugged volumes, by volume name.
    pub attached: Vec<Attached>,
    /// The names of every block node this crate named (`n-…`), sorted, whether a device uses it
    /// or not: a node without its device is what an unplug interrupted after `device_del`
    /// leaves (the caller decides whether it is still wanted).
    pub nodes: Vec<String>,
}

impl Inventory {
    /// Whether `volume`'s device is attached.
    #[must_use]
    pub fn has_device(&self, volume: &str) -> bool {
        self.attached.iter().any(|a| a.volume == volume)
    }

    /// Whether block node `node` exists.
    #[must_use]
    pub fn has_node(&self, node: &str) -> bool {
        self.nodes.iter().any(|n| n == node)
    }

    /// What [`Machine::inventory`] answers once `volume` is plugged ([`Machine::plug`]
    /// succeeded) as a `kind` device, read-only or not: its device on its node.
    pub fn plugged(&mut self, volume: &str, kind: DeviceKind, readonly: bool) {
        let node = node_name(volume);
        if !self.has_node(&node) {
            self.nodes.push(node.clone());
            self.nodes.sort();
        }
        self.attached.retain(|a| a.volume != volume);
        let device_type = kind.driver().to_owned();
        self.attached.push(Attached { volume: volume.to_owned(), device_type, node: Some(node), readonly });
        self.attached.sort_by(|a, b| a.volume.cmp(&b.volume));
    }

    /// What [`Machine::inventory`] answers once `volume` is unplugged
    /// ([`Unplugging::finish`](crate::Unplugging::finish) succeeded): neither its device nor
    /// its node.
    pub fn unplugged(&mut self, volume: &str) {
        let node = node_name(volume);
        self.attached.retain(|a| a.volume != volume);
        self.nodes.retain(|n| *n != node);
    }
}

/// The children of `/machine/peripheral` (`qom-list`): (id, type).
fn peripherals(list: &Value) -> Vec<(String, String)> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let name = p.get("name")?.as_str()?.to_owned();
            let ty = p.get("type")?.as_str()?;
            let ty = ty.strip_prefix("child<")?.strip_suffix('>')?.to_owned();
            Some((name, ty))
        })
        .collect()
}

fn node_of(n: &Value) -> Option<&str> {
    n.get("node-name").and_then(Value::as_str)
}

/// The inventory from a `qom-list` of the peripherals and a flat `query-named-block-nodes`.
fn inventory(devices: &Value, nodes: &Value) -> Inventory {
    let nodes = nodes.as_array().map(Vec::as_slice).unwrap_or_default();
    let mut attached = Vec::new();
    for (name, ty) in peripherals(devices) {
        let Some(volume) = name.strip_prefix("vp-") else { continue };
        let node = node_name(volume);
        let n = nodes.iter().find(|n| node_of(n) == Some(node.as_str()));
        attached.push(Attached {
            volume: volume.to_owned(),
            device_type: ty,
            node: n.map(|_| node.clone()),
            readonly: n.and_then(|n| n.get("ro")).and_then(Value::as_bool).unwrap_or(false),
        });
    }
    attached.sort_by(|a, b| a.volume.cmp(&b.volume));
    let mut ours: Vec<String> = nodes.iter().filter_map(node_of).filter(|n| n.starts_with("n-")).map(str::to_owned).collect();
    ours.sort();
    ours.dedup();
    Inventory { attached, nodes: ours }
}

/// The removable drives of a `query-block`.
fn drives(blocks: &Value) -> Vec<Drive> {
    blocks
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
        .collect()
}

impl Machine {
    async fn peripheral_list(&self) -> Result<Value, QmpError> {
        self.command("qom-list", json!({"path": "/machine/peripheral"})).await
    }

    async fn node_list(&self) -> Result<Value, QmpError> {
        self.command("query-named-block-nodes", json!({"flat": true})).await
    }

    /// Whether device `id` exists (`qom-list`).
    pub(crate) async fn device_exists(&self, id: &str) -> Result<bool, QmpError> {
        Ok(peripherals(&self.peripheral_list().await?).iter().any(|(n, _)| n == id))
    }

    /// Whether block node `node` exists (`query-named-block-nodes`).
    pub(crate) async fn node_exists(&self, node: &str) -> Result<bool, QmpError> {
        Ok(self.node_list().await?.as_array().into_iter().flatten().any(|n| node_of(n) == Some(node)))
    }

    /// The hot-plugged volumes, as QEMU reports them (after any restart of the caller).
    ///
    /// # Errors
    /// The QMP error.
    pub async fn attached(&self) -> Result<Vec<Attached>, QmpError> {
        Ok(self.inventory().await?.attached)
    }

    /// The hot-plugged volumes and every block node this crate named ([`Inventory`]); the same
    /// two QMP queries as [`Machine::attached`]. Hand it to [`Machine::stage_with`] to stage
    /// without asking again.
    ///
    /// # Errors
    /// The QMP error.
    pub async fn inventory(&self) -> Result<Inventory, QmpError> {
        // Both queries go out at once (QMP answers in order, by id): one round trip, not two.
        let (nodes, devices) = tokio::join!(self.node_list(), self.peripheral_list());
        Ok(inventory(&devices?, &nodes?))
    }

    /// The CD-ROM drives and their media.
    ///
    /// # Errors
    /// The QMP error.
    pub async fn drives(&self) -> Result<Vec<Drive>, QmpError> {
        Ok(drives(&self.command("query-block", json!({})).await?))
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
        for set in self.command("query-fdsets", json!({})).await?.as_array().into_iter().flatten() {
            let ours = set
                .get("fds")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|fd| fd.get("opaque").and_then(Value::as_str).is_some_and(|o| o.starts_with("virtplug:")));
            let Some(id) = set.get("fdset-id").and_then(Value::as_i64).filter(|_| ours) else { continue };
            match self.command("remove-fd", json!({"fdset-id": id})).await {
                Ok(_) => removed.push(id),
                Err(e) => tracing::warn!(fdset = id, error = %e, "cannot remove a stale fd set; the next takeover retries"),
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
        self.command("blockdev-del", json!({"node-name": node})).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;
    use crate::qmp::fake::Fake;

    fn machine() -> (Arc<Fake>, Machine) {
        let fake = Arc::new(Fake::new());
        (Arc::clone(&fake), Machine::new(fake))
    }

    fn attached(volume: &str, device_type: &str, node: Option<&str>, readonly: bool) -> Attached {
        Attached { volume: volume.into(), device_type: device_type.into(), node: node.map(str::to_owned), readonly }
    }

    #[tokio::test(start_paused = true)]
    async fn the_inventory_lists_this_crates_devices_with_their_nodes_and_every_node_it_named() {
        let (fake, m) = machine();
        fake.reply(
            "query-named-block-nodes",
            json!([
                {"node-name": "n-b", "ro": true},
                {"node-name": "#block123", "ro": false},
                {"node-name": "n-a", "ro": false},
                {"node-name": "n-gone", "ro": false},
                {"node-name": "n-a", "ro": false},
                {"node-name": "drive-cd0", "ro": true}
            ]),
        );
        fake.reply(
            "qom-list",
            json!([
                {"name": "type", "type": "string"},
                {"name": "vp-b", "type": "child<scsi-block>"},
                {"name": "cd0", "type": "child<ide-cd>"},
                {"name": "vp-a", "type": "child<scsi-hd>"},
                {"name": "vp-c", "type": "child<scsi-hd>"}
            ]),
        );
        let inv = m.inventory().await.unwrap();
        assert_eq!(
            inv.attached,
            [
                attached("a", "scsi-hd", Some("n-a"), false),
                attached("b", "scsi-block", Some("n-b"), true),
                // Its node is gone (a detach between device_del's answer and DEVICE_DELETED).
                attached("c", "scsi-hd", None, false),
            ]
        );
        // Sorted, once each, only this crate's: the device-less `n-gone` is listed for the caller.
        assert_eq!(inv.nodes, ["n-a", "n-b", "n-gone"]);
        assert_eq!(fake.calls()[1].args, json!({"path": "/machine/peripheral"}));
        assert_eq!(fake.calls()[0].args, json!({"flat": true}));
    }

    #[tokio::test(start_paused = true)]
    async fn drives_are_the_removable_blocks_named_by_their_device_id() {
        let (fake, m) = machine();
        fake.reply(
            "query-block",
            json!([
                {"qdev": "cd0", "removable": true, "tray_open": false, "inserted": {"node-name": "n-iso"}},
                {"qdev": "/machine/peripheral-anon/device[3]/virtio-backend", "removable": true, "tray_open": true},
                {"qdev": "/machine/peripheral/vp-a/virtio-backend", "removable": false, "inserted": {"node-name": "n-a"}}
            ]),
        );
        let d = m.drives().await.unwrap();
        assert_eq!(
            d,
            [
                Drive { id: "cd0".into(), medium_node: Some("n-iso".into()), tray_open: false },
                Drive { id: "device[3]".into(), medium_node: None, tray_open: true },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_this_crates_fd_sets_are_removed_and_a_refused_removal_is_skipped() {
        let (fake, m) = machine();
        fake.reply(
            "query-fdsets",
            json!([
                {"fdset-id": 0, "fds": [{"fd": 30, "opaque": "virtplug:a"}]},
                {"fdset-id": 1, "fds": [{"fd": 31, "opaque": "someone-else"}]},
                {"fdset-id": 2, "fds": [{"fd": 32}]},
                {"fdset-id": 3, "fds": [{"fd": 33}, {"fd": 34, "opaque": "virtplug:b"}]},
                {"fdset-id": 4, "fds": [{"fd": 35, "opaque": "virtplug:c"}]},
                // A launcher pod's boot disk (`-add-fd`): its drive's for QEMU's life, never stale.
                {"fdset-id": 5, "fds": [{"fd": 36, "opaque": format!("{}root", crate::cmdline::BOOT_FDSET_PREFIX)}]}
            ]),
        );
        fake.reply("remove-fd", json!({})).refuse("remove-fd", "GenericError", "fdset-id not found");
        assert_eq!(m.remove_stale_fdsets().await.unwrap(), [0, 4]);
        let removals: Vec<Value> = fake.calls().into_iter().filter(|c| c.command == "remove-fd").map(|c| c.args).collect();
        assert_eq!(removals, [json!({"fdset-id": 0}), json!({"fdset-id": 3}), json!({"fdset-id": 4})]);
    }
}
