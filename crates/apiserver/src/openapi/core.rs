//! Schemas of the core kinds (core/v1, coordination, events, storage, authorization and
//! authentication), generated from k8s-openapi's types through their `schemars` schemas, which
//! carry Kubernetes' own descriptions and structure.
//!
//! # Flow
//! One `schemars` generator, whose definitions path is `#/definitions/`, is asked for every kind
//! of [`KINDS`]; its definitions (the kinds and every type they reach) are then brought to the
//! form Kubernetes publishes ([`kubernetes_form`]): the list and patch extensions of
//! [`super::lists`], `Quantity` and `IntOrString` as the strings Kubernetes declares them,
//! `metadata` not required, and `x-kubernetes-group-version-kind` on each kind.
//!
//! # Guarantees
//! - Every `$ref` names a definition of the same set (schemars adds each type it refers to).
//! - Deterministic: the same definitions in the same order on every run.
//!
//! # Caveats
//! Only the extensions in [`super::lists`] are added; `x-kubernetes-map-type` and
//! `x-kubernetes-unions` are not.

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::Schema;
use serde_json::{json, Map, Value};

use k8s_openapi::api::{authentication, authorization, coordination, core::v1 as core, events, storage};

use super::lists;

/// Where [`generate`]'s `$ref`s point.
pub const DEFINITIONS: &str = "#/definitions/";

/// A core kind: group, version, kind, and the schema of its k8s-openapi type.
type Kind = (&'static str, &'static str, &'static str, fn(&mut SchemaGenerator) -> Schema);

/// The core kinds this module describes, whether or not the registry serves them yet.
pub const KINDS: &[Kind] = &[
    ("", "v1", "Namespace", |g| g.subschema_for::<core::Namespace>()),
    ("", "v1", "Node", |g| g.subschema_for::<core::Node>()),
    ("", "v1", "PersistentVolumeClaim", |g| g.subschema_for::<core::PersistentVolumeClaim>()),
    ("", "v1", "PersistentVolume", |g| g.subschema_for::<core::PersistentVolume>()),
    ("", "v1", "Event", |g| g.subschema_for::<core::Event>()),
    ("", "v1", "Secret", |g| g.subschema_for::<core::Secret>()),
    ("", "v1", "ConfigMap", |g| g.subschema_for::<core::ConfigMap>()),
    ("", "v1", "ServiceAccount", |g| g.subschema_for::<core::ServiceAccount>()),
    ("", "v1", "Pod", |g| g.subschema_for::<core::Pod>()),
    ("", "v1", "Service", |g| g.subschema_for::<core::Service>()),
    ("coordination.k8s.io", "v1", "Lease", |g| g.subschema_for::<coordination::v1::Lease>()),
    ("events.k8s.io", "v1", "Event", |g| g.subschema_for::<events::v1::Event>()),
    ("storage.k8s.io", "v1", "StorageClass", |g| g.subschema_for::<storage::v1::StorageClass>()),
    ("authorization.k8s.io", "v1", "SelfSubjectAccessReview", |g| g.subschema_for::<authorization::v1::SelfSubjectAccessReview>()),
    ("authorization.k8s.io", "v1", "SelfSubjectRulesReview", |g| g.subschema_for::<authorization::v1::SelfSubjectRulesReview>()),
    ("authentication.k8s.io", "v1", "SelfSubjectReview", |g| g.subschema_for::<authentication::v1::SelfSubjectReview>()),
    // kubectl 1.27's `auth whoami` versions: the same message as v1.
    ("authentication.k8s.io", "v1beta1", "SelfSubjectReview", |g| g.subschema_for::<authentication::v1::SelfSubjectReview>()),
    ("authentication.k8s.io", "v1alpha1", "SelfSubjectReview", |g| g.subschema_for::<authentication::v1::SelfSubjectReview>()),
    ("apiextensions.k8s.io", "v1", "CustomResourceDefinition", |g| {
        g.subschema_for::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>()
    }),
];

/// The generated definitions, and the definition name of each of [`KINDS`] (same order).
#[derive(Debug, Default)]
pub struct CoreSchemas {
    pub definitions: Map<String, Value>,
    pub roots: Vec<String>,
}

impl CoreSchemas {
    /// The definition name of a kind, when it is one of [`KINDS`].
    #[must_use]
    pub fn root(&self, group: &str, version: &str, kind: &str) -> Option<&str> {
        KINDS.iter().zip(&self.roots).find(|((g, v, k, _), _)| *g == group && *v == version && *k == kind).map(|(_, name)| name.as_str())
    }
}

/// Generates the definitions of every kind of [`KINDS`] and of the types they reach.
#[must_use]
pub fn generate() -> CoreSchemas {
    let mut generator = SchemaSettings::draft07()
        .with(|s| {
            s.definitions_path = DEFINITIONS.into();
            s.meta_schema = None;
            s.transforms = Vec::new();
        })
        .into_generator();
    let mut roots = Vec::new();
    for (_, _, _, schema) in KINDS {
        let reference = schema(&mut generator);
        let name = reference.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix(DEFINITIONS)).unwrap_or_default();
        roots.push(name.to_owned());
    }
    let mut definitions = generator.take_definitions(false);
    kubernetes_form(&mut definitions);
    // A kind served in versions k8s-openapi has one type for (SelfSubjectReview v1beta1 and
    // v1alpha1) gets its own copy under its version's name, as Kubernetes' documents have it.
    let mut seen = std::collections::HashSet::new();
    for ((group, version, kind, _), name) in KINDS.iter().zip(roots.iter_mut()) {
        if !seen.insert(name.clone()) {
            let copy = format!("io.k8s.api.{}.{version}.{kind}", group.split('.').next().unwrap_or("core"));
            if let Some(def) = definitions.get(name.as_str()).cloned() {
                definitions.insert(copy.clone(), def);
                *name = copy;
            }
        }
    }
    for ((group, version, kind, _), name) in KINDS.iter().zip(&roots) {
        if let Some(Value::Object(root)) = definitions.get_mut(name) {
            root.insert("x-kubernetes-group-version-kind".into(), json!([{"group": group, "version": version, "kind": kind}]));
        }
    }
    CoreSchemas { definitions, roots }
}

