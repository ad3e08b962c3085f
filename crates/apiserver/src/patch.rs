//! Applying PATCH bodies: RFC 6902 JSON patch, RFC 7396 merge patch, and strategic merge patch
//! for the core types ([`strategic`]: lists merged by their Kubernetes merge keys, with the
//! directives).
//!
//! # Flow
//! [`Patch::parse`] reads the body once (400 when it is not a patch of its kind, 413 for more
//! than [`MAX_JSON_PATCH_OPS`] operations, as kube-apiserver); [`Patch::apply`] applies it to a
//! copy of the current object, as often as the write is retried.
//!
//! # Guarantees
//! - Nothing is changed on failure: the patch works on a copy.
//! - A JSON patch never builds a document nested deeper than [`MAX_OBJECT_DEPTH`] (each
//!   operation is checked before it runs, so no intermediate step recurses without bound), never
//!   copies more than [`MAX_JSON_PATCH_COPY_BYTES`], and never shifts more than
//!   [`MAX_JSON_PATCH_WORK`] array elements in total (422 Invalid, as kube-apiserver answers a
//!   patch it cannot apply).
//! - A merge patch nests no deeper than the deeper of the object and the patch.
//! - Nothing panics: operations run one by one on the copy, without json-patch's undo log
//!   (whose replay can panic on a `move` to the root).

pub mod strategic;

use serde_json::Value;

use crate::limits::{self, MAX_JSON_PATCH_COPY_BYTES, MAX_JSON_PATCH_OPS, MAX_JSON_PATCH_WORK, MAX_OBJECT_DEPTH};
use crate::status::ApiError;

/// The patch formats the server distinguishes by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    /// From a `Content-Type` header value.
    #[must_use]
    pub fn from_content_type(ct: &str) -> Option<PatchKind> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            // CBOR apply patches are refused (415) with the types accepted.
            "application/apply-patch+yaml" => Some(PatchKind::Apply),
            _ => None,
        }
    }
}

/// A parsed patch body.
#[derive(Debug, Clone)]
pub enum Patch {
    /// RFC 6902 operations.
    Json(Vec<json_patch::PatchOperation>),
    /// An RFC 7396 merge patch.
    Merge(Value),
    /// A strategic merge patch, applied by the kind of the object it patches.
    Strategic(Value),
}

impl Patch {
    /// Parses `body` as a patch of `kind`.
    ///
    /// # Errors
    /// 400 when the body is not a patch of its kind; 413 for a JSON patch of more than
    /// [`MAX_JSON_PATCH_OPS`] operations; 415 for server-side apply, which is no patch of the
    /// object but a configuration merged by [`crate::apply`].
    pub fn parse(kind: PatchKind, body: &[u8]) -> Result<Patch, ApiError> {
        match kind {
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("the JSON patch is not a list of RFC 6902 operations: {e}")))?;
                if ops.0.len() > MAX_JSON_PATCH_OPS {
                    return Err(ApiError::entity_too_large(format!(
                        "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPS}, got {}",
                        ops.0.len()
                    )));
                }
                Ok(Patch::Json(ops.0))
            }
            PatchKind::Merge | PatchKind::Strategic => {
                let patch: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("the merge patch is not a JSON object: {e}")))?;
                if !patch.is_object() {
                    return Err(ApiError::bad_request("the merge patch must be a JSON object"));
                }
                Ok(if kind == PatchKind::Strategic { Patch::Strategic(patch) } else { Patch::Merge(patch) })
            }
            PatchKind::Apply => {
                Err(ApiError::unsupported_media("an apply patch is applied by crate::apply (Objects::apply), not parsed as a patch"))
            }
        }
    }

    /// Whether the patch sets `metadata.resourceVersion`, making it a precondition.
    #[must_use]
    pub fn carries_rv(&self) -> bool {
        match self {
            Patch::Merge(p) | Patch::Strategic(p) => p.pointer("/metadata/resourceVersion").is_some_and(Value::is_string),
            Patch::Json(ops) => ops.iter().any(|op| {
                use json_patch::PatchOperation as O;
                matches!(op, O::Test(_) | O::Replace(_) | O::Add(_)) && op.path().as_str() == "/metadata/resourceVersion"
            }),
        }
    }

    /// Applies the patch to a copy of `current` and returns the result.
    ///
    /// # Errors
    /// 422 Invalid when a JSON patch operation fails (a `test` that does not match, a path that
    /// does not exist) or would exceed a limit of the module docs.
    pub fn apply(&self, current: &Value) -> Result<Value, ApiError> {
        let mut doc = current.clone();
        match self {
            Patch::Merge(p) => json_patch::merge(&mut doc, p),
            Patch::Strategic(p) => {
                let kind = current.get("kind").and_then(Value::as_str).unwrap_or_default();
                doc = strategic::apply(kind, std::mem::take(&mut doc), p);
            }
            Patch::Json(ops) => {
                let mut budget = Budget { copied: 0, work: 0 };
                for (i, op) in ops.iter().enumerate() {
                    budget
                        .admit(&doc, op)
                        .map_err(|m| ApiError::unprocessable(format!("the JSON patch could not be applied: operation {i}: {m}")))?;
                    json_patch::patch_unsafe(&mut doc, std::slice::from_ref(op))
                        .map_err(|e| ApiError::unprocessable(format!("the JSON patch could not be applied: operation {i}: {e}")))?;
                }
            }
        }
        Ok(doc)
    }
}

