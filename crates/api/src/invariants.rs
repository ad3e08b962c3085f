//! Invariants every VM (and VMI) spec must hold, whoever wrote it.
//!
//! These are the rules whose violation turns into a crash-looping VM in KubeVirt: a volume
//! without a disk is attached as a writable hard disk (a read-only ISO then fails to open), a disk
//! without a volume fails the domain definition, two disks with one `bootOrder` make the domain
//! XML invalid. Admission refuses specs that break them; the controller's self-heal and every
//! test check them again.

use std::collections::{BTreeMap, BTreeSet};

use crate::cause::{Cause, CauseType};
use crate::kubevirt::{DiskKind, VirtualMachineInstanceSpec};

/// Returns every violation in `spec`, each with its field path under `prefix`
/// (e.g. `spec.template.spec`). An empty list means the spec is consistent.
///
/// Checked: disk names unique, volume names unique, every disk names a volume except an empty
/// CD-ROM drive, every volume has a disk, `bootOrder` values unique and at least 1.
#[must_use]
pub fn check(spec: &VirtualMachineInstanceSpec, prefix: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let disks = &spec.domain.devices.disks;
    let disk_path = format!("{prefix}.domain.devices.disks");
    let volume_path = format!("{prefix}.volumes");

    let mut disk_names = BTreeSet::new();
    for (i, disk) in disks.iter().enumerate() {
        if !disk_names.insert(disk.name.as_str()) {
            causes.push(Cause::new(
                CauseType::Duplicate,
                format!("{disk_path}[{i}].name"),
                format!("disk name {:?} is used by an earlier disk; give every disk its own name", disk.name),
            ));
        }
    }
    let mut volume_names = BTreeSet::new();
    for (i, volume) in spec.volumes.iter().enumerate() {
        if !volume_names.insert(volume.name.as_str()) {
            causes.push(Cause::new(
                CauseType::Duplicate,
                format!("{volume_path}[{i}].name"),
                format!("volume name {:?} is used by an earlier volume; give every volume its own name", volume.name),
            ));
        }
    }

    for (i, disk) in disks.iter().enumerate() {
        if !volume_names.contains(disk.name.as_str()) && disk.kind() != DiskKind::Cdrom {
            causes.push(Cause::new(
                CauseType::Invalid,
                format!("{disk_path}[{i}].name"),
                format!(
                    "disk {:?} has no volume of the same name; add a volume named {:?} to {volume_path} \
                     or remove the disk (only an empty CD-ROM drive may have no volume)",
                    disk.name, disk.name
                ),
            ));
        }
    }
    for (i, volume) in spec.volumes.iter().enumerate() {
        if !disk_names.contains(volume.name.as_str()) {
            causes.push(Cause::new(
                CauseType::Invalid,
                format!("{volume_path}[{i}].name"),
                format!(
                    "volume {:?} has no disk of the same name; add a disk named {:?} to {disk_path} \
                     (a CD-ROM medium needs its cdrom disk) or remove the volume",
                    volume.name, volume.name
                ),
            ));
        }
    }

    let mut boot_orders: BTreeMap<u32, &str> = BTreeMap::new();
    for (i, disk) in disks.iter().enumerate() {
        let Some(order) = disk.boot_order else { continue };
        if order == 0 {
            causes.push(Cause::new(
                CauseType::Invalid,
                format!("{disk_path}[{i}].bootOrder"),
                "bootOrder must be 1 or more; leave it out to keep the disk out of the boot order".to_owned(),
            ));
        } else if let Some(first) = boot_orders.insert(order, disk.name.as_str()) {
            boot_orders.insert(order, first);
            causes.push(Cause::new(
                CauseType::Duplicate,
                format!("{disk_path}[{i}].bootOrder"),
                format!("bootOrder {order} is already used by disk {first:?}; every bootOrder must be unique"),
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubevirt::{CdromTarget, Disk, Volume};

    fn disk(name: &str, boot: Option<u32>) -> Disk {
        Disk { name: name.into(), boot_order: boot, ..Disk::default() }
    }
    fn cdrom(name: &str) -> Disk {
        Disk { name: name.into(), cdrom: Some(CdromTarget::default()), ..Disk::default() }
    }
    fn volume(name: &str) -> Volume {
        Volume { name: name.into(), ..Volume::default() }
    }
    fn spec(disks: Vec<Disk>, volumes: Vec<Volume>) -> VirtualMachineInstanceSpec {
        let mut s = VirtualMachineInstanceSpec::default();
        s.domain.devices.disks = disks;
        s.volumes = volumes;
        s
    }
    fn fields(c: &[Cause]) -> Vec<&str> {
        c.iter().map(|c| c.field.as_str()).collect()
    }

    #[test]
    fn consistent_spec_has_no_violations() {
        let s = spec(vec![disk("root", Some(1)), cdrom("cd"), disk("data", Some(2))], vec![volume("root"), volume("data")]);
        assert!(check(&s, "spec").is_empty());
    }

    /// The corruption from the lost-update bug: the CD-ROM volume survived without its disk.
    #[test]
    fn volume_without_disk_is_reported_with_its_path() {
        let s = spec(vec![disk("root", Some(1))], vec![volume("root"), volume("cdrom0")]);
        let c = check(&s, "spec.template.spec");
        assert_eq!(fields(&c), ["spec.template.spec.volumes[1].name"]);
        assert!(c[0].message.contains("cdrom0"));
    }

    #[test]
    fn disk_without_volume_is_reported_unless_empty_cdrom() {
        let s = spec(vec![disk("root", None), cdrom("cd")], vec![]);
        assert_eq!(fields(&check(&s, "spec")), ["spec.domain.devices.disks[0].name"]);
    }

    #[test]
    fn duplicates_and_zero_boot_order_are_all_reported() {
        let s = spec(vec![disk("a", Some(1)), disk("a", Some(1)), disk("b", Some(0))], vec![volume("a"), volume("b"), volume("b")]);
        let c = check(&s, "spec");
        assert_eq!(
            fields(&c),
            [
                "spec.domain.devices.disks[1].name",
                "spec.volumes[2].name",
                "spec.domain.devices.disks[1].bootOrder",
                "spec.domain.devices.disks[2].bootOrder",
            ]
        );
    }
}
