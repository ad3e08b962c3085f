//! [`Doc`]: an object as the store keeps it — its JSON bytes, written once by the store's writer
//! and shared by the in-memory state, the watch window, every watch stream and the responses.
//!
//! Why bytes and not a parsed [`Value`]: with `preserve_order` a parsed object costs ~40 KiB of
//! heap per KiB of JSON (every map an `IndexMap` with its own hash table), so 10,000 VMs held
//! ~400 MiB; as bytes the object costs its own size. Readers that need fields parse on demand
//! ([`Doc::value`]); the paths that only pass objects on (lists, watches, write responses)
//! splice the bytes without re-encoding them.

use std::fmt;

use bytes::Bytes;
use serde_json::Value;

/// A stored object's JSON. Cheap to clone (a reference count).
#[derive(Clone, PartialEq, Eq)]
pub struct Doc(Bytes);

impl Doc {
    /// Serializes `v` (exactly sized: no spare capacity is kept for the object's lifetime).
    #[must_use]
    pub fn new(v: &Value) -> Doc {
        // Serializing a `Value` cannot fail: its map keys are strings.
        let mut bytes = serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec());
        bytes.shrink_to_fit();
        Doc(Bytes::from(bytes))
    }

    /// Bytes read back from the database, parsed and encoded again, so that what is served is
    /// compact JSON of one line (a watch event is a line) in valid UTF-8, whatever was put in
    /// the row by hand; a row that is not JSON reads as `null` (a damaged row reads as no object
    /// instead of failing the whole store). Only at start: rows the server wrote are already in
    /// this form and come out unchanged.
    #[must_use]
    pub fn from_stored(bytes: &[u8]) -> Doc {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => Doc::new(&v),
            Err(_) => Doc(Bytes::from_static(b"null")),
        }
    }

    /// The JSON.
    #[must_use]
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// Whether the JSON contains `text` anywhere (a quick pre-check before parsing: a match may
    /// be in a value as well as a key, never a miss).
    #[must_use]
    pub fn mentions(&self, text: &str) -> bool {
        memchr::memmem::find(&self.0, text.as_bytes()).is_some()
    }

    /// `{"metadata": ...}` of the object without its `managedFields` (for scans over every object
    /// that look at names, owners and finalizers: no other field is built). `Null` metadata when
    /// the object has none.
    #[must_use]
    pub fn metadata_view(&self) -> Value {
        #[derive(serde::Deserialize)]
        struct Outer {
            #[serde(default)]
            metadata: Option<Meta>,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(rename = "managedFields", default)]
            _managed: serde::de::IgnoredAny,
            #[serde(flatten)]
            rest: serde_json::Map<String, Value>,
        }
        let meta = serde_json::from_slice::<Outer>(&self.0).ok().and_then(|o| o.metadata).map_or(Value::Null, |m| Value::Object(m.rest));
        serde_json::json!({ "metadata": meta })
    }

    /// Only the fields at `paths` (dotted: `metadata.labels`, `status.nodeName`), in an object of
    /// the same shape; everything else is skipped without being built. What a selector needs from
    /// an object: a watch with a selector checks every event, and a list every object, so
    /// parsing whole objects there (and `managedFields` with them) was most of the cost. A path
    /// through something that is not an object is left out, as a missing field; `Null` for a
    /// damaged row or one that is not an object.
    #[must_use]
    pub fn project(&self, paths: &[&str]) -> Value {
        let split: Vec<Vec<&str>> = paths.iter().map(|p| p.split('.').collect()).collect();
        let wanted: Vec<&[&str]> = split.iter().map(Vec::as_slice).collect();
        let mut de = serde_json::Deserializer::from_slice(&self.0);
        match serde::de::DeserializeSeed::deserialize(Pick(&wanted), &mut de) {
            Ok(Some(v)) => v,
            Ok(None) | Err(_) => Value::Null,
        }
    }

    /// The object, parsed. The bytes were produced from a `Value` or checked when read back, so
    /// this does not fail; `Null` stands for a damaged row.
    #[must_use]
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.0).unwrap_or(Value::Null)
    }
}

