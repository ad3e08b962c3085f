//! Virtual media and boot overrides, as data on the VM: what the Redfish service writes, what
//! the controller honours (self-heal of a lost drive, power-on gated on the medium, a one-time
//! boot override consumed by the next start) and what `virtplug vm get` shows. Everything lives
//! in the VM object, never in a process's memory, so it survives restarts of every component.
//!
//! # The drive
//! The `Cd` virtual-media member is one CD-ROM drive of the VM ([`cd_drive`]): the drive marked
//! in [`VIRTUAL_MEDIA`], else the first SATA CD-ROM drive without a volume, else a new drive
//! [`DRIVE`] (added on the first insert or Cd override). A drive stays when its medium is
//! ejected, as on real hardware; the medium is a hot-pluggable DataVolume volume of the drive's
//! name, so a running guest sees it inserted and ejected in the same drive.
//!
//! # The boot override
//! [`BOOT_OVERRIDE`] holds the override (target, `Once` or `Continuous`) and the boot order
//! before it ([`BootOverride::original`]). Applying it gives the target `bootOrder` 1 and the
//! devices that had an order the next ones, in their old order; removing it restores the old
//! orders. It is recomputed from the recorded original whenever the devices change (an insert
//! that adds the drive), so an insert and an override end in the same spec in either order.
//! A `Once` override is consumed by the controller when it creates the next VMI ([`consume_once`]):
//! that VMI boots with it, the VM's spec goes back to the original order, and the running
//! guest's order follows (QEMU's `bootindex` is settable at run time and read at each reset), so
//! a reboot inside the guest, a restart and a power cycle all boot the original device.
//! A `Once` override set while a guest runs reaches that guest's next reset: the controller
//! copies it to the VMI, the node agent reports it used ([`BOOT_ONCE_USED`]) when the guest
//! resets with it in effect, and the controller then consumes it the same way.

use std::collections::BTreeMap;

use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::kubevirt::{CdromTarget, DataVolumeSource, Disk, DiskKind, Volume};
use crate::VirtualMachine;

/// VM annotation: comma-separated names of the drives (and their volumes) used as virtual media.
pub const VIRTUAL_MEDIA: &str = "virtplug.io/virtual-media";
/// VM annotation: the boot override, JSON ([`BootOverride`]).
pub const BOOT_OVERRIDE: &str = "virtplug.io/boot-override";
/// VMI annotation, by the node agent: the [`BOOT_OVERRIDE`] value (a `Once` one, copied to the
/// running VMI by the controller) that was in effect when the guest reset: the guest booted
/// with it, so it is used up.
pub const BOOT_ONCE_USED: &str = "virtplug.io/boot-once-used";
/// DataVolume label: the name of the VM whose virtual medium it is.
pub const MEDIUM_OF: &str = "virtplug.io/virtual-medium-of";
/// The drive added when the VM has no free CD-ROM drive.
pub const DRIVE: &str = "vmedia-cd";

