//! Messages of Kubernetes' `generated.proto` files described as data ([`Message`]), and one
//! decoder that turns any described message into the JSON Go's encoding would write for it.
//!
//! # Flow
//! A kind's [`Message`] lists its fields (number, JSON name, [`Ty`]); [`decode`] walks the wire
//! fields of a buffer and looks each up. Nested messages are described the same way, so a new
//! kind needs a table, not a decoder.
//!
//! # Guarantees
//! - Go's `omitempty`: empty strings, zero numbers and `false` are left out unless the field is
//!   a pointer in Go ([`Field::keep_zero`], set with [`ptr`]); empty lists and maps are left out.
//! - Nothing is dropped silently: a field number a described message does not list (and does not
//!   name in [`Message::skip`], the server-set fields) is an error naming the message and the
//!   number, so an object is either decoded whole or refused (400) with the advice to send JSON.
//! - Recursion is bounded by the depth of the descriptor tables (none refers to itself).
//! - Nothing panics on any input.

use base64::Engine;
use serde_json::{json, Map, Value as Json};

use super::wire::{Fields, Value, WireError};

/// A field's type.
#[derive(Clone, Copy, Debug)]
pub enum Ty {
    Str,
    /// `int32`/`int64` (two's complement in a varint).
    Int,
    Bool,
    /// `bytes`, base64 in JSON.
    Bytes,
    /// `metav1.Time`: RFC 3339 in seconds.
    Time,
    /// `metav1.MicroTime`: RFC 3339 with microseconds.
    MicroTime,
    /// `resource.Quantity` (its string, field 1).
    Quantity,
    /// `intstr.IntOrString`.
    IntOrString,
    Msg(&'static Message),
    /// `map<string, T>`: entries of key 1, value 2.
    Map(&'static Ty),
}

/// One field of a message.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub num: u64,
    pub name: &'static str,
    pub ty: Ty,
    pub repeated: bool,
    /// A pointer in Go: a zero value is written, not left out.
    pub keep_zero: bool,
}

/// A described message.
#[derive(Debug)]
pub struct Message {
    /// Its Go type name, for errors (`ServiceSpec`).
    pub name: &'static str,
    pub fields: &'static [Field],
    /// Fields read and dropped: ones only the server sets (`ObjectMeta.managedFields`) or a
    /// status the server computes.
    pub skip: &'static [u64],
}

/// A singular field.
#[must_use]
pub const fn f(num: u64, name: &'static str, ty: Ty) -> Field {
    Field { num, name, ty, repeated: false, keep_zero: false }
}

/// A pointer field (its zero value is kept).
#[must_use]
pub const fn ptr(num: u64, name: &'static str, ty: Ty) -> Field {
    Field { num, name, ty, repeated: false, keep_zero: true }
}

/// A repeated field.
#[must_use]
pub const fn rep(num: u64, name: &'static str, ty: Ty) -> Field {
    Field { num, name, ty, repeated: true, keep_zero: false }
}

/// `map<string, string>`.
pub const STR_MAP: Ty = Ty::Map(&Ty::Str);
/// `map<string, bytes>`.
pub const BYTES_MAP: Ty = Ty::Map(&Ty::Bytes);
/// `map<string, Quantity>` (`ResourceList`).
pub const RESOURCE_LIST: Ty = Ty::Map(&Ty::Quantity);

/// Why a buffer is not a message of its description.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("field {field} of {message} has the wrong wire type")]
    Type { message: &'static str, field: u64 },
    #[error(
        "field {field} of {message} is one this server does not decode from protobuf; \
         send the object as JSON or YAML (kubectl create -f or apply) to keep it whole"
    )]
    Unknown { message: &'static str, field: u64 },
}

