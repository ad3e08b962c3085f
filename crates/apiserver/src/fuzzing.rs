//! Entry points for the fuzz targets: each takes raw bytes from the fuzzer and runs them through
//! the same parsing and limit checks a request goes through, without a store or a socket.
//!
//! # Contract
//! None of these functions may panic, overflow, recurse without bound or take time or memory
//! beyond the limits of [`crate::limits`], whatever the input: a fuzzer that finds one that does
//! has found a bug. They return nothing; the answer a client would get is not checked here
//! (the unit and integration tests do that), except for these properties, which panic when
//! broken (so the fuzzer reports them):
//! - an object the stored-object checks accept is at most [`limits::MAX_OBJECT_DEPTH`] deep and
//!   [`limits::MAX_OBJECT_BYTES`] long (measured independently of the check);
//! - a parsed watch timeout is at most [`limits::MAX_WATCH_TIMEOUT`], a parsed `limit` positive.
//!
//! | function | surface |
//! |---|---|
//! | [`request_body`] | a create/update/patch body per `Content-Type` (JSON, YAML, JSON patch, merge patch, strategic merge patch, apply) |
//! | [`patch`] | a patch of each kind applied to a fuzzer-chosen current object |
//! | [`query`] | a query string: selectors, `limit`, `continue`, `resourceVersion`(`Match`), `timeoutSeconds`, `gracePeriodSeconds` |

use serde_json::{json, Value};

use crate::patch::{Patch, PatchKind};
use crate::query::{self, ListOptions};
use crate::{body, labels, limits, list, registry};

/// The object the body fuzzers patch when the input does not give one.
fn sample() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "fuzz", "namespace": "default", "labels": {"app": "fuzz"}, "resourceVersion": "5"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {"disks": [{"name": "root"}]}}}}}
    })
}

/// Runs the checks every stored object goes through; an object they accept must be within the
/// limits.
fn check_stored(obj: &Value) {
    if let Some(def) = registry::find("kubevirt.io", "v1", "virtualmachines") {
        if limits::check_object(def, "fuzz", obj).is_ok() {
            let depth = limits::depth(obj, limits::MAX_OBJECT_DEPTH);
            assert!(depth <= limits::MAX_OBJECT_DEPTH, "an object {depth} levels deep passed the checks");
            let len = limits::json_len(obj);
            assert!(len <= limits::MAX_OBJECT_BYTES, "an object of {len} bytes passed the checks");
        }
    }
    let _ = labels::causes(obj);
}

/// A request body sent with `content_type`: patch content types are parsed as that patch and
/// applied to a sample object; any other is parsed as an object (JSON, or YAML when the type
/// says so). The result goes through the checks before storing.
pub fn request_body(content_type: &str, body: &[u8]) {
    match PatchKind::from_content_type(content_type) {
        Some(kind) => {
            if let Ok(p) = Patch::parse(kind, body) {
                let _ = p.carries_rv();
                if let Ok(out) = p.apply(&sample()) {
                    check_stored(&out);
                }
            }
        }
        None => {
            if let Ok(obj) = body::parse_object(content_type, body) {
                check_stored(&obj);
            }
        }
    }
}

/// A patch of kind `kind_index % 4` (JSON, merge, strategic, apply) with body `body` applied to
/// `current` (JSON; the sample object when it is not a JSON object).
pub fn patch(kind_index: u8, current: &[u8], body: &[u8]) {
    let kind = [PatchKind::Json, PatchKind::Merge, PatchKind::Strategic, PatchKind::Apply][usize::from(kind_index % 4)];
    let current = serde_json::from_slice::<Value>(current).ok().filter(Value::is_object).unwrap_or_else(sample);
    if kind == PatchKind::Apply {
        return apply(kind_index, &current, body);
    }
    if let Ok(p) = Patch::parse(kind, body) {
        if let Ok(out) = p.apply(&current) {
            check_stored(&out);
        }
    }
}

/// Server-side apply of `body` (YAML) to `current` on a VM and on a Node (map and set lists),
/// forced or not by `kind_index`'s high bit, then again by another manager, and an Update
/// recording what changed: none may panic, and what an apply returns is storable.
fn apply(kind_index: u8, current: &Value, body: &[u8]) {
    let Ok(config) = body::parse_yaml(body, limits::MAX_YAML_EXPANSION_BYTES) else { return };
    let force = kind_index & 0x80 != 0;
    for def in ["virtualmachines", "nodes"].into_iter().filter_map(|p| crate::registry::all().into_iter().find(|d| d.plural == p)) {
        for part in [crate::objects::Part::Main, crate::objects::Part::Status] {
            let Ok(once) = crate::apply::apply(def, part, Some(current), &config, "a", force) else { continue };
            check_stored(&once);
            if let Ok(twice) = crate::apply::apply(def, part, Some(&once), &config, "b", force) {
                check_stored(&twice);
            }
            let mut updated = once.clone();
            crate::apply::record_update(def, part, Some(current), &mut updated, Some("u"));
        }
    }
}

/// A query string (without `?`), parsed as a read's options; a `continue` token in it is decoded
/// for a namespaced list of VMs on a store at revision 100 that keeps revisions from 10.
pub fn query(q: &str) {
    let params = query::params(Some(q));
    let _ = query::grace_period(&params);
    let Ok(opts) = ListOptions::parse(&params) else { return };
    assert!(opts.timeout.is_none_or(|t| t <= limits::MAX_WATCH_TIMEOUT), "timeout {:?} passed the parser", opts.timeout);
    assert!(opts.limit.is_none_or(|l| l > 0), "limit 0 passed the parser");
    if let Some(token) = &opts.continue_token {
        let _ = list::decode(token, "/kubevirt.io/virtualmachines/default/", 100, 10);
    }
    let obj = sample();
    let _ = opts.labels.matches_labels(&obj);
    let _ = opts.fields.matches_fields(&obj);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_take_anything() {
        let deep = "[".repeat(10_000);
        let inputs: [&[u8]; 6] =
            [b"", b"{", b"\xff\xfe", b"[{\"op\":\"copy\",\"from\":\"\",\"path\":\"/a\"}]", deep.as_bytes(), b"a: &a [*a]"];
        for ct in [
            "application/json",
            "application/yaml",
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
            "",
        ] {
            for body in inputs {
                request_body(ct, body);
            }
        }
        for k in 0..4 {
            for body in inputs {
                patch(k, b"{\"a\":[1,2,3]}", body);
                patch(k, body, b"{\"a\":null}");
            }
        }
        for q in [
            "limit=-9223372036854775808",
            "timeoutSeconds=9223372036854775807",
            "continue=%00",
            "labelSelector=a+in+(",
            "resourceVersion=99999999999999999999",
            "fieldSelector=%ff",
        ] {
            query(q);
        }
    }
}