/// The drives marked as virtual media on `vm`.
#[must_use]
pub fn marked(vm: &VirtualMachine) -> Vec<String> {
    vm.annotations()
        .get(VIRTUAL_MEDIA)
        .map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn set_marked(vm: &mut VirtualMachine, names: &[String]) {
    if names.is_empty() {
        vm.annotations_mut().remove(VIRTUAL_MEDIA);
    } else {
        vm.annotations_mut().insert(VIRTUAL_MEDIA.to_owned(), names.join(","));
    }
}

fn sata_cdrom(d: &Disk) -> bool {
    d.kind() == DiskKind::Cdrom && d.bus().unwrap_or("sata") == "sata"
}

/// The drive of the `Cd` member (see the module docs).
#[must_use]
pub fn cd_drive(vm: &VirtualMachine) -> String {
    let Some(spec) = vm.spec.template.spec.as_ref() else { return DRIVE.to_owned() };
    let disks = &spec.domain.devices.disks;
    let marked = marked(vm);
    if let Some(d) = disks.iter().find(|d| sata_cdrom(d) && marked.contains(&d.name)) {
        return d.name.clone();
    }
    let free = disks.iter().find(|d| sata_cdrom(d) && !spec.volumes.iter().any(|v| v.name == d.name));
    free.map_or_else(|| DRIVE.to_owned(), |d| d.name.clone())
}

/// A virtual-media CD-ROM drive named `name` (SATA: a drive that exists from boot, whose media
/// are swapped, KubeVirt's rule for hot-plugged CD-ROM media).
#[must_use]
pub fn drive(name: &str) -> Disk {
    Disk {
        name: name.to_owned(),
        cdrom: Some(CdromTarget { bus: Some("sata".to_owned()), readonly: Some(true), ..CdromTarget::default() }),
        ..Disk::default()
    }
}

/// The DataVolume in the `Cd` drive of `vm`, if a medium is inserted.
#[must_use]
pub fn medium(vm: &VirtualMachine) -> Option<String> {
    let spec = vm.spec.template.spec.as_ref()?;
    let drive = cd_drive(vm);
    spec.volumes.iter().find(|v| v.name == drive)?.data_volume.as_ref().map(|d| d.name.clone())
}

/// Whether the VM has the drive `name` in its template.
#[must_use]
pub fn has_disk(vm: &VirtualMachine, name: &str) -> bool {
    vm.spec.template.spec.as_ref().is_some_and(|s| s.domain.devices.disks.iter().any(|d| d.name == name))
}

/// Puts DataVolume `dv` in the `Cd` drive (adding the drive if the VM has none); returns the
/// DataVolume it replaced. The override, if any, is re-applied (the drive may be new).
///
/// # Errors
/// When the VM has no template spec.
pub fn insert(vm: &mut VirtualMachine, dv: &str) -> Result<Option<String>, OverrideError> {
    let drive_name = cd_drive(vm);
    let mut names = marked(vm);
    if !names.contains(&drive_name) {
        names.push(drive_name.clone());
    }
    set_marked(vm, &names);
    let spec = vm.spec.template.spec.as_mut().ok_or(OverrideError::NoTemplate)?;
    if !spec.domain.devices.disks.iter().any(|d| d.name == drive_name) {
        spec.domain.devices.disks.push(drive(&drive_name));
    }
    let volume = Volume {
        name: drive_name.clone(),
        data_volume: Some(DataVolumeSource { name: dv.to_owned(), hotpluggable: Some(true), ..DataVolumeSource::default() }),
        ..Volume::default()
    };
    let old = match spec.volumes.iter_mut().find(|v| v.name == drive_name) {
        Some(v) => {
            let old = v.data_volume.as_ref().map(|d| d.name.clone());
            *v = volume;
            old
        }
        None => {
            spec.volumes.push(volume);
            None
        }
    };
    reapply(vm)?;
    Ok(old.filter(|o| o != dv))
}

/// Takes the medium out of the `Cd` drive (the drive stays); returns its DataVolume.
pub fn eject(vm: &mut VirtualMachine) -> Option<String> {
    let drive_name = cd_drive(vm);
    if !marked(vm).contains(&drive_name) {
        return None;
    }
    let spec = vm.spec.template.spec.as_mut()?;
    let i = spec.volumes.iter().position(|v| v.name == drive_name)?;
    let v = spec.volumes.remove(i);
    v.data_volume.map(|d| d.name)
}

/// Whether `vm` boots through UEFI (`firmware.bootloader.efi`), else legacy BIOS.
#[must_use]
pub fn uefi(vm: &VirtualMachine) -> bool {
    let fw = vm.spec.template.spec.as_ref().and_then(|s| s.domain.firmware.as_ref());
    fw.and_then(|f| serde_json::to_value(f).ok()).is_some_and(|f| f.pointer("/bootloader/efi").is_some())
}

/// Sets the firmware `vm` boots with at its next start: `firmware.bootloader` `efi` (secure
/// boot off) or `bios`. Unchanged when it already boots that way.
///
/// # Errors
/// When the VM has no template spec.
pub fn set_uefi(vm: &mut VirtualMachine, on: bool) -> Result<(), OverrideError> {
    if uefi(vm) == on {
        return Ok(());
    }
    let spec = vm.spec.template.spec.as_mut().ok_or(OverrideError::NoTemplate)?;
    let mut fw = serde_json::to_value(spec.domain.firmware.clone().unwrap_or_default()).map_err(|_| OverrideError::NoTemplate)?;
    fw["bootloader"] = if on { serde_json::json!({"efi": {"secureBoot": false}}) } else { serde_json::json!({"bios": {}}) };
    spec.domain.firmware = Some(serde_json::from_value(fw).map_err(|_| OverrideError::NoTemplate)?);
    Ok(())
}

/// Removes the drive `name` and its virtual-media mark (taking back an insert that added it).
pub fn remove_drive(vm: &mut VirtualMachine, name: &str) {
    let names: Vec<String> = marked(vm).into_iter().filter(|n| n != name).collect();
    set_marked(vm, &names);
    if let Some(spec) = vm.spec.template.spec.as_mut() {
        spec.domain.devices.disks.retain(|d| d.name != name);
        spec.volumes.retain(|v| v.name != name);
    }
}

/// `BootSourceOverrideTarget` values that change the order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Pxe,
    Cd,
    Hdd,
}