/// Decodes `buf` as a `msg`.
///
/// # Errors
/// [`DecodeError`] for malformed input, a field of the wrong type or one `msg` does not list.
pub fn decode(msg: &'static Message, buf: &[u8]) -> Result<Json, DecodeError> {
    let mut out = Map::new();
    for field in Fields::new(buf) {
        let (num, value) = field?;
        let Some(fd) = msg.fields.iter().find(|f| f.num == num) else {
            if msg.skip.contains(&num) {
                continue;
            }
            return Err(DecodeError::Unknown { message: msg.name, field: num });
        };
        let wrong = || DecodeError::Type { message: msg.name, field: num };
        if let Ty::Map(inner) = fd.ty {
            let entries = out.entry(fd.name).or_insert_with(|| json!({}));
            let (k, v) = map_entry(inner, value.bytes().map_err(|_| wrong())?, msg)?;
            if let Json::Object(m) = entries {
                m.insert(k, v);
            }
            continue;
        }
        let v = scalar(fd.ty, value, msg).map_err(|e| if matches!(e, DecodeError::Wire(WireError::Type(_))) { wrong() } else { e })?;
        if fd.repeated {
            if let Json::Array(a) = out.entry(fd.name).or_insert_with(|| json!([])) {
                a.push(v);
            }
        } else if fd.keep_zero || !is_zero(&v) {
            out.insert(fd.name.to_owned(), v);
        } else {
            out.remove(fd.name);
        }
    }
    Ok(Json::Object(out))
}

fn map_entry(ty: &'static Ty, entry: &[u8], msg: &'static Message) -> Result<(String, Json), DecodeError> {
    let (mut key, mut value) = (String::new(), None);
    for f in Fields::new(entry) {
        match f? {
            (1, v) => key = v.string().map_err(|_| DecodeError::Type { message: msg.name, field: 1 })?,
            (2, v) => value = Some(scalar(*ty, v, msg)?),
            _ => {}
        }
    }
    let empty = match ty {
        Ty::Str | Ty::Bytes | Ty::Quantity => json!(""),
        Ty::Msg(_) => json!({}),
        _ => Json::Null,
    };
    Ok((key, value.unwrap_or(empty)))
}

fn scalar(ty: Ty, v: Value<'_>, msg: &'static Message) -> Result<Json, DecodeError> {
    Ok(match ty {
        Ty::Str => Json::String(v.string()?),
        Ty::Int => json!(v.varint()?.cast_signed()),
        Ty::Bool => Json::Bool(v.varint()? != 0),
        Ty::Bytes => Json::String(base64::engine::general_purpose::STANDARD.encode(v.bytes()?)),
        Ty::Time => time(v.bytes()?, false)?,
        Ty::MicroTime => time(v.bytes()?, true)?,
        Ty::Quantity => {
            let mut s = String::new();
            for f in Fields::new(v.bytes()?) {
                if let (1, x) = f? {
                    s = x.string()?;
                }
            }
            Json::String(s)
        }
        Ty::IntOrString => {
            let (mut is_str, mut int, mut s) = (false, 0i64, String::new());
            for f in Fields::new(v.bytes()?) {
                match f? {
                    (1, x) => is_str = x.varint()? == 1,
                    (2, x) => int = x.varint()?.cast_signed(),
                    (3, x) => s = x.string()?,
                    _ => {}
                }
            }
            if is_str {
                Json::String(s)
            } else {
                json!(int)
            }
        }
        Ty::Msg(m) => decode(m, v.bytes()?)?,
        Ty::Map(_) => return Err(DecodeError::Type { message: msg.name, field: 0 }),
    })
}

/// Go's `omitempty`.
fn is_zero(v: &Json) -> bool {
    match v {
        Json::Null => true,
        Json::Bool(b) => !b,
        Json::String(s) => s.is_empty(),
        Json::Number(n) => n.as_i64() == Some(0),
        Json::Array(_) | Json::Object(_) => false,
    }
}

/// `metav1.Time`/`MicroTime` (`seconds` 1, `nanos` 2); `null` for the zero time (an empty message).
fn time(buf: &[u8], micro: bool) -> Result<Json, DecodeError> {
    let (mut seconds, mut nanos) = (None, 0i64);
    for f in Fields::new(buf) {
        match f? {
            (1, v) => seconds = Some(v.varint()?.cast_signed()),
            (2, v) => nanos = v.varint()?.cast_signed(),
            _ => {}
        }
    }
    let Some(t) = seconds.and_then(|s| jiff::Timestamp::new(s, i32::try_from(nanos).unwrap_or(0)).ok()) else {
        return Ok(Json::Null);
    };
    let fmt = if micro { "%Y-%m-%dT%H:%M:%S%.6fZ" } else { "%Y-%m-%dT%H:%M:%SZ" };
    Ok(Json::String(t.strftime(fmt).to_string()))
}

