//! The OpenAPI documents, both rendered from one set of schemas:
//! - v3 per group-version (`/openapi/v3/...`): what kubectl ≥ 1.27 explains from, checks
//!   `fieldValidation` support in, and looks for strategic merge patch in;
//! - Swagger 2.0 (`/openapi/v2`, gnostic protobuf for client-go, JSON for anyone else): what
//!   every kubectl parses before `explain`, `apply` and `--validate` (a document kube-openapi
//!   cannot parse fails them all), what `explain --output=plaintext-openapiv2` and servers
//!   without v3 explain from, and where kubectl ≤ 1.28 takes PATCH media types from.
//!
//! # Flow
//! [`documents`] builds everything on first use and again after the registry changed (a CRD
//! registered, changed or deleted; the server starts the first build in the background at
//! start, see [`warm`]):
//! 1. The schemas ([`catalog`]): the custom resources' from their CRDs as registered
//!    ([`crate::crd`]; virtplug's own keep unknown fields at every object level, so a full
//!    KubeVirt manifest applies under `--validate=strict`); the core
//!    kinds' from k8s-openapi ([`core`]), as definitions with `$ref`s. Each resource's root
//!    carries `x-kubernetes-group-version-kind`.
//! 2. The operations of each resource ([`paths`]).
//! 3. Two renderings of both ([`schema::to_v3`], [`schema::to_v2`]), serialized once:
//!    the v3 index and one v3 document per group-version (the definitions its resources reach),
//!    the v2 document as JSON and as gnostic protobuf ([`gnostic`]).
//!
//! # Guarantees
//! - v2 and v3 describe the same fields with the same descriptions for every resource (a test
//!   walks both).
//! - Each document has an ETag (a hash of its bytes); the v3 index's `?hash=` is that of the
//!   group-version's document, so kubectl's disk cache, which is keyed by that URL, never serves
//!   a document of another build.
//! - Building never fails and never panics: a resource without a known schema gets a
//!   placeholder object schema.

pub mod core;
mod gnostic;
mod lists;
mod paths;
pub mod schema;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::registry::{self, ResourceDef};

/// A serialized document and its ETag.
#[derive(Clone, Debug)]
pub struct Served {
    pub body: Bytes,
    /// Quoted, as the header carries it.
    pub etag: String,
}

impl Served {
    fn new(body: Vec<u8>) -> Self {
        let etag = format!("\"{:016x}\"", fnv1a(&body));
        Served { body: Bytes::from(body), etag }
    }
    fn json(v: &Value) -> Self {
        Served::new(v.to_string().into_bytes())
    }
}

/// Every document, built once.
#[derive(Debug)]
pub struct Documents {
    pub v3_index: Served,
    /// By group-version path (`api/v1`, `apis/kubevirt.io/v1`).
    pub v3: BTreeMap<String, Served>,
    pub v2_json: Served,
    pub v2_protobuf: Served,
    /// How long building took.
    pub build_time: Duration,
}

/// The schemas of every served resource, in the neutral form of [`schema`].
#[derive(Debug, Default)]
pub struct Catalog {
    /// Every definition (`$ref`s as `#/definitions/NAME`).
    pub definitions: Map<String, Value>,
    /// The resources, as [`registry::all`] listed them when the catalog was built.
    pub resources: Vec<&'static ResourceDef>,
    /// The root definition of each of `resources`, same order.
    pub roots: Vec<String>,
}

/// 64-bit FNV-1a: stable across builds and platforms, which `std`'s hasher does not promise.
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3))
}

/// `api/v1` or `apis/GROUP/VERSION`.
#[must_use]
pub fn gv_path(r: &ResourceDef) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

/// The definition name of a custom resource (`io.kubevirt.v1.VirtualMachine`).
fn crd_name(r: &ResourceDef) -> String {
    let group: Vec<&str> = r.group.split('.').rev().collect();
    format!("{}.{}.{}", group.join("."), r.version, r.kind)
}

