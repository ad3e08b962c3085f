//! The documents against each other and against what kubectl's parsers require.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::*;
use crate::protobuf::wire::{self, Fields};

/// The definitions of a document: v2's `definitions`, v3's `components.schemas`.
fn defs(doc: &Value) -> &Map<String, Value> {
    doc.get("definitions").or_else(|| doc.pointer("/components/schemas")).and_then(Value::as_object).expect("a document with definitions")
}

/// The definition a schema refers to (`$ref`, or v3's `allOf: [{$ref}]`).
fn referred<'a>(defs: &'a Map<String, Value>, s: &Value) -> Option<&'a Value> {
    let r = s.get("$ref").or_else(|| s.pointer("/allOf/0/$ref")).and_then(Value::as_str)?;
    let name = r.rsplit('/').next()?;
    defs.get(name)
}

fn type_of(s: &Value) -> String {
    match s.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => {
            let real: Vec<&str> = ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect();
            if real.len() == 1 {
                real[0].to_owned()
            } else {
                String::new()
            }
        }
        _ => String::new(),
    }
}

/// Every field below `s` to `depth` levels: path -> (type, description), refs followed.
fn fields(defs: &Map<String, Value>, s: &Value, path: &str, depth: usize, out: &mut BTreeMap<String, (String, String)>) {
    let target = referred(defs, s).unwrap_or(s);
    let description = s.get("description").or_else(|| target.get("description")).and_then(Value::as_str).unwrap_or_default();
    out.insert(path.to_owned(), (type_of(target), description.to_owned()));
    if depth == 0 {
        return;
    }
    for (name, p) in target.get("properties").and_then(Value::as_object).into_iter().flatten() {
        fields(defs, p, &format!("{path}.{name}"), depth - 1, out);
    }
    if let Some(items) = target.get("items").filter(|i| i.is_object()) {
        fields(defs, items, &format!("{path}[]"), depth - 1, out);
    }
    if let Some(values) = target.get("additionalProperties").filter(|i| i.is_object()) {
        fields(defs, values, &format!("{path}{{}}"), depth - 1, out);
    }
}

#[test]
fn v2_and_v3_carry_the_same_schema_for_every_resource() {
    let cat = catalog();
    let v2 = v2(&cat);
    // A CRD's own schema type (JSONSchemaProps) nests `JSONSchemaPropsOrArray`/`OrBool`, which
    // v2 can only carry in the reduced shapes kube-openapi parses: compared elsewhere (the
    // parser-rule test), not field by field.
    // A custom resource's v2 schema is reduced where it keeps unknown fields, as kube-apiserver
    // reduces it (compared in `custom_resources_keep_unknown_fields_in_both_renderings`).
    for (r, root) in cat.resources.iter().copied().zip(&cat.roots).filter(|(r, _)| r.kind != "CustomResourceDefinition" && r.crd.is_none())
    {
        let v3 = v3_group(&cat, &gv_path(r)).expect("a v3 document for each served group-version");
        let (mut in_v2, mut in_v3) = (BTreeMap::new(), BTreeMap::new());
        fields(defs(&v2), &defs(&v2)[root], r.kind, 6, &mut in_v2);
        fields(defs(&v3), &defs(&v3)[root], r.kind, 6, &mut in_v3);
        assert!(in_v2.len() > 4, "{}: {in_v2:?}", r.kind);
        assert_eq!(in_v2, in_v3, "{}", r.kind);
        for doc in [&v2, &v3] {
            assert_eq!(
                defs(doc)[root]["x-kubernetes-group-version-kind"],
                json!([{"group": r.group, "version": r.version, "kind": r.kind}])
            );
        }
    }
}

