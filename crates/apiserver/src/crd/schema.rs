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

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key) == Some(&Value::Bool(true))
}

/// A structural schema compiled once per served version: each node's checks as fields, its
/// `pattern` compiled, its defaults listed, so that a write looks nothing up by name and
/// allocates nothing unless it finds something to report.
#[derive(Debug, Default)]
pub struct Structural {
    ty: Option<String>,
    nullable: bool,
    int_or_string: bool,
    /// `x-kubernetes-preserve-unknown-fields`, or `additionalProperties` that is `true` or a
    /// schema: unknown fields of an object here are kept.
    keep_unknown: bool,
    embedded: bool,
    enumeration: Option<Vec<Value>>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: bool,
    exclusive_maximum: bool,
    min_length: Option<usize>,
    max_length: Option<usize>,
    min_items: Option<usize>,
    max_items: Option<usize>,
    min_properties: Option<usize>,
    max_properties: Option<usize>,
    /// The pattern as written, and compiled (`None` when it is not a regular expression, which
    /// [`structural_causes`] refuses before a CRD is stored).
    pattern: Option<(String, Option<regex::Regex>)>,
    required: Vec<String>,
    /// `(property, default, nullable)` for each property with a `default`.
    defaults: Vec<(String, Value, bool)>,
    properties: Option<std::collections::BTreeMap<String, Structural>>,
    /// `additionalProperties` when it is a schema.
    additional: Option<Box<Structural>>,
    items: Option<Box<Structural>>,
    /// Whether pruning or defaulting can change anything at or under this node: false for a
    /// subtree that keeps unknown fields and has no defaults anywhere, which
    /// [`prune_and_default`] then skips.
    prunes: bool,
}

impl Structural {
    /// Compiles `schema` (an `openAPIV3Schema` node). Below [`crate::limits::MAX_OBJECT_DEPTH`]
    /// a node keeps everything and checks nothing ([`structural_causes`] refuses such schemas).
    #[must_use]
    pub fn compile(schema: &Value) -> Structural {
        Self::compile_at(schema, 0)
    }

    fn compile_at(schema: &Value, depth: usize) -> Structural {
        if depth > crate::limits::MAX_OBJECT_DEPTH {
            return Structural { keep_unknown: true, ..Structural::default() };
        }
        let count = |k: &str| schema.get(k).and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
        let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
        let props = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties");
        let sub = |v: &Value| Box::new(Self::compile_at(v, depth + 1));
        let mut s = Structural {
            ty: schema.get("type").and_then(Value::as_str).map(str::to_owned),
            nullable: flag(schema, "nullable"),
            int_or_string: flag(schema, "x-kubernetes-int-or-string"),
            keep_unknown: flag(schema, "x-kubernetes-preserve-unknown-fields")
                || additional.is_some_and(|a| a.is_object() || a == &Value::Bool(true)),
            embedded: flag(schema, "x-kubernetes-embedded-resource"),
            enumeration: schema.get("enum").and_then(Value::as_array).cloned(),
            minimum: bound("minimum"),
            maximum: bound("maximum"),
            exclusive_minimum: flag(schema, "exclusiveMinimum"),
            exclusive_maximum: flag(schema, "exclusiveMaximum"),
            min_length: count("minLength"),
            max_length: count("maxLength"),
            min_items: count("minItems"),
            max_items: count("maxItems"),
            min_properties: count("minProperties"),
            max_properties: count("maxProperties"),
            pattern: schema.get("pattern").and_then(Value::as_str).map(|p| (p.to_owned(), regex::Regex::new(p).ok())),
            required: schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            defaults: props
                .into_iter()
                .flatten()
                .filter_map(|(k, sub)| sub.get("default").map(|d| (k.clone(), d.clone(), flag(sub, "nullable"))))
                .collect(),
            properties: props.map(|p| p.iter().map(|(k, v)| (k.clone(), Self::compile_at(v, depth + 1))).collect()),
            additional: additional.filter(|a| a.is_object()).map(sub),
            items: schema.get("items").map(sub),
            prunes: false,
        };
        s.prunes = !s.keep_unknown
            || !s.defaults.is_empty()
            || s.properties.iter().flat_map(|p| p.values()).any(|p| p.prunes)
            || s.additional.as_ref().is_some_and(|a| a.prunes)
            || s.items.as_ref().is_some_and(|i| i.prunes);
        s
    }

