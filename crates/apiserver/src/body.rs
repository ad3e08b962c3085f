//! Request bodies: an object sent as JSON or YAML (create and update).
//!
//! # Guarantees
//! - JSON is read by serde_json, which refuses nesting of 128 levels or more.
//! - YAML is read into JSON values through a budget: every node it produces (aliases expanded)
//!   is charged its approximate JSON size against [`MAX_YAML_EXPANSION_BYTES`], and nesting
//!   deeper than [`MAX_OBJECT_DEPTH`] stops it. A few hundred bytes of anchors and aliases that
//!   describe gigabytes ("billion laughs") are refused after at most that much work, with 400.
//!   serde_yaml's own repetition limit (100 alias jumps per event) does not bound this: a body
//!   with one large anchored list and many aliases to it stays under it.
//! - Nothing here panics on any input.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::limits::{MAX_OBJECT_DEPTH, MAX_YAML_EXPANSION_BYTES};
use crate::status::ApiError;

/// Parses the body of a create or update: YAML when the content type says so, JSON otherwise.
///
/// Kubernetes' protobuf is decoded by [`crate::protobuf`] for the kinds that have a decoder.
///
/// # Errors
/// 415 for CBOR and for protobuf of a kind without a decoder (kube-apiserver's answer to a type
/// it does not decode; client-go then falls back to JSON for CBOR, not for protobuf).
/// 400 for an empty body, a body that does not parse, is not an object, or (YAML) expands past
/// the limits.
pub fn parse_object(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    parse_object_with(content_type, body, |group, kind| {
        crate::registry::by_kind(group, kind).and_then(crate::registry::ResourceDef::protobuf)
    })
}

/// [`parse_object`] for a body that is no stored kind's (a subresource's, such as
/// `TokenRequest`): protobuf is decoded with the message `find` gives for its group and kind.
///
/// # Errors
/// As [`parse_object`].
pub fn parse_object_with(
    content_type: &str,
    body: &[u8],
    find: impl Fn(&str, &str) -> Option<&'static crate::protobuf::message::Message>,
) -> Result<Value, ApiError> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    if crate::protobuf::is_protobuf(media) {
        return crate::protobuf::decode_object(body, find);
    }
    if media.contains("protobuf") || media.contains("cbor") {
        return Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format ({media}) - accepted media types include: {}",
            crate::protobuf::ACCEPTED
        )));
    }
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty; send the object as JSON or YAML"));
    }
    let v: Value = if content_type.contains("yaml") {
        parse_yaml(body, MAX_YAML_EXPANSION_BYTES)?
    } else {
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be an object with apiVersion, kind and metadata"));
    }
    Ok(v)
}

/// Reads one YAML document into a JSON value, spending at most `budget` bytes of JSON.
///
/// # Errors
/// 400 when the YAML is invalid, holds more than one document, has a key that is not a scalar,
/// nests deeper than [`MAX_OBJECT_DEPTH`], or expands past `budget`.
pub fn parse_yaml(body: &[u8], budget: usize) -> Result<Value, ApiError> {
    let left = Cell::new(budget);
    let de = serde_yaml::Deserializer::from_slice(body);
    Node { left: &left, budget, depth: 0 }.deserialize(de).map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}")))
}

/// One value being built; `depth` containers enclose it.
#[derive(Clone, Copy)]
struct Node<'a> {
    left: &'a Cell<usize>,
    budget: usize,
    depth: usize,
}

