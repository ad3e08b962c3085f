//! core/v1 `Secret`, as kube-apiserver stores it (`pkg/registry/core/secret/strategy.go`,
//! `pkg/apis/core/validation.ValidateSecret`).
//!
//! # Guarantees
//! - `type` defaults to `Opaque` and cannot change on update.
//! - `stringData` is write-only: each entry is folded into `data` (base64-encoded, overriding a
//!   `data` entry of the same key) on create, update and patch, and never stored or returned.
//! - Every `data` value is a base64 string (RFC 4648 standard alphabet with padding, as Go's
//!   `[]byte` JSON decoding wants); keys are config keys (`[-._a-zA-Z0-9]+`, not `.` or `..`,
//!   at most 253 characters); keys plus decoded values are at most 1 MiB.
//! - The built-in types (`kubernetes.io/tls`, `.../ssh-auth`, `.../basic-auth`,
//!   `.../dockercfg`, `.../dockerconfigjson`, `.../service-account-token`) carry their required
//!   keys or annotation.
//! - `immutable: true` freezes `data` and itself.
//!
//! # Deviations
//! A value that is not base64 is 422 Invalid naming `data[KEY]`; kube-apiserver fails to decode
//! the body (400) with a message that names no field.

use base64::Engine;
use serde_json::{json, Map, Value};

use api::validation::{Cause, CauseType};

use crate::protobuf::message::{f, ptr, Message, Ty, BYTES_MAP, OBJECT_META, STR_MAP};
use crate::registry::Strategy;

/// The type a Secret without one gets.
pub const DEFAULT_TYPE: &str = "Opaque";
/// Largest total of keys and decoded values (kube-apiserver's `MaxSecretSize`).
pub const MAX_SECRET_SIZE: usize = 1024 * 1024;
/// Longest key (`validation.IsConfigMapKey`).
pub const MAX_KEY_LEN: usize = super::MAX_KEY_LEN;

/// The Secret strategy.
pub static STRATEGY: Strategy = Strategy { normalize, validate_update, schema, from_protobuf: Some(&PROTOBUF) };

/// Defaults `type` and folds `stringData` into `data`; returns what is malformed in
/// `stringData` (then nothing is folded).
#[must_use]
pub fn normalize(obj: &mut Value) -> Vec<Cause> {
    let Some(map) = obj.as_object_mut() else { return Vec::new() };
    if map.get("type").is_none_or(|t| t.is_null() || t.as_str() == Some("")) {
        map.insert("type".into(), json!(DEFAULT_TYPE));
    }
    let Some(string_data) = map.remove("stringData") else { return Vec::new() };
    let entries = match string_data {
        Value::Null => return Vec::new(),
        Value::Object(m) => m,
        _ => return vec![Cause::new(CauseType::Invalid, "stringData", "must be an object of strings (key: value)")],
    };
    let mut causes = Vec::new();
    let mut folded = Map::new();
    for (k, v) in entries {
        match v {
            Value::String(s) => {
                folded.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(s)));
            }
            _ => causes.push(Cause::new(CauseType::Invalid, format!("stringData[{k}]"), "must be a string")),
        }
    }
    if !causes.is_empty() {
        return causes;
    }
    if folded.is_empty() {
        return Vec::new();
    }
    if map.get("data").is_none_or(Value::is_null) {
        map.insert("data".into(), json!({}));
    }
    // `data` of another shape is left as is: `validate` refuses it, naming it.
    if let Some(Value::Object(data)) = map.get_mut("data") {
        data.extend(folded);
    }
    causes
}

