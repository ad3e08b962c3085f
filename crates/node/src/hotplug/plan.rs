//! What one pass does: pure, from what the spec wants, what QEMU holds (its [`Inventory`] and
//! drives, as the pass began: asked then, or what the last pass left, [`super::Known`]) and what
//! `volumeStatus` says. The executor ([`super::execute`]) runs the steps; what a step's outcome
//! writes is decided there and in [`super::waiting`].
//!
//! # Rules
//! - A wanted volume QEMU holds (its device; a medium: in its drive) is kept; its entry is made
//!   `Ready` if it says otherwise (an agent restarted mid-attach adopts what QEMU took).
//! - A wanted volume QEMU does not hold is attached: a disk or LUN as a SCSI device, a CD-ROM
//!   volume as the medium of its drive (swapping out another medium).
//! - A device the spec no longer wants is unplugged; a medium no wanted volume names is ejected
//!   (media of the VM's own, not named `n-…`, are never touched).
//! - A block node of this agent's that nothing accounts for — not a wanted volume's (staged, or
//!   about to be plugged), not a device's, not a drive's medium — is deleted: what an unplug
//!   interrupted after `device_del` leaves. (Stale fd sets are removed when a QEMU is taken
//!   over, before the first pass: see [`crate::worker`].)
//! - The entry of a hot-plug volume neither wanted nor in QEMU (removed while it waited) goes.

use api::kubevirt::{Disk, DiskKind, VirtualMachineInstanceSpec, VirtualMachineInstanceStatus, Volume, VolumeStatus};
use api::phases::VolumePhase;
use qemu::{node_name, DeviceKind, Drive, Inventory};

use crate::claims::Claim;

/// A hot-plug volume of the spec, with its disk.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    pub volume: &'a Volume,
    pub disk: &'a Disk,
}

/// The hot-plug volumes of `spec` that have their disk (KubeVirt pairs them by name).
#[must_use]
pub fn wanted(spec: &VirtualMachineInstanceSpec) -> Vec<Wanted<'_>> {
    spec.volumes
        .iter()
        .filter(|v| v.is_hotpluggable())
        .filter_map(|volume| spec.domain.devices.disks.iter().find(|d| d.name == volume.name).map(|disk| Wanted { volume, disk }))
        .collect()
}

/// What a volume becomes in QEMU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A SCSI device on the hot-plug bus (`scsi-hd` with `serial`, or `scsi-block`).
    Device { kind: DeviceKind, serial: String },
    /// The medium of the CD-ROM drive `drive` (no device is plugged).
    Medium { drive: String },
}

/// An attach: the volume's source opened, then handed to QEMU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attach {
    pub volume: String,
    pub claim: Claim,
    /// The disk is read-only (the source is opened read-only; QEMU's open mode must match).
    pub readonly: bool,
    pub target: Target,
    /// Cluster mode: the attachment pod the entry names (`hotplugVolume.attachPodUID`), in which
    /// the volume is opened.
    pub attach_pod: Option<String>,
}

/// One step of a pass, in the order the executor runs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// QEMU holds the wanted volume and its entry says `Ready`: nothing to do.
    Keep { volume: String },
    /// QEMU holds the wanted volume but its entry does not say `Ready`: record it.
    RecordReady { volume: String },
    /// Attach a wanted volume QEMU does not hold.
    Attach(Attach),
    /// Unplug the device of a volume the spec no longer wants.
    Detach { volume: String },
    /// Eject the medium `node` of `drive`; `volume` is its entry's name, when there is one.
    Eject { drive: String, node: String, volume: Option<String> },
    /// Delete a block node of this agent's that nothing accounts for.
    RemoveNode { node: String },
    /// Drop the entry of a hot-plug volume neither wanted nor in QEMU.
    DropEntry { volume: String },
}