/// What the operations of one JSON patch have spent so far.
struct Budget {
    copied: usize,
    work: usize,
}

impl Budget {
    /// Checks, before it runs, that `op` keeps the document within the limits.
    fn admit(&mut self, doc: &Value, op: &json_patch::PatchOperation) -> Result<(), String> {
        use json_patch::PatchOperation as O;
        let placed = match op {
            O::Add(o) => Some((&o.path, depth_of(&o.value))),
            O::Replace(o) => Some((&o.path, depth_of(&o.value))),
            O::Copy(o) => {
                let from = doc.pointer(o.from.as_str());
                let size = from.map_or(0, limits::json_len);
                self.copied = self.copied.saturating_add(size);
                if self.copied > MAX_JSON_PATCH_COPY_BYTES {
                    return Err(format!(
                        "the copies of this patch add up to {} bytes, more than the {MAX_JSON_PATCH_COPY_BYTES} bytes a patch may copy",
                        self.copied
                    ));
                }
                Some((&o.path, from.map_or(0, depth_of)))
            }
            O::Move(o) => Some((&o.path, doc.pointer(o.from.as_str()).map_or(0, depth_of))),
            O::Remove(_) | O::Test(_) => None,
        };
        if let Some((path, d)) = placed {
            let levels = path.count().saturating_add(d);
            if levels > MAX_OBJECT_DEPTH {
                return Err(format!(
                    "it would nest {} {levels} levels deep, more than the {MAX_OBJECT_DEPTH} levels of objects and arrays \
                     an object may have",
                    path.as_str()
                ));
            }
        }
        // An insert or remove in an array shifts its tail.
        let touched = [Some(op.path()), if let O::Move(o) = op { Some(o.from.as_ptr()) } else { None }];
        for p in touched.into_iter().flatten() {
            let parent = p.split_back().map(|(parent, _)| parent);
            if let Some(Value::Array(a)) = parent.and_then(|pp| doc.pointer(pp.as_str())) {
                self.work = self.work.saturating_add(a.len());
            }
        }
        self.work = self.work.saturating_add(1);
        if self.work > MAX_JSON_PATCH_WORK {
            return Err(format!(
                "it shifts more than {MAX_JSON_PATCH_WORK} array elements in total; send a smaller patch or replace the array"
            ));
        }
        Ok(())
    }
}

/// Nesting depth of a value placed by an operation, counted one past the limit at most.
fn depth_of(v: &Value) -> usize {
    limits::depth(v, MAX_OBJECT_DEPTH)
}

