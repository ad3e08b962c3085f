//! A Swagger 2.0 document (JSON) encoded as gnostic's `openapi.v2.Document` protobuf message,
//! the only form client-go's `OpenAPISchema()` reads: it asks `/openapi/v2` for
//! `application/com.github.proto-openapi.spec.v2@v1.0+protobuf` and `proto.Unmarshal`s the body
//! whatever its content type (falling back to `/swagger-2.0.0.pb-v1` only on 403, 404 and 406).
//!
//! # Flow
//! [`document`] walks the JSON the way gnostic's compiler reads Swagger: each object becomes
//! its message (field numbers from gnostic-models' `openapiv2/OpenAPIv2.proto`), maps become
//! repeated `Named*` pairs in document order, `x-` keys become `NamedAny` vendor extensions whose
//! `Any.yaml` is the value's JSON text (JSON is YAML, which kube-openapi parses them as).
//!
//! # Guarantees
//! - proto3 encoding: scalars at their zero value are left out; a message that is present but
//!   empty (`properties: {}`) is written with length 0, so Go sees it as present, which
//!   kube-openapi tells an object with properties from a map by.
//! - Members of a `oneof` are written even at their zero value (`additionalProperties: false`).
//! - Keys this encoder does not know are skipped, never an error: [`super::schema::to_v2`] has
//!   already reduced schemas to Swagger's keywords.

use serde_json::{Map, Value};

/// A message being written.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            // Truncation is the point: the low seven bits, then the rest.
            #[allow(clippy::cast_possible_truncation)]
            self.0.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        #[allow(clippy::cast_possible_truncation)]
        self.0.push(v as u8);
    }
    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire_type));
    }
    /// A length-delimited field, written even when empty.
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn message(&mut self, field: u32, m: &Msg) {
        self.bytes(field, &m.0);
    }
    fn string(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }
    fn bool(&mut self, field: u32, b: bool) {
        if b {
            self.key(field, 0);
            self.varint(1);
        }
    }
    fn int64(&mut self, field: u32, v: i64) {
        if v != 0 {
            self.key(field, 0);
            // Negative int64s are ten-byte varints of their two's complement, as protobuf writes them.
            #[allow(clippy::cast_sign_loss)]
            self.varint(v as u64);
        }
    }
    fn double(&mut self, field: u32, v: f64) {
        if v != 0.0 {
            self.key(field, 1);
            self.0.extend_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    fn strings(&mut self, field: u32, v: Option<&Value>) {
        for s in v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            self.bytes(field, s.as_bytes());
        }
    }
}

fn str_of<'a>(m: &'a Map<String, Value>, k: &str) -> &'a str {
    m.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn bool_of(m: &Map<String, Value>, k: &str) -> bool {
    m.get(k).and_then(Value::as_bool).unwrap_or_default()
}

/// `Any`: the value as YAML (its JSON text).
fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(2, &v.to_string());
    m
}

/// The `x-` keys of `m` as repeated `NamedAny` at `field`.
fn extensions(w: &mut Msg, field: u32, m: &Map<String, Value>) {
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Msg::default();
        named.string(1, k);
        named.message(2, &any(v));
        w.message(field, &named);
    }
}

/// A `Named*` pair: name 1, value 2.
fn named(name: &str, value: &Msg) -> Msg {
    let mut m = Msg::default();
    m.string(1, name);
    m.message(2, value);
    m
}

/// The whole document.
#[must_use]
pub fn document(doc: &Value) -> Vec<u8> {
    let empty = Map::new();
    let d = doc.as_object().unwrap_or(&empty);
    let mut w = Msg::default();
    w.string(1, str_of(d, "swagger"));
    if let Some(Value::Object(i)) = d.get("info") {
        let mut info = Msg::default();
        info.string(1, str_of(i, "title"));
        info.string(2, str_of(i, "version"));
        info.string(3, str_of(i, "description"));
        extensions(&mut info, 7, i);
        w.message(2, &info);
    }
    w.string(3, str_of(d, "host"));
    w.string(4, str_of(d, "basePath"));
    w.strings(5, d.get("schemes"));
    w.strings(6, d.get("consumes"));
    w.strings(7, d.get("produces"));
    if let Some(Value::Object(p)) = d.get("paths") {
        let mut paths = Msg::default();
        extensions(&mut paths, 1, p);
        for (name, item) in p.iter().filter(|(k, _)| !k.starts_with("x-")) {
            paths.message(2, &named(name, &path_item(item.as_object().unwrap_or(&empty))));
        }
        w.message(8, &paths);
    }
    if let Some(Value::Object(defs)) = d.get("definitions") {
        let mut definitions = Msg::default();
        for (name, s) in defs {
            definitions.message(1, &named(name, &schema(s)));
        }
        w.message(9, &definitions);
    }
    extensions(&mut w, 16, d);
    w.0
}

fn path_item(p: &Map<String, Value>) -> Msg {
    let mut w = Msg::default();
    w.string(1, str_of(p, "$ref"));
    for (method, field) in [("get", 2), ("put", 3), ("post", 4), ("delete", 5), ("options", 6), ("head", 7), ("patch", 8)] {
        if let Some(Value::Object(o)) = p.get(method) {
            w.message(field, &operation(o));
        }
    }
    for param in p.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        w.message(9, &parameters_item(param));
    }
    extensions(&mut w, 10, p);
    w
}