#[test]
fn core_kinds_have_their_full_kubernetes_schemas() {
    let cat = catalog();
    let v2 = v2(&cat);
    let mut f = BTreeMap::new();
    fields(defs(&v2), &defs(&v2)["io.k8s.api.core.v1.PersistentVolumeClaim"], "pvc", 4, &mut f);
    assert!(
        f["pvc.spec.storageClassName"].1.contains("name of the StorageClass required by the claim"),
        "{:?}",
        f["pvc.spec.storageClassName"]
    );
    assert_eq!(f["pvc.spec.accessModes"].0, "array");
    assert_eq!(f["pvc.metadata.name"].0, "string");
    let conditions = &defs(&v2)["io.k8s.api.core.v1.PersistentVolumeClaimStatus"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-patch-merge-key"], "type");
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    let secret = core_schema("", "v1", "Secret").expect("Secret is a core kind");
    assert_eq!(
        secret["properties"]["metadata"]["allOf"][0]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert!(core_schema("", "v1", "Pod").is_some() && core_schema("coordination.k8s.io", "v1", "Lease").is_some());
    assert!(core_schema("kubevirt.io", "v1", "VirtualMachine").is_none());
}

#[test]
fn custom_resources_keep_unknown_fields_in_both_renderings() {
    let cat = catalog();
    let v2 = v2(&cat);
    let v3 = v3_group(&cat, "apis/kubevirt.io/v1").expect("kubevirt.io/v1 is served");
    let domain =
        defs(&v3)["io.kubevirt.v1.VirtualMachine"].pointer("/properties/spec/properties/template/properties/spec/properties/domain");
    assert_eq!(domain.and_then(|d| d.get("x-kubernetes-preserve-unknown-fields")), Some(&json!(true)));
    // v2 as kube-apiserver publishes a CRD: the node that keeps unknown fields says so and lists
    // no properties (kubectl's v2 validation refuses fields a node's properties do not list).
    let spec = &defs(&v2)["io.kubevirt.v1.VirtualMachine"]["properties"]["spec"];
    assert_eq!(spec.get("x-kubernetes-preserve-unknown-fields"), Some(&json!(true)), "{spec}");
    assert!(spec.get("properties").is_none(), "{spec}");
    // And every kind carries apiVersion, kind and metadata, with its List beside it.
    let vm = &defs(&v2)["io.kubevirt.v1.VirtualMachine"]["properties"];
    assert_eq!(vm["metadata"]["$ref"], "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta");
    assert_eq!((vm["apiVersion"]["type"].as_str(), vm["kind"]["type"].as_str()), (Some("string"), Some("string")));
    assert_eq!(
        defs(&v2)["io.kubevirt.v1.VirtualMachineList"]["properties"]["items"]["items"]["$ref"],
        "#/definitions/io.kubevirt.v1.VirtualMachine"
    );
}

#[test]
fn patch_operations_offer_merge_and_json_patch_and_writes_field_validation() {
    let cat = catalog();
    let v2 = v2(&cat);
    let vm = &v2["paths"]["/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}"]["patch"];
    assert_eq!(vm["consumes"], json!(["application/json-patch+json", "application/merge-patch+json"]));
    assert_eq!(vm["x-kubernetes-group-version-kind"], json!({"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachine"}));
    assert!(vm["parameters"].as_array().is_some_and(|p| p.iter().any(|p| p["name"] == "fieldValidation" && p["in"] == "query")));
    let v3 = v3_group(&cat, "api/v1").expect("core/v1 is served");
    let ns = &v3["paths"]["/api/v1/namespaces/{name}"]["patch"];
    let content: Vec<&String> = ns["requestBody"]["content"].as_object().map(|c| c.keys().collect()).unwrap_or_default();
    assert_eq!(content, ["application/json-patch+json", "application/merge-patch+json"]);
}

/// A decoded message: fields by number, in order.
fn decode(b: &[u8]) -> Vec<(u64, wire::Value<'_>)> {
    Fields::new(b).collect::<Result<Vec<_>, _>>().expect("well-formed protobuf")
}

fn string(v: wire::Value<'_>) -> String {
    v.string().expect("a string field")
}

fn sub<'a>(m: &[(u64, wire::Value<'a>)], n: u64) -> Vec<&'a [u8]> {
    m.iter().filter(|(f, _)| *f == n).map(|(_, v)| v.bytes().expect("a message field")).collect()
}

/// `Named*` pairs of a repeated field.
fn named<'a>(m: &[(u64, wire::Value<'a>)], n: u64) -> Vec<(String, &'a [u8])> {
    m.iter()
        .filter(|(f, _)| *f == n)
        .map(|(_, v)| {
            let pair = decode(v.bytes().expect("a Named message"));
            let name = pair.iter().find(|(f, _)| *f == 1).map(|(_, v)| string(*v)).unwrap_or_default();
            let value = pair.iter().find(|(f, _)| *f == 2).and_then(|(_, v)| v.bytes().ok()).unwrap_or_default();
            (name, value)
        })
        .collect()
}

