//! VM spec edits the way the real writers make them: Redfish virtual media (insert, eject),
//! boot order re-stamping, boot-once. Each takes every decision from the VM it is given.
#![allow(dead_code)]

use api::kubevirt::{CdromTarget, DataVolumeSource, Disk, Volume};
use api::VirtualMachine;

fn spec(vm: &mut VirtualMachine) -> &mut api::kubevirt::VirtualMachineInstanceSpec {
    vm.spec.template.spec.get_or_insert_with(Default::default)
}

/// Virtual media insert: the CD-ROM drive `name` (added when missing) gets a medium.
pub fn insert_media(vm: &mut VirtualMachine, name: &str, image: &str) {
    let s = spec(vm);
    if !s.domain.devices.disks.iter().any(|d| d.name == name) {
        s.domain.devices.disks.push(Disk {
            name: name.into(),
            cdrom: Some(CdromTarget { bus: Some("sata".into()), readonly: Some(true), ..CdromTarget::default() }),
            ..Disk::default()
        });
    }
    s.volumes.retain(|v| v.name != name);
    s.volumes.push(Volume {
        name: name.into(),
        data_volume: Some(DataVolumeSource { name: image.into(), hotpluggable: Some(true), ..DataVolumeSource::default() }),
        ..Volume::default()
    });
}

/// Virtual media eject: the medium goes, the drive stays (empty).
pub fn eject_media(vm: &mut VirtualMachine, name: &str) {
    spec(vm).volumes.retain(|v| v.name != name);
}

/// Re-stamps `bootOrder` on every disk: the named ones first, in the given order, then the rest
/// in spec order.
pub fn set_boot_order(vm: &mut VirtualMachine, first: &[&str]) {
    let disks = &mut spec(vm).domain.devices.disks;
    let mut order: Vec<String> = first.iter().filter(|n| disks.iter().any(|d| d.name == **n)).map(|n| (*n).to_owned()).collect();
    for d in disks.iter() {
        if !order.contains(&d.name) {
            order.push(d.name.clone());
        }
    }
    for d in disks.iter_mut() {
        d.boot_order = order.iter().position(|n| *n == d.name).and_then(|p| u32::try_from(p + 1).ok());
    }
}

/// Boot-once from `name`: it boots first, everything else keeps its relative order.
pub fn boot_once(vm: &mut VirtualMachine, name: &str) {
    let disks = &spec(vm).domain.devices.disks;
    let mut rest: Vec<(u32, String)> =
        disks.iter().filter(|d| d.name != name).map(|d| (d.boot_order.unwrap_or(u32::MAX), d.name.clone())).collect();
    rest.sort();
    let mut first = vec![name];
    first.extend(rest.iter().map(|(_, n)| n.as_str()));
    let first: Vec<String> = first.into_iter().map(str::to_owned).collect();
    let refs: Vec<&str> = first.iter().map(String::as_str).collect();
    set_boot_order(vm, &refs);
}
