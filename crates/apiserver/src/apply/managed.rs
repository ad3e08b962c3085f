//! `metadata.managedFields`: one entry per manager, operation and subresource, read into
//! [`Entry`]s and written back in kube-apiserver's order.
//!
//! # Guarantees
//! - Reading never fails: a list that is not a valid `managedFields` is [`Sent::Malformed`],
//!   and the caller falls back to the stored entries (kube-apiserver's `decodeLiveOrNew`), so a
//!   client that mangles them cannot take ownership away from anyone.
//! - `[]` (or `[{}]`) is [`Sent::Reset`], kube-apiserver's way to clear them.

use serde_json::{json, Map, Value};

use super::fieldset::FieldSet;

/// An operation recorded in an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: Option<String>,
    /// `""` for the main resource, `status` for the status subresource.
    pub subresource: String,
    pub fields: FieldSet,
}

impl Entry {
    /// Whether this entry is the one `manager` writes with `operation` on `subresource`
    /// (kube-apiserver keys entries by all three; the API version does not matter here, as
    /// every kind is served in one version).
    #[must_use]
    pub fn is(&self, manager: &str, operation: Operation, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }

    /// The manager as kube-apiserver names it in a conflict: `"name"`, with
    /// ` with subresource "status"`, and ` using <apiVersion>` for an Update.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == Operation::Update {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    fn to_json(&self) -> Value {
        let mut e = json!({"manager": self.manager, "operation": self.operation.as_str(), "apiVersion": self.api_version});
        if let Some(t) = &self.time {
            e["time"] = json!(t);
        }
        e["fieldsType"] = json!("FieldsV1");
        e["fieldsV1"] = self.fields.to_json();
        if !self.subresource.is_empty() {
            e["subresource"] = json!(self.subresource);
        }
        e
    }

    fn from_json(v: &Value) -> Option<Entry> {
        let m = v.as_object()?;
        let text = |k: &str| match m.get(k) {
            None | Some(Value::Null) => Some(String::new()),
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => None,
        };
        let operation = match m.get("operation").and_then(Value::as_str)? {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return None,
        };
        if !matches!(m.get("fieldsType"), None | Some(Value::Null)) && m.get("fieldsType").and_then(Value::as_str) != Some("FieldsV1") {
            return None;
        }
        let fields = match m.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::default(),
            Some(f) => FieldSet::from_json(f).ok()?,
        };
        let time = text("time")?;
        Some(Entry {
            manager: text("manager")?,
            operation,
            api_version: text("apiVersion")?,
            time: (!time.is_empty()).then_some(time),
            subresource: text("subresource")?,
            fields,
        })
    }
}

/// What a write carries in `metadata.managedFields`.
#[derive(Debug)]
pub enum Sent {
    /// Nothing (or `null`).
    Missing,
    /// `[]` or `[{}]`: clear them.
    Reset,
    /// Not a valid list of entries: ignored.
    Malformed,
    Entries(Vec<Entry>),
}

/// Reads `metadata.managedFields` of `obj`.
#[must_use]
pub fn read(obj: &Value) -> Sent {
    match obj.pointer("/metadata/managedFields") {
        None | Some(Value::Null) => Sent::Missing,
        Some(Value::Array(a)) if a.is_empty() => Sent::Reset,
        Some(Value::Array(a)) if a.len() == 1 && a[0].as_object().is_some_and(Map::is_empty) => Sent::Reset,
        Some(Value::Array(a)) => a.iter().map(Entry::from_json).collect::<Option<Vec<_>>>().map_or(Sent::Malformed, Sent::Entries),
        Some(_) => Sent::Malformed,
    }
}

/// The entries stored in `obj` (none when they are missing or malformed).
#[must_use]
pub fn stored(obj: &Value) -> Vec<Entry> {
    match read(obj) {
        Sent::Entries(e) => e,
        Sent::Missing | Sent::Reset | Sent::Malformed => Vec::new(),
    }
}

/// Writes `entries` into `obj`'s `metadata.managedFields`, without the empty ones, sorted as
/// kube-apiserver sorts them (operation, time, manager, API version, subresource); removes the
/// field when none is left.
pub fn write(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.fields.is_empty());
    entries.sort_by(|a, b| {
        (a.operation, &a.time, &a.manager, &a.api_version, &a.subresource).cmp(&(
            b.operation,
            &b.time,
            &b.manager,
            &b.api_version,
            &b.subresource,
        ))
    });
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    if entries.is_empty() {
        meta.shift_remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(entries.iter().map(Entry::to_json).collect()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_reset_and_junk_are_told_apart() {
        let obj = json!({"metadata": {"managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
            "time": "2024-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}}]}});
        let Sent::Entries(e) = read(&obj) else { panic!("entries") };
        let mut back = json!({"metadata": {}});
        write(&mut back, e);
        assert_eq!(back, obj);
        assert!(matches!(read(&json!({"metadata": {"managedFields": []}})), Sent::Reset));
        assert!(matches!(read(&json!({"metadata": {"managedFields": [{}]}})), Sent::Reset));
        assert!(matches!(read(&json!({"metadata": {}})), Sent::Missing));
        for junk in [json!("x"), json!([1]), json!([{"operation": "Steal"}]), json!([{"operation": "Apply", "fieldsV1": {"spec": 1}}])] {
            assert!(matches!(read(&json!({"metadata": {"managedFields": junk}})), Sent::Malformed), "{junk}");
        }
    }
}