fn operation(o: &Map<String, Value>) -> Msg {
    let mut w = Msg::default();
    w.strings(1, o.get("tags"));
    w.string(2, str_of(o, "summary"));
    w.string(3, str_of(o, "description"));
    w.string(5, str_of(o, "operationId"));
    w.strings(6, o.get("produces"));
    w.strings(7, o.get("consumes"));
    for param in o.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        w.message(8, &parameters_item(param));
    }
    if let Some(Value::Object(r)) = o.get("responses") {
        let mut responses = Msg::default();
        for (code, resp) in r.iter().filter(|(k, _)| !k.starts_with("x-")) {
            let Value::Object(resp) = resp else { continue };
            let mut response = Msg::default();
            response.string(1, str_of(resp, "description"));
            if let Some(s) = resp.get("schema") {
                let mut item = Msg::default();
                item.message(1, &schema(s));
                response.message(2, &item);
            }
            extensions(&mut response, 5, resp);
            // ResponseValue { oneof: response = 1 }
            let mut value = Msg::default();
            value.message(1, &response);
            responses.message(1, &named(code, &value));
        }
        extensions(&mut responses, 2, r);
        w.message(9, &responses);
    }
    w.strings(10, o.get("schemes"));
    w.bool(11, bool_of(o, "deprecated"));
    extensions(&mut w, 13, o);
    w
}

/// `ParametersItem { oneof: parameter = 1 }` of a parameter object.
fn parameters_item(p: &Value) -> Msg {
    let empty = Map::new();
    let p = p.as_object().unwrap_or(&empty);
    let mut parameter = Msg::default();
    if str_of(p, "in") == "body" {
        let mut body = Msg::default();
        body.string(1, str_of(p, "description"));
        body.string(2, str_of(p, "name"));
        body.string(3, "body");
        body.bool(4, bool_of(p, "required"));
        if let Some(s) = p.get("schema") {
            body.message(5, &schema(s));
        }
        extensions(&mut body, 6, p);
        parameter.message(1, &body);
    } else {
        // Query and path sub-schemas share their first fields: required 1, in 2,
        // description 3, name 4; then type is 6 for query (after allowEmptyValue) and 5 for path.
        let (choice, type_field, ext_field) = match str_of(p, "in") {
            "query" => (3, 6, 23),
            "path" => (4, 5, 22),
            "header" => (1, 5, 22),
            _ => (2, 6, 23),
        };
        let mut sub = Msg::default();
        sub.bool(1, bool_of(p, "required"));
        sub.string(2, str_of(p, "in"));
        sub.string(3, str_of(p, "description"));
        sub.string(4, str_of(p, "name"));
        sub.string(type_field, str_of(p, "type"));
        extensions(&mut sub, ext_field, p);
        let mut non_body = Msg::default();
        non_body.message(choice, &sub);
        parameter.message(2, &non_body);
    }
    let mut item = Msg::default();
    item.message(1, &parameter);
    item
}

fn int_of(m: &Map<String, Value>, k: &str) -> i64 {
    m.get(k).and_then(Value::as_i64).unwrap_or_default()
}

fn f64_of(m: &Map<String, Value>, k: &str) -> f64 {
    m.get(k).and_then(Value::as_f64).unwrap_or_default()
}

/// `Schema`.
fn schema(s: &Value) -> Msg {
    let empty = Map::new();
    let s = s.as_object().unwrap_or(&empty);
    let mut w = Msg::default();
    w.string(1, str_of(s, "$ref"));
    w.string(2, str_of(s, "format"));
    w.string(3, str_of(s, "title"));
    w.string(4, str_of(s, "description"));
    if let Some(d) = s.get("default") {
        w.message(5, &any(d));
    }
    w.double(6, f64_of(s, "multipleOf"));
    w.double(7, f64_of(s, "maximum"));
    w.bool(8, bool_of(s, "exclusiveMaximum"));
    w.double(9, f64_of(s, "minimum"));
    w.bool(10, bool_of(s, "exclusiveMinimum"));
    w.int64(11, int_of(s, "maxLength"));
    w.int64(12, int_of(s, "minLength"));
    w.string(13, str_of(s, "pattern"));
    w.int64(14, int_of(s, "maxItems"));
    w.int64(15, int_of(s, "minItems"));
    w.bool(16, bool_of(s, "uniqueItems"));
    w.int64(17, int_of(s, "maxProperties"));
    w.int64(18, int_of(s, "minProperties"));
    w.strings(19, s.get("required"));
    for e in s.get("enum").and_then(Value::as_array).into_iter().flatten() {
        w.message(20, &any(e));
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            // A oneof member: written even when false.
            let mut item = Msg::default();
            item.key(2, 0);
            item.varint(u64::from(*b));
            w.message(21, &item);
        }
        Some(sub @ Value::Object(_)) => {
            let mut item = Msg::default();
            item.message(1, &schema(sub));
            w.message(21, &item);
        }
        _ => {}
    }
    if let Some(t) = s.get("type") {
        let mut type_item = Msg::default();
        match t {
            Value::String(one) => type_item.bytes(1, one.as_bytes()),
            other => type_item.strings(1, Some(other)),
        }
        w.message(22, &type_item);
    }
    if let Some(items) = s.get("items") {
        let mut item = Msg::default();
        match items {
            Value::Array(all) => all.iter().for_each(|i| item.message(1, &schema(i))),
            one => item.message(1, &schema(one)),
        }
        w.message(23, &item);
    }
    for sub in s.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        w.message(24, &schema(sub));
    }
    if let Some(Value::Object(props)) = s.get("properties") {
        let mut properties = Msg::default();
        for (name, p) in props {
            properties.message(1, &named(name, &schema(p)));
        }
        w.message(25, &properties);
    }
    w.bool(27, bool_of(s, "readOnly"));
    if let Some(e) = s.get("example") {
        w.message(30, &any(e));
    }
    extensions(&mut w, 31, s);
    w
}
