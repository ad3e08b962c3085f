//! The two renderings of one schema: OpenAPI v3 (components) and Swagger 2.0 (definitions).
//!
//! Schemas are kept in one neutral form, whose `$ref`s point to `#/definitions/NAME`
//! ([`super::core::DEFINITIONS`]); [`to_v3`] and [`to_v2`] render it.
//!
//! # Guarantees
//! - [`to_v3`]: refs point to `#/components/schemas/NAME`; a ref with siblings (a field's
//!   description next to its type) becomes `allOf: [{$ref}]` plus the siblings, as Kubernetes
//!   writes it, since OpenAPI 3.0 ignores the siblings of a `$ref`.
//! - [`to_v2`]: only the keywords of Swagger 2.0's Schema Object and `x-` extensions remain,
//!   with the shapes kube-openapi's v2 parser (`pkg/util/proto`, which kubectl ≤ 1.28 runs on
//!   every `explain`, `apply` and `--validate`) accepts: one `type` (a `null` alternative is
//!   dropped, several types are dropped), `items` a single schema, a `$ref` with no `type` or
//!   `properties` beside it. `anyOf`, `oneOf`, `not` and `nullable` have no v2 form and are
//!   dropped, as kube-apiserver drops them when it publishes a CRD in v2; a node with
//!   `x-kubernetes-preserve-unknown-fields` loses its `properties` and `items`, as there
//!   (kubectl's v2 validation would refuse the fields they do not list).

use serde_json::{Map, Value};

use super::core::DEFINITIONS;

/// Where v3 refs point.
pub const COMPONENTS: &str = "#/components/schemas/";

/// The Swagger 2.0 Schema Object keywords (`x-` extensions are kept too).
const V2_KEYWORDS: &[&str] = &[
    "$ref",
    "format",
    "title",
    "description",
    "default",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxProperties",
    "minProperties",
    "required",
    "enum",
    "additionalProperties",
    "type",
    "items",
    "allOf",
    "properties",
    "readOnly",
    "example",
];

/// The v3 rendering of a neutral schema.
#[must_use]
pub fn to_v3(s: &Value) -> Value {
    match s {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                let v = match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => Value::String(rebase(r, COMPONENTS)),
                    // Values, not schemas.
                    ("default" | "example" | "enum", _) => v.clone(),
                    ("properties", Value::Object(props)) => Value::Object(props.iter().map(|(n, p)| (n.clone(), to_v3(p))).collect()),
                    _ => to_v3(v),
                };
                out.insert(k.clone(), v);
            }
            if out.len() > 1 {
                if let Some(r) = out.remove("$ref") {
                    let mut reference = Map::new();
                    reference.insert("$ref".into(), r);
                    out.insert("allOf".into(), Value::Array(vec![Value::Object(reference)]));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(to_v3).collect()),
        other => other.clone(),
    }
}

