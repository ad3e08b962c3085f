//! Strategic merge patch (`application/strategic-merge-patch+json`) for the core kinds, as
//! `k8s.io/apimachinery/pkg/util/strategicpatch` applies it: lists whose Kubernetes type has a
//! `patchMergeKey` are merged item by item on that key (a Pod's containers by `name`, their
//! ports by `containerPort`, a Service's ports by `port`, conditions by `type`, ...),
//! `finalizers` as a set, every other list replaced, objects merged, `null` deleting.
//!
//! # Directives
//! `$patch: replace` (an object or list item replaced whole), `$patch: delete` (a list item,
//! found by its key, removed), `$retainKeys` (an object keeps only the listed keys),
//! `$setElementOrder/FIELD` (the merged list ordered as listed, items it does not name after
//! them), `$deleteFromPrimitiveList/FIELD` (values removed from a set list). Directives never
//! reach the stored object.
//!
//! # Guarantees
//! Recursion follows the patch, which the body parser bounds in depth; nothing panics; the
//! current object is not changed (the merge works on a copy).

use serde_json::{Map, Value};

/// How a list at a path merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListMerge {
    /// Items are objects merged by this key.
    Key(&'static str),
    /// Items are scalars merged as a set.
    Set,
}

/// The lists of `kind` (or any kind, for `metadata`) that merge rather than replace, by dotted
/// path without indexes (Kubernetes' `patchStrategy:"merge"` tags).
fn list_merge(kind: &str, path: &str) -> Option<ListMerge> {
    use ListMerge::{Key, Set};
    match path {
        "metadata.ownerReferences" => return Some(Key("uid")),
        "metadata.finalizers" => return Some(Set),
        "status.conditions" if matches!(kind, "Pod" | "Node" | "PersistentVolumeClaim" | "Namespace" | "Service") => {
            return Some(Key("type"));
        }
        _ => {}
    }
    match kind {
        "Pod" => {
            let rest = path.strip_prefix("spec.")?;
            let container = ["containers.", "initContainers.", "ephemeralContainers."].iter().find_map(|p| rest.strip_prefix(p));
            match (rest, container) {
                (
                    "containers"
                    | "initContainers"
                    | "ephemeralContainers"
                    | "volumes"
                    | "imagePullSecrets"
                    | "resourceClaims"
                    | "schedulingGates",
                    _,
                ) => Some(Key("name")),
                ("hostAliases", _) => Some(Key("ip")),
                (_, Some("env")) => Some(Key("name")),
                (_, Some("ports")) => Some(Key("containerPort")),
                (_, Some("volumeMounts")) => Some(Key("mountPath")),
                (_, Some("volumeDevices")) => Some(Key("devicePath")),
                (_, Some("resizePolicy")) => Some(Key("resourceName")),
                _ => None,
            }
        }
        "Service" if path == "spec.ports" => Some(Key("port")),
        "ServiceAccount" if matches!(path, "secrets" | "imagePullSecrets") => Some(Key("name")),
        "Node" if path == "status.addresses" => Some(Key("type")),
        "Namespace" if path == "spec.finalizers" => Some(Set),
        _ => None,
    }
}

/// Applies strategic merge `patch` to `current`, an object of `kind`.
#[must_use]
pub fn apply(kind: &str, current: Value, patch: &Value) -> Value {
    merge_object(kind, "", current, patch)
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn merge_object(kind: &str, path: &str, current: Value, patch: &Value) -> Value {
    let Value::Object(p) = patch else { return clean(patch) };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        return clean(patch);
    }
    let mut out = match current {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        out.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, pv) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(drop)) = (out.get_mut(field), pv) {
                items.retain(|i| !drop.contains(i));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let at = child_path(path, k);
        match pv {
            Value::Null => {
                out.remove(k);
            }
            Value::Object(_) => {
                let cur = out.remove(k).unwrap_or(Value::Null);
                out.insert(k.clone(), merge_object(kind, &at, cur, pv));
            }
            Value::Array(items) => {
                let cur = out.remove(k).unwrap_or(Value::Null);
                let mut merged = match list_merge(kind, &at) {
                    Some(rule) => merge_list(kind, &at, rule, cur, items),
                    None => clean(pv),
                };
                if let (Some(Value::Array(order)), Value::Array(list)) = (p.get(&format!("$setElementOrder/{k}")), &mut merged) {
                    reorder(list, order, list_merge(kind, &at));
                }
                out.insert(k.clone(), merged);
            }
            _ => {
                out.insert(k.clone(), pv.clone());
            }
        }
    }
    Value::Object(out)
}

