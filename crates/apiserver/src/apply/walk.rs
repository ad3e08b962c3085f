//! The walks over objects that server-side apply needs, each guided by the kind's
//! [`Schema`]: the fields a value sets ([`Walker::fields`], structured-merge-diff's
//! `ToFieldSet`), what changed between two versions ([`Walker::compare`], its `Compare`), merging
//! an applied configuration into an object ([`Walker::merge`]) and removing a field
//! ([`Walker::remove`]).
//!
//! # Guarantees
//! - A list whose items cannot be told apart as its rule says (a map-list item without a key
//!   field and no default, a key that is not a scalar, duplicate keys or values, a set item
//!   that is an object) is handled as an atomic list: it is never an error and never panics.
//! - No walk goes deeper than [`MAX_OBJECT_DEPTH`]: below that a value is one leaf.
//! - The fields only the server sets (`apiVersion`, `kind`, `metadata.name`, `.uid`,
//!   `.resourceVersion`, `.managedFields`, ... as kube-apiserver's `stripMetaManager`) and, by
//!   [`Scope`], `status` or everything but `status`, are never walked.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::fieldset::FieldSet;
use super::schema::{Rule, Schema};
use crate::limits::MAX_OBJECT_DEPTH;

/// The fields of `metadata` no manager owns (kube-apiserver's `stripMetaManager`).
const SERVER_METADATA: [&str; 9] =
    ["name", "namespace", "creationTimestamp", "selfLink", "uid", "clusterName", "generation", "managedFields", "resourceVersion"];

/// Which part of an object a write manages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The whole object (a kind without a status subresource).
    All,
    /// All but `status` (the main resource of a kind with a status subresource).
    NotStatus,
    /// Only `status` (the status subresource).
    StatusOnly,
}

/// What changed from one version to the next: paths added or modified, paths removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Diff {
    pub changed: FieldSet,
    pub removed: FieldSet,
}

impl Diff {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }
}

/// One element of the path being walked, encoded only when a set needs it.
#[derive(Clone)]
enum Elem<'a> {
    Field(&'a str),
    /// Already encoded (`k:{...}` or `v:...`).
    Item(String),
}

impl Elem<'_> {
    fn encode(&self) -> String {
        match self {
            Elem::Field(f) => format!("f:{f}"),
            Elem::Item(s) => s.clone(),
        }
    }
}

/// A walk over values of one kind.
pub struct Walker<'s> {
    schema: &'s Schema,
    scope: Scope,
    /// Dotted field path of the current value (see [`super::schema`]).
    spath: String,
}

/// The rule of a list at the current path, checked against its items.
enum ListItems {
    Atomic,
    /// Each item's encoded path element, in order.
    Keyed(Vec<String>),
}

impl<'s> Walker<'s> {
    #[must_use]
    pub fn new(schema: &'s Schema, scope: Scope) -> Self {
        Walker { schema, scope, spath: String::new() }
    }

    fn skip(&self, key: &str) -> bool {
        match self.spath.as_str() {
            "" => {
                matches!(key, "apiVersion" | "kind")
                    || (self.scope == Scope::NotStatus && key == "status")
                    || (self.scope == Scope::StatusOnly && key != "status")
            }
            "metadata" => SERVER_METADATA.contains(&key),
            _ => false,
        }
    }

    fn enter(&mut self, key: &str) -> usize {
        let len = self.spath.len();
        if !self.spath.is_empty() {
            self.spath.push('.');
        }
        self.spath.push_str(key);
        len
    }

    fn atomic_map(&self) -> bool {
        matches!(self.schema.rule(&self.spath), Some(Rule::AtomicMap))
    }

    /// How the list at the current path splits into items.
    fn items(&self, list: &[Value]) -> ListItems {
        let encoded: Option<Vec<String>> = match self.schema.rule(&self.spath) {
            Some(Rule::Set) => list.iter().map(|v| (!v.is_object() && !v.is_array()).then(|| format!("v:{v}"))).collect(),
            Some(Rule::Map(keys)) => list.iter().map(|v| item_key(v, keys)).collect(),
            _ => None,
        };
        match encoded {
            Some(e) if e.iter().collect::<HashSet<_>>().len() == e.len() => ListItems::Keyed(e),
            _ => ListItems::Atomic,
        }
    }

    /// Every field `v` sets, as the applied configuration's field set (`ToFieldSet`): leaves,
    /// atomic lists and maps, and list items; not the maps that contain them.
    #[must_use]
    pub fn fields(&mut self, v: &Value) -> FieldSet {
        let mut out = FieldSet::default();
        self.fields_at(v, &mut Vec::new(), &mut out, 0);
        out
    }

