//! How server-side apply merges each list and map of a kind: structured-merge-diff's
//! `x-kubernetes-list-type` (`atomic`, `set`, `map` with `x-kubernetes-list-map-keys`) and
//! `x-kubernetes-map-type: atomic`.
//!
//! Custom resources take them from their CRD's schema, where a list without a list type is
//! atomic (as for CRDs in Kubernetes; KubeVirt's CRDs mark none, so all their lists are). Core
//! kinds take them from [`CORE`], one table copied from Kubernetes' OpenAPI (`listType` /
//! `patchMergeKey` markers of `k8s.io/api/core/v1`, `storage/v1`, `coordination/v1`); a core
//! list not in the table is atomic.
//!
//! A rule is looked up by the dotted path of field names from the object's root, list items
//! adding no segment: `spec.containers.ports` is the `ports` of every container.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde_json::Value;

use crate::registry::ResourceDef;

/// How a list or map merges; anything without a rule is a granular map or an atomic list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A list of scalars merged as a set (`x-kubernetes-list-type: set`).
    Set,
    /// A list of objects merged by these key fields, each with the default the schema gives a
    /// missing key (`protocol` of a port is `TCP`).
    Map(Vec<(String, Option<Value>)>),
    /// A map replaced as a whole (`x-kubernetes-map-type: atomic`).
    AtomicMap,
}

/// A rule of the core table: the list's keys, with their defaults.
#[derive(Clone, Copy)]
enum Spec {
    Map(&'static [(&'static str, Option<&'static str>)]),
    Set,
    AtomicMap,
}

const NAME: Spec = Spec::Map(&[("name", None)]);
const TYPE: Spec = Spec::Map(&[("type", None)]);

/// The rules of the core kinds: `(kind, path, rule)`; kind `*` applies to every kind.
#[rustfmt::skip]
const CORE: &[(&str, &str, Spec)] = &[
    // ObjectMeta (every kind, custom ones too).
    ("*", "metadata.ownerReferences", Spec::Map(&[("uid", None)])),
    ("*", "metadata.finalizers", Spec::Set),
    // Pod (PodSpec, PodStatus).
    ("Pod", "spec.containers", NAME),
    ("Pod", "spec.initContainers", NAME),
    ("Pod", "spec.ephemeralContainers", NAME),
    ("Pod", "spec.containers.ports", Spec::Map(&[("containerPort", None), ("protocol", Some("TCP"))])),
    ("Pod", "spec.initContainers.ports", Spec::Map(&[("containerPort", None), ("protocol", Some("TCP"))])),
    ("Pod", "spec.containers.env", NAME),
    ("Pod", "spec.initContainers.env", NAME),
    ("Pod", "spec.containers.volumeMounts", Spec::Map(&[("mountPath", None)])),
    ("Pod", "spec.initContainers.volumeMounts", Spec::Map(&[("mountPath", None)])),
    ("Pod", "spec.containers.volumeDevices", Spec::Map(&[("devicePath", None)])),
    ("Pod", "spec.containers.resizePolicy", Spec::Map(&[("resourceName", None)])),
    ("Pod", "spec.volumes", NAME),
    ("Pod", "spec.imagePullSecrets", NAME),
    ("Pod", "spec.hostAliases", Spec::Map(&[("ip", None)])),
    ("Pod", "spec.schedulingGates", NAME),
    ("Pod", "spec.resourceClaims", NAME),
    ("Pod", "spec.topologySpreadConstraints", Spec::Map(&[("topologyKey", None), ("whenUnsatisfiable", None)])),
    ("Pod", "spec.nodeSelector", Spec::AtomicMap),
    ("Pod", "status.conditions", TYPE),
    ("Pod", "status.podIPs", Spec::Map(&[("ip", None)])),
    ("Pod", "status.hostIPs", Spec::Map(&[("ip", None)])),
    // Service.
    ("Service", "spec.ports", Spec::Map(&[("port", None), ("protocol", Some("TCP"))])),
    ("Service", "spec.selector", Spec::AtomicMap),
    ("Service", "status.conditions", TYPE),
    // Node.
    ("Node", "spec.podCIDRs", Spec::Set),
    ("Node", "status.conditions", TYPE),
    ("Node", "status.addresses", TYPE),
    // Namespace, PersistentVolumeClaim, PersistentVolume.
    ("Namespace", "status.conditions", TYPE),
    ("PersistentVolumeClaim", "status.conditions", TYPE),
    ("PersistentVolume", "spec.claimRef", Spec::AtomicMap),
    // ServiceAccount.
    ("ServiceAccount", "secrets", NAME),
];

/// The rules of one kind.
#[derive(Debug, Default)]
pub struct Schema {
    rules: HashMap<String, Rule>,
}

impl Schema {
    /// The rule at `path`, if any.
    #[must_use]
    pub fn rule(&self, path: &str) -> Option<&Rule> {
        self.rules.get(path)
    }