/// kube-openapi's `ParseSchema` (`pkg/util/proto/document.go`), which fails kubectl ≤ 1.28's
/// `explain`, `apply` and `--validate` outright when any definition breaks it.
fn parse_as_kube_openapi(names: &[String], schema: &[u8], path: &str) {
    let m = decode(schema);
    let reference = m.iter().find(|(f, _)| *f == 1).map(|(_, v)| string(*v));
    let types: Vec<String> = sub(&m, 22).first().map(|t| decode(t).into_iter().map(|(_, v)| string(v)).collect()).unwrap_or_default();
    let properties = sub(&m, 25);
    if let Some(r) = reference {
        assert!(properties.first().is_none_or(|p| p.is_empty()) && types.is_empty(), "{path}: a $ref with a type or properties");
        let name = r.strip_prefix("#/definitions/").unwrap_or_else(|| panic!("{path}: {r} is not a definition"));
        assert!(names.iter().any(|n| n == name), "{path}: unknown model in reference {r}");
        return;
    }
    assert!(types.len() <= 1, "{path}: several types {types:?}");
    match types.first().map(String::as_str) {
        None | Some("object") => {}
        Some("array") => {
            let items = sub(&m, 23);
            let schemas = items.first().map(|i| sub(&decode(i), 1).into_iter().map(<[u8]>::to_vec).collect::<Vec<_>>()).unwrap_or_default();
            assert_eq!(schemas.len(), 1, "{path}: an array needs exactly one item schema");
            parse_as_kube_openapi(names, &schemas[0], &format!("{path}[]"));
        }
        Some(t) => assert!(["string", "number", "integer", "boolean"].contains(&t), "{path}: unknown primitive type {t:?}"),
    }
    for p in properties {
        for (name, s) in named(&decode(p), 1) {
            parse_as_kube_openapi(names, s, &format!("{path}.{name}"));
        }
    }
    for extra in sub(&m, 21) {
        if let Some(s) = sub(&decode(extra), 1).first() {
            parse_as_kube_openapi(names, s, &format!("{path}{{}}"));
        }
    }
}

#[test]
fn the_v2_protobuf_decodes_as_kube_openapi_parses_it() {
    let docs = build();
    let json: Value = serde_json::from_slice(&docs.v2_json.body).expect("JSON");
    let doc = decode(&docs.v2_protobuf.body);
    assert_eq!(doc.iter().find(|(f, _)| *f == 1).map(|(_, v)| string(*v)).as_deref(), Some("2.0"));
    let definitions = decode(sub(&doc, 9)[0]);
    let defs = named(&definitions, 1);
    let names: Vec<String> = defs.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names.len(), json["definitions"].as_object().map_or(0, Map::len));
    for (name, s) in &defs {
        parse_as_kube_openapi(&names, s, name);
    }
    // The gvk extension kubectl finds kinds by, as YAML kube-openapi reads.
    let (_, vm) = defs.iter().find(|(n, _)| n == "io.kubevirt.v1.VirtualMachine").expect("the VM definition");
    let ext = named(&decode(vm), 31);
    let (_, gvk) = ext.iter().find(|(n, _)| n == "x-kubernetes-group-version-kind").expect("a gvk extension");
    let yaml = decode(gvk).into_iter().find(|(f, _)| *f == 2).map(|(_, v)| string(v)).unwrap_or_default();
    assert_eq!(
        serde_json::from_str::<Value>(&yaml).ok(),
        Some(json!([{"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachine"}]))
    );
    // PATCH of a VM: consumes (7) and the fieldValidation query parameter (8 -> 1 -> 2 -> 3 -> name 4).
    let paths = decode(sub(&doc, 8)[0]);
    let (_, item) = named(&paths, 2)
        .into_iter()
        .find(|(n, _)| n == "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}")
        .expect("the VM object path");
    let patch = decode(sub(&decode(item), 8)[0]);
    let consumes: Vec<String> = patch.iter().filter(|(f, _)| *f == 7).map(|(_, v)| string(*v)).collect();
    assert_eq!(consumes, ["application/json-patch+json", "application/merge-patch+json"]);
    let query_names: Vec<String> = sub(&patch, 8)
        .into_iter()
        .filter_map(|item| sub(&decode(item), 1).first().map(|p| decode(p)))
        .filter_map(|p: Vec<(u64, wire::Value<'_>)>| sub(&p, 2).first().map(|nb| decode(nb)))
        .filter_map(|nb: Vec<(u64, wire::Value<'_>)>| sub(&nb, 3).first().map(|q| decode(q)))
        .filter_map(|q| q.iter().find(|(f, _)| *f == 4).map(|(_, v)| string(*v)))
        .collect();
    assert!(query_names.iter().any(|n| n == "fieldValidation"), "{query_names:?}");
}

/// Not an assertion on speed: the numbers the report quotes (`--nocapture`).
#[test]
fn documents_are_built_once_and_measured() {
    let docs = documents();
    assert!(Arc::ptr_eq(&docs, &documents()), "cached while the registry stands");
    let v3: usize = docs.v3.values().map(|s| s.body.len()).sum();
    eprintln!(
        "OpenAPI: built in {:?}; v2 JSON {} bytes, v2 protobuf {} bytes, v3 {} bytes in {} documents, index {} bytes",
        docs.build_time,
        docs.v2_json.body.len(),
        docs.v2_protobuf.body.len(),
        v3,
        docs.v3.len(),
        docs.v3_index.body.len()
    );
    let index: Value = serde_json::from_slice(&docs.v3_index.body).expect("JSON");
    for (gv, doc) in &docs.v3 {
        let url = index["paths"][gv]["serverRelativeURL"].as_str().unwrap_or_default();
        assert!(url.ends_with(&format!("hash={}", doc.etag.trim_matches('"'))), "{gv}: {url}");
    }
}