const API_VERSION_DOC: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DOC: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// What kube-apiserver adds to a CRD's schema when it publishes it: `apiVersion` and `kind`,
/// and `metadata` as a reference to apimachinery's `ObjectMeta` (or `ListMeta` for a list),
/// whatever the CRD itself says of them. Without them a client validating against the
/// document (kubectl on a `List` file) finds `apiVersion`, `kind` and `metadata` unknown.
fn with_object_envelope(s: &mut Value, what: &str) {
    let Some(m) = s.as_object_mut() else { return };
    let meta = if what == "list" { "ListMeta" } else { "ObjectMeta" };
    let doc = if what == "list" {
        "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
    } else {
        "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
    };
    let props = m.entry("properties").or_insert_with(|| json!({}));
    if let Some(p) = props.as_object_mut() {
        p.insert("apiVersion".into(), json!({"type": "string", "description": API_VERSION_DOC}));
        p.insert("kind".into(), json!({"type": "string", "description": KIND_DOC}));
        p.insert(
            "metadata".into(),
            json!({"$ref": format!("#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.{meta}"), "description": doc}),
        );
    }
    m.entry("type").or_insert_with(|| json!("object"));
}

/// `KindList`'s definition, as kube-apiserver publishes it beside a CRD's kind.
fn list_definition(r: &ResourceDef, item: &str) -> Value {
    let mut s = json!({
        "type": "object",
        "description": format!("{}List is a list of {}", r.kind, r.kind),
        "required": ["items"],
        "properties": {"items": {"type": "array", "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", r.plural),
                                 "items": {"$ref": format!("#/definitions/{item}")}}},
    });
    with_object_envelope(&mut s, "list");
    s["x-kubernetes-group-version-kind"] = json!([{"group": r.group, "version": r.version, "kind": format!("{}List", r.kind)}]);
    s
}

fn preserve_unknown(v: &mut Value) {
    if let Value::Object(m) = v {
        if m.get("type") == Some(&json!("object")) || m.contains_key("properties") {
            m.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
        }
        for child in m.values_mut() {
            preserve_unknown(child);
        }
    } else if let Value::Array(a) = v {
        for child in a {
            preserve_unknown(child);
        }
    }
}

fn core_schemas() -> &'static core::CoreSchemas {
    static S: OnceLock<core::CoreSchemas> = OnceLock::new();
    S.get_or_init(core::generate)
}

/// The OpenAPI v3 schema of a core kind (one of [`core::KINDS`], served or not), whose `$ref`s
/// point to `#/components/schemas/NAME`; every one of them is in the v3 document of the kind's
/// group-version once the kind is served, and in [`core_definition`] meanwhile.
#[must_use]
pub fn core_schema(group: &str, version: &str, kind: &str) -> Option<Value> {
    let s = core_schemas();
    s.root(group, version, kind).and_then(core_definition)
}

/// One definition of the core kinds' schemas (`io.k8s.api.core.v1.PodSpec`), rendered for v3.
#[must_use]
pub fn core_definition(name: &str) -> Option<Value> {
    core_schemas().definitions.get(name).map(schema::to_v3)
}

