//! A CRD's structural schema applied to its objects, as kube-apiserver's apiextensions server
//! does on every write: unknown fields pruned, defaults set, then the object validated.
//!
//! # Flow
//! [`prune_and_default`] walks the object beside its schema: an object field the schema does
//! not name is dropped unless `x-kubernetes-preserve-unknown-fields` (or
//! `x-kubernetes-embedded-resource`'s type fields, or `additionalProperties`) keeps it; a
//! missing field with a `default` gets it. [`validate`] then checks types (with
//! `x-kubernetes-int-or-string` and `nullable`), `required`, `enum`, bounds, lengths, `pattern`
//! and item and property counts, naming each field as kube-apiserver does
//! (`spec.replicas`, `spec.ports[0].name`).
//!
//! `apiVersion`, `kind` and `metadata` at the root are the server's, never pruned or checked
//! here.
//!
//! # Guarantees
//! Recursion follows the object, which the body parser bounds in depth; a `pattern` that is
//! not a valid regular expression is refused when the CRD is written ([`structural_causes`]);
//! nothing panics.

use serde_json::{Map, Value};

use api::validation::{Cause, CauseType};

const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

fn preserves(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

/// Drops the fields `schema` does not allow and sets its defaults, in place.
pub fn prune_and_default(schema: &Value, obj: &mut Value) {
    walk(schema, obj, true);
}

fn walk(schema: &Value, obj: &mut Value, root: bool) {
    match obj {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            if let Some(props) = props {
                for (k, sub) in props {
                    if let Some(default) = sub.get("default") {
                        if map.get(k).is_none_or(Value::is_null)
                            && !(sub.get("nullable") == Some(&Value::Bool(true)) && map.contains_key(k))
                        {
                            map.insert(k.clone(), default.clone());
                        }
                    }
                }
            }
            let additional = schema.get("additionalProperties");
            let embedded = schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
            let keep_unknown = preserves(schema) || additional.is_some_and(|a| a.is_object() || a == &Value::Bool(true));
            map.retain(|k, _| {
                (root && ROOT_FIELDS.contains(&k.as_str()))
                    || (embedded && ROOT_FIELDS.contains(&k.as_str()))
                    || props.is_some_and(|p| p.contains_key(k))
                    || keep_unknown
            });
            for (k, v) in map.iter_mut() {
                if root && ROOT_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(sub) = props.and_then(|p| p.get(k)) {
                    walk(sub, v, false);
                } else if let Some(sub) = additional.filter(|a| a.is_object()) {
                    walk(sub, v, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for item in items {
                    walk(sub, item, false);
                }
            }
        }
        _ => {}
    }
}

/// Validates `obj` against `schema`; every violation, named by field.
#[must_use]
pub fn validate(schema: &Value, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    check(schema, obj, "", true, &mut causes);
    causes
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn invalid(causes: &mut Vec<Cause>, path: &str, v: &Value, what: &str) {
    causes.push(Cause::new(CauseType::Invalid, path, format!("Invalid value: {v}: {what}")));
}

fn check(schema: &Value, v: &Value, path: &str, root: bool, causes: &mut Vec<Cause>) {
    let at = if path.is_empty() { "body".to_owned() } else { format!("{path} in body") };
    if v.is_null() {
        if !root && schema.get("nullable") != Some(&Value::Bool(true)) && schema.get("type").is_some() {
            invalid(causes, path, v, &format!("{at} must be of type {}", schema["type"].as_str().unwrap_or("object")));
        }
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let actual = type_name(v);
    if int_or_string {
        if !matches!(actual, "integer" | "string") {
            invalid(causes, path, v, &format!("{at} must be of type integer or string"));
            return;
        }
    } else if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let ok = want == actual || (want == "number" && actual == "integer");
        if !ok {
            invalid(causes, path, v, &format!("{at} must be of type {want}: {actual:?}"));
            return;
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.contains(v) {
            let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
            causes.push(Cause::new(
                CauseType::NotSupported,
                path,
                format!("Unsupported value: {v}: supported values: {}", list.join(", ")),
            ));
        }
    }
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
            let excl = |k: &str| schema.get(k) == Some(&Value::Bool(true));
            if let Some(min) = bound("minimum") {
                if x < min || (excl("exclusiveMinimum") && x <= min) {
                    invalid(causes, path, v, &format!("{at} should be greater than or equal to {min}"));
                }
            }
            if let Some(max) = bound("maximum") {
                if x > max || (excl("exclusiveMaximum") && x >= max) {
                    invalid(causes, path, v, &format!("{at} should be less than or equal to {max}"));
                }
            }
        }
        Value::String(s) => {
            let len = s.chars().count();
            let count = |k: &str| schema.get(k).and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
            if count("minLength").is_some_and(|m| len < m) {
                invalid(causes, path, v, &format!("{at} should be at least {} chars long", count("minLength").unwrap_or(0)));
            }
            if let Some(m) = count("maxLength").filter(|m| len > *m) {
                causes.push(Cause::new(CauseType::TooLong, path, format!("Too long: may not be more than {m} bytes")));
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
                if regex::Regex::new(p).is_ok_and(|re| !re.is_match(s)) {
                    invalid(causes, path, v, &format!("{at} should match '{p}'"));
                }
            }
        }
        Value::Array(items) => {
            let count = |k: &str| schema.get(k).and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
            if let Some(m) = count("minItems").filter(|m| items.len() < *m) {
                invalid(causes, path, v, &format!("{at} should have at least {m} items"));
            }
            if let Some(m) = count("maxItems").filter(|m| items.len() > *m) {
                causes.push(Cause::new(CauseType::TooLong, path, format!("Too many: {}: must have at most {m} items", items.len())));
            }
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(sub, item, &format!("{path}[{i}]"), false, causes);
                }
            }
        }
        Value::Object(map) => check_object(schema, map, path, root, causes),
        Value::Null | Value::Bool(_) => {}
    }
}

