//! Self-heal of VM specs: what [`api::invariants`] finds is reported, and the one break that
//! has a safe repair — a CD-ROM medium whose drive (disk) was lost, the corruption that two
//! merge-patch writers produce (kubevirt-redfish) — is repaired when the volume is known to be
//! virtual media.
//!
//! The mark: the VM annotation [`VIRTUAL_MEDIA`], a comma-separated list of volume names that
//! the Redfish service inserted as virtual media. Only those get a drive re-added; any other
//! volume without a disk is reported, never guessed at.

use api::kubevirt::Disk;
use api::validation::Cause;
use api::VirtualMachine;

pub use api::virtual_media::{marked, VIRTUAL_MEDIA};
/// The VM condition that reports invariant violations (present only while there are some).
pub const CONDITION: &str = "SpecValid";

/// The CD-ROM drives to re-add to `vm`'s template: one per marked volume that exists and has no
/// disk, on the SATA bus (KubeVirt's rule for a hot-pluggable CD-ROM medium: its drive exists
/// from boot and media are swapped in it).
#[must_use]
pub fn missing_drives(vm: &VirtualMachine) -> Vec<Disk> {
    let Some(spec) = vm.spec.template.spec.as_ref() else { return Vec::new() };
    marked(vm)
        .into_iter()
        .filter(|m| spec.volumes.iter().any(|v| v.name == *m) && !spec.domain.devices.disks.iter().any(|d| d.name == *m))
        .map(|m| api::virtual_media::drive(&m))
        .collect()
}

/// The invariant violations of `vm`'s template.
#[must_use]
pub fn violations(vm: &api::VirtualMachine) -> Vec<Cause> {
    vm.spec.template.spec.as_ref().map(|s| api::invariants::check(s, "spec.template.spec")).unwrap_or_default()
}

/// One line naming every violation (the condition's and the Event's message).
#[must_use]
pub fn describe(causes: &[Cause]) -> String {
    causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vm(annotation: Option<&str>) -> VirtualMachine {
        let mut vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "v"}, "spec": {"template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root"}]}},
            "volumes": [{"name": "root"}, {"name": "cdrom0", "dataVolume": {"name": "iso", "hotpluggable": true}}, {"name": "other"}]}}}});
        if let Some(a) = annotation {
            vm["metadata"]["annotations"] = json!({VIRTUAL_MEDIA: a});
        }
        serde_json::from_value(vm).unwrap()
    }

    #[test]
    fn only_marked_volumes_without_a_disk_get_a_drive() {
        assert!(missing_drives(&vm(None)).is_empty(), "unmarked: reported, not repaired");
        let drives = serde_json::to_value(missing_drives(&vm(Some("cdrom0, gone")))).unwrap();
        assert_eq!(drives, json!([{"name": "cdrom0", "cdrom": {"bus": "sata", "readonly": true}}]));
        assert!(missing_drives(&vm(Some("root"))).is_empty(), "root has its disk");
    }
}