/// Parses `body` as `kind` and applies it to `current`: [`Patch::parse`] then [`Patch::apply`].
///
/// # Errors
/// Those of both.
pub fn apply(kind: PatchKind, current: &Value, body: &[u8]) -> Result<Value, ApiError> {
    Patch::parse(kind, body)?.apply(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_replaces_arrays_and_null_deletes() {
        let cur = json!({"a": [1, 2], "b": {"c": 1, "d": 2}});
        let out = apply(PatchKind::Merge, &cur, br#"{"a":[3],"b":{"c":null}}"#).unwrap();
        assert_eq!(out, json!({"a": [3], "b": {"d": 2}}));
    }

    #[test]
    fn failed_test_is_422_and_changes_nothing() {
        let cur = json!({"metadata": {"resourceVersion": "5"}});
        let e = apply(PatchKind::Json, &cur, br#"[{"op":"test","path":"/metadata/resourceVersion","value":"4"}]"#).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(e.reason, "Invalid");
    }

    #[test]
    fn bad_bodies_are_400() {
        assert_eq!(apply(PatchKind::Json, &json!({}), b"{").unwrap_err().code, 400);
        assert_eq!(apply(PatchKind::Merge, &json!({}), b"[1]").unwrap_err().code, 400);
        assert_eq!(apply(PatchKind::Apply, &json!({}), b"{}").unwrap_err().code, 415);
    }

    fn ops(v: &Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    #[test]
    fn more_than_10000_operations_is_413_with_kubes_message() {
        let many: Vec<Value> = (0..=MAX_JSON_PATCH_OPS).map(|_| json!({"op": "test", "path": "/a", "value": 1})).collect();
        let e = Patch::parse(PatchKind::Json, &ops(&json!(many))).unwrap_err();
        assert_eq!((e.code, e.reason), (413, "RequestEntityTooLarge"));
        assert_eq!(e.message, "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001");
        let at_limit: Vec<Value> = (0..MAX_JSON_PATCH_OPS).map(|_| json!({"op": "test", "path": "/a", "value": 1})).collect();
        assert!(apply(PatchKind::Json, &json!({"a": 1}), &ops(&json!(at_limit))).is_ok());
    }

    #[test]
    fn copies_that_double_the_object_stop_at_the_copy_budget() {
        let mut p = vec![json!({"op": "add", "path": "/a", "value": "x".repeat(1 << 20)})];
        p.extend((0..8).map(|i| json!({"op": "copy", "from": "/a", "path": format!("/c{i}")})));
        let e = apply(PatchKind::Json, &json!({}), &ops(&json!(p))).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("a patch may copy"), "{}", e.message);
    }

    #[test]
    fn copies_into_themselves_stop_at_the_depth_limit() {
        // Each copy nests the value inside itself, three levels deeper each time.
        let mut p = vec![json!({"op": "add", "path": "/a", "value": {"b": {"c": {}}}})];
        p.extend((0..60).map(|_| json!({"op": "copy", "from": "/a", "path": "/a/b/c/d"})));
        let e = apply(PatchKind::Json, &json!({}), &ops(&json!(p))).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.contains("levels deep"), "{}", e.message);
    }

    #[test]
    fn removes_at_the_front_of_a_long_array_stop_at_the_work_budget() {
        let cur = json!({"a": vec![0; 100_000]});
        let p: Vec<Value> = (0..MAX_JSON_PATCH_OPS).map(|_| json!({"op": "remove", "path": "/a/0"})).collect();
        let t = std::time::Instant::now();
        let e = apply(PatchKind::Json, &cur, &ops(&json!(p))).unwrap_err();
        assert!(e.message.contains("array elements"), "{}", e.message);
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn a_move_to_the_root_followed_by_a_failure_is_an_error_not_a_panic() {
        // json-patch's undo log panics replaying this; operations here run without it.
        let body = br#"[{"op":"move","from":"/x","path":""},{"op":"test","path":"/missing","value":1}]"#;
        assert_eq!(apply(PatchKind::Json, &json!({"x": {"y": 1}}), body).unwrap_err().code, 422);
    }

    #[test]
    fn a_precondition_is_seen_in_either_kind() {
        assert!(Patch::parse(PatchKind::Merge, br#"{"metadata":{"resourceVersion":"3"}}"#).unwrap().carries_rv());
        assert!(Patch::parse(PatchKind::Json, br#"[{"op":"test","path":"/metadata/resourceVersion","value":"3"}]"#).unwrap().carries_rv());
        assert!(!Patch::parse(PatchKind::Json, br#"[{"op":"remove","path":"/metadata/resourceVersion"}]"#).unwrap().carries_rv());
    }
}