/// Validates a whole Secret (create and update).
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let ty = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        None | Some(Value::Null) => DEFAULT_TYPE,
        Some(_) => {
            causes.push(Cause::new(CauseType::Invalid, "type", "must be a string such as \"Opaque\""));
            DEFAULT_TYPE
        }
    };
    if obj.get("immutable").is_some_and(|v| !v.is_boolean() && !v.is_null()) {
        causes.push(Cause::new(CauseType::Invalid, "immutable", "must be true or false"));
    }
    let empty = Map::new();
    let data = match obj.get("data") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(d)) => d,
        Some(_) => {
            causes.push(Cause::new(CauseType::Invalid, "data", "must be an object of base64-encoded strings (key: value)"));
            &empty
        }
    };
    let mut total = 0usize;
    for (k, v) in data {
        causes.extend(super::config_key_causes("data", k));
        let field = format!("data[{k}]");
        match v {
            Value::String(s) => match base64::engine::general_purpose::STANDARD.decode(s) {
                Ok(bytes) => total += k.len() + bytes.len(),
                Err(e) => causes.push(Cause::new(
                    CauseType::Invalid,
                    field,
                    format!("is not base64 ({e}): encode the value (e.g. `base64 -w0`), or send it in stringData as plain text"),
                )),
            },
            Value::Null => {}
            _ => causes.push(Cause::new(CauseType::Invalid, field, "must be a base64-encoded string")),
        }
    }
    if total > MAX_SECRET_SIZE {
        causes.push(Cause::new(
            CauseType::TooLong,
            "data",
            format!("Too long: must have at most {MAX_SECRET_SIZE} bytes (keys and decoded values are {total})"),
        ));
    }
    causes.extend(type_causes(obj, ty, data));
    causes
}

/// The keys (or annotation) a built-in type requires.
fn type_causes(obj: &Value, ty: &str, data: &Map<String, Value>) -> Vec<Cause> {
    let need = |keys: &[&str]| -> Vec<Cause> {
        keys.iter()
            .filter(|k| !data.contains_key(**k))
            .map(|k| Cause::new(CauseType::Required, format!("data[{k}]"), format!("a Secret of type {ty} needs the key {k}")))
            .collect()
    };
    match ty {
        "kubernetes.io/tls" => need(&["tls.crt", "tls.key"]),
        "kubernetes.io/ssh-auth" => need(&["ssh-privatekey"]),
        "kubernetes.io/dockercfg" => need(&[".dockercfg"]),
        "kubernetes.io/dockerconfigjson" => need(&[".dockerconfigjson"]),
        "kubernetes.io/basic-auth" if !data.contains_key("username") && !data.contains_key("password") => {
            vec![Cause::new(CauseType::Required, "data[username]", "a Secret of type kubernetes.io/basic-auth needs username or password")]
        }
        "kubernetes.io/service-account-token"
            if obj
                .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            vec![Cause::new(
                CauseType::Required,
                "metadata.annotations[kubernetes.io/service-account.name]",
                "a Secret of type kubernetes.io/service-account-token names its service account in this annotation",
            )]
        }
        _ => Vec::new(),
    }
}

/// What an update may not change: `type`, and an immutable Secret's `data` and `immutable`.
#[must_use]
pub fn validate_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let ty = |o: &Value| o.get("type").and_then(Value::as_str).unwrap_or(DEFAULT_TYPE).to_owned();
    if ty(old) != ty(new) {
        causes.push(Cause::new(
            CauseType::Invalid,
            "type",
            format!("field is immutable (it is {:?}): delete the Secret and create it with the new type", ty(old)),
        ));
    }
    let immutable = |o: &Value| o.get("immutable").and_then(Value::as_bool) == Some(true);
    if immutable(old) {
        if !immutable(new) {
            causes.push(Cause::new(CauseType::Forbidden, "immutable", "field is immutable when `immutable` is set"));
        }
        let data = |o: &Value| o.get("data").filter(|d| !d.is_null()).cloned().unwrap_or_else(|| json!({}));
        if data(old) != data(new) {
            causes.push(Cause::new(
                CauseType::Forbidden,
                "data",
                "field is immutable when `immutable` is set: delete the Secret and create it with the new data",
            ));
        }
    }
    causes
}

/// A Secret in protobuf (`k8s.io/api/core/v1` `Secret`), as kubectl 1.32 and later send
/// `kubectl create secret`.
pub static PROTOBUF: Message = Message {
    name: "Secret",
    fields: &[
        f(1, "metadata", Ty::Msg(&OBJECT_META)),
        f(2, "data", BYTES_MAP),
        f(3, "type", Ty::Str),
        f(4, "stringData", STR_MAP),
        ptr(5, "immutable", Ty::Bool),
    ],
    skip: &[],
};