    fn property(&self, key: &str) -> Option<&Structural> {
        self.properties.as_ref().and_then(|p| p.get(key))
    }
}

/// Drops the fields `schema` does not allow and sets its defaults, in place.
pub fn prune_and_default(schema: &Structural, obj: &mut Value) {
    walk(schema, obj, true);
}

fn walk(schema: &Structural, obj: &mut Value, root: bool) {
    if !schema.prunes {
        return;
    }
    match obj {
        Value::Object(map) => {
            for (k, default, nullable) in &schema.defaults {
                if map.get(k).is_none_or(Value::is_null) && !(*nullable && map.contains_key(k)) {
                    map.insert(k.clone(), default.clone());
                }
            }
            if !schema.keep_unknown {
                map.retain(|k, _| ((root || schema.embedded) && ROOT_FIELDS.contains(&k.as_str())) || schema.property(k).is_some());
            }
            for (k, v) in map.iter_mut() {
                if root && ROOT_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(sub) = schema.property(k).or(schema.additional.as_deref()) {
                    walk(sub, v, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = &schema.items {
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
pub fn validate(schema: &Structural, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    check(schema, obj, Path::Root, true, &mut causes);
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

/// Where a value is, spelled only when a cause names it (`spec.ports[0].name`).
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, k) => f.write_str(k),
            Path::Key(p, k) => write!(f, "{p}.{k}"),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

impl Path<'_> {
    /// The field as a cause names it.
    fn field(&self) -> String {
        self.to_string()
    }

    /// The value as kube-apiserver's messages place it: `body`, `spec.size in body`.
    fn at(&self) -> String {
        match self {
            Path::Root => "body".to_owned(),
            p => format!("{p} in body"),
        }
    }
}

fn invalid(causes: &mut Vec<Cause>, path: Path<'_>, v: &Value, what: &str) {
    causes.push(Cause::new(CauseType::Invalid, path.field(), format!("Invalid value: {v}: {what}")));
}

fn check(schema: &Structural, v: &Value, path: Path<'_>, root: bool, causes: &mut Vec<Cause>) {
    if v.is_null() {
        if !root && !schema.nullable {
            if let Some(ty) = &schema.ty {
                invalid(causes, path, v, &format!("{} must be of type {ty}", path.at()));
            }
        }
        return;
    }
    let actual = type_name(v);
    if schema.int_or_string {
        if !matches!(actual, "integer" | "string") {
            invalid(causes, path, v, &format!("{} must be of type integer or string", path.at()));
            return;
        }
    } else if let Some(want) = &schema.ty {
        let ok = want == actual || (want == "number" && actual == "integer");
        if !ok {
            invalid(causes, path, v, &format!("{} must be of type {want}: {actual:?}", path.at()));
            return;
        }
    }
    if let Some(allowed) = &schema.enumeration {
        if !allowed.contains(v) {
            let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
            causes.push(Cause::new(
                CauseType::NotSupported,
                path.field(),
                format!("Unsupported value: {v}: supported values: {}", list.join(", ")),
            ));
        }
    }
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = schema.minimum {
                if x < min || (schema.exclusive_minimum && x <= min) {
                    invalid(causes, path, v, &format!("{} should be greater than or equal to {min}", path.at()));
                }
            }
            if let Some(max) = schema.maximum {
                if x > max || (schema.exclusive_maximum && x >= max) {
                    invalid(causes, path, v, &format!("{} should be less than or equal to {max}", path.at()));
                }
            }
        }
        Value::String(s) => {
            if schema.min_length.is_some() || schema.max_length.is_some() {
                let len = s.chars().count();
                if let Some(m) = schema.min_length.filter(|m| len < *m) {
                    invalid(causes, path, v, &format!("{} should be at least {m} chars long", path.at()));
                }
                if let Some(m) = schema.max_length.filter(|m| len > *m) {
                    causes.push(Cause::new(CauseType::TooLong, path.field(), format!("Too long: may not be more than {m} bytes")));
                }
            }
            if let Some((p, Some(re))) = &schema.pattern {
                if !re.is_match(s) {
                    invalid(causes, path, v, &format!("{} should match '{p}'", path.at()));
                }
            }
        }
        Value::Array(items) => {
            if let Some(m) = schema.min_items.filter(|m| items.len() < *m) {
                invalid(causes, path, v, &format!("{} should have at least {m} items", path.at()));
            }
            if let Some(m) = schema.max_items.filter(|m| items.len() > *m) {
                causes.push(Cause::new(
                    CauseType::TooLong,
                    path.field(),
                    format!("Too many: {}: must have at most {m} items", items.len()),
                ));
            }
            if let Some(sub) = &schema.items {
                for (i, item) in items.iter().enumerate() {
                    check(sub, item, Path::Index(&path, i), false, causes);
                }
            }
        }
        Value::Object(map) => check_object(schema, map, path, root, causes),
        Value::Null | Value::Bool(_) => {}
    }
}

fn check_object(schema: &Structural, map: &Map<String, Value>, path: Path<'_>, root: bool, causes: &mut Vec<Cause>) {
    for r in &schema.required {
        if !map.contains_key(r) {
            causes.push(Cause::new(CauseType::Required, Path::Key(&path, r).field(), "Required value"));
        }
    }
    if let Some(m) = schema.max_properties.filter(|m| map.len() > *m) {
        causes.push(Cause::new(CauseType::TooLong, path.field(), format!("Too many: {}: must have at most {m} items", map.len())));
    }
    if let Some(m) = schema.min_properties.filter(|m| map.len() < *m) {
        causes.push(Cause::new(CauseType::Invalid, path.field(), format!("must have at least {m} properties")));
    }
    for (k, v) in map {
        if root && ROOT_FIELDS.contains(&k.as_str()) {
            continue;
        }
        if let Some(sub) = schema.property(k).or(schema.additional.as_deref()) {
            check(sub, v, Path::Key(&path, k), false, causes);
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
        let compiled = Structural::compile(schema);
        let mut defaulted = d.clone();
        walk(&compiled, &mut defaulted, false);
        let mut inner = Vec::new();
        check(&compiled, &defaulted, Path::Root, false, &mut inner);
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
        prune_and_default(&Structural::compile(&schema()), &mut obj);
        assert_eq!(
            obj,
            json!({"apiVersion": "x.io/v1", "kind": "T", "metadata": {"name": "a"},
                                "spec": {"size": 2, "color": "red", "labels": {"a": "b"}, "extra": {"kept": {"deep": 1}}}})
        );
        assert!(validate(&Structural::compile(&schema()), &obj).is_empty(), "{:?}", validate(&Structural::compile(&schema()), &obj));
    }

    #[test]
    fn violations_name_each_field_as_kube_apiserver_does() {
        let obj = json!({"spec": {"size": 0, "color": "green", "port": true, "name": "ABCDEFG", "tags": ["a", "b", 3], "labels": {"a": 1}},
                         "status": {"ready": "yes"}});
        let fields: Vec<String> = validate(&Structural::compile(&schema()), &obj).into_iter().map(|c| c.field).collect();
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
        let missing: Vec<String> = validate(&Structural::compile(&schema()), &json!({"spec": {}})).into_iter().map(|c| c.field).collect();
        assert_eq!(missing, ["spec.size"]);
        let c = &validate(&Structural::compile(&schema()), &json!({"spec": {"size": "two"}}))[0];
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