/// The steps of one pass (see the module's rules).
#[must_use]
pub fn plan(wanted: &[Wanted<'_>], inventory: &Inventory, drives: &[Drive], status: Option<&VirtualMachineInstanceStatus>) -> Vec<Step> {
    let entries: &[VolumeStatus] = status.map_or(&[], |s| &s.volume_status);
    let entry = |volume: &str| entries.iter().find(|e| e.name == volume);
    let mut steps = Vec::new();
    for w in wanted {
        let volume = w.volume.name.clone();
        if holds(w, inventory, drives) {
            let ready = entry(&volume).and_then(|e| e.phase.as_ref()) == Some(&VolumePhase::Ready);
            steps.push(if ready { Step::Keep { volume } } else { Step::RecordReady { volume } });
        } else if let Some(a) = attach(w, entry(&volume)) {
            steps.push(Step::Attach(a));
        }
    }
    let is_wanted = |volume: &str| wanted.iter().any(|w| w.volume.name == volume);
    let wanted_nodes: Vec<String> = wanted.iter().map(|w| node_name(&w.volume.name)).collect();
    let in_a_drive = |node: &str| drives.iter().any(|d| d.medium_node.as_deref() == Some(node));
    steps.extend(inventory.attached.iter().filter(|a| !is_wanted(&a.volume)).map(|a| Step::Detach { volume: a.volume.clone() }));
    for d in drives {
        let Some(node) = d.medium_node.as_deref().filter(|n| n.starts_with("n-") && !wanted_nodes.iter().any(|w| w == n)) else {
            continue;
        };
        // A wanted medium going into this drive swaps this one out itself.
        if wanted.iter().any(|w| w.disk.kind() == DiskKind::Cdrom && w.disk.name == d.id) {
            continue;
        }
        // The entry of the medium, found by its node name (long names are hashed).
        let volume = entries.iter().find(|e| node_name(&e.name) == node).map(|e| e.name.clone());
        steps.push(Step::Eject { drive: d.id.clone(), node: node.to_owned(), volume });
    }
    for node in &inventory.nodes {
        let accounted = wanted_nodes.contains(node) || inventory.attached.iter().any(|a| a.node.as_ref() == Some(node)) || in_a_drive(node);
        if !accounted {
            steps.push(Step::RemoveNode { node: node.clone() });
        }
    }
    for e in entries.iter().filter(|e| e.hotplug_volume.is_some() && !is_wanted(&e.name)) {
        if !inventory.has_device(&e.name) && !in_a_drive(&node_name(&e.name)) {
            steps.push(Step::DropEntry { volume: e.name.clone() });
        }
    }
    steps
}

/// Whether QEMU holds the wanted volume: its device, or (a CD-ROM volume) its medium in its drive.
fn holds(w: &Wanted<'_>, inventory: &Inventory, drives: &[Drive]) -> bool {
    if w.disk.kind() == DiskKind::Cdrom {
        let node = node_name(&w.volume.name);
        drives.iter().any(|d| d.id == w.disk.name && d.medium_node.as_deref() == Some(node.as_str()))
    } else {
        inventory.has_device(&w.volume.name)
    }
}

/// The attach of a wanted volume; `None` for a volume without a claim (none is hot-pluggable).
fn attach(w: &Wanted<'_>, entry: Option<&VolumeStatus>) -> Option<Attach> {
    let serial = || w.disk.serial.clone().unwrap_or_else(|| w.volume.name.clone());
    let target = match w.disk.kind() {
        DiskKind::Cdrom => Target::Medium { drive: w.disk.name.clone() },
        DiskKind::Lun => Target::Device { kind: DeviceKind::Lun, serial: serial() },
        DiskKind::Disk => Target::Device { kind: DeviceKind::Disk, serial: serial() },
    };
    Some(Attach {
        volume: w.volume.name.clone(),
        claim: Claim::of(w.volume)?,
        readonly: w.disk.readonly(),
        target,
        attach_pod: entry.and_then(|e| e.hotplug_volume.as_ref()).and_then(|h| h.attach_pod_uid.clone()),
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