/// [`Doc::project`]'s walk: the rest of each wanted path below the current value. An empty rest
/// takes the whole value; a value no path goes into is skipped (`IgnoredAny`), never built.
struct Pick<'p>(&'p [&'p [&'p str]]);

impl<'de> serde::de::DeserializeSeed<'de> for Pick<'_> {
    type Value = Option<Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        if self.0.iter().any(|p| p.is_empty()) {
            return serde::Deserialize::deserialize(d).map(Some);
        }
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pick<'_> {
    type Value = Option<Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Option<Value>, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let below: Vec<&[&str]> = self.0.iter().filter(|p| p.first() == Some(&key.as_ref())).map(|p| &p[1..]).collect();
            if below.is_empty() {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else if let Some(v) = map.next_value_seed(Pick(&below))? {
                out.insert(key.into_owned(), v);
            }
        }
        Ok(Some(Value::Object(out)))
    }

    // A path that goes into something other than an object finds nothing there.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Value>, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_str<E>(self, _: &str) -> Result<Option<Value>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<Value>, E> {
        Ok(None)
    }
}

impl fmt::Debug for Doc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_doc_round_trips_its_object_in_order() {
        let v = json!({"metadata": {"name": "a", "labels": {"z": "1", "a": "2"}}, "spec": [1, "x", null]});
        let d = Doc::new(&v);
        assert_eq!(d.value(), v);
        assert_eq!(std::str::from_utf8(d.bytes()).unwrap(), r#"{"metadata":{"name":"a","labels":{"z":"1","a":"2"}},"spec":[1,"x",null]}"#);
    }

    #[test]
    fn a_damaged_row_reads_as_null_and_a_hand_edited_one_as_one_line() {
        let damaged: [&[u8]; 3] = [b"{\"metadata\":", b"{\"metadata\":{\"name\":\"\xff\"}}", br#"{"a":"\ud800"}"#];
        for damaged in damaged {
            assert_eq!(Doc::from_stored(damaged).bytes().as_ref(), b"null", "{}", String::from_utf8_lossy(damaged));
        }
        assert_eq!(Doc::from_stored(b"{\"a\":1}").value(), json!({"a": 1}));
        let pretty = b"{\n  \"metadata\": {\"name\": \"a\"}\n}\n";
        assert_eq!(Doc::from_stored(pretty).bytes().as_ref(), br#"{"metadata":{"name":"a"}}"#, "a watch line stays one line");
    }

    #[test]
    fn a_projection_holds_the_wanted_fields_and_nothing_else() {
        let d = Doc::new(&json!({
            "metadata": {"name": "a", "labels": {"app": "web"}, "managedFields": [{"manager": "m"}]},
            "spec": {"nodeName": "n1", "hostNetwork": true, "containers": [{"name": "c"}]},
            "status": "odd"
        }));
        assert_eq!(
            d.project(&["metadata.labels", "spec.nodeName", "metadata.name"]),
            json!({"metadata": {"name": "a", "labels": {"app": "web"}}, "spec": {"nodeName": "n1"}})
        );
        // Through a string, an array or a missing key: nothing, as a missing field.
        assert_eq!(d.project(&["status.phase", "spec.containers.name", "spec.missing"]), json!({"spec": {}}));
        assert_eq!(d.project(&["spec"]), d.value().pointer("/spec").map(|s| json!({"spec": s})).unwrap());
        assert_eq!(d.project(&[]), json!({}));
        assert_eq!(Doc::from_stored(b"{").project(&["metadata.name"]), Value::Null);
        assert_eq!(Doc::new(&json!([1, 2])).project(&["metadata.name"]), Value::Null);
    }

    #[test]
    fn the_metadata_view_leaves_out_managed_fields_and_everything_else() {
        let d = Doc::new(&json!({"metadata": {"name": "a", "managedFields": [{"manager": "m"}], "finalizers": ["f"]}, "spec": {"x": 1}}));
        assert_eq!(d.metadata_view(), json!({"metadata": {"name": "a", "finalizers": ["f"]}}));
        assert_eq!(Doc::new(&json!({"spec": {}})).metadata_view(), json!({"metadata": null}));
        assert_eq!(Doc::new(&json!([1])).metadata_view(), json!({"metadata": null}));
    }
}
