//! The typed shape of a status write: `status` must decode as the resource's status type, as
//! a CRD's structural schema (and kube-apiserver's typed decoding of core resources) require.
//!
//! # Why
//! Every component reads objects through typed Kubernetes clients: one object whose status does
//! not decode (`"status": {"conditions": "oops"}`, `"status": 5`) makes every list of its
//! resource fail to decode, so a controller or node agent that lists again (after a restart or a
//! 410) sees none of the resource's objects. Main writes of VMs, VMIs and DataVolumes are
//! decoded whole by their validators already; this closes the status subresource.
//!
//! # Errors
//! 422 Invalid with the field path of the first value that does not decode (`status.conditions`).

use serde_json::Value;

use api::validation::{decode_causes, Cause};
use k8s_openapi::api::core::v1::{NamespaceStatus, NodeStatus, PersistentVolumeClaimStatus};

use crate::registry::ResourceDef;

/// The causes why `obj`'s `status` does not decode as `def`'s status type (none when it does or
/// when `def` has no typed status here).
#[must_use]
pub fn status_causes(def: &ResourceDef, obj: &Value) -> Vec<Cause> {
    let Some(status) = obj.get("status") else { return Vec::new() };
    match def.kind {
        "VirtualMachine" => decode_causes::<api::kubevirt::VirtualMachineStatus>(status, "status"),
        "VirtualMachineInstance" => decode_causes::<api::kubevirt::VirtualMachineInstanceStatus>(status, "status"),
        "DataVolume" => decode_causes::<api::cdi::DataVolumeStatus>(status, "status"),
        "PersistentVolumeClaim" => decode_causes::<PersistentVolumeClaimStatus>(status, "status"),
        "Node" => decode_causes::<NodeStatus>(status, "status"),
        "Namespace" => decode_causes::<NamespaceStatus>(status, "status"),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::registry;

    #[test]
    fn a_status_of_the_wrong_shape_is_named_by_its_field() {
        let vm = registry::find("kubevirt.io", "v1", "virtualmachines").unwrap_or_else(|| panic!("VMs are served"));
        let ns = registry::find("", "v1", "namespaces").unwrap_or_else(|| panic!("namespaces are served"));
        assert!(status_causes(vm, &json!({"status": {"printableStatus": "Running", "conditions": []}})).is_empty());
        assert!(status_causes(vm, &json!({"spec": {}})).is_empty(), "no status: nothing to decode");
        let c = status_causes(vm, &json!({"status": {"conditions": "oops"}}));
        assert_eq!(c.iter().map(|c| c.field.as_str()).collect::<Vec<_>>(), ["status.conditions"]);
        assert_eq!(status_causes(ns, &json!({"status": "Terminating"}))[0].field, "status");
    }
}