fn merge_list(kind: &str, path: &str, rule: ListMerge, current: Value, patch: &[Value]) -> Value {
    let mut list = match current {
        Value::Array(a) => a,
        _ => Vec::new(),
    };
    match rule {
        ListMerge::Set => {
            for item in patch {
                if !list.contains(item) {
                    list.push(clean(item));
                }
            }
        }
        ListMerge::Key(key) => {
            if patch.iter().any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace") && i.get(key).is_none()) {
                // `[{"$patch": "replace"}, items...]`: the list is the patch's items.
                return Value::Array(patch.iter().filter(|i| i.get("$patch").is_none()).map(clean).collect());
            }
            for item in patch {
                let id = item.get(key);
                let at = list.iter().position(|c| id.is_some() && c.get(key) == id);
                match (item.get("$patch").and_then(Value::as_str), at) {
                    (Some("delete"), Some(i)) => {
                        list.remove(i);
                    }
                    (Some("delete"), None) => {}
                    (Some("replace"), Some(i)) => list[i] = clean(item),
                    (_, Some(i)) => {
                        let cur = std::mem::take(&mut list[i]);
                        list[i] = merge_object(kind, path, cur, item);
                    }
                    (_, None) => list.push(clean(item)),
                }
            }
        }
    }
    Value::Array(list)
}

/// Orders `list` as `order` names its items; the items it does not name keep their order after.
fn reorder(list: &mut [Value], order: &[Value], rule: Option<ListMerge>) {
    let id = |v: &Value| -> Value {
        match rule {
            Some(ListMerge::Key(k)) => v.get(k).cloned().unwrap_or(Value::Null),
            _ => v.clone(),
        }
    };
    let rank = |v: &Value| order.iter().position(|o| id(o) == id(v)).unwrap_or(usize::MAX);
    list.sort_by_key(|v| rank(v));
}

/// A patch value as stored: directives dropped.
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), clean(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(clean).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"kind": "Pod", "metadata": {"finalizers": ["a"]}, "spec": {"containers": [
            {"name": "app", "image": "x:1", "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80}]},
            {"name": "side", "image": "y:1"}]}})
    }

    #[test]
    fn containers_env_and_ports_merge_by_their_keys() {
        // What `kubectl set env pod/p B=2` and `kubectl set image` send.
        let patch = json!({"spec": {"containers": [{"name": "app", "env": [{"name": "B", "value": "2"}], "image": "x:2"}]}});
        let out = apply("Pod", pod(), &patch);
        assert_eq!(out.pointer("/spec/containers/0/image"), Some(&json!("x:2")));
        assert_eq!(out.pointer("/spec/containers/0/env"), Some(&json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])));
        assert_eq!(out.pointer("/spec/containers/1"), Some(&json!({"name": "side", "image": "y:1"})), "the other container stays");
    }

    #[test]
    fn directives_delete_replace_order_and_retain() {
        let patch = json!({"spec": {"containers": [{"name": "side", "$patch": "delete"}]}, "metadata": {"finalizers": ["b"]}});
        let out = apply("Pod", pod(), &patch);
        assert_eq!(out.pointer("/spec/containers").and_then(Value::as_array).map(Vec::len), Some(1));
        assert_eq!(out.pointer("/metadata/finalizers"), Some(&json!(["a", "b"])), "finalizers merge as a set");
        let patch = json!({"$setElementOrder/finalizers": ["b", "a"], "finalizers": ["b"]});
        let meta = apply("Pod", json!({"metadata": {"finalizers": ["a"]}}), &json!({"metadata": patch}));
        assert_eq!(meta.pointer("/metadata/finalizers"), Some(&json!(["b", "a"])));
        let patch = json!({"$deleteFromPrimitiveList/finalizers": ["a"]});
        assert_eq!(apply("Pod", pod(), &json!({"metadata": patch})).pointer("/metadata/finalizers"), Some(&json!([])));
        let patch =
            json!({"spec": {"$retainKeys": ["containers"], "containers": [{"name": "app", "$patch": "replace", "image": "z"}], "x": 1}});
        let out = apply("Pod", pod(), &patch);
        assert_eq!(out.pointer("/spec/containers/0"), Some(&json!({"name": "app", "image": "z"})));
        assert_eq!(out.pointer("/spec/x"), Some(&json!(1)));
        assert!(out.to_string().find('$').is_none(), "no directive is stored: {out}");
    }

    #[test]
    fn lists_without_a_merge_key_are_replaced() {
        let cur = json!({"spec": {"tolerations": [{"key": "a"}], "containers": [{"name": "c", "args": ["1", "2"]}]}});
        let out = apply("Pod", cur, &json!({"spec": {"tolerations": [{"key": "b"}], "containers": [{"name": "c", "args": ["3"]}]}}));
        assert_eq!(out.pointer("/spec/tolerations"), Some(&json!([{"key": "b"}])));
        assert_eq!(out.pointer("/spec/containers/0/args"), Some(&json!(["3"])));
        let svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        let out = apply("Service", svc, &json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}}));
        assert_eq!(out.pointer("/spec/ports/1"), Some(&json!({"port": 443, "name": "https", "targetPort": 8443})));
    }
}