/// `OwnerReference`.
pub static OWNER_REFERENCE: Message = Message {
    name: "OwnerReference",
    fields: &[
        f(1, "kind", Ty::Str),
        f(3, "name", Ty::Str),
        f(4, "uid", Ty::Str),
        f(5, "apiVersion", Ty::Str),
        ptr(6, "controller", Ty::Bool),
        ptr(7, "blockOwnerDeletion", Ty::Bool),
    ],
    skip: &[],
};

/// `ObjectMeta`: the fields a client sets; `selfLink` (4) and `managedFields` (17) are dropped.
pub static OBJECT_META: Message = Message {
    name: "ObjectMeta",
    fields: &[
        f(1, "name", Ty::Str),
        f(2, "generateName", Ty::Str),
        f(3, "namespace", Ty::Str),
        f(5, "uid", Ty::Str),
        f(6, "resourceVersion", Ty::Str),
        f(7, "generation", Ty::Int),
        f(8, "creationTimestamp", Ty::Time),
        f(9, "deletionTimestamp", Ty::Time),
        f(10, "deletionGracePeriodSeconds", Ty::Int),
        f(11, "labels", STR_MAP),
        f(12, "annotations", STR_MAP),
        rep(13, "ownerReferences", Ty::Msg(&OWNER_REFERENCE)),
        rep(14, "finalizers", Ty::Str),
    ],
    skip: &[4, 15, 16, 17],
};

/// `ObjectReference`.
pub static OBJECT_REFERENCE: Message = Message {
    name: "ObjectReference",
    fields: &[
        f(1, "kind", Ty::Str),
        f(2, "namespace", Ty::Str),
        f(3, "name", Ty::Str),
        f(4, "uid", Ty::Str),
        f(5, "apiVersion", Ty::Str),
        f(6, "resourceVersion", Ty::Str),
        f(7, "fieldPath", Ty::Str),
    ],
    skip: &[],
};

/// `LocalObjectReference`.
pub static LOCAL_OBJECT_REFERENCE: Message = Message { name: "LocalObjectReference", fields: &[f(1, "name", Ty::Str)], skip: &[] };

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(n: u8, b: &[u8]) -> Vec<u8> {
        let mut v = vec![(n << 3) | 2, u8::try_from(b.len()).unwrap()];
        v.extend_from_slice(b);
        v
    }

    static THING: Message = Message {
        name: "Thing",
        fields: &[
            f(1, "metadata", Ty::Msg(&OBJECT_META)),
            f(2, "data", STR_MAP),
            ptr(3, "on", Ty::Bool),
            f(4, "off", Ty::Bool),
            rep(5, "xs", Ty::Str),
        ],
        skip: &[9],
    };

    #[test]
    fn a_described_message_decodes_as_gos_json_would_write_it() {
        let entry = [ld(1, b"k"), ld(2, b"v")].concat();
        let raw =
            [ld(1, &ld(1, b"cm")), ld(2, &entry), vec![3 << 3, 0], vec![4 << 3, 0], ld(5, b"a"), ld(5, b"b"), ld(9, b"dropped")].concat();
        let v = decode(&THING, &raw).unwrap();
        assert_eq!(v, json!({"metadata": {"name": "cm"}, "data": {"k": "v"}, "on": false, "xs": ["a", "b"]}));
    }

    #[test]
    fn a_field_it_does_not_describe_is_refused_not_dropped() {
        let err = decode(&THING, &ld(7, b"x")).unwrap_err();
        assert_eq!(err, DecodeError::Unknown { message: "Thing", field: 7 });
        assert!(err.to_string().contains("send the object as JSON"), "{err}");
        assert!(matches!(decode(&THING, &[2 << 3, 1]), Err(DecodeError::Type { message: "Thing", field: 2 })));
        assert!(decode(&THING, &[0x0a, 0x05, b'a']).is_err(), "truncated");
    }
}
