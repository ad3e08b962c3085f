//! Sets of field paths in Kubernetes' `FieldsV1` form (structured-merge-diff's `fieldpath.Set`).
//!
//! A set is a tree whose edges are encoded path elements, exactly the keys of `FieldsV1`:
//! `f:name` (a field), `k:{"name":"x"}` (the item of a map-list with those key fields),
//! `v:"x"` (the item of a set-list with that value), `i:0` (an index; never produced here). A
//! node is a *member* when its path itself is in the set; `FieldsV1` writes a member that also
//! has children as `".": {}`.
//!
//! # Guarantees
//! - Children are kept sorted (a `BTreeMap`), so [`FieldSet::to_json`] writes the same bytes for
//!   the same set, in the order kube-apiserver writes them (`.` then `f:`, `k:`, `v:`).
//! - No empty child is kept: every operation prunes what it empties, so two equal sets compare
//!   equal.
//! - [`FieldSet::from_json`] refuses (rather than recurses without bound on) a tree deeper than
//!   [`MAX_OBJECT_DEPTH`], and anything that is not `FieldsV1`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::limits::MAX_OBJECT_DEPTH;

/// A set of field paths (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

impl FieldSet {
    /// Whether the set holds no path.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    /// Adds `path` (encoded elements, from the root); the root itself is never a member.
    pub fn insert<S: AsRef<str>>(&mut self, path: &[S]) {
        let Some((last, parents)) = path.split_last() else { return };
        let mut node = self;
        for e in parents {
            node = node.children.entry(e.as_ref().to_owned()).or_default();
        }
        node.children.entry(last.as_ref().to_owned()).or_default().member = true;
    }

    /// The node at `path`, when the set has it or anything under it.
    #[must_use]
    pub fn get<S: AsRef<str>>(&self, path: &[S]) -> Option<&FieldSet> {
        let mut node = self;
        for e in path {
            node = node.children.get(e.as_ref())?;
        }
        Some(node)
    }

    /// Whether `path` is a member.
    #[must_use]
    pub fn has<S: AsRef<str>>(&self, path: &[S]) -> bool {
        !path.is_empty() && self.get(path).is_some_and(|n| n.member)
    }

    /// Adds every path of `other`.
    pub fn union(&mut self, other: &FieldSet) {
        self.member |= other.member;
        for (k, o) in &other.children {
            self.children.entry(k.clone()).or_default().union(o);
        }
    }

    /// Removes every path of `other` (only those: a member's children stay unless `other` has
    /// them too).
    pub fn difference(&mut self, other: &FieldSet) {
        if other.member {
            self.member = false;
        }
        for (k, o) in &other.children {
            if let Some(mine) = self.children.get_mut(k) {
                mine.difference(o);
                if mine.is_empty() {
                    self.children.remove(k);
                }
            }
        }
    }

    /// The paths in both.
    #[must_use]
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet { member: self.member && other.member, children: BTreeMap::new() };
        for (k, mine) in &self.children {
            if let Some(o) = other.children.get(k) {
                let both = mine.intersection(o);
                if !both.is_empty() {
                    out.children.insert(k.clone(), both);
                }
            }
        }
        out
    }

    /// Every member path, in order.
    #[must_use]
    pub fn paths(&self) -> Vec<Vec<String>> {
        fn walk(node: &FieldSet, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
            for (k, child) in &node.children {
                prefix.push(k.clone());
                if child.member {
                    out.push(prefix.clone());
                }
                walk(child, prefix, out);
                prefix.pop();
            }
        }
        let mut out = Vec::new();
        walk(self, &mut Vec::new(), &mut out);
        out
    }

    /// The `FieldsV1` object.
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (k, child) in &self.children {
            m.insert(k.clone(), child.to_json());
        }
        Value::Object(m)
    }

    /// Reads a `FieldsV1` object.
    ///
    /// # Errors
    /// A message naming what is not `FieldsV1`: a value that is not an object, a key that is no
    /// path element, a `.` that is not `{}`, or nesting deeper than [`MAX_OBJECT_DEPTH`].
    pub fn from_json(v: &Value) -> Result<FieldSet, String> {
        fn read(v: &Value, depth: usize) -> Result<FieldSet, String> {
            if depth > MAX_OBJECT_DEPTH {
                return Err(format!("fieldsV1 nests deeper than {MAX_OBJECT_DEPTH} levels"));
            }
            let Value::Object(m) = v else { return Err("every value in fieldsV1 must be an object".into()) };
            let mut out = FieldSet::default();
            for (k, child) in m {
                if k == "." {
                    if !child.as_object().is_some_and(Map::is_empty) {
                        return Err("\".\" in fieldsV1 must be {}".into());
                    }
                    out.member = true;
                    continue;
                }
                if !["f:", "k:", "v:", "i:"].iter().any(|p| k.starts_with(p)) {
                    return Err(format!("{k:?} in fieldsV1 is not a path element (f:, k:, v:, i:)"));
                }
                let mut node = read(child, depth + 1)?;
                // A leaf (`{}`) is a member; a node with children is one only with `.`.
                if node.children.is_empty() {
                    node.member = true;
                }
                out.children.insert(k.clone(), node);
            }
            Ok(out)
        }
        let mut set = read(v, 0)?;
        set.member = false;
        Ok(set)
    }
}

