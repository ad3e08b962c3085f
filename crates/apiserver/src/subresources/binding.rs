//! `POST /api/v1/namespaces/NS/pods/NAME/binding`: kube-apiserver's `pods/binding`, the one way
//! a Pod gets its `spec.nodeName` after creation (kube-scheduler calls it; a Pod update may not
//! change `spec.nodeName`, [`crate::kinds::pod::validate_update`]).
//!
//! # Guarantees (kube-apiserver's `BindingREST.assignPod`)
//! - The body is a v1 `Binding` whose `metadata.name` (when given) is the Pod's and whose
//!   `target` names a Node: 400 otherwise.
//! - A Pod is bound once: an already bound Pod is 409 Conflict ("pod NAME is already assigned
//!   to node N"), as is a Pod being deleted; `metadata.uid`, when given, must still be the Pod's
//!   (409 for a Pod replaced under the same name).
//! - The bind sets `spec.nodeName` and the `PodScheduled=True` condition in one write; the
//!   answer is kube-apiserver's `Status` Success, 201.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use crate::objects::Objects;
use crate::registry;
use crate::status::ApiError;

/// What a `Binding` body asks.
#[derive(Debug, PartialEq, Eq)]
struct Bind {
    node: String,
    uid: Option<String>,
}

fn parse(pod: &str, body: &[u8]) -> Result<Bind, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the Binding body is not valid JSON: {e}")))?;
    if let Some(name) = v.pointer("/metadata/name").and_then(Value::as_str) {
        if name != pod {
            return Err(ApiError::bad_request(format!("Binding metadata.name {name:?} does not match the pod {pod:?}")));
        }
    }
    let kind = v.pointer("/target/kind").and_then(Value::as_str).unwrap_or("Node");
    if kind != "Node" {
        return Err(ApiError::bad_request(format!("target.kind must be Node, not {kind:?}")));
    }
    let node = v.pointer("/target/name").and_then(Value::as_str).filter(|n| !n.is_empty());
    let node = node.ok_or_else(|| ApiError::bad_request("target.name: Required value: the node to bind the pod to"))?;
    Ok(Bind { node: node.to_owned(), uid: v.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_owned) })
}

/// The Pod `cur` bound as `bind` asks, or why it cannot be.
fn bound(pod: &str, cur: &Value, bind: &Bind) -> Result<Value, ApiError> {
    if let Some(uid) = &bind.uid {
        if cur.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid.as_str()) {
            return Err(ApiError::conflict_message(format!("pod {pod} has another UID than the Binding's {uid}: it was replaced")));
        }
    }
    if cur.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(ApiError::conflict_message(format!("pod {pod} is being deleted, cannot be assigned to a host")));
    }
    if let Some(n) = cur.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
        return Err(ApiError::conflict_message(format!("pod {pod} is already assigned to node {n:?}")));
    }
    let mut new = cur.clone();
    new["spec"]["nodeName"] = json!(bind.node);
    if !new.get("status").is_some_and(Value::is_object) {
        new["status"] = json!({});
    }
    let scheduled = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
        "lastTransitionTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()});
    let conditions = new["status"].as_object_mut().map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    if let Some(Value::Array(cs)) = conditions {
        cs.retain(|c| c.get("type") != Some(&json!("PodScheduled")));
        cs.push(scheduled);
    }
    Ok(new)
}

/// Handles `POST .../pods/NAME/binding`.
///
/// # Errors
/// 400 for a bad body, 404 for a missing Pod, 409 (see the module docs).
pub async fn handle(objects: &Objects, ns: &str, pod: &str, body: &[u8], dry_run: bool) -> Result<Response, ApiError> {
    let bind = parse(pod, body)?;
    let def = registry::find("", "v1", "pods").ok_or_else(ApiError::no_resource)?;
    objects.bind(def, ns, pod, dry_run, |cur| bound(pod, cur, &bind)).await?;
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
    Ok(crate::reply::json_response(StatusCode::CREATED, &status))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": "p", "uid": "u1"}, "spec": {"containers": []}, "status": {"phase": "Pending"}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    #[test]
    fn a_binding_sets_the_node_once() {
        let b =
            parse("p", br#"{"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}"#)
                .unwrap();
        assert_eq!(b, Bind { node: "n1".into(), uid: None });
        let new = bound("p", &pod(None), &b).unwrap();
        assert_eq!(new.pointer("/spec/nodeName"), Some(&json!("n1")));
        assert_eq!(new.pointer("/status/conditions/0/type"), Some(&json!("PodScheduled")));
        // kube-apiserver's 409 for a second bind, even to the same node.
        let again = bound("p", &new, &b).unwrap_err();
        assert_eq!((again.code, again.message.as_str()), (409, "pod p is already assigned to node \"n1\""));
    }

    #[test]
    fn bad_bindings_are_refused() {
        assert_eq!(parse("p", br#"{"target": {}}"#).unwrap_err().code, 400);
        assert_eq!(parse("p", br#"{"metadata": {"name": "q"}, "target": {"name": "n1"}}"#).unwrap_err().code, 400);
        assert_eq!(parse("p", br#"{"target": {"kind": "Pod", "name": "n1"}}"#).unwrap_err().code, 400);
        let other = Bind { node: "n1".into(), uid: Some("u2".into()) };
        assert_eq!(bound("p", &pod(None), &other).unwrap_err().code, 409, "a replaced pod is not bound");
    }
}