/// Brings schemars' definitions to the form of Kubernetes' own documents (see the module docs).
fn kubernetes_form(definitions: &mut Map<String, Value>) {
    for (name, def) in definitions.iter_mut() {
        let Value::Object(def) = def else { continue };
        match name.as_str() {
            // Kubernetes declares both as strings (`format: int-or-string` for the latter);
            // their JSON also takes numbers, which the server accepts as kube-apiserver does.
            "io.k8s.apimachinery.pkg.api.resource.Quantity" => {
                def.remove("x-kubernetes-int-or-string");
                def.insert("type".into(), json!("string"));
            }
            "io.k8s.apimachinery.pkg.util.intstr.IntOrString" => {
                def.remove("x-kubernetes-int-or-string");
                def.insert("type".into(), json!("string"));
                def.insert("format".into(), json!("int-or-string"));
            }
            _ => {}
        }
        // k8s-openapi requires `metadata` of every object (its Rust field is not optional);
        // Kubernetes does not, and `kubectl explain` would mark it required.
        let is_object =
            def.get("properties").and_then(Value::as_object).is_some_and(|p| p.contains_key("apiVersion") && p.contains_key("kind"));
        if is_object {
            if let Some(Value::Array(required)) = def.get_mut("required") {
                required.retain(|f| f != "metadata");
                if required.is_empty() {
                    def.remove("required");
                }
            }
        }
    }
    let api = lists::API.iter().map(|row| (format!("io.k8s.api.{}", row.0), row));
    let meta = lists::META.iter().map(|row| (row.0.to_owned(), row));
    for (name, (_, field, list_type, keys, strategy, merge_key)) in api.chain(meta) {
        let Some(Value::Object(prop)) = definitions.get_mut(&name).and_then(|d| d.pointer_mut(&format!("/properties/{field}"))) else {
            continue;
        };
        if let Some(t) = list_type {
            prop.insert("x-kubernetes-list-type".into(), json!(t));
        }
        if !keys.is_empty() {
            prop.insert("x-kubernetes-list-map-keys".into(), json!(keys));
        }
        if let Some(s) = strategy {
            prop.insert("x-kubernetes-patch-strategy".into(), json!(s));
        }
        if let Some(k) = merge_key {
            prop.insert("x-kubernetes-patch-merge-key".into(), json!(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|c| refs(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| refs(c, out)),
            _ => {}
        }
    }

    #[test]
    fn every_kind_has_a_root_and_every_ref_resolves() {
        let s = generate();
        for ((g, v, k, _), name) in KINDS.iter().zip(&s.roots) {
            let root = s.definitions.get(name).unwrap_or_else(|| panic!("{g}/{v} {k}: no definition {name:?}"));
            assert_eq!(root["x-kubernetes-group-version-kind"][0]["kind"], json!(k), "{name}");
            assert!(root["properties"]["metadata"].is_object(), "{name}");
        }
        let mut all = Vec::new();
        refs(&Value::Object(s.definitions.clone()), &mut all);
        for r in all {
            let name = r.strip_prefix(DEFINITIONS).unwrap_or_else(|| panic!("{r} is not a definitions ref"));
            assert!(s.definitions.contains_key(name), "{r} is dangling");
        }
    }

    /// Every row of the table lands on a field: a row that names no field (a typo, a renamed
    /// type) would silently publish nothing.
    #[test]
    fn every_list_row_names_a_generated_field() {
        let s = generate();
        for (def, field, ..) in lists::API {
            let name = format!("io.k8s.api.{def}");
            assert!(s.definitions.get(&name).and_then(|d| d.pointer(&format!("/properties/{field}"))).is_some(), "{name}.{field}");
        }
        let pod_spec = &s.definitions["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(pod_spec["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(pod_spec["x-kubernetes-list-map-keys"], json!(["name"]));
        assert!(s.definitions["io.k8s.api.core.v1.Secret"].get("required").is_none(), "metadata is not required");
    }
}