/// The OpenAPI v3 schema (`io.k8s.api.core.v1.Secret`, k8s-openapi's, see [`crate::openapi::core`]).
#[must_use]
pub fn schema() -> Value {
    crate::openapi::core_schema("", "v1", "Secret").unwrap_or_else(|| json!({"type": "object"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn string_data_is_folded_over_data_and_type_defaults() {
        let mut s = json!({"data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "two", "c": "three"}});
        assert!(normalize(&mut s).is_empty());
        assert_eq!(s, json!({"type": "Opaque", "data": {"a": "eA==", "b": "dHdv", "c": "dGhyZWU="}}));
        let mut s = json!({"type": "kubernetes.io/tls", "stringData": {"tls.crt": "c", "tls.key": "k"}});
        assert!(normalize(&mut s).is_empty());
        assert_eq!(s["data"], json!({"tls.crt": "Yw==", "tls.key": "aw=="}));
        assert!(validate(&s).is_empty());
    }

    #[test]
    fn malformed_values_name_their_field() {
        let mut s = json!({"stringData": {"ok": "x", "bad": 1}});
        assert_eq!(fields(&normalize(&mut s)), ["stringData[bad]"]);
        let s = json!({"type": "Opaque", "data": {"good": "aGk=", "bad": "not base64!", "num": 5, "bad key": "aGk="}});
        assert_eq!(fields(&validate(&s)), ["data[bad]", "data[num]", "data[bad key]"]);
        assert_eq!(fields(&validate(&json!({"type": "kubernetes.io/tls", "data": {"tls.crt": ""}}))), ["data[tls.key]"]);
    }

    /// A length-delimited field.
    fn ld(field: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2, u8::try_from(bytes.len()).unwrap_or(0)];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn a_protobuf_secret_decodes_as_go_would_encode_it_in_json() {
        // What kubectl 1.33 sends for `create secret generic creds --from-literal=a=b`
        // (empty proto2 strings included, as Go writes them).
        let meta =
            [ld(1, b"creds"), ld(2, b""), ld(3, b""), ld(6, b""), ld(8, b""), ld(11, &[ld(1, b"app"), ld(2, b"x")].concat())].concat();
        let raw = [ld(1, &meta), ld(2, &[ld(1, b"a"), ld(2, b"\x00\xffb")].concat()), ld(3, b""), vec![(5 << 3), 1]].concat();
        let obj = crate::protobuf::message::decode(&PROTOBUF, &raw).unwrap_or_default();
        assert_eq!(obj, json!({"metadata": {"name": "creds", "labels": {"app": "x"}}, "data": {"a": "AP9i"}, "immutable": true}));
        assert!(crate::protobuf::message::decode(&PROTOBUF, &[ld(1, b"\x0a\x05ab")].concat()).is_err(), "truncated metadata");
        assert!(crate::protobuf::message::decode(&PROTOBUF, &[ld(3, &[0xff, 0xfe])].concat()).is_err(), "a type that is not UTF-8");
    }

    #[test]
    fn an_immutable_secret_keeps_its_data_and_stays_immutable() {
        let old = json!({"type": "Opaque", "immutable": true, "data": {"a": "eA=="}});
        assert!(validate_update(
            &old,
            &json!({"type": "Opaque", "immutable": true, "data": {"a": "eA=="}, "metadata": {"labels": {"x": "y"}}})
        )
        .is_empty());
        assert_eq!(fields(&validate_update(&old, &json!({"type": "Opaque", "immutable": true, "data": {"a": "eQ=="}}))), ["data"]);
        assert_eq!(fields(&validate_update(&old, &json!({"type": "Opaque", "immutable": false, "data": {"a": "eA=="}}))), ["immutable"]);
        assert_eq!(fields(&validate_update(&old, &json!({"type": "other", "immutable": true, "data": {"a": "eA=="}}))), ["type"]);
    }
}
