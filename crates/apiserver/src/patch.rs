//! Applying PATCH bodies: RFC 6902 JSON patch, RFC 7396 merge patch, and strategic merge patch
//! for the core types (served as a merge patch without its list-merge directives, which the
//! fields of PVCs, Events and Namespaces do not need).

use serde_json::Value;

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
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(PatchKind::Apply),
            _ => None,
        }
    }
}

/// Applies `body` to `current` and returns the patched document. Nothing is changed on failure.
///
/// # Errors
/// 400 when the body is not a patch of its kind; 422 when a JSON patch operation fails (a `test`
/// that does not match, a path that does not exist).
pub fn apply(kind: PatchKind, current: &Value, body: &[u8]) -> Result<Value, ApiError> {
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("the JSON patch is not a list of RFC 6902 operations: {e}")))?;
            let mut doc = current.clone();
            json_patch::patch(&mut doc, &ops).map_err(|e| ApiError::unprocessable(format!("the JSON patch could not be applied: {e}")))?;
            Ok(doc)
        }
        PatchKind::Merge | PatchKind::Strategic => {
            let mut patch: Value =
                serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the merge patch is not a JSON object: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("the merge patch must be a JSON object"));
            }
            if kind == PatchKind::Strategic {
                strip_directives(&mut patch);
            }
            let mut doc = current.clone();
            json_patch::merge(&mut doc, &patch);
            Ok(doc)
        }
        PatchKind::Apply => Err(ApiError::unsupported_media(
            "server-side apply is not supported by virtplug's API server; use kubectl apply without --server-side \
             (client-side apply uses a merge patch)",
        )),
    }
}

/// Drops strategic-merge directives (`$patch`, `$retainKeys`, `$setElementOrder/...`,
/// `$deleteFromPrimitiveList/...`) so the rest applies as a merge patch.
fn strip_directives(v: &mut Value) {
    if let Value::Object(map) = v {
        map.retain(|k, _| !k.starts_with('$'));
        for child in map.values_mut() {
            strip_directives(child);
        }
    }
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
}