/// A path as structured-merge-diff prints it in conflicts: `.spec.ports[port=80,protocol="TCP"].name`.
#[must_use]
pub fn display_path<S: AsRef<str>>(path: &[S]) -> String {
    let mut out = String::new();
    for e in path {
        let e = e.as_ref();
        if let Some(f) = e.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = e.strip_prefix("k:") {
            let fields: Vec<String> = match serde_json::from_str::<Map<String, Value>>(k) {
                Ok(m) => m.iter().map(|(name, v)| format!("{name}={v}")).collect(),
                Err(_) => vec![k.to_owned()],
            };
            out.push_str(&format!("[{}]", fields.join(",")));
        } else if let Some(v) = e.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        } else if let Some(i) = e.strip_prefix("i:") {
            out.push_str(&format!("[{i}]"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn members_with_children_are_written_with_a_dot_and_round_trip() {
        let mut s = FieldSet::default();
        s.insert(&["f:metadata", "f:labels"]);
        s.insert(&["f:metadata", "f:labels", "f:a"]);
        s.insert(&["f:spec", "f:containers", r#"k:{"name":"x"}"#]);
        s.insert(&["f:spec", "f:containers", r#"k:{"name":"x"}"#, "f:image"]);
        let j = s.to_json();
        assert_eq!(
            j.to_string(),
            r#"{"f:metadata":{"f:labels":{".":{},"f:a":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"x\"}":{".":{},"f:image":{}}}}}"#
        );
        assert_eq!(FieldSet::from_json(&j).unwrap(), s);
    }

    #[test]
    fn difference_prunes_what_it_empties_and_keeps_the_rest() {
        let mut a = FieldSet::default();
        a.insert(&["f:spec", "f:a"]);
        a.insert(&["f:spec", "f:b"]);
        let mut b = FieldSet::default();
        b.insert(&["f:spec", "f:a"]);
        a.difference(&b);
        assert_eq!(a.paths(), vec![vec!["f:spec".to_owned(), "f:b".to_owned()]]);
        a.difference(&a.clone());
        assert!(a.is_empty());
    }

    #[test]
    fn malformed_fields_are_refused_not_trusted() {
        for bad in [json!([1]), json!({"spec": {}}), json!({".": {"x": {}}}), json!({"f:a": 1})] {
            assert!(FieldSet::from_json(&bad).is_err(), "{bad}");
        }
        let mut deep = json!({});
        for _ in 0..(MAX_OBJECT_DEPTH + 5) {
            deep = json!({ "f:a": deep });
        }
        assert!(FieldSet::from_json(&deep).is_err());
    }

    #[test]
    fn paths_print_as_kube_prints_them_in_conflicts() {
        assert_eq!(display_path(&["f:spec", "f:runStrategy"]), ".spec.runStrategy");
        assert_eq!(
            display_path(&["f:spec", "f:ports", r#"k:{"port":80,"protocol":"TCP"}"#, "f:name"]),
            r#".spec.ports[port=80,protocol="TCP"].name"#
        );
        assert_eq!(display_path(&["f:metadata", "f:finalizers", r#"v:"a""#]), r#".metadata.finalizers[="a"]"#);
    }
}
