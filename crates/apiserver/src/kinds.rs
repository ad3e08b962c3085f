//! Rules of core kinds beyond the generic verbs: what kube-apiserver's REST strategy for each
//! kind does (defaulting, conversion of write-only fields, validation on create and update), as a
//! [`Strategy`](crate::registry::Strategy) that [`crate::registry::RESOURCES`] points to, and
//! the description of the kind's protobuf message where kubectl sends it so.
//!
//! One file per kind; a kind without special rules needs none. [`review`] holds the access
//! reviews, which are answered, not stored.

pub mod configmap;
pub mod event;
pub mod lease;
pub mod namespace;
pub mod persistentvolume;
pub mod pod;
pub mod rbac;
pub mod review;
pub mod secret;
pub mod service;
pub mod serviceaccount;
pub mod storageclass;

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

/// Longest config key (`validation.IsConfigMapKey`).
pub const MAX_KEY_LEN: usize = 253;

/// `validation.IsConfigMapKey` for key `key` of the map at `map` (`data`, `binaryData`).
#[must_use]
pub fn config_key_causes(map: &str, key: &str) -> Vec<Cause> {
    let field = format!("{map}[{key}]");
    if key.len() > MAX_KEY_LEN {
        return vec![Cause::new(CauseType::TooLong, field, format!("key is {} characters long; at most {MAX_KEY_LEN}", key.len()))];
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if key.is_empty() || !key.chars().all(allowed) {
        return vec![Cause::new(
            CauseType::Invalid,
            field,
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name', or 'KEY_NAME', \
             or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
        )];
    }
    if key == "." || key == ".." {
        return vec![Cause::new(CauseType::Invalid, field, format!("must not be '{key}'"))];
    }
    Vec::new()
}

/// Whether `obj` decodes as the Kubernetes type `T` (what every typed client does with it): the
/// first field of the wrong shape, named, or nothing.
#[must_use]
pub fn typed_causes<T: serde::de::DeserializeOwned>(obj: &Value) -> Vec<Cause> {
    api::validation::decode_causes::<T>(obj, "")
}

/// A schema that names the top-level fields; the served documents use the full one where
/// [`crate::openapi`] has it.
#[must_use]
pub fn object_schema() -> Value {
    json!({"type": "object",
           "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}})
}

/// Nothing an update may not change beyond the generic rules.
#[must_use]
pub fn no_update_rules(_old: &Value, _new: &Value) -> Vec<Cause> {
    Vec::new()
}

/// No defaults or write-only fields.
#[must_use]
pub fn no_normalize(_obj: &mut Value) -> Vec<Cause> {
    Vec::new()
}

/// Sets `obj[ptr]` to `value` when it is missing or null (`ptr` a JSON pointer of object keys).
pub fn default(obj: &mut Value, ptr: &str, value: Value) {
    let mut cur = obj;
    let keys: Vec<&str> = ptr.split('/').skip(1).collect();
    for (i, k) in keys.iter().enumerate() {
        let Some(map) = cur.as_object_mut() else { return };
        if i + 1 == keys.len() {
            if map.get(*k).is_none_or(Value::is_null) {
                map.insert((*k).to_owned(), value);
            }
            return;
        }
        cur = map.entry((*k).to_owned()).or_insert_with(|| json!({}));
    }
}

/// A field whose value may not change: the cause, or nothing.
#[must_use]
pub fn immutable(old: &Value, new: &Value, ptr: &str, field: &str) -> Option<Cause> {
    (old.pointer(ptr) != new.pointer(ptr)).then(|| Cause::new(CauseType::Invalid, field, "field is immutable"))
}
