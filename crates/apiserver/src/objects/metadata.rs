//! The metadata rules of a write: the type fields a body must carry, the label and annotation
//! checks, and the fields only the server sets (identity, `resourceVersion`, `generation`) or
//! that belong to the other part (status on a main write and the reverse).

use serde_json::{json, Map, Value};

use crate::registry::ResourceDef;
use crate::status::ApiError;

/// Which part of the object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Everything but `status` (for resources with a status subresource).
    Main,
    /// Only `status`.
    Status,
}

/// The object's `metadata` (`null` when it has none).
pub(super) fn meta(obj: &Value) -> &Value {
    obj.get("metadata").unwrap_or(&Value::Null)
}

/// The object's `metadata`, made an object first if it is not one.
pub(super) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    // Callers pass objects (`check_type`, `not_an_object`); anything else would make `obj[..]`
    // panic, so it is replaced rather than indexed.
    if !obj.is_object() {
        *obj = json!({});
    }
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// Checks labels and annotations ([`crate::labels`]) when they are new or changed from `prev`:
/// an object stored before the rules were enforced can still be written without touching them.
pub(super) fn check_metadata(def: &ResourceDef, name: &str, obj: &Value, prev: Option<&Value>) -> Result<(), ApiError> {
    let same = |field: &str| prev.is_some_and(|p| meta(p).get(field) == meta(obj).get(field));
    if same("labels") && same("annotations") {
        return Ok(());
    }
    let causes = crate::labels::causes(obj)?;
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def.group, def.kind, name, &causes))
    }
}

/// Sets or checks `apiVersion` and `kind` of a body for `def`.
pub fn check_type(def: &ResourceDef, obj: &mut Value) -> Result<(), ApiError> {
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(format!("the body must be a JSON or YAML object of kind {}", def.kind)));
    };
    let want_av = def.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), json!(want_av));
        }
        Some(av) if av != want_av => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )));
        }
        Some(_) => {}
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(def.kind));
        }
        Some(k) if k != def.kind => {
            return Err(ApiError::bad_request(format!("the kind in the data ({k}) does not match the expected kind ({})", def.kind)));
        }
        Some(_) => {}
    }
    if map.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

/// Whether two objects are equal outside `metadata` and `status` (what moves `generation`),
/// compared in place: no copy of either.
fn same_spec(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return a == b };
    let outside = |k: &String| k != "metadata" && k != "status";
    a.keys().filter(|k| outside(k)).count() == b.keys().filter(|k| outside(k)).count()
        && a.iter().filter(|(k, _)| outside(k)).all(|(k, v)| b.get(k) == Some(v))
}

/// Builds the object to store from the current one and what the client sent: identity fields
/// stay the server's, status writes change only status, main writes keep the old status, and
/// `generation` moves when the spec changes.
pub(super) fn merge_server_fields(def: &ResourceDef, cur: &Value, sent: Value, part: Part) -> Value {
    let mut new = if part == Part::Status {
        let mut n = cur.clone();
        n["status"] = sent.get("status").cloned().unwrap_or(Value::Null);
        if n["status"].is_null() {
            if let Some(o) = n.as_object_mut() {
                o.remove("status");
            }
        }
        n
    } else {
        let mut n = sent;
        if def.status {
            match cur.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(o) = n.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
        n
    };
    // Borrowed, not cloned: metadata carries managedFields, often the object's largest part.
    let old_meta = meta(cur);
    let m = meta_mut(&mut new);
    for field in ["name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"] {
        match old_meta.get(field) {
            Some(v) => {
                m.insert(field.into(), v.clone());
            }
            None => {
                m.remove(field);
            }
        }
    }
    m.insert("resourceVersion".into(), old_meta.get("resourceVersion").cloned().unwrap_or(Value::Null));
    if part == Part::Main && old_meta.get("generation").is_some() && !same_spec(cur, &new) {
        let g = old_meta.get("generation").and_then(Value::as_i64).unwrap_or(1).saturating_add(1);
        meta_mut(&mut new).insert("generation".into(), json!(g));
    }
    new
}

#[cfg(test)]
mod tests {
    use super::same_spec;
    use serde_json::json;

    #[test]
    fn same_spec_ignores_metadata_and_status_only() {
        let a = json!({"kind": "VirtualMachine", "metadata": {"name": "a", "managedFields": [1]}, "spec": {"x": 1}, "status": {"s": 1}});
        assert!(same_spec(&a, &json!({"kind": "VirtualMachine", "metadata": {"name": "b"}, "spec": {"x": 1}})));
        assert!(!same_spec(&a, &json!({"kind": "VirtualMachine", "metadata": {}, "spec": {"x": 2}})), "a changed field");
        assert!(!same_spec(&a, &json!({"kind": "VirtualMachine", "metadata": {}})), "a removed field");
        assert!(!same_spec(&a, &json!({"kind": "VirtualMachine", "spec": {"x": 1}, "data": {}})), "an added field");
    }
}
