//! Self-heal of VM specs: what [`api::invariants`] finds is reported, and the one break that
//! has a safe repair — a CD-ROM medium whose drive (disk) was lost, the corruption that two
//! merge-patch writers produce (kubevirt-redfish) — is repaired when the volume is known to be
//! virtual media.
//!
//! The mark: the VM annotation [`VIRTUAL_MEDIA`], a comma-separated list of volume names that
//! the Redfish service inserted as virtual media. Only those get a drive re-added; any other
//! volume without a disk is reported, never guessed at.

use serde_json::{json, Value};

use api::validation::Cause;

/// VM annotation: comma-separated names of volumes inserted as virtual media.
pub const VIRTUAL_MEDIA: &str = "virtplug.io/virtual-media";
/// The VM condition that reports invariant violations (present only while there are some).
pub const CONDITION: &str = "SpecValid";

/// The volumes marked as virtual media on `vm`.
#[must_use]
pub fn marked(vm: &Value) -> Vec<String> {
    vm.pointer("/metadata/annotations")
        .and_then(|a| a.get(VIRTUAL_MEDIA))
        .and_then(Value::as_str)
        .map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The CD-ROM drives to re-add to `vm`'s template: one per marked volume that exists and has no
/// disk, on the SATA bus (KubeVirt's rule for a hot-pluggable CD-ROM medium: its drive exists
/// from boot and media are swapped in it).
#[must_use]
pub fn missing_drives(vm: &Value) -> Vec<Value> {
    let spec = vm.pointer("/spec/template/spec").unwrap_or(&Value::Null);
    let names = |ptr: &str| -> Vec<String> {
        spec.pointer(ptr)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.get("name").and_then(Value::as_str)).map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let (volumes, disks) = (names("/volumes"), names("/domain/devices/disks"));
    marked(vm)
        .into_iter()
        .filter(|m| volumes.contains(m) && !disks.contains(m))
        .map(|m| json!({"name": m, "cdrom": {"bus": "sata", "readonly": true}}))
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
    use super::*;

    fn vm(annotation: Option<&str>) -> Value {
        let mut vm = json!({"metadata": {"name": "v"}, "spec": {"template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root"}]}},
            "volumes": [{"name": "root"}, {"name": "cdrom0", "dataVolume": {"name": "iso", "hotpluggable": true}}, {"name": "other"}]}}}});
        if let Some(a) = annotation {
            vm["metadata"]["annotations"] = json!({VIRTUAL_MEDIA: a});
        }
        vm
    }

    #[test]
    fn only_marked_volumes_without_a_disk_get_a_drive() {
        assert!(missing_drives(&vm(None)).is_empty(), "unmarked: reported, not repaired");
        assert_eq!(missing_drives(&vm(Some("cdrom0, gone"))), [json!({"name": "cdrom0", "cdrom": {"bus": "sata", "readonly": true}})]);
        assert!(missing_drives(&vm(Some("root"))).is_empty(), "root has its disk");
    }
}
