//! How large a request may make things: the bounds every write and read path applies, so that a
//! small request cannot cost unbounded memory or CPU, and every stored object stays readable by
//! every Kubernetes client.
//!
//! | limit | value | as in Kubernetes |
//! |---|---|---|
//! | request body | `Config::body_limit`, 3 MiB | `MaxRequestBodyBytes` |
//! | stored object (compact JSON) | [`MAX_OBJECT_BYTES`], 1.5 MiB | etcd's `--max-request-bytes` |
//! | nesting of a stored object | [`MAX_OBJECT_DEPTH`], 125 | — (see the constant) |
//! | JSON patch operations | [`MAX_JSON_PATCH_OPS`], 10,000 | `maxJSONPatchOperations` |
//! | bytes a JSON patch may `copy` | [`MAX_JSON_PATCH_COPY_BYTES`], 3 MiB | `JSONPatchMaxCopyBytes` |
//! | array work of a JSON patch | [`MAX_JSON_PATCH_WORK`] | — |
//! | what a YAML body expands to | [`MAX_YAML_EXPANSION_BYTES`], 3 MiB | go-yaml's alias heuristic |
//! | total annotations | [`MAX_ANNOTATIONS_BYTES`], 256 KiB | `TotalAnnotationSizeLimitB` |
//! | a label or field selector | [`MAX_SELECTOR_BYTES`], 64 KiB | — |
//! | a watch's `timeoutSeconds` | [`MAX_WATCH_TIMEOUT`], 24 h | — |
//! | concurrent watches per server | [`MAX_WATCHES`], 2,048 | — |
//! | wait for a resourceVersion newer than the store | [`FRESHNESS_WAIT`], 3 s | the watch cache's `blockTimeout` |
//!
//! The values are constants: change them here (the body limit is `Config::body_limit`).

use std::time::Duration;

use serde_json::Value;

use crate::registry::ResourceDef;
use crate::status::ApiError;

/// Largest stored object, as compact JSON: etcd's default request limit (1.5 MiB), which
/// Kubernetes applies to every object it stores.
pub const MAX_OBJECT_BYTES: usize = 1_572_864;

/// Deepest nesting of objects and arrays in a stored object (`{}` is 1, `{"a":{}}` is 2).
///
/// serde_json, which kube-rs reads every response with, refuses documents nested 128 levels or
/// more; a List wraps each object in two more (`{"items":[...]}`), so 125 is the deepest object
/// that every client can read back in a list (Go and Python clients allow far more).
pub const MAX_OBJECT_DEPTH: usize = 125;

/// Most operations in one JSON patch (kube-apiserver's `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPS: usize = 10_000;

/// Most bytes the `copy` operations of one JSON patch may copy in total (kube-apiserver's
/// `JSONPatchMaxCopyBytes`): without it, each copy could double the object.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Most array elements the operations of one JSON patch may shift in total (an insert or a
/// remove in an array moves its tail): 10,000 removes at the front of a long array would
/// otherwise take minutes of CPU.
pub const MAX_JSON_PATCH_WORK: usize = 20_000_000;

/// Most a YAML body may expand to (its JSON size, roughly), aliases included: a few hundred
/// bytes of anchors and aliases can otherwise describe gigabytes ("billion laughs").
pub const MAX_YAML_EXPANSION_BYTES: usize = 3 * 1024 * 1024;

/// Largest total size of an object's annotations, keys plus values (Kubernetes'
/// `TotalAnnotationSizeLimitB`).
pub const MAX_ANNOTATIONS_BYTES: usize = 262_144;

/// Longest `labelSelector` or `fieldSelector`.
pub const MAX_SELECTOR_BYTES: usize = 64 * 1024;

/// Longest a watch stays open, whatever `timeoutSeconds` asks for.
pub const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Most watches one server serves at once; more are refused with 429 until one ends.
pub const MAX_WATCHES: usize = 2048;

/// How long a read from a resourceVersion newer than the store waits for it to arrive before
/// answering "Too large resource version" (kube-apiserver's watch cache waits 3 s).
pub const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// Nesting depth of `v`, counted up to `cap + 1` (so a deep value costs no more than `cap`).
/// Iterative: it never recurses, whatever the value.
#[must_use]
pub fn depth(v: &Value, cap: usize) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, above)) = stack.pop() {
        let level = above + 1;
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, level))),
            Value::Object(o) => stack.extend(o.values().map(|c| (c, level))),
            _ => continue,
        }
        deepest = deepest.max(level);
        if deepest > cap {
            return deepest;
        }
    }
    deepest
}

/// The path (`spec.a.b[0]...`) to the first container nested deeper than `max`, if any. The
/// depth is measured first without paths: every write is checked, and building a path string
/// for each of an object's nodes cost ~3 % of the API server's CPU per update of a VMI.
fn too_deep_at(v: &Value, max: usize) -> Option<String> {
    if depth(v, max) <= max {
        return None;
    }
    let mut stack: Vec<(&Value, usize, String)> = vec![(v, 0, String::new())];
    while let Some((v, above, path)) = stack.pop() {
        let level = match v {
            Value::Array(_) | Value::Object(_) => above + 1,
            _ => continue,
        };
        if level > max {
            return Some(path);
        }
        match v {
            Value::Array(a) => stack.extend(a.iter().enumerate().map(|(i, c)| (c, level, format!("{path}[{i}]")))),
            Value::Object(o) => {
                stack.extend(o.iter().map(|(k, c)| (c, level, if path.is_empty() { k.clone() } else { format!("{path}.{k}") })));
            }
            _ => {}
        }
    }
    None
}

