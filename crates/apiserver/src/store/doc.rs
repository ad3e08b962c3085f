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

    /// The object, parsed. The bytes were produced from a `Value` or checked when read back, so
    /// this does not fail; `Null` stands for a damaged row.
    #[must_use]
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.0).unwrap_or(Value::Null)
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
    fn the_metadata_view_leaves_out_managed_fields_and_everything_else() {
        let d = Doc::new(&json!({"metadata": {"name": "a", "managedFields": [{"manager": "m"}], "finalizers": ["f"]}, "spec": {"x": 1}}));
        assert_eq!(d.metadata_view(), json!({"metadata": {"name": "a", "finalizers": ["f"]}}));
        assert_eq!(Doc::new(&json!({"spec": {}})).metadata_view(), json!({"metadata": null}));
        assert_eq!(Doc::new(&json!([1])).metadata_view(), json!({"metadata": null}));
    }
}
