//! Whether the caller may make a request: a `SubjectAccessReview` to the API server for every
//! request but the health checks, in the attributes KubeVirt's roles grant.
//!
//! # Attributes (KubeVirt's RBAC)
//! - `.../namespaces/NS/virtualmachineinstances/NAME/console|vnc`: verb `get` on
//!   `virtualmachineinstances/console|vnc` in group `subresources.kubevirt.io` (KubeVirt's
//!   `kubevirt.io:edit` grants `get` there);
//! - the other subresources are `PUT`: verb `update` on `virtualmachines/start`,
//!   `virtualmachineinstances/pause`, ... (KubeVirt's roles grant `update` on them);
//! - `subresources.virtplug.io/v1/nodes/NODE/tunnel|streams/ID`: verb `get` on
//!   `nodes/tunnel|streams`, name NODE, cluster-scoped (the node agent's role);
//! - anything else (discovery): a non-resource request, the lower-cased method on the path, as
//!   kube-apiserver (`system:discovery` grants `get` on `/apis/*`).
//!
//! # Errors
//! A denial is 403 with kube-apiserver's wording (`virtualmachineinstances.subresources.kubevirt.io
//! "NAME" is forbidden: User "U" cannot get resource "virtualmachineinstances/console" in API
//! group "subresources.kubevirt.io" in the namespace "NS"`, then `: REASON` when the review gave
//! one); a review that cannot be made is 503 (fail closed).

use http::Method;
use serde_json::{json, Value};

use apiserver::status::ApiError;

use crate::authn::User;

/// A request's attributes in RBAC's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attributes {
    Resource { verb: String, group: String, version: String, resource: String, subresource: String, namespace: String, name: String },
    NonResource { verb: String, path: String },
}

impl Attributes {
    /// The attributes of `method` on `path`.
    #[must_use]
    pub fn of(method: &Method, path: &str) -> Attributes {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let verb = |resource_verb: bool| -> String {
            match (*method == Method::GET || *method == Method::HEAD, *method == Method::PUT, resource_verb) {
                (true, _, _) => "get".to_owned(),
                (_, true, true) => "update".to_owned(),
                _ if *method == Method::POST && resource_verb => "create".to_owned(),
                _ => method.as_str().to_ascii_lowercase(),
            }
        };
        match segs.as_slice() {
            ["apis", group @ "subresources.kubevirt.io", version, "namespaces", ns, resource, name, sub] => Attributes::Resource {
                verb: verb(true),
                group: (*group).to_owned(),
                version: (*version).to_owned(),
                resource: (*resource).to_owned(),
                subresource: (*sub).to_owned(),
                namespace: (*ns).to_owned(),
                name: (*name).to_owned(),
            },
            ["apis", group @ "subresources.virtplug.io", version, "nodes", node, sub @ ("tunnel" | "streams"), ..] => {
                Attributes::Resource {
                    verb: verb(true),
                    group: (*group).to_owned(),
                    version: (*version).to_owned(),
                    resource: "nodes".to_owned(),
                    subresource: (*sub).to_owned(),
                    namespace: String::new(),
                    name: (*node).to_owned(),
                }
            }
            _ => Attributes::NonResource { verb: verb(false), path: path.to_owned() },
        }
    }

    /// The `SubjectAccessReview` asking whether `user` may.
    #[must_use]
    pub fn review(&self, user: &User) -> Value {
        let mut spec = json!({"user": user.name, "groups": user.groups, "extra": user.extra});
        if !user.uid.is_empty() {
            spec["uid"] = json!(user.uid);
        }
        match self {
            Attributes::Resource { verb, group, version, resource, subresource, namespace, name } => {
                spec["resourceAttributes"] = json!({"verb": verb, "group": group, "version": version, "resource": resource,
                    "subresource": subresource, "namespace": namespace, "name": name});
            }
            Attributes::NonResource { verb, path } => spec["nonResourceAttributes"] = json!({"verb": verb, "path": path}),
        }
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
    }

    /// The 403 kube-apiserver answers when `user` may not (`reason`: the review's).
    #[must_use]
    pub fn forbidden(&self, user: &User, reason: &str) -> ApiError {
        let reason = if reason.is_empty() { String::new() } else { format!(": {reason}") };
        match self {
            Attributes::Resource { verb, group, resource, subresource, namespace, name, .. } => {
                let whole = if subresource.is_empty() { resource.clone() } else { format!("{resource}/{subresource}") };
                let scope =
                    if namespace.is_empty() { "at the cluster scope".to_owned() } else { format!("in the namespace {namespace:?}") };
                let mut e = ApiError::forbidden(format!(
                    "{resource}.{group} {name:?} is forbidden: User {:?} cannot {verb} resource {whole:?} in API group {group:?} {scope}{reason}",
                    user.name
                ));
                e.details = Some(json!({"name": name, "group": group, "kind": resource}));
                e
            }
            Attributes::NonResource { verb, path } => {
                ApiError::forbidden(format!("forbidden: User {:?} cannot {verb} path {path:?}{reason}", user.name))
            }
        }
    }
}

/// Asks the API server whether `user` may do what `attrs` say: `Ok(())`, or the 403.
///
/// # Errors
/// The 403, or 503 when the review cannot be made.
pub async fn check(client: &kube::Client, user: &User, attrs: &Attributes) -> Result<(), ApiError> {
    let body =
        serde_json::to_vec(&attrs.review(user)).map_err(|e| ApiError::internal(format!("the access review cannot be written: {e}")))?;
    let req = http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|e| ApiError::internal(format!("the access review cannot be sent: {e}")))?;
    let answer: Value = client.request(req).await.map_err(|e| {
        ApiError::unavailable(format!("cannot ask the API server whether {:?} may do this (SubjectAccessReview): {e}", user.name))
    })?;
    if answer.pointer("/status/allowed") == Some(&json!(true)) && answer.pointer("/status/denied") != Some(&json!(true)) {
        return Ok(());
    }
    Err(attrs.forbidden(user, answer.pointer("/status/reason").and_then(Value::as_str).unwrap_or("")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes KubeVirt's roles grant, and kube-apiserver's 403 wording for them.
    #[test]
    fn paths_map_to_kubevirts_rbac_attributes_and_denials_read_as_kube_apiservers() {
        let console = Attributes::of(&Method::GET, "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachineinstances/vm1/console");
        let bob = User { name: "bob".into(), ..User::default() };
        assert_eq!(
            console.forbidden(&bob, "").message,
            "virtualmachineinstances.subresources.kubevirt.io \"vm1\" is forbidden: User \"bob\" cannot get resource \"virtualmachineinstances/console\" in API group \"subresources.kubevirt.io\" in the namespace \"ns1\""
        );
        let review = console.review(&bob);
        assert_eq!(review.pointer("/spec/resourceAttributes/verb"), Some(&json!("get")));
        let start = Attributes::of(&Method::PUT, "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/start");
        assert!(matches!(&start, Attributes::Resource { verb, subresource, .. } if verb == "update" && subresource == "start"));
        let tunnel = Attributes::of(&Method::GET, "/apis/subresources.virtplug.io/v1/nodes/n1/streams/abc");
        assert!(tunnel
            .forbidden(&bob, "no")
            .message
            .ends_with("cannot get resource \"nodes/streams\" in API group \"subresources.virtplug.io\" at the cluster scope: no"));
        let discovery = Attributes::of(&Method::GET, "/apis/subresources.kubevirt.io/v1");
        assert_eq!(discovery, Attributes::NonResource { verb: "get".into(), path: "/apis/subresources.kubevirt.io/v1".into() });
    }
}