/// Counts what is written to it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Size of `v` as compact JSON, without building the text. Call it only on values whose depth
/// is bounded (serialisation recurses).
#[must_use]
pub fn json_len(v: &Value) -> usize {
    let mut c = Counter(0);
    // Writing a Value to a Counter cannot fail: the writer never errors and keys are strings.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Shortens a path for a message.
fn short(path: &str) -> String {
    const KEEP: usize = 120;
    if path.len() <= KEEP {
        return path.to_owned();
    }
    let cut = (0..=KEEP).rev().find(|i| path.is_char_boundary(*i)).unwrap_or(0);
    format!("{}...", &path[..cut])
}

/// Checks an object about to be stored: nesting depth (422 Invalid) then size (413
/// RequestEntityTooLarge). Depth comes first so that measuring the size never recurses deeply.
///
/// # Errors
/// As above, naming the object, the limit and what it measured.
pub fn check_object(def: &ResourceDef, name: &str, obj: &Value) -> Result<(), ApiError> {
    if let Some(path) = too_deep_at(obj, MAX_OBJECT_DEPTH) {
        let cause = api::validation::Cause::new(
            api::validation::CauseType::Invalid,
            short(&path),
            format!(
                "nested more than {MAX_OBJECT_DEPTH} levels of objects and arrays deep, which Kubernetes clients \
                 cannot read back; flatten this value"
            ),
        );
        return Err(ApiError::invalid(def.group, def.kind, name, &[cause]));
    }
    let size = json_len(obj);
    if size > MAX_OBJECT_BYTES {
        return Err(ApiError::entity_too_large(format!(
            "{} {name:?} would be {size} bytes as JSON, more than the {MAX_OBJECT_BYTES} bytes (1.5 MiB) an object \
             may have; nothing was stored - keep large data out of the object",
            def.kind
        )));
    }
    Ok(())
}

/// Checks the result of an update like [`check_object`], except that an object already over a
/// limit (stored before the limit was enforced) may still be written as long as the write makes
/// it neither deeper nor larger: the garbage collector and the controllers can then still
/// remove finalizers or owner references from it.
///
/// # Errors
/// Those of [`check_object`].
pub fn check_update(def: &ResourceDef, name: &str, cur: &Value, new: &Value) -> Result<(), ApiError> {
    let Err(e) = check_object(def, name, new) else { return Ok(()) };
    if check_object(def, name, cur).is_ok() {
        return Err(e);
    }
    let cap = MAX_OBJECT_DEPTH.saturating_mul(4);
    // Depth first: the sizes are only measured on values whose depth is known to be bounded.
    let (d_new, d_cur) = (depth(new, cap), depth(cur, cap));
    if d_new <= d_cur && d_cur <= cap && json_len(new) <= json_len(cur) {
        return Ok(());
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(levels: usize) -> Value {
        let mut v = json!(1);
        for _ in 0..levels {
            v = json!({ "a": v });
        }
        v
    }

    fn vm_def() -> &'static ResourceDef {
        crate::registry::find("kubevirt.io", "v1", "virtualmachines").unwrap()
    }

    #[test]
    fn depth_counts_containers_and_stops_at_the_cap() {
        assert_eq!(depth(&json!(1), 10), 0);
        assert_eq!(depth(&json!({}), 10), 1);
        assert_eq!(depth(&json!({"a": [1, {"b": []}]}), 10), 4);
        assert_eq!(depth(&nested(50), 10), 11, "stops one past the cap");
    }

    #[test]
    fn an_object_at_the_depth_limit_is_stored_one_deeper_is_refused_with_its_path() {
        assert!(check_object(vm_def(), "x", &nested(MAX_OBJECT_DEPTH)).is_ok());
        let e = check_object(vm_def(), "x", &nested(MAX_OBJECT_DEPTH + 1)).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        let field = e.details.unwrap()["causes"][0]["field"].as_str().unwrap().to_owned();
        assert!(field.starts_with("a.a.a.") && field.ends_with("..."), "{field}");
    }

    #[test]
    fn a_list_of_the_deepest_object_is_readable_by_serde_json() {
        // The reason for the limit: kube-rs reads lists with serde_json.
        let list = json!({"items": [nested(MAX_OBJECT_DEPTH)]}).to_string();
        assert!(serde_json::from_str::<Value>(&list).is_ok());
        let list = json!({"items": [nested(MAX_OBJECT_DEPTH + 1)]}).to_string();
        assert!(serde_json::from_str::<Value>(&list).is_err());
    }

    #[test]
    fn an_object_over_a_limit_may_shrink_but_not_grow() {
        let big = |n: usize| json!({"metadata": {"name": "x", "finalizers": ["f"]}, "spec": {"blob": "x".repeat(n)}});
        let cur = big(MAX_OBJECT_BYTES + 10);
        let mut shrunk = cur.clone();
        shrunk["metadata"]["finalizers"] = json!([]);
        assert!(check_update(vm_def(), "x", &cur, &shrunk).is_ok());
        assert_eq!(check_update(vm_def(), "x", &cur, &big(MAX_OBJECT_BYTES + 20)).unwrap_err().code, 413);
        assert_eq!(check_update(vm_def(), "x", &big(10), &big(MAX_OBJECT_BYTES + 20)).unwrap_err().code, 413);
    }

    #[test]
    fn size_is_the_compact_json_length_and_over_the_limit_is_413() {
        let v = json!({"a": "x".repeat(10)});
        assert_eq!(json_len(&v), v.to_string().len());
        let big = json!({"metadata": {"name": "x"}, "spec": {"blob": "x".repeat(MAX_OBJECT_BYTES)}});
        let e = check_object(vm_def(), "x", &big).unwrap_err();
        assert_eq!((e.code, e.reason), (413, "RequestEntityTooLarge"));
        assert!(e.message.contains("1572864"), "{}", e.message);
    }
}