impl Node<'_> {
    fn charge<E: serde::de::Error>(&self, bytes: usize) -> Result<(), E> {
        match self.left.get().checked_sub(bytes) {
            Some(rest) => {
                self.left.set(rest);
                Ok(())
            }
            None => Err(E::custom(format!(
                "it expands to more than {} bytes (anchors and aliases included); send the object expanded, or smaller",
                self.budget
            ))),
        }
    }

    fn child<E: serde::de::Error>(&self) -> Result<Self, E> {
        if self.depth >= MAX_OBJECT_DEPTH {
            return Err(E::custom(format!("it nests objects and arrays more than {MAX_OBJECT_DEPTH} levels deep")));
        }
        self.charge(2)?;
        Ok(Node { depth: self.depth + 1, ..*self })
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value that can be written as JSON")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.charge(5)?;
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.charge(20)?;
        Ok(Value::from(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.charge(20)?;
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.charge(24)?;
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.charge(v.len().saturating_add(2))?;
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.charge(v.len().saturating_add(2))?;
        Ok(Value::String(v))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.charge(4)?;
        Ok(Value::Null)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let child = self.child()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(child)? {
            child.charge(1)?;
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let child = self.child()?;
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(Key(child))? {
            let v = map.next_value_seed(child)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

/// A map key: a scalar, read as a string (as serde_json's own YAML-to-JSON does).
struct Key<'a>(Node<'a>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
        self.0.charge(v.len().saturating_add(4))?;
        Ok(v.to_owned())
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<String, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<String, E> {
        Err(E::custom("a map key is null; keys must be strings"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Nine levels of nine aliases: 9^9 strings if expanded.
    fn laughs() -> String {
        let mut y = String::from("a0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n");
        for i in 1..9 {
            let p = i - 1;
            y += &format!("a{i}: &a{i} [*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p}]\n");
        }
        y
    }

    /// One anchored list of 1,000 strings of 100 bytes, then 20,000 aliases to it: 2 GB if
    /// expanded, and within serde_yaml's own repetition limit.
    pub(crate) fn wide_laughs() -> String {
        let item = "x".repeat(100);
        let mut y = format!("metadata: {{name: laughs}}\nanchor: &a [{}]\nspec: [", vec![item.as_str(); 1000].join(","));
        y += &vec!["*a"; 20_000].join(",");
        y += "]\n";
        y
    }

    #[test]
    fn yaml_reads_as_json_does() {
        let v =
            parse_object("application/yaml", b"apiVersion: v1\nkind: X\nmetadata: {name: a, labels: {n: 1}}\nlist: [1, 2.5, true, ~]\n")
                .unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "labels": {"n": 1}}, "list": [1, 2.5, true, null]})
        );
    }

    #[test]
    fn small_aliases_still_work() {
        let v = parse_yaml(b"a: &x {k: v}\nb: *x\n", 1024).unwrap();
        assert_eq!(v, json!({"a": {"k": "v"}, "b": {"k": "v"}}));
    }

    #[test]
    fn billion_laughs_is_refused_quickly() {
        for doc in [laughs(), wide_laughs()] {
            let t = std::time::Instant::now();
            let e = parse_object("application/yaml", doc.as_bytes()).unwrap_err();
            assert_eq!(e.code, 400);
            assert!(e.message.contains("expands to more than") || e.message.contains("repetition limit"), "{}", e.message);
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "took {:?}", t.elapsed());
        }
    }

    #[test]
    fn deep_yaml_is_refused_and_nothing_recurses_without_bound() {
        let deep = format!("{}1{}", "[".repeat(MAX_OBJECT_DEPTH + 1), "]".repeat(MAX_OBJECT_DEPTH + 1));
        let e = parse_yaml(deep.as_bytes(), usize::MAX).unwrap_err();
        assert!(e.message.contains("levels deep"), "{}", e.message);
        let ok = format!("{}1{}", "[".repeat(MAX_OBJECT_DEPTH), "]".repeat(MAX_OBJECT_DEPTH));
        assert!(parse_yaml(ok.as_bytes(), usize::MAX).is_ok());
        let very = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(parse_yaml(very.as_bytes(), usize::MAX).unwrap_err().code, 400);
    }

    #[test]
    fn odd_yaml_is_400_not_a_panic() {
        for doc in ["a: 1\n---\nb: 2\n", "? [a]\n: b\n", "~: x\n", "!tag {a: 1}\n", "a: !!binary aGVsbG8=\n", "[1, 2"] {
            let _ = parse_yaml(doc.as_bytes(), 1024);
        }
        assert_eq!(parse_yaml(b"a: 1\n---\nb: 2\n", 1024).unwrap_err().code, 400);
        assert_eq!(parse_object("application/yaml", b"- 1\n").unwrap_err().code, 400);
        assert_eq!(parse_object("application/json", b"").unwrap_err().code, 400);
    }
}