/// The Swagger 2.0 rendering of a neutral schema (see the module docs).
#[must_use]
pub fn to_v2(s: &Value) -> Value {
    let Value::Object(m) = s else { return Value::Object(Map::new()) };
    let mut out = Map::new();
    let is_ref = m.contains_key("$ref");
    for (k, v) in m {
        let keep = k.starts_with("x-") || V2_KEYWORDS.contains(&k.as_str());
        if !keep || (is_ref && !matches!(k.as_str(), "$ref" | "description") && !k.starts_with("x-")) {
            continue;
        }
        let v = match (k.as_str(), v) {
            ("$ref", Value::String(r)) => Value::String(rebase(r, DEFINITIONS)),
            ("type", Value::Array(types)) => {
                let real: Vec<&Value> = types.iter().filter(|t| t.as_str() != Some("null")).collect();
                match real.as_slice() {
                    [one] => (*one).clone(),
                    _ => continue,
                }
            }
            ("items", Value::Array(items)) => match items.as_slice() {
                [one] => to_v2(one),
                _ => continue,
            },
            ("items", item) => to_v2(item),
            ("additionalProperties", Value::Bool(b)) => Value::Bool(*b),
            ("additionalProperties", schema) => to_v2(schema),
            ("allOf", Value::Array(all)) => Value::Array(all.iter().map(to_v2).collect()),
            ("properties", Value::Object(props)) => Value::Object(props.iter().map(|(n, p)| (n.clone(), to_v2(p))).collect()),
            // JSON Schema's numeric form of these has no v2 equivalent.
            ("exclusiveMaximum" | "exclusiveMinimum", v) if !v.is_boolean() => continue,
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

/// The Swagger 2.0 rendering of a CRD's schema as kube-apiserver publishes it: [`to_v2`] after
/// every node that keeps unknown fields has lost its `properties` and `items` (and an array
/// left without items, its type). kubectl's v2 validation (which it still runs on a `List`
/// file) refuses any field a node's `properties` do not list, so they would make it refuse
/// what the server accepts.
#[must_use]
pub fn crd_to_v2(s: &Value) -> Value {
    fn open(v: &mut Value) {
        match v {
            Value::Object(m) => {
                if m.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
                    m.shift_remove("properties");
                    if m.shift_remove("items").is_some() || m.get("type").and_then(Value::as_str) == Some("array") {
                        m.shift_remove("type");
                    }
                }
                m.values_mut().for_each(open);
            }
            Value::Array(a) => a.iter_mut().for_each(open),
            _ => {}
        }
    }
    let mut s = s.clone();
    open(&mut s);
    to_v2(&s)
}

/// `r` (`#/definitions/NAME` or `#/components/schemas/NAME`) pointing into `prefix`.
fn rebase(r: &str, prefix: &str) -> String {
    let name = r.strip_prefix(DEFINITIONS).or_else(|| r.strip_prefix(COMPONENTS)).unwrap_or(r);
    format!("{prefix}{name}")
}

/// The definition names `s` refers to, directly.
pub fn refs(s: &Value, out: &mut Vec<String>) {
    match s {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get("$ref") {
                if let Some(name) = r.strip_prefix(DEFINITIONS) {
                    out.push(name.to_owned());
                }
            }
            for (k, v) in m {
                if !matches!(k.as_str(), "default" | "example" | "enum") {
                    refs(v, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// `roots` and every definition they reach, in a stable order (roots first, then as reached).
#[must_use]
pub fn closure(definitions: &Map<String, Value>, roots: &[String]) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut todo: Vec<String> = roots.iter().rev().cloned().collect();
    while let Some(name) = todo.pop() {
        if seen.contains(&name) {
            continue;
        }
        if let Some(def) = definitions.get(&name) {
            let mut next = Vec::new();
            refs(def, &mut next);
            todo.extend(next.into_iter().rev());
        }
        seen.push(name);
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_ref_with_a_description_is_all_of_in_v3_and_a_bare_ref_in_v2() {
        let s = json!({"properties": {"metadata": {"$ref": "#/definitions/M", "description": "meta"}, "x": {"$ref": "#/definitions/X"}}});
        assert_eq!(
            to_v3(&s),
            json!({"properties": {"metadata": {"allOf": [{"$ref": "#/components/schemas/M"}], "description": "meta"},
                                  "x": {"$ref": "#/components/schemas/X"}}})
        );
        assert_eq!(
            to_v2(&s),
            json!({"properties": {"metadata": {"$ref": "#/definitions/M", "description": "meta"}, "x": {"$ref": "#/definitions/X"}}})
        );
    }

    #[test]
    fn v2_keeps_only_shapes_kube_openapi_parses() {
        let s = json!({
            "type": "object", "nullable": true,
            "properties": {
                "a": {"type": ["string", "null"], "description": "d"},
                "b": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true},
                "c": {"type": "array", "items": [{"type": "string"}]},
                "d": {"type": "integer", "exclusiveMinimum": 0, "enum": [{"anyOf": 1}]},
                "e": {"type": ["string", "integer"]},
            },
        });
        assert_eq!(
            to_v2(&s),
            json!({"type": "object", "properties": {
                "a": {"type": "string", "description": "d"},
                "b": {"x-kubernetes-int-or-string": true},
                "c": {"type": "array", "items": {"type": "string"}},
                "d": {"type": "integer", "enum": [{"anyOf": 1}]},
                "e": {},
            }})
        );
    }

    #[test]
    fn a_crd_in_v2_drops_the_properties_of_a_node_that_keeps_unknown_fields() {
        let s = json!({"type": "object", "properties": {
            "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}},
            "list": {"type": "array", "x-kubernetes-preserve-unknown-fields": true, "items": {"type": "object"}},
            "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
        }});
        assert_eq!(
            crd_to_v2(&s),
            json!({"type": "object", "properties": {
                "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "list": {"x-kubernetes-preserve-unknown-fields": true},
                "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
            }})
        );
    }

    #[test]
    fn closure_follows_refs_once_even_in_cycles() {
        let defs = json!({"A": {"properties": {"b": {"$ref": "#/definitions/B"}}}, "B": {"items": {"$ref": "#/definitions/A"}}, "C": {}});
        let Value::Object(defs) = defs else { unreachable!() };
        assert_eq!(closure(&defs, &["A".to_owned()]), ["A", "B"]);
    }
}