/// The schemas of every resource [`registry::all`] lists.
#[must_use]
pub fn catalog() -> Catalog {
    let core = core_schemas();
    let resources = registry::all();
    let mut cat = Catalog { definitions: core.definitions.clone(), resources: resources.clone(), roots: Vec::new() };
    cat.definitions.entry("io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta").or_insert_with(|| {
        json!({"type": "object", "description": "ListMeta describes metadata that synthetic resources must have, including lists and various status objects.",
               "properties": {"continue": {"type": "string"}, "remainingItemCount": {"type": "integer", "format": "int64"},
                              "resourceVersion": {"type": "string"}, "selfLink": {"type": "string"}}})
    });
    for r in resources {
        if let Some(name) = core.root(r.group, r.version, r.kind).filter(|_| !r.custom) {
            cat.roots.push(name.to_owned());
            continue;
        }
        // A CRD's schema is served as the CRD gives it: it is also what prunes.
        if let Some(crd) = r.crd {
            let mut s = crd.schema.clone();
            with_object_envelope(&mut s, "object");
            s["x-kubernetes-group-version-kind"] = json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
            let name = crd_name(r);
            cat.definitions.insert(format!("{name}List"), list_definition(r, &name));
            cat.definitions.insert(name.clone(), s);
            cat.roots.push(name);
            continue;
        }
        let known = r.strategy.map(|s| (s.schema)());
        let mut s = known.unwrap_or_else(|| {
            json!({"type": "object", "description": format!("{} ({}).", r.kind, r.api_version()),
                   "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                                  "spec": {"type": "object"}, "status": {"type": "object"}}})
        });
        preserve_unknown(&mut s);
        s["x-kubernetes-group-version-kind"] = json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
        let name = if r.custom {
            crd_name(r)
        } else {
            // Kubernetes' naming: `io.k8s.api.core.v1.Kind`, `io.k8s.api.storage.v1.Kind`.
            format!("io.k8s.api.{}.{}.{}", r.group.split('.').next().filter(|g| !g.is_empty()).unwrap_or("core"), r.version, r.kind)
        };
        cat.definitions.insert(name.clone(), s);
        cat.roots.push(name);
    }
    cat
}

/// The v3 document of group-version `gv`, or `None` when nothing is served there.
#[must_use]
pub fn v3_group(cat: &Catalog, gv: &str) -> Option<Value> {
    let members: Vec<(&ResourceDef, &String)> = cat.resources.iter().copied().zip(&cat.roots).filter(|(r, _)| gv_path(r) == gv).collect();
    if members.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    for (r, root) in &members {
        for p in paths::operations(r, gv) {
            paths.insert(p.path.clone(), paths::v3_path_item(r, root, &p));
        }
    }
    let roots: Vec<String> = members.iter().map(|(_, root)| (*root).clone()).collect();
    let mut schemas = Map::new();
    for name in schema::closure(&cat.definitions, &roots) {
        if let Some(def) = cat.definitions.get(&name) {
            schemas.insert(name, schema::to_v3(def));
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "virtplug", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// The Swagger 2.0 document: every resource's paths, every definition.
#[must_use]
pub fn v2(cat: &Catalog) -> Value {
    let mut paths = Map::new();
    for (r, root) in cat.resources.iter().copied().zip(&cat.roots) {
        for p in paths::operations(r, &gv_path(r)) {
            paths.insert(p.path.clone(), paths::v2_path_item(r, root, &p));
        }
    }
    let crds: std::collections::HashSet<&String> =
        cat.resources.iter().zip(&cat.roots).filter(|(r, _)| r.crd.is_some()).map(|(_, n)| n).collect();
    let definitions: Map<String, Value> =
        cat.definitions.iter().map(|(n, d)| (n.clone(), if crds.contains(n) { schema::crd_to_v2(d) } else { schema::to_v2(d) })).collect();
    json!({
        "swagger": "2.0",
        "info": {"title": "virtplug", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "definitions": definitions,
    })
}

/// Builds every document (see the module docs).
#[must_use]
pub fn build() -> Documents {
    let start = Instant::now();
    let cat = catalog();
    let mut v3 = BTreeMap::new();
    for r in &cat.resources {
        let gv = gv_path(r);
        if let std::collections::btree_map::Entry::Vacant(slot) = v3.entry(gv) {
            if let Some(doc) = v3_group(&cat, slot.key()) {
                slot.insert(Served::json(&doc));
            }
        }
    }
    let index: Map<String, Value> = v3
        .iter()
        .map(|(gv, s)| (gv.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={}", s.etag.trim_matches('"'))})))
        .collect();
    let v2 = v2(&cat);
    let docs = Documents {
        v3_index: Served::json(&json!({"paths": index})),
        v3,
        v2_protobuf: Served::new(gnostic::document(&v2)),
        v2_json: Served::json(&v2),
        build_time: start.elapsed(),
    };
    tracing::debug!(
        build_ms = docs.build_time.as_millis(),
        v2_json_bytes = docs.v2_json.body.len(),
        v2_protobuf_bytes = docs.v2_protobuf.body.len(),
        v3_bytes = docs.v3.values().map(|s| s.body.len()).sum::<usize>(),
        "OpenAPI documents built"
    );
    docs
}

/// The documents of the registry as it is now: built on first use and after each change.
pub fn documents() -> Arc<Documents> {
    static DOCS: Mutex<Option<(u64, Arc<Documents>)>> = Mutex::new(None);
    // virtplug's own CRDs register on first use: before the generation is read, not during
    // the build.
    crate::crd::register_builtin();
    let generation = registry::generation();
    let mut docs = DOCS.lock().unwrap_or_else(PoisonError::into_inner);
    match docs.as_ref() {
        Some((g, d)) if *g == generation => Arc::clone(d),
        _ => {
            let built = Arc::new(build());
            *docs = Some((generation, Arc::clone(&built)));
            built
        }
    }
}

/// Builds the documents on a thread of their own, so the first kubectl does not wait for them.
pub fn warm() {
    // A failed spawn only means the first request builds them.
    let _ = std::thread::Builder::new().name("openapi".into()).spawn(|| drop(documents()));
}

#[cfg(test)]
mod tests;
