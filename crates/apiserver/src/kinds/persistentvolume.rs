//! core/v1 `PersistentVolume`, cluster-scoped, with its status subresource. The local
//! provisioner creates one per claim it provisions and binds the two (`spec.claimRef`,
//! `spec.volumeName`, both `Bound`), as a CSI external-provisioner and the PV controller do.
//!
//! # Guarantees
//! - Defaults `persistentVolumeReclaimPolicy: Retain` (Kubernetes' for a PV made by hand; the
//!   provisioner sets its class's policy), `volumeMode: Filesystem`; a new PV is `Pending`
//!   until the provisioner or binder writes its status, as kube-apiserver has it.
//! - `spec.capacity.storage`, `spec.accessModes` and exactly one volume source are required;
//!   the volume source cannot change.

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::registry::Strategy;

/// The volume sources virtplug's consumers can use, and the common ones a manifest may carry.
const SOURCES: [&str; 8] = ["hostPath", "local", "csi", "nfs", "iscsi", "fc", "rbd", "cephfs"];

/// The PersistentVolume strategy.
pub static STRATEGY: Strategy = Strategy { normalize, validate_update, schema: super::object_schema, from_protobuf: None };

/// Kubernetes' defaults, and the status of a new PV.
#[must_use]
pub fn normalize(obj: &mut Value) -> Vec<Cause> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        return Vec::new();
    }
    super::default(obj, "/spec/persistentVolumeReclaimPolicy", json!("Retain"));
    super::default(obj, "/spec/volumeMode", json!("Filesystem"));
    if obj.get("status").is_none_or(Value::is_null) {
        obj["status"] = json!({"phase": "Pending"});
    }
    Vec::new()
}

/// Validates a whole PersistentVolume.
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = super::typed_causes::<k8s_openapi::api::core::v1::PersistentVolume>(obj);
    if !causes.is_empty() {
        return causes;
    }
    if obj.pointer("/spec/capacity/storage").and_then(Value::as_str).is_none_or(|q| api::quantity::bytes(q).is_err()) {
        causes.push(Cause::new(CauseType::Required, "spec.capacity.storage", "the volume's size, as a quantity (e.g. 10Gi)"));
    }
    if obj.pointer("/spec/accessModes").and_then(Value::as_array).is_none_or(Vec::is_empty) {
        causes.push(Cause::new(
            CauseType::Required,
            "spec.accessModes",
            "at least one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod",
        ));
    }
    let sources: Vec<&str> = SOURCES.iter().copied().filter(|s| obj.pointer(&format!("/spec/{s}")).is_some_and(|v| !v.is_null())).collect();
    match sources.len() {
        0 => causes.push(Cause::new(CauseType::Required, "spec", "must specify a volume type (e.g. hostPath, local or csi)")),
        1 => {}
        _ => causes.push(Cause::new(CauseType::Forbidden, format!("spec.{}", sources[1]), "may not specify more than 1 volume type")),
    }
    if let Some(p) = obj.pointer("/spec/persistentVolumeReclaimPolicy").and_then(Value::as_str) {
        if !["Delete", "Retain", "Recycle"].contains(&p) {
            causes.push(Cause::new(
                CauseType::NotSupported,
                "spec.persistentVolumeReclaimPolicy",
                "supported values: \"Delete\", \"Recycle\", \"Retain\"",
            ));
        }
    }
    causes
}

/// The volume source and mode cannot change.
#[must_use]
pub fn validate_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes: Vec<Cause> =
        SOURCES.iter().filter_map(|s| super::immutable(old, new, &format!("/spec/{s}"), &format!("spec.{s}"))).collect();
    causes.extend(super::immutable(old, new, "/spec/volumeMode", "spec.volumeMode"));
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn a_pv_needs_size_modes_and_one_source() {
        let mut pv = json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}});
        assert!(normalize(&mut pv).is_empty());
        assert!(validate(&pv).is_empty(), "{:?}", validate(&pv));
        assert_eq!(pv["status"], json!({"phase": "Pending"}));
        assert_eq!(fields(&validate(&json!({"spec": {}}))), ["spec.capacity.storage", "spec.accessModes", "spec"]);
        let two = json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}, "local": {"path": "/y"}}});
        assert_eq!(fields(&validate(&two)), ["spec.local"]);
        let mut moved = pv.clone();
        moved["spec"]["hostPath"]["path"] = json!("/z");
        assert_eq!(fields(&validate_update(&pv, &moved)), ["spec.hostPath"]);
    }
}