    /// A schema with the given rules (for tests of the merge).
    #[must_use]
    pub fn with(rules: &[(&str, Rule)]) -> Schema {
        Schema { rules: rules.iter().map(|(p, r)| ((*p).to_owned(), r.clone())).collect() }
    }
}

/// The schema of `def`'s kind, built once per served resource (the registry's defs live for
/// the process and are built once per CRD spec, so this cache is bounded by them).
#[must_use]
pub fn of(def: &ResourceDef) -> &'static Schema {
    static ALL: Mutex<Option<HashMap<usize, &'static Schema>>> = Mutex::new(None);
    let key = std::ptr::from_ref(def) as usize;
    let mut all = ALL.lock().unwrap_or_else(PoisonError::into_inner);
    let all = all.get_or_insert_with(HashMap::new);
    if let Some(s) = all.get(&key) {
        return s;
    }
    let built: &'static Schema = Box::leak(Box::new(build(def.kind, def.crd.map(|c| &c.schema))));
    all.insert(key, built);
    built
}

fn build(kind: &str, crd: Option<&Value>) -> Schema {
    let mut rules = HashMap::new();
    for (_, path, spec) in CORE.iter().filter(|(k, _, _)| *k == "*" || (*k == kind && crd.is_none())) {
        let rule = match spec {
            Spec::Set => Rule::Set,
            Spec::AtomicMap => Rule::AtomicMap,
            Spec::Map(keys) => Rule::Map(keys.iter().map(|(n, d)| ((*n).to_owned(), d.map(|d| Value::String(d.to_owned())))).collect()),
        };
        rules.insert((*path).to_owned(), rule);
    }
    if let Some(crd) = crd {
        from_openapi(crd, &mut String::new(), &mut rules, 0);
    }
    Schema { rules }
}

/// Collects the list and map types an OpenAPI v3 schema declares.
fn from_openapi(node: &Value, path: &mut String, rules: &mut HashMap<String, Rule>, depth: usize) {
    if depth > crate::limits::MAX_OBJECT_DEPTH {
        return;
    }
    match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => {
            rules.insert(path.clone(), Rule::Set);
        }
        Some("map") => {
            let keys = node.get("x-kubernetes-list-map-keys").and_then(Value::as_array).into_iter().flatten();
            let item_props = node.pointer("/items/properties");
            let keys = keys
                .filter_map(Value::as_str)
                .map(|k| (k.to_owned(), item_props.and_then(|p| p.get(k)).and_then(|p| p.get("default")).cloned()))
                .collect();
            rules.insert(path.clone(), Rule::Map(keys));
        }
        _ => {}
    }
    if node.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic") {
        rules.insert(path.clone(), Rule::AtomicMap);
    }
    if let Some(items) = node.get("items") {
        from_openapi(items, path, rules, depth + 1);
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(name);
            from_openapi(child, path, rules, depth + 1);
            path.truncate(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn crd_schemas_give_their_list_and_map_types() {
        let crd = json!({"properties": {"spec": {"properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port", "protocol"],
                      "items": {"properties": {"protocol": {"type": "string", "default": "TCP"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set"},
            "selector": {"type": "object", "x-kubernetes-map-type": "atomic"}}}}});
        let s = build("Thing", Some(&crd));
        assert_eq!(s.rule("spec.ports"), Some(&Rule::Map(vec![("port".into(), None), ("protocol".into(), Some(json!("TCP")))])));
        assert_eq!(s.rule("spec.tags"), Some(&Rule::Set));
        assert_eq!(s.rule("spec.selector"), Some(&Rule::AtomicMap));
        assert_eq!(s.rule("metadata.finalizers"), Some(&Rule::Set), "ObjectMeta's rules apply to custom kinds too");
    }

    #[test]
    fn every_served_kind_has_a_schema_with_objectmetas_rules() {
        for def in crate::registry::all() {
            assert_eq!(of(def).rule("metadata.ownerReferences"), Some(&Rule::Map(vec![("uid".into(), None)])), "{}", def.kind);
        }
        let node = crate::registry::by_kind("", "Node").unwrap();
        assert_eq!(of(node).rule("status.conditions"), Some(&Rule::Map(vec![("type".into(), None)])));
    }
}