fn check_object(schema: &Value, map: &Map<String, Value>, path: &str, root: bool, causes: &mut Vec<Cause>) {
    for r in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        if !map.contains_key(r) {
            causes.push(Cause::new(CauseType::Required, join(path, r), "Required value"));
        }
    }
    let count = |k: &str| schema.get(k).and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
    if let Some(m) = count("maxProperties").filter(|m| map.len() > *m) {
        causes.push(Cause::new(CauseType::TooLong, path, format!("Too many: {}: must have at most {m} items", map.len())));
    }
    if let Some(m) = count("minProperties").filter(|m| map.len() < *m) {
        causes.push(Cause::new(CauseType::Invalid, path, format!("must have at least {m} properties")));
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (k, v) in map {
        if root && ROOT_FIELDS.contains(&k.as_str()) {
            continue;
        }
        if let Some(sub) = props.and_then(|p| p.get(k)).or(additional) {
            check(sub, v, &join(path, k), false, causes);
        }
    }
}

/// What makes a CRD's schema unusable here: a root that is not an object, a type that is not
/// one of OpenAPI's, a `pattern` that is not a regular expression, a `default` that does not
/// fit its own schema. Named under `at` (`spec.versions[0].schema.openAPIV3Schema`).
#[must_use]
pub fn structural_causes(schema: &Value, at: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    if schema.get("type").and_then(Value::as_str).is_some_and(|t| t != "object") {
        causes.push(Cause::new(CauseType::Invalid, format!("{at}.type"), "must be object at the root"));
    }
    lint(schema, at, 0, &mut causes);
    causes
}

fn lint(schema: &Value, at: &str, depth: usize, causes: &mut Vec<Cause>) {
    if depth > crate::limits::MAX_OBJECT_DEPTH {
        causes.push(Cause::new(CauseType::Invalid, at, "the schema nests too deep"));
        return;
    }
    let Some(m) = schema.as_object() else { return };
    if let Some(t) = m.get("type") {
        if !matches!(t.as_str(), Some("object" | "array" | "string" | "integer" | "number" | "boolean")) {
            causes.push(Cause::new(
                CauseType::NotSupported,
                format!("{at}.type"),
                "supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\"",
            ));
        }
    }
    if let Some(p) = m.get("pattern").and_then(Value::as_str) {
        if let Err(e) = regex::Regex::new(p) {
            causes.push(Cause::new(CauseType::Invalid, format!("{at}.pattern"), format!("is not a regular expression: {e}")));
        }
    }
    if let Some(d) = m.get("default") {
        let mut defaulted = d.clone();
        walk(schema, &mut defaulted, false);
        let mut inner = Vec::new();
        check(schema, &defaulted, "", false, &mut inner);
        if let Some(c) = inner.first() {
            causes.push(Cause::new(CauseType::Invalid, format!("{at}.default"), format!("does not match its schema: {}", c.message)));
        }
    }
    for (k, sub) in m.get("properties").and_then(Value::as_object).into_iter().flatten() {
        lint(sub, &format!("{at}.properties[{k}]"), depth + 1, causes);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = m.get(key).filter(|s| s.is_object()) {
            lint(sub, &format!("{at}.{key}"), depth + 1, causes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                "port": {"x-kubernetes-int-or-string": true},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        }})
    }

    #[test]
    fn unknown_fields_are_pruned_where_the_schema_says_and_defaults_are_set() {
        let mut obj = json!({"apiVersion": "x.io/v1", "kind": "T", "metadata": {"name": "a"}, "junk": 1,
                             "spec": {"size": 2, "typo": true, "labels": {"a": "b"}, "extra": {"kept": {"deep": 1}}}});
        prune_and_default(&schema(), &mut obj);
        assert_eq!(
            obj,
            json!({"apiVersion": "x.io/v1", "kind": "T", "metadata": {"name": "a"},
                                "spec": {"size": 2, "color": "red", "labels": {"a": "b"}, "extra": {"kept": {"deep": 1}}}})
        );
        assert!(validate(&schema(), &obj).is_empty(), "{:?}", validate(&schema(), &obj));
    }

    #[test]
    fn violations_name_each_field_as_kube_apiserver_does() {
        let obj = json!({"spec": {"size": 0, "color": "green", "port": true, "name": "ABCDEFG", "tags": ["a", "b", 3], "labels": {"a": 1}},
                         "status": {"ready": "yes"}});
        let fields: Vec<String> = validate(&schema(), &obj).into_iter().map(|c| c.field).collect();
        assert_eq!(
            fields,
            [
                "spec.size",
                "spec.color",
                "spec.port",
                "spec.name",
                "spec.name",
                "spec.tags",
                "spec.tags[2]",
                "spec.labels.a",
                "status.ready"
            ]
        );
        let missing: Vec<String> = validate(&schema(), &json!({"spec": {}})).into_iter().map(|c| c.field).collect();
        assert_eq!(missing, ["spec.size"]);
        let c = &validate(&schema(), &json!({"spec": {"size": "two"}}))[0];
        assert!(c.message.contains("spec.size in body must be of type integer"), "{}", c.message);
    }

    #[test]
    fn a_schema_with_a_bad_pattern_type_or_default_is_refused() {
        let bad = json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}, "b": {"type": "thing"},
                                                         "c": {"type": "integer", "default": "x"}}});
        let fields: Vec<String> = structural_causes(&bad, "s").into_iter().map(|c| c.field).collect();
        assert_eq!(fields, ["s.properties[a].pattern", "s.properties[b].type", "s.properties[c].default"]);
    }
}
