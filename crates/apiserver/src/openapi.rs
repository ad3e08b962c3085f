//! OpenAPI documents: v3 per group-version (what `kubectl explain` and kubectl's field-validation
//! check read) and a minimal v2 document.
//!
//! Schemas of the custom resources come from the CRDs generated from the `api` types, with
//! `x-kubernetes-preserve-unknown-fields` on every object: virtplug keeps fields it does not
//! model, so a full KubeVirt manifest applies under `--validate=strict`. PATCH operations list the
//! merge and JSON patch media types only, which is how
//! kubectl decides to send a merge patch for custom resources.

use serde_json::{json, Map, Value};

use crate::registry::{self, ResourceDef};

fn gv_path(r: &ResourceDef) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

fn schema_name(r: &ResourceDef) -> String {
    let group: Vec<&str> = r.group.split('.').rev().collect();
    if r.group.is_empty() {
        format!("io.k8s.api.core.{}.{}", r.version, r.kind)
    } else {
        format!("{}.{}.{}", group.join("."), r.version, r.kind)
    }
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

fn schema_for(r: &ResourceDef) -> Value {
    let known = r.crd.map(|c| c.schema.clone()).or_else(|| r.strategy.map(|s| (s.schema)()));
    let mut s = known.unwrap_or_else(|| {
        json!({"type": "object", "description": format!("{} (core/v1); fields as in Kubernetes.", r.kind),
               "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                              "spec": {"type": "object"}, "status": {"type": "object"}}})
    });
    preserve_unknown(&mut s);
    s["x-kubernetes-group-version-kind"] = json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
    s
}

fn operation(r: &ResourceDef, verb: &str, patch: bool) -> Value {
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let mut op = json!({
        "operationId": format!("{verb}{}", r.kind),
        "x-kubernetes-action": verb,
        "x-kubernetes-group-version-kind": gvk,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{}", schema_name(r))}}}}},
    });
    if matches!(verb, "post" | "put" | "patch") {
        op["parameters"] = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        ]);
        let body = json!({"schema": {"type": "object"}});
        let mut content = Map::new();
        if patch {
            content.insert("application/json-patch+json".into(), body.clone());
            // Strategic merge patch is not listed even for core types: kubectl then builds it
            // from its compiled-in types instead of from these open schemas.
            content.insert("application/merge-patch+json".into(), body);
        } else {
            content.insert("application/json".into(), body);
        }
        op["requestBody"] = json!({"content": content, "required": true});
    }
    op
}

/// The `/openapi/v3` index.
#[must_use]
pub fn v3_index() -> Value {
    let mut paths = Map::new();
    for r in registry::all() {
        let p = gv_path(r);
        paths.entry(p.clone()).or_insert_with(
            || json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", env!("CARGO_PKG_VERSION").replace('.', ""))}),
        );
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of one group-version (`apis/kubevirt.io/v1`, `api/v1`).
#[must_use]
pub fn v3_group(gv: &str) -> Option<Value> {
    let members: Vec<&ResourceDef> = registry::all().into_iter().filter(|r| gv_path(r) == gv).collect();
    if members.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for r in members {
        schemas.insert(schema_name(r), schema_for(r));
        let base = if r.namespaced { format!("/{gv}/namespaces/{{namespace}}/{}", r.plural) } else { format!("/{gv}/{}", r.plural) };
        paths.insert(base.clone(), json!({"get": operation(r, "list", false), "post": operation(r, "post", false)}));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({"get": operation(r, "get", false), "put": operation(r, "put", false),
                   "patch": operation(r, "patch", true), "delete": operation(r, "delete", false)}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "virtplug", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// A minimal `/openapi/v2` document. Kinds carry no `x-kubernetes-group-version-kind` here, so
/// kubectl takes patch strategies and explanations from v3.
#[must_use]
pub fn v2() -> Value {
    json!({"swagger": "2.0", "info": {"title": "virtplug", "version": env!("CARGO_PKG_VERSION")}, "paths": {}, "definitions": {}})
}

/// `/openapi/v2` as protobuf (gnostic `openapi_v2.Document`), which kubectl asks for first: a
/// document with `swagger`, `info` and empty `paths`. Without definitions kubectl takes patch
/// strategies from v3 (merge patch for custom resources); `kubectl explain` needs OpenAPI v3
/// (kubectl 1.29 and later by default; `KUBECTL_EXPLAIN_OPENAPIV3=true` for 1.27 and 1.28).
#[must_use]
pub fn v2_protobuf() -> Vec<u8> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2);
        // Every field here is shorter than 128 bytes, so its length is a one-byte varint.
        out.push(u8::try_from(bytes.len()).unwrap_or(0));
        out.extend_from_slice(bytes);
    }
    let mut info = Vec::new();
    field(&mut info, 1, b"virtplug");
    field(&mut info, 2, env!("CARGO_PKG_VERSION").as_bytes());
    let mut doc = Vec::new();
    field(&mut doc, 1, b"2.0");
    field(&mut doc, 2, &info);
    field(&mut doc, 8, &[]);
    doc
}