    fn fields_at<'a>(&mut self, v: &'a Value, path: &mut Vec<Elem<'a>>, out: &mut FieldSet, depth: usize) {
        match v {
            Value::Object(m) if depth < MAX_OBJECT_DEPTH && !self.atomic_map() => {
                for (k, child) in m {
                    if self.skip(k) {
                        continue;
                    }
                    let len = self.enter(k);
                    path.push(Elem::Field(k));
                    self.fields_at(child, path, out, depth + 1);
                    path.pop();
                    self.spath.truncate(len);
                }
            }
            Value::Array(a) if depth < MAX_OBJECT_DEPTH => match self.items(a) {
                ListItems::Keyed(keys) => {
                    for (item, key) in a.iter().zip(keys) {
                        path.push(Elem::Item(key));
                        insert(out, path);
                        if item.is_object() {
                            self.fields_at(item, path, out, depth + 1);
                        }
                        path.pop();
                    }
                }
                ListItems::Atomic => insert(out, path),
            },
            _ => insert(out, path),
        }
    }

    /// What changed from `old` to `new` (`Compare`): a path on one side only is added or
    /// removed with everything under it (so an added map is a member, written `.`), a leaf,
    /// atomic list or atomic map that differs is changed.
    #[must_use]
    pub fn compare(&mut self, old: Option<&Value>, new: &Value) -> Diff {
        let mut d = Diff::default();
        self.compare_at(old, Some(new), &mut Vec::new(), &mut d, 0);
        d
    }

    fn compare_at<'a>(&mut self, old: Option<&'a Value>, new: Option<&'a Value>, path: &mut Vec<Elem<'a>>, d: &mut Diff, depth: usize) {
        let (o, n) = match (old, new) {
            (None, None) => return,
            (None, Some(n)) => {
                mark(&mut d.changed, path);
                self.everything_under(n, path, &mut d.changed, depth);
                return;
            }
            (Some(o), None) => {
                mark(&mut d.removed, path);
                self.everything_under(o, path, &mut d.removed, depth);
                return;
            }
            // Equal values differ nowhere below: one comparison instead of a walk that builds
            // paths (most of an update's object is unchanged).
            (Some(o), Some(n)) if o == n => return,
            (Some(o), Some(n)) => (o, n),
        };
        if depth >= MAX_OBJECT_DEPTH {
            if o != n {
                mark(&mut d.changed, path);
            }
            return;
        }
        match (o, n) {
            (Value::Object(om), Value::Object(nm)) if !self.atomic_map() => {
                for (k, ov) in om {
                    if self.skip(k) {
                        continue;
                    }
                    let len = self.enter(k);
                    path.push(Elem::Field(k));
                    self.compare_at(Some(ov), nm.get(k), path, d, depth + 1);
                    path.pop();
                    self.spath.truncate(len);
                }
                for (k, nv) in nm.iter().filter(|(k, _)| !om.contains_key(*k)) {
                    if self.skip(k) {
                        continue;
                    }
                    let len = self.enter(k);
                    path.push(Elem::Field(k));
                    self.compare_at(None, Some(nv), path, d, depth + 1);
                    path.pop();
                    self.spath.truncate(len);
                }
            }
            (Value::Array(oa), Value::Array(na)) => match (self.items(oa), self.items(na)) {
                (ListItems::Keyed(ok), ListItems::Keyed(nk)) => {
                    let olds: HashMap<&str, &Value> = ok.iter().map(String::as_str).zip(oa).collect();
                    let news: HashSet<&str> = nk.iter().map(String::as_str).collect();
                    for (key, item) in nk.iter().zip(na) {
                        path.push(Elem::Item(key.clone()));
                        self.compare_at(olds.get(key.as_str()).copied(), Some(item), path, d, depth + 1);
                        path.pop();
                    }
                    for (key, item) in ok.iter().zip(oa).filter(|(k, _)| !news.contains(k.as_str())) {
                        path.push(Elem::Item(key.clone()));
                        self.compare_at(Some(item), None, path, d, depth + 1);
                        path.pop();
                    }
                }
                _ if oa != na => mark(&mut d.changed, path),
                _ => {}
            },
            _ if o != n => {
                mark(&mut d.changed, path);
                // A value that changes type: what was under the old one is gone, what is under
                // the new one is added.
                if o.is_object() != n.is_object() || o.is_array() != n.is_array() {
                    self.everything_under(n, path, &mut d.changed, depth);
                    self.everything_under(o, path, &mut d.removed, depth);
                }
            }
            _ => {}
        }
    }

    /// Every path under `v` (not `v`'s own), each a member.
    fn everything_under<'a>(&mut self, v: &'a Value, path: &mut Vec<Elem<'a>>, out: &mut FieldSet, depth: usize) {
        if depth >= MAX_OBJECT_DEPTH {
            return;
        }
        match v {
            Value::Object(m) if !self.atomic_map() => {
                for (k, child) in m {
                    if self.skip(k) {
                        continue;
                    }
                    let len = self.enter(k);
                    path.push(Elem::Field(k));
                    mark(out, path);
                    self.everything_under(child, path, out, depth + 1);
                    path.pop();
                    self.spath.truncate(len);
                }
            }
            Value::Array(a) => {
                if let ListItems::Keyed(keys) = self.items(a) {
                    for (item, key) in a.iter().zip(keys) {
                        path.push(Elem::Item(key));
                        mark(out, path);
                        self.everything_under(item, path, out, depth + 1);
                        path.pop();
                    }
                }
            }
            _ => {}
        }
    }

    /// Merges an applied configuration into `live` (`Merge`): maps field by field, map-lists
    /// item by key (a new item goes at the end), set-lists by value, anything else replaced by
    /// the configuration's value. A `null` in the configuration removes the field.
    pub fn merge(&mut self, live: &mut Value, config: &Value) {
        self.merge_at(live, config, 0);
    }

    fn merge_at(&mut self, live: &mut Value, config: &Value, depth: usize) {
        if depth >= MAX_OBJECT_DEPTH {
            live.clone_from(config);
            return;
        }
        match (&mut *live, config) {
            (Value::Object(lm), Value::Object(cm)) if !self.atomic_map() => {
                for (k, cv) in cm {
                    if self.skip(k) {
                        continue;
                    }
                    let len = self.enter(k);
                    match (lm.get_mut(k), cv) {
                        (_, Value::Null) => {
                            lm.shift_remove(k);
                        }
                        (Some(lv), _) => self.merge_at(lv, cv, depth + 1),
                        (None, _) => {
                            lm.insert(k.clone(), self.without_skipped(cv));
                        }
                    }
                    self.spath.truncate(len);
                }
            }
            (Value::Array(la), Value::Array(ca)) => match (self.items(la), self.items(ca)) {
                (ListItems::Keyed(lk), ListItems::Keyed(ck)) => {
                    let at: HashMap<String, usize> = lk.into_iter().enumerate().map(|(i, k)| (k, i)).collect();
                    for (key, item) in ck.iter().zip(ca) {
                        match at.get(key).and_then(|i| la.get_mut(*i)) {
                            Some(existing) => self.merge_at(existing, item, depth + 1),
                            None => la.push(item.clone()),
                        }
                    }
                }
                _ => live.clone_from(config),
            },
            _ => *live = self.without_skipped(config),
        }
    }

    /// `v`, without the fields this scope skips when `v` is the root.
    fn without_skipped(&self, v: &Value) -> Value {
        match v {
            Value::Object(m) if self.spath.is_empty() || self.spath == "metadata" => {
                Value::Object(m.iter().filter(|(k, _)| !self.skip(k)).map(|(k, v)| (k.clone(), v.clone())).collect::<Map<_, _>>())
            }
            _ => v.clone(),
        }
    }

    /// Removes the value at `path` (encoded elements) from `v`; nothing when it is not there.
    pub fn remove(&mut self, v: &mut Value, path: &[String]) {
        self.spath.clear();
        self.remove_at(v, path);
    }

    fn remove_at(&mut self, v: &mut Value, path: &[String]) {
        let Some((first, rest)) = path.split_first() else { return };
        match v {
            Value::Object(m) => {
                let Some(name) = first.strip_prefix("f:") else { return };
                if rest.is_empty() {
                    m.shift_remove(name);
                } else if let Some(child) = m.get_mut(name) {
                    let len = self.enter(name);
                    self.remove_at(child, rest);
                    self.spath.truncate(len);
                }
            }
            Value::Array(a) => {
                let ListItems::Keyed(keys) = self.items(a) else { return };
                let Some(i) = keys.iter().position(|k| k == first) else { return };
                if rest.is_empty() {
                    a.remove(i);
                } else if let Some(item) = a.get_mut(i) {
                    self.remove_at(item, rest);
                }
            }
            _ => {}
        }
    }
}

/// The encoded path element of a map-list item (`k:{"name":"x"}`, key fields sorted), or `None`
/// when a key is missing without a default or is not a scalar.
fn item_key(item: &Value, keys: &[(String, Option<Value>)]) -> Option<String> {
    let obj = item.as_object()?;
    let mut sorted: Vec<&(String, Option<Value>)> = keys.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut m = Map::new();
    for (k, default) in sorted {
        let v = obj.get(k).filter(|v| !v.is_null()).or(default.as_ref())?;
        if v.is_object() || v.is_array() {
            return None;
        }
        m.insert(k.clone(), v.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

fn insert(out: &mut FieldSet, path: &[Elem<'_>]) {
    let encoded: Vec<String> = path.iter().map(Elem::encode).collect();
    out.insert(&encoded);
}

/// Inserts `path` as a member, except `metadata` itself, which no manager owns.
fn mark(out: &mut FieldSet, path: &[Elem<'_>]) {
    if matches!(path, [Elem::Field("metadata")]) {
        return;
    }
    insert(out, path);
}