/// `BootSourceOverrideEnabled` values that hold an override.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enabled {
    Once,
    Continuous,
}

/// The override on a VM: what boots first, for how long, and the order before it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct BootOverride {
    pub target: Target,
    pub enabled: Enabled,
    /// `bootOrder` of every disk that had one before the override.
    #[serde(default)]
    pub original: BTreeMap<String, u32>,
    /// `bootOrder` of every interface that had one before the override.
    #[serde(default, rename = "originalInterfaces")]
    pub original_interfaces: BTreeMap<String, u32>,
    /// When it was set (Unix ms): tells a VMI created before it (the override reaches that
    /// running guest's next reset) from one created with it; and makes two overrides set at
    /// different times different values.
    #[serde(default)]
    pub since: i64,
}

impl BootOverride {
    /// Whether the override is a one-time one that a VMI created at `created` (Unix ms) did not
    /// boot with: the running guest's next reset uses it.
    #[must_use]
    pub fn pending_for(&self, created: i64) -> bool {
        self.enabled == Enabled::Once && created < self.since
    }
}

/// Why an override cannot be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OverrideError {
    #[error("the VM has no spec.template.spec")]
    NoTemplate,
    #[error("the VM has no disk to boot from (only CD-ROM drives); add a disk or choose Cd")]
    NoDisk,
    #[error(
        "the VM has no network interface to boot from (spec.template.spec.domain.devices.interfaces is empty); add one or choose Cd or Hdd"
    )]
    NoInterface,
}

/// The override on `vm`, if any (a malformed annotation counts as none).
#[must_use]
pub fn boot_override(vm: &VirtualMachine) -> Option<BootOverride> {
    vm.annotations().get(BOOT_OVERRIDE).and_then(|s| serde_json::from_str(s).ok())
}

fn interfaces_mut(vm: &mut VirtualMachine) -> Option<&mut Vec<Value>> {
    vm.spec.template.spec.as_mut()?.domain.devices.extra.get_mut("interfaces")?.as_array_mut()
}

fn interface_orders(vm: &VirtualMachine) -> BTreeMap<String, u32> {
    let Some(list) = vm.spec.template.spec.as_ref().and_then(|s| s.domain.devices.extra.get("interfaces")).and_then(Value::as_array) else {
        return BTreeMap::new();
    };
    list.iter()
        .filter_map(|i| {
            let order = u32::try_from(i.get("bootOrder")?.as_u64()?).ok()?;
            Some((i.get("name")?.as_str()?.to_owned(), order))
        })
        .collect()
}

/// Sets (`Some`) or removes (`None`) the override. Setting one over another keeps the first
/// one's original order.
///
/// # Errors
/// When the target has no device on this VM; the VM is then unchanged.
pub fn set_override(vm: &mut VirtualMachine, new: Option<(Target, Enabled)>) -> Result<(), OverrideError> {
    let current = boot_override(vm);
    let Some((target, enabled)) = new else {
        if let Some(o) = current {
            restore(vm, &o)?;
            vm.annotations_mut().remove(BOOT_OVERRIDE);
        }
        return Ok(());
    };
    let o = current.map_or_else(
        || {
            let disks = vm.spec.template.spec.as_ref().map(|s| s.domain.devices.disks.as_slice()).unwrap_or_default();
            BootOverride {
                target,
                enabled,
                original: disks.iter().filter_map(|d| Some((d.name.clone(), d.boot_order?))).collect(),
                original_interfaces: interface_orders(vm),
                since: jiff::Timestamp::now().as_millisecond(),
            }
        },
        |o| BootOverride { target, enabled, since: jiff::Timestamp::now().as_millisecond(), ..o },
    );
    let mut edited = vm.clone();
    let text = serde_json::to_string(&o).map_err(|_| OverrideError::NoTemplate)?;
    edited.annotations_mut().insert(BOOT_OVERRIDE.to_owned(), text);
    if target == Target::Cd && !has_disk(&edited, &cd_drive(&edited)) {
        let name = cd_drive(&edited);
        edited.spec.template.spec.as_mut().ok_or(OverrideError::NoTemplate)?.domain.devices.disks.push(drive(&name));
    }
    apply(&mut edited, &o)?;
    *vm = edited;
    Ok(())
}

