//! `storage.k8s.io/v1` `StorageClass`. The server creates the default class [`LOCAL`] at first
//! start: the local provisioner's (`virtplug.io/local`), annotated as the default class, so a
//! claim without `storageClassName` is the local provisioner's, as before.
//!
//! # Guarantees
//! - Defaults `reclaimPolicy: Delete` and `volumeBindingMode: Immediate`.
//! - `provisioner` is required; `reclaimPolicy` is Delete or Retain; `volumeBindingMode` is
//!   Immediate or WaitForFirstConsumer.
//! - `provisioner`, `parameters`, `reclaimPolicy` and `volumeBindingMode` cannot change.

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::registry::Strategy;

/// The default class, served by the local provisioner.
pub const LOCAL: &str = "local";
/// The local provisioner's name.
pub const LOCAL_PROVISIONER: &str = "virtplug.io/local";
/// The annotation that marks the default class.
pub const DEFAULT_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// The StorageClass strategy.
pub static STRATEGY: Strategy = Strategy { normalize, validate_update, schema: super::object_schema, from_protobuf: None };

/// The class the server creates at first start.
#[must_use]
pub fn local() -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": LOCAL, "annotations": {DEFAULT_ANNOTATION: "true"}},
        "provisioner": LOCAL_PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": false,
    })
}

/// Kubernetes' defaults.
#[must_use]
pub fn normalize(obj: &mut Value) -> Vec<Cause> {
    super::default(obj, "/reclaimPolicy", json!("Delete"));
    super::default(obj, "/volumeBindingMode", json!("Immediate"));
    Vec::new()
}

/// Validates a whole StorageClass.
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = super::typed_causes::<k8s_openapi::api::storage::v1::StorageClass>(obj);
    if !causes.is_empty() {
        return causes;
    }
    match obj.get("provisioner").and_then(Value::as_str) {
        None | Some("") => causes.push(Cause::new(CauseType::Required, "provisioner", "name the provisioner (e.g. virtplug.io/local)")),
        Some(p) => causes.extend(api::validation::dns1123_subdomain(&p.replace('/', "."), "provisioner")),
    }
    for (field, allowed) in [("reclaimPolicy", &["Delete", "Retain"][..]), ("volumeBindingMode", &["Immediate", "WaitForFirstConsumer"])] {
        if let Some(v) = obj.get(field).and_then(Value::as_str) {
            if !allowed.contains(&v) {
                let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
                causes.push(Cause::new(CauseType::NotSupported, field, format!("supported values: {}", list.join(", "))));
            }
        }
    }
    causes
}

/// What a StorageClass may not change.
#[must_use]
pub fn validate_update(old: &Value, new: &Value) -> Vec<Cause> {
    ["provisioner", "parameters", "reclaimPolicy", "volumeBindingMode"]
        .into_iter()
        .filter_map(|f| super::immutable(old, new, &format!("/{f}"), f))
        .collect()
}

/// Whether `sc` is marked as the default class.
#[must_use]
pub fn is_default(sc: &Value) -> bool {
    sc.pointer("/metadata/annotations").and_then(|a| a.get(DEFAULT_ANNOTATION)).and_then(Value::as_str) == Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_class_is_valid_and_its_rules_hold() {
        let mut sc = local();
        assert!(normalize(&mut sc).is_empty());
        assert!(validate(&sc).is_empty(), "{:?}", validate(&sc));
        assert!(is_default(&sc));
        let mut changed = sc.clone();
        changed["reclaimPolicy"] = json!("Retain");
        let f: Vec<String> = validate_update(&sc, &changed).into_iter().map(|c| c.field).collect();
        assert_eq!(f, ["reclaimPolicy"]);
        let bad = json!({"provisioner": "", "volumeBindingMode": "Later"});
        let f: Vec<String> = validate(&bad).into_iter().map(|c| c.field).collect();
        assert_eq!(f, ["provisioner", "volumeBindingMode"]);
    }
}
