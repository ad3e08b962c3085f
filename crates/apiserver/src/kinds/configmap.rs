//! core/v1 `ConfigMap`, as kube-apiserver validates it (`ValidateConfigMap`).
//!
//! # Guarantees
//! - Keys of `data` and `binaryData` are config keys and no key is in both; `binaryData` values
//!   are base64; keys and values together are at most 1 MiB.
//! - `immutable: true` freezes `data`, `binaryData` and itself.

use base64::Engine;
use serde_json::{json, Map, Value};

use api::validation::{Cause, CauseType};

use crate::protobuf::message::{f, ptr, Message, Ty, BYTES_MAP, OBJECT_META, STR_MAP};
use crate::registry::Strategy;

/// Largest total of keys and values (kube-apiserver checks ConfigMaps against `MaxSecretSize`).
pub const MAX_SIZE: usize = 1024 * 1024;

/// `ConfigMap` (metadata 1, data 2, binaryData 3, immutable 4), as `kubectl create configmap`
/// sends it from 1.32 on.
pub static PROTOBUF: Message = Message {
    name: "ConfigMap",
    fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "data", STR_MAP), f(3, "binaryData", BYTES_MAP), ptr(4, "immutable", Ty::Bool)],
    skip: &[],
};

/// The ConfigMap strategy.
pub static STRATEGY: Strategy =
    Strategy { normalize: super::no_normalize, validate_update, schema: super::object_schema, from_protobuf: Some(&PROTOBUF) };

/// Validates a whole ConfigMap.
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let empty = Map::new();
    let map = |field: &str, causes: &mut Vec<Cause>| -> Map<String, Value> {
        match obj.get(field) {
            None | Some(Value::Null) => empty.clone(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                causes.push(Cause::new(CauseType::Invalid, field, "must be an object of strings (key: value)"));
                empty.clone()
            }
        }
    };
    let data = map("data", &mut causes);
    let binary = map("binaryData", &mut causes);
    let mut total = 0usize;
    for (k, v) in &data {
        causes.extend(super::config_key_causes("data", k));
        match v {
            Value::String(s) => total += k.len() + s.len(),
            _ => causes.push(Cause::new(CauseType::Invalid, format!("data[{k}]"), "must be a string (quote numbers and booleans)")),
        }
    }
    for (k, v) in &binary {
        causes.extend(super::config_key_causes("binaryData", k));
        if data.contains_key(k) {
            causes.push(Cause::new(
                CauseType::Duplicate,
                format!("binaryData[{k}]"),
                "the key is also in data; a key may be in one of them",
            ));
        }
        match v.as_str().map(|s| base64::engine::general_purpose::STANDARD.decode(s)) {
            Some(Ok(bytes)) => total += k.len() + bytes.len(),
            _ => causes.push(Cause::new(CauseType::Invalid, format!("binaryData[{k}]"), "must be a base64-encoded string")),
        }
    }
    if obj.get("immutable").is_some_and(|v| !v.is_boolean() && !v.is_null()) {
        causes.push(Cause::new(CauseType::Invalid, "immutable", "must be true or false"));
    }
    if total > MAX_SIZE {
        causes.push(Cause::new(
            CauseType::TooLong,
            "data",
            format!("Too long: must have at most {MAX_SIZE} bytes (keys and values are {total})"),
        ));
    }
    causes
}

/// An immutable ConfigMap keeps its data and stays immutable.
#[must_use]
pub fn validate_update(old: &Value, new: &Value) -> Vec<Cause> {
    let immutable = |o: &Value| o.get("immutable").and_then(Value::as_bool) == Some(true);
    if !immutable(old) {
        return Vec::new();
    }
    let mut causes = Vec::new();
    if !immutable(new) {
        causes.push(Cause::new(CauseType::Forbidden, "immutable", "field is immutable when `immutable` is set"));
    }
    for field in ["data", "binaryData"] {
        let get = |o: &Value| o.get(field).filter(|d| !d.is_null()).cloned().unwrap_or_else(|| json!({}));
        if get(old) != get(new) {
            causes.push(Cause::new(
                CauseType::Forbidden,
                field,
                "field is immutable when `immutable` is set: delete the ConfigMap and create it with the new data",
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn keys_values_and_the_two_maps_are_checked() {
        let cm = json!({"data": {"ok": "1", "bad key": "x", "n": 5, "both": "x"}, "binaryData": {"both": "AA==", "raw": "not base64!"}});
        assert_eq!(fields(&validate(&cm)), ["data[bad key]", "data[n]", "binaryData[both]", "binaryData[raw]"]);
        assert!(validate(&json!({"data": {"a.b": "x"}, "binaryData": {"c": "AP8="}})).is_empty());
    }

    #[test]
    fn an_immutable_config_map_keeps_its_data() {
        let old = json!({"immutable": true, "data": {"a": "x"}});
        assert!(validate_update(&old, &json!({"immutable": true, "data": {"a": "x"}, "metadata": {"labels": {"l": "v"}}})).is_empty());
        assert_eq!(fields(&validate_update(&old, &json!({"immutable": true, "data": {"a": "y"}}))), ["data"]);
        assert_eq!(fields(&validate_update(&old, &json!({"data": {"a": "x"}}))), ["immutable"]);
    }
}
