//! The operations of each served resource, described once ([`operations`]) and rendered as
//! OpenAPI v3 ([`v3_path_item`]) or Swagger 2.0 ([`v2_path_item`]).
//!
//! # Guarantees
//! - Every operation carries `x-kubernetes-action` and `x-kubernetes-group-version-kind`, which
//!   kubectl matches operations by (field-validation support, patch types).
//! - PATCH lists the JSON patch and merge patch media types only, for every kind: kubectl ≤ 1.28
//!   (`GetConsumes` on v2) and later (v3 first) then send a merge patch to custom resources and,
//!   for core kinds, build a strategic merge patch from their compiled-in types (they do when
//!   the document does not offer strategic merge patch), not from these schemas.
//! - Writes (POST, PUT, PATCH) declare `fieldValidation`, so kubectl ≥ 1.27 leaves
//!   `--validate=strict` to the server instead of validating against these schemas itself.

use serde_json::{json, Map, Value};

use super::core::DEFINITIONS;
use super::schema::COMPONENTS;
use crate::registry::ResourceDef;

/// A query parameter: name and Swagger type.
type Query = (&'static str, &'static str);

const LIST_QUERY: &[Query] = &[
    ("labelSelector", "string"),
    ("fieldSelector", "string"),
    ("limit", "integer"),
    ("continue", "string"),
    ("resourceVersion", "string"),
    ("resourceVersionMatch", "string"),
    ("timeoutSeconds", "integer"),
    ("watch", "boolean"),
    ("allowWatchBookmarks", "boolean"),
];
const WRITE_QUERY: &[Query] = &[("dryRun", "string"), ("fieldManager", "string"), ("fieldValidation", "string")];
const DELETE_QUERY: &[Query] = &[("dryRun", "string"), ("gracePeriodSeconds", "integer"), ("propagationPolicy", "string")];

/// The media types a PATCH takes (see the module docs).
pub const PATCH_TYPES: &[&str] = &["application/json-patch+json", "application/merge-patch+json"];

/// What an operation's body or response is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    None,
    /// The resource's own schema.
    Object,
    /// Any JSON object (a list, a Status, a patch).
    Any,
}

/// One operation, in neither rendering.
#[derive(Debug)]
pub struct Operation {
    /// HTTP method, lower case, as path items name them.
    pub method: &'static str,
    /// `x-kubernetes-action`.
    pub action: &'static str,
    pub id: String,
    pub query: &'static [Query],
    pub body: Payload,
    pub response: Payload,
}

/// One path and its operations.
#[derive(Debug)]
pub struct PathOps {
    pub path: String,
    /// Path parameters, in order.
    pub params: Vec<&'static str>,
    pub operations: Vec<Operation>,
}

fn op(method: &'static str, action: &'static str, id: String, query: &'static [Query], body: Payload, response: Payload) -> Operation {
    Operation { method, action, id, query, body, response }
}

/// The paths of `r` (served under `gv`, `api/v1` or `apis/GROUP/VERSION`).
#[must_use]
pub fn operations(r: &ResourceDef, gv: &str) -> Vec<PathOps> {
    let (base, mut params, scope) = if r.namespaced {
        (format!("/{gv}/namespaces/{{namespace}}/{}", r.plural), vec!["namespace"], "Namespaced")
    } else {
        (format!("/{gv}/{}", r.plural), Vec::new(), "")
    };
    let k = r.kind;
    let mut out = vec![PathOps {
        path: base.clone(),
        params: params.clone(),
        operations: vec![
            op("get", "list", format!("list{scope}{k}"), LIST_QUERY, Payload::None, Payload::Any),
            op("post", "post", format!("create{scope}{k}"), WRITE_QUERY, Payload::Object, Payload::Object),
            op("delete", "deletecollection", format!("deleteCollection{scope}{k}"), DELETE_QUERY, Payload::None, Payload::Any),
        ],
    }];
    params.push("name");
    out.push(PathOps {
        path: format!("{base}/{{name}}"),
        params: params.clone(),
        operations: vec![
            op("get", "get", format!("read{scope}{k}"), &[], Payload::None, Payload::Object),
            op("put", "put", format!("replace{scope}{k}"), WRITE_QUERY, Payload::Object, Payload::Object),
            op("patch", "patch", format!("patch{scope}{k}"), WRITE_QUERY, Payload::Any, Payload::Object),
            op("delete", "delete", format!("delete{scope}{k}"), DELETE_QUERY, Payload::None, Payload::Any),
        ],
    });
    if r.status {
        out.push(PathOps {
            path: format!("{base}/{{name}}/status"),
            params,
            operations: vec![
                op("get", "get", format!("read{scope}{k}Status"), &[], Payload::None, Payload::Object),
                op("put", "put", format!("replace{scope}{k}Status"), WRITE_QUERY, Payload::Object, Payload::Object),
                op("patch", "patch", format!("patch{scope}{k}Status"), WRITE_QUERY, Payload::Any, Payload::Object),
            ],
        });
    }
    out
}

