//! The edits of KubeVirt's `addvolume` / `removevolume`, on an instance spec (a VM's
//! `spec.template.spec` or a VMI's `spec`), shared by the API server's subresources and the
//! controller's legacy `status.volumeRequests` path so both refuse and apply alike.
//!
//! As KubeVirt: a volume name or claim already in use is refused; adding to an empty CD-ROM
//! drive inserts a medium (the drive stays, no new disk); removing an unknown or
//! non-hot-pluggable volume is refused; removing a CD-ROM medium keeps the empty drive (eject).
//! A refused edit changes nothing.

use crate::kubevirt::{Disk, VirtualMachineInstanceSpec, Volume};

/// Why an edit was refused (KubeVirt's messages; the API answers them with 409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EditRefused(pub String);

/// Adds `volume` and its `disk` (both named `volume.name`) to `spec`.
///
/// # Errors
/// When the name or the source is already used, or a non-CD-ROM disk has the name.
pub fn add(spec: &mut VirtualMachineInstanceSpec, disk: Disk, volume: Volume) -> Result<(), EditRefused> {
    let name = volume.name.as_str();
    if spec.volumes.iter().any(|v| v.name == name) {
        return Err(EditRefused(format!("Unable to add volume [{name}] because volume with that name already exists")));
    }
    if let Some(src) = volume.claim_name() {
        if spec.volumes.iter().any(|v| v.claim_name() == Some(src)) {
            return Err(EditRefused(format!("Unable to add volume source [{src}] because it already exists")));
        }
    }
    let disks = &mut spec.domain.devices.disks;
    match disks.iter().find(|d| d.name == name) {
        // An empty CD-ROM drive gets a medium: the drive is already there.
        Some(d) if d.cdrom.is_some() => {}
        Some(_) => return Err(EditRefused(format!("Unable to add volume [{name}] because a disk with that name already exists"))),
        None => disks.push(disk),
    }
    spec.volumes.push(volume);
    Ok(())
}

/// Removes the hot-plug volume named `name` (or whose claim is `name`) and its disk, keeping an
/// emptied CD-ROM drive. Returns the removed volume's name.
///
/// # Errors
/// When no such volume exists or it is not hot-pluggable.
pub fn remove(spec: &mut VirtualMachineInstanceSpec, name: &str) -> Result<String, EditRefused> {
    let Some(v) = spec.volumes.iter().find(|v| v.name == name || v.claim_name() == Some(name)) else {
        return Err(EditRefused(format!("Unable to remove volume [{name}] because it does not exist")));
    };
    if !v.is_hotpluggable() {
        return Err(EditRefused(format!("Unable to remove volume [{name}] because it is not hotpluggable")));
    }
    let vname = v.name.clone();
    spec.volumes.retain(|x| x.name != vname);
    spec.domain.devices.disks.retain(|d| d.name != vname || d.cdrom.is_some());
    Ok(vname)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn spec() -> VirtualMachineInstanceSpec {
        typed(json!({"domain": {"devices": {"disks": [{"name": "root"}, {"name": "cd", "cdrom": {"bus": "sata"}}]}},
               "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "root"}}]}))
    }

    #[test]
    fn add_then_remove_round_trips_and_a_medium_keeps_its_drive() {
        let mut s = spec();
        let hp = |c: &str| typed(json!({"name": c, "persistentVolumeClaim": {"claimName": c, "hotpluggable": true}}));
        add(&mut s, typed(json!({"name": "data", "disk": {"bus": "scsi"}})), hp("data")).unwrap();
        add(&mut s, typed(json!({"name": "cd", "cdrom": {"bus": "scsi"}})), hp("cd")).unwrap();
        assert_eq!(s.domain.devices.disks.len(), 3, "the medium went into the existing drive");
        assert_eq!(remove(&mut s, "cd").unwrap(), "cd");
        assert_eq!(remove(&mut s, "data").unwrap(), "data");
        assert_eq!(s, spec());
    }

    #[test]
    fn refusals_carry_kubevirts_messages() {
        let mut s = spec();
        let v = typed(json!({"name": "x", "persistentVolumeClaim": {"claimName": "root", "hotpluggable": true}}));
        assert_eq!(
            add(&mut s, typed(json!({"name": "x"})), v).unwrap_err().0,
            "Unable to add volume source [root] because it already exists"
        );
        assert_eq!(remove(&mut s, "root").unwrap_err().0, "Unable to remove volume [root] because it is not hotpluggable");
        assert_eq!(remove(&mut s, "nope").unwrap_err().0, "Unable to remove volume [nope] because it does not exist");
        assert_eq!(s, spec(), "a refused edit changes nothing");
    }
}
