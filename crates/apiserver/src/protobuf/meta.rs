//! `ObjectMeta` (k8s.io/apimachinery `generated.proto`) from protobuf into JSON, the fields a
//! client sets; server-set ones (`selfLink`, `managedFields`) are skipped.

use serde_json::{json, Map, Value as Json};

use super::wire::{self, Fields, WireError};

/// Decodes an `ObjectMeta` message.
///
/// # Errors
/// [`WireError`] for malformed input.
pub fn object_meta(buf: &[u8]) -> Result<Json, WireError> {
    let mut m = Map::new();
    let (mut labels, mut annotations, mut owners, mut finalizers) = (Map::new(), Map::new(), Vec::new(), Vec::new());
    for f in Fields::new(buf) {
        let (n, v) = f?;
        let typed = |r: Result<Json, WireError>| r.map_err(|_| WireError::Type(n));
        let name = match n {
            1 => "name",
            2 => "generateName",
            3 => "namespace",
            5 => "uid",
            6 => "resourceVersion",
            7 => "generation",
            8 => "creationTimestamp",
            9 => "deletionTimestamp",
            10 => "deletionGracePeriodSeconds",
            11 => {
                wire::string_entry(v.bytes().map_err(|_| WireError::Type(n))?, &mut labels)?;
                continue;
            }
            12 => {
                wire::string_entry(v.bytes().map_err(|_| WireError::Type(n))?, &mut annotations)?;
                continue;
            }
            13 => {
                owners.push(owner_reference(v.bytes().map_err(|_| WireError::Type(n))?)?);
                continue;
            }
            14 => {
                finalizers.push(Json::String(v.string().map_err(|_| WireError::Type(n))?));
                continue;
            }
            _ => continue,
        };
        let value = match n {
            7 | 10 => typed(v.varint().map(|x| json!(x.cast_signed())))?,
            8 | 9 => time(v.bytes().map_err(|_| WireError::Type(n))?)?,
            _ => typed(v.string().map(Json::String))?,
        };
        if !is_empty(&value) {
            m.insert(name.into(), value);
        }
    }
    for (name, map) in [("labels", labels), ("annotations", annotations)] {
        if !map.is_empty() {
            m.insert(name.into(), Json::Object(map));
        }
    }
    if !owners.is_empty() {
        m.insert("ownerReferences".into(), Json::Array(owners));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Json::Array(finalizers));
    }
    Ok(Json::Object(m))
}

/// Go's `omitempty`: empty strings, zero numbers and nulls are left out.
fn is_empty(v: &Json) -> bool {
    match v {
        Json::Null => true,
        Json::String(s) => s.is_empty(),
        Json::Number(n) => n.as_i64() == Some(0),
        _ => false,
    }
}

/// `metav1.Time` (`seconds` 1, `nanos` 2) as RFC 3339 in seconds, `null` for the zero time
/// (which Go encodes as an empty message).
fn time(buf: &[u8]) -> Result<Json, WireError> {
    let mut seconds = None;
    for f in Fields::new(buf) {
        if let (1, v) = f? {
            seconds = Some(v.varint().map_err(|_| WireError::Type(1))?.cast_signed());
        }
    }
    Ok(seconds
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map_or(Json::Null, |t| Json::String(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())))
}

/// `OwnerReference`: kind 1, name 3, uid 4, apiVersion 5, controller 6, blockOwnerDeletion 7.
fn owner_reference(buf: &[u8]) -> Result<Json, WireError> {
    let mut m = Map::new();
    for f in Fields::new(buf) {
        let (n, v) = f?;
        let (name, value) = match n {
            1 => ("kind", Json::String(v.string().map_err(|_| WireError::Type(n))?)),
            3 => ("name", Json::String(v.string().map_err(|_| WireError::Type(n))?)),
            4 => ("uid", Json::String(v.string().map_err(|_| WireError::Type(n))?)),
            5 => ("apiVersion", Json::String(v.string().map_err(|_| WireError::Type(n))?)),
            6 => ("controller", Json::Bool(v.varint().map_err(|_| WireError::Type(n))? != 0)),
            7 => ("blockOwnerDeletion", Json::Bool(v.varint().map_err(|_| WireError::Type(n))? != 0)),
            _ => continue,
        };
        m.insert(name.into(), value);
    }
    Ok(Json::Object(m))
}