fn gvk(r: &ResourceDef) -> Value {
    json!({"group": r.group, "version": r.version, "kind": r.kind})
}

fn consumes(o: &Operation) -> Vec<&'static str> {
    match (o.method, o.body) {
        ("patch", _) => PATCH_TYPES.to_vec(),
        (_, Payload::None) => Vec::new(),
        _ => vec!["application/json", "application/yaml"],
    }
}

fn payload_schema(p: Payload, prefix: &str, root: &str) -> Value {
    match p {
        Payload::Object => json!({"$ref": format!("{prefix}{root}")}),
        Payload::Any | Payload::None => json!({"type": "object"}),
    }
}

/// The v3 path item of `p`, whose resource's schema is the component `root`.
#[must_use]
pub fn v3_path_item(r: &ResourceDef, root: &str, p: &PathOps) -> Value {
    let mut item = Map::new();
    for o in &p.operations {
        let mut params: Vec<Value> =
            p.params.iter().map(|n| json!({"name": n, "in": "path", "required": true, "schema": {"type": "string"}})).collect();
        params.extend(o.query.iter().map(|(n, t)| json!({"name": n, "in": "query", "schema": {"type": t}})));
        let mut v = json!({
            "operationId": o.id,
            "x-kubernetes-action": o.action,
            "x-kubernetes-group-version-kind": gvk(r),
            "parameters": params,
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": payload_schema(o.response, COMPONENTS, root)}}}},
        });
        if o.body != Payload::None {
            let content: Map<String, Value> =
                consumes(o).into_iter().map(|t| (t.to_owned(), json!({"schema": payload_schema(o.body, COMPONENTS, root)}))).collect();
            v["requestBody"] = json!({"content": content, "required": true});
        }
        item.insert(o.method.to_owned(), v);
    }
    Value::Object(item)
}

/// The Swagger 2.0 path item of `p`, whose resource's schema is the definition `root`.
#[must_use]
pub fn v2_path_item(r: &ResourceDef, root: &str, p: &PathOps) -> Value {
    let mut item = Map::new();
    for o in &p.operations {
        let mut params: Vec<Value> =
            p.params.iter().map(|n| json!({"name": n, "in": "path", "required": true, "type": "string"})).collect();
        params.extend(o.query.iter().map(|(n, t)| json!({"name": n, "in": "query", "type": t})));
        if o.body != Payload::None {
            params.push(json!({"name": "body", "in": "body", "required": true, "schema": payload_schema(o.body, DEFINITIONS, root)}));
        }
        let mut v = json!({
            "operationId": o.id,
            "produces": ["application/json"],
            "schemes": ["https"],
            "parameters": params,
            "responses": {"200": {"description": "OK", "schema": payload_schema(o.response, DEFINITIONS, root)}},
            "x-kubernetes-action": o.action,
            "x-kubernetes-group-version-kind": gvk(r),
        });
        let types = consumes(o);
        if !types.is_empty() {
            v["consumes"] = json!(types);
        }
        item.insert(o.method.to_owned(), v);
    }
    Value::Object(item)
}