/// Re-applies the VM's override after its devices changed.
///
/// # Errors
/// When the target lost its device.
pub fn reapply(vm: &mut VirtualMachine) -> Result<(), OverrideError> {
    match boot_override(vm) {
        Some(o) => apply(vm, &o),
        None => Ok(()),
    }
}

/// A `Once` override is used by the VMI about to be created from `vm`: the VM goes back to its
/// original order. Returns whether there was one.
///
/// # Errors
/// When the VM has no template.
pub fn consume_once(vm: &mut VirtualMachine) -> Result<bool, OverrideError> {
    match boot_override(vm) {
        Some(o) if o.enabled == Enabled::Once => {
            restore(vm, &o)?;
            vm.annotations_mut().remove(BOOT_OVERRIDE);
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn restore(vm: &mut VirtualMachine, o: &BootOverride) -> Result<(), OverrideError> {
    let spec = vm.spec.template.spec.as_mut().ok_or(OverrideError::NoTemplate)?;
    for d in &mut spec.domain.devices.disks {
        d.boot_order = o.original.get(&d.name).copied();
    }
    if let Some(list) = interfaces_mut(vm) {
        for i in list.iter_mut() {
            let name = i.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
            if let Some(obj) = i.as_object_mut() {
                match o.original_interfaces.get(&name) {
                    Some(n) => obj.insert("bootOrder".to_owned(), Value::from(*n)),
                    None => obj.remove("bootOrder"),
                };
            }
        }
    }
    Ok(())
}

/// One bootable device: a disk or an interface.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Device {
    Disk(String),
    Interface(String),
}

fn apply(vm: &mut VirtualMachine, o: &BootOverride) -> Result<(), OverrideError> {
    let spec = vm.spec.template.spec.as_ref().ok_or(OverrideError::NoTemplate)?;
    let disks = &spec.domain.devices.disks;
    // The devices that had an order, in that order.
    let mut before: Vec<(u32, Device)> = o
        .original
        .iter()
        .filter(|(n, _)| disks.iter().any(|d| &d.name == *n))
        .map(|(n, k)| (*k, Device::Disk(n.clone())))
        .chain(o.original_interfaces.iter().map(|(n, k)| (*k, Device::Interface(n.clone()))))
        .collect();
    before.sort();
    let first = match o.target {
        Target::Cd => Device::Disk(cd_drive(vm)),
        Target::Hdd => {
            let ordered = before.iter().find_map(|(_, d)| match d {
                Device::Disk(n) if disks.iter().any(|x| &x.name == n && x.kind() != DiskKind::Cdrom) => Some(d.clone()),
                _ => None,
            });
            ordered
                .or_else(|| disks.iter().find(|d| d.kind() != DiskKind::Cdrom).map(|d| Device::Disk(d.name.clone())))
                .ok_or(OverrideError::NoDisk)?
        }
        Target::Pxe => {
            let ordered = before.iter().find(|(_, d)| matches!(d, Device::Interface(_))).map(|(_, d)| d.clone());
            let any = spec
                .domain
                .devices
                .extra
                .get("interfaces")
                .and_then(Value::as_array)
                .and_then(|l| l.first())
                .and_then(|i| i.get("name")?.as_str())
                .map(|n| Device::Interface(n.to_owned()));
            ordered.or(any).ok_or(OverrideError::NoInterface)?
        }
    };
    let order: Vec<Device> = std::iter::once(first.clone()).chain(before.into_iter().map(|(_, d)| d).filter(|d| *d != first)).collect();
    let position = |d: &Device| order.iter().position(|x| x == d).and_then(|p| u32::try_from(p + 1).ok());
    let spec = vm.spec.template.spec.as_mut().ok_or(OverrideError::NoTemplate)?;
    for d in &mut spec.domain.devices.disks {
        d.boot_order = position(&Device::Disk(d.name.clone()));
    }
    if let Some(list) = interfaces_mut(vm) {
        for i in list.iter_mut() {
            let name = i.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
            if let Some(obj) = i.as_object_mut() {
                match position(&Device::Interface(name)) {
                    Some(n) => obj.insert("bootOrder".to_owned(), Value::from(n)),
                    None => obj.remove("bootOrder"),
                };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[allow(clippy::needless_pass_by_value)]
    fn vm(disks: Value, volumes: Value) -> VirtualMachine {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "bm"},
            "spec": {"template": {"spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}}}}))
        .unwrap()
    }

    fn orders(vm: &VirtualMachine) -> Vec<(String, Option<u32>)> {
        vm.spec.template.spec.as_ref().unwrap().domain.devices.disks.iter().map(|d| (d.name.clone(), d.boot_order)).collect()
    }

    fn root() -> VirtualMachine {
        vm(
            json!([{"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}}]),
            json!([{"name": "root", "emptyDisk": {"capacity": "1Gi"}}]),
        )
    }

    #[test]
    fn insert_and_override_in_either_order_give_the_same_spec() {
        let mut a = root();
        insert(&mut a, "bm-vmedia-1").unwrap();
        set_override(&mut a, Some((Target::Cd, Enabled::Once))).unwrap();
        let mut b = root();
        set_override(&mut b, Some((Target::Cd, Enabled::Once))).unwrap();
        insert(&mut b, "bm-vmedia-1").unwrap();
        // The override's `since` is the clock at each call, which may be a millisecond apart.
        let spec = |vm: &VirtualMachine| {
            let mut v = serde_json::to_value(vm).unwrap();
            let o = &mut v["metadata"]["annotations"][BOOT_OVERRIDE];
            let mut parsed: serde_json::Value = serde_json::from_str(o.as_str().unwrap()).unwrap();
            assert!(parsed["since"].as_i64().is_some(), "{parsed}");
            parsed["since"] = json!(0);
            *o = json!(parsed.to_string());
            v
        };
        assert_eq!(spec(&a), spec(&b));
        assert_eq!(orders(&a), [("root".into(), Some(2)), (DRIVE.into(), Some(1))]);
        assert_eq!(medium(&a).as_deref(), Some("bm-vmedia-1"));
    }

    #[test]
    fn once_is_consumed_and_restores_the_original_order() {
        let mut v = root();
        insert(&mut v, "m").unwrap();
        set_override(&mut v, Some((Target::Cd, Enabled::Once))).unwrap();
        assert!(consume_once(&mut v).unwrap());
        assert_eq!(orders(&v), [("root".into(), Some(1)), (DRIVE.into(), None)]);
        assert!(boot_override(&v).is_none());
        assert!(!consume_once(&mut v).unwrap(), "consumed once only");
        set_override(&mut v, Some((Target::Cd, Enabled::Continuous))).unwrap();
        assert!(!consume_once(&mut v).unwrap(), "Continuous persists");
        set_override(&mut v, Some((Target::Hdd, Enabled::Continuous))).unwrap();
        assert_eq!(orders(&v), [("root".into(), Some(1)), (DRIVE.into(), None)], "Hdd: the disk first, the drive had no order");
        set_override(&mut v, None).unwrap();
        assert_eq!(orders(&v), [("root".into(), Some(1)), (DRIVE.into(), None)]);
    }

    #[test]
    fn a_once_override_is_pending_only_for_a_vmi_created_before_it() {
        let mut v = root();
        set_override(&mut v, Some((Target::Hdd, Enabled::Once))).unwrap();
        let o = boot_override(&v).unwrap();
        assert!(o.pending_for(o.since - 1) && !o.pending_for(o.since + 1));
        set_override(&mut v, Some((Target::Hdd, Enabled::Continuous))).unwrap();
        assert!(!boot_override(&v).unwrap().pending_for(0), "only Once is used up by a reset");
    }

    #[test]
    fn a_free_drive_is_reused_and_eject_keeps_it() {
        let mut v = vm(
            json!([{"name": "root", "bootOrder": 1}, {"name": "cdrom0", "cdrom": {"bus": "sata"}}]),
            json!([{"name": "root", "emptyDisk": {"capacity": "1Gi"}}]),
        );
        assert_eq!(cd_drive(&v), "cdrom0");
        assert_eq!(insert(&mut v, "one").unwrap(), None);
        assert_eq!(insert(&mut v, "two").unwrap().as_deref(), Some("one"), "a different medium replaces the first");
        assert_eq!(cd_drive(&v), "cdrom0", "the marked drive, now holding a volume");
        assert_eq!(eject(&mut v).as_deref(), Some("two"));
        assert!(has_disk(&v, "cdrom0"));
        assert_eq!(medium(&v), None);
        assert_eq!(eject(&mut v), None, "an empty drive ejects nothing");
    }

    #[test]
    fn targets_without_a_device_are_refused_and_change_nothing() {
        let mut v = vm(json!([{"name": "cd", "cdrom": {"bus": "sata"}}]), json!([]));
        let before = serde_json::to_value(&v).unwrap();
        assert_eq!(set_override(&mut v, Some((Target::Hdd, Enabled::Once))), Err(OverrideError::NoDisk));
        assert_eq!(set_override(&mut v, Some((Target::Pxe, Enabled::Once))), Err(OverrideError::NoInterface));
        assert_eq!(serde_json::to_value(&v).unwrap(), before);
    }
}
