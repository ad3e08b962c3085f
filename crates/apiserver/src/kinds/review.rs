//! The access reviews kubectl's `auth can-i` and `auth whoami` create: `authorization.k8s.io/v1`
//! `SelfSubjectAccessReview` and `SelfSubjectRulesReview`, `authentication.k8s.io`
//! `SelfSubjectReview`; and the two an aggregated API server (`virtplug subresources-api`)
//! delegates to the API server: `SubjectAccessReview` and `TokenReview`. They are answered,
//! never stored.
//!
//! The server has one credential, the bearer token in the kubeconfig, and its holder is an
//! administrator: every self access review is allowed, the rules review lists `*` for
//! everything, and the subject review names the kubeconfig's user ([`ADMIN_USER`]) in
//! `system:masters`. A `TokenReview` authenticates that token (as that user), and the
//! ServiceAccount tokens `serviceaccounts/token` minted ([`crate::tokens`]: with their
//! ServiceAccount's user, groups and bound-object extras, while they are valid). A
//! `SubjectAccessReview` is decided for the user and groups it names by the stored RBAC objects
//! ([`super::rbac`]).
//!
//! # Guarantees
//! A SelfSubjectAccessReview names exactly one of `resourceAttributes` and
//! `nonResourceAttributes` (422 naming `spec` otherwise, as kube-apiserver).

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::protobuf::message::{f, rep, Message, Ty, OBJECT_META};

/// The user the kubeconfig names and the subject review reports.
pub const ADMIN_USER: &str = "virtplug-admin";
/// The groups of [`ADMIN_USER`].
pub const ADMIN_GROUPS: [&str; 2] = ["system:masters", "system:authenticated"];

/// What a review may consult.
pub struct Context<'a> {
    pub objects: &'a crate::objects::Objects,
    /// The bearer token a `TokenReview` authenticates as the administrator; `None`: none.
    pub token: Option<&'a str>,
    /// The minted ServiceAccount tokens a `TokenReview` also authenticates.
    pub tokens: &'a crate::tokens::Tokens,
}

/// A review kind: its protobuf message and its answer.
#[derive(Debug)]
pub struct Review {
    pub protobuf: &'static Message,
    /// The review with its `status`, or what is wrong with the request.
    pub answer: fn(&Context<'_>, Value) -> Result<Value, Vec<Cause>>,
}

static RESOURCE_ATTRIBUTES: Message = Message {
    name: "ResourceAttributes",
    fields: &[
        f(1, "namespace", Ty::Str),
        f(2, "verb", Ty::Str),
        f(3, "group", Ty::Str),
        f(4, "version", Ty::Str),
        f(5, "resource", Ty::Str),
        f(6, "subresource", Ty::Str),
        f(7, "name", Ty::Str),
    ],
    // Field and label selector attributes (8, 9) narrow a list check; an administrator is
    // allowed either way.
    skip: &[8, 9],
};
static NON_RESOURCE_ATTRIBUTES: Message =
    Message { name: "NonResourceAttributes", fields: &[f(1, "path", Ty::Str), f(2, "verb", Ty::Str)], skip: &[] };
static ACCESS_SPEC: Message = Message {
    name: "SelfSubjectAccessReviewSpec",
    fields: &[f(1, "resourceAttributes", Ty::Msg(&RESOURCE_ATTRIBUTES)), f(2, "nonResourceAttributes", Ty::Msg(&NON_RESOURCE_ATTRIBUTES))],
    skip: &[],
};
static ACCESS_PROTOBUF: Message = Message {
    name: "SelfSubjectAccessReview",
    fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&ACCESS_SPEC))],
    skip: &[3],
};
static RULES_SPEC: Message = Message { name: "SelfSubjectRulesReviewSpec", fields: &[f(1, "namespace", Ty::Str)], skip: &[] };
static RULES_PROTOBUF: Message = Message {
    name: "SelfSubjectRulesReview",
    fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&RULES_SPEC))],
    skip: &[3],
};
static SAR_SPEC: Message = Message {
    name: "SubjectAccessReviewSpec",
    fields: &[
        f(1, "resourceAttributes", Ty::Msg(&RESOURCE_ATTRIBUTES)),
        f(2, "nonResourceAttributes", Ty::Msg(&NON_RESOURCE_ATTRIBUTES)),
        f(3, "user", Ty::Str),
        rep(4, "groups", Ty::Str),
        f(6, "uid", Ty::Str),
    ],
    // `extra` (5) plays no part in RBAC's decision.
    skip: &[5],
};
static SAR_PROTOBUF: Message = Message {
    name: "SubjectAccessReview",
    fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&SAR_SPEC))],
    skip: &[3],
};
static TOKEN_SPEC: Message =
    Message { name: "TokenReviewSpec", fields: &[f(1, "token", Ty::Str), rep(2, "audiences", Ty::Str)], skip: &[] };
static TOKEN_PROTOBUF: Message =
    Message { name: "TokenReview", fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&TOKEN_SPEC))], skip: &[3] };
static SUBJECT_PROTOBUF: Message = Message { name: "SelfSubjectReview", fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META))], skip: &[2] };

/// `SelfSubjectAccessReview`: allowed.
pub static ACCESS: Review = Review { protobuf: &ACCESS_PROTOBUF, answer: access };
/// `SelfSubjectRulesReview`: everything.
pub static RULES: Review = Review { protobuf: &RULES_PROTOBUF, answer: rules };
/// `SelfSubjectReview`: the administrator.
pub static SUBJECT: Review = Review { protobuf: &SUBJECT_PROTOBUF, answer: subject };

/// `SubjectAccessReview`: decided by RBAC.
pub static SUBJECT_ACCESS: Review = Review { protobuf: &SAR_PROTOBUF, answer: subject_access };
/// `TokenReview`: the kubeconfig's token is the administrator; a minted one its ServiceAccount.
pub static TOKEN: Review = Review { protobuf: &TOKEN_PROTOBUF, answer: token };

fn one_of_attributes(review: &Value) -> Result<(), Vec<Cause>> {
    let has = |f: &str| review.pointer(&format!("/spec/{f}")).is_some_and(|v| !v.is_null());
    if has("resourceAttributes") == has("nonResourceAttributes") {
        return Err(vec![Cause::new(
            CauseType::Invalid,
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )]);
    }
    Ok(())
}

fn subject_access(cx: &Context<'_>, mut review: Value) -> Result<Value, Vec<Cause>> {
    use super::rbac::{authorize, Attributes, ResourceAttributes, Subject};
    one_of_attributes(&review)?;
    let s = |p: &str| review.pointer(p).and_then(Value::as_str).unwrap_or("");
    let user = s("/spec/user");
    let groups = super::rbac::strings(&review["spec"], "groups");
    if user.is_empty() && groups.is_empty() {
        return Err(vec![Cause::new(CauseType::Required, "spec.user", "at least one of user or group must be specified")]);
    }
    let resource = review.pointer("/spec/resourceAttributes").filter(|v| !v.is_null()).map(|_| ResourceAttributes {
        namespace: s("/spec/resourceAttributes/namespace"),
        group: s("/spec/resourceAttributes/group"),
        resource: s("/spec/resourceAttributes/resource"),
        subresource: s("/spec/resourceAttributes/subresource"),
        name: s("/spec/resourceAttributes/name"),
    });
    let verb = if resource.is_some() { s("/spec/resourceAttributes/verb") } else { s("/spec/nonResourceAttributes/verb") };
    let attrs = Attributes { verb, resource, path: s("/spec/nonResourceAttributes/path") };
    let status = match authorize(cx.objects, &Subject { user, groups: &groups }, &attrs) {
        Ok(reason) => json!({"allowed": true, "reason": reason}),
        Err(reason) => json!({"allowed": false, "reason": reason}),
    };
    review["status"] = status;
    Ok(review)
}

fn token(cx: &Context<'_>, mut review: Value) -> Result<Value, Vec<Cause>> {
    let given = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or("").to_owned();
    if given.is_empty() {
        return Err(vec![Cause::new(CauseType::Required, "spec.token", "token must not be empty")]);
    }
    // Constant time for tokens of the right length, as the router's check.
    let admin = cx.token.is_some_and(|t| bool::from(subtle::ConstantTimeEq::ct_eq(t.as_bytes(), given.as_bytes())));
    let audiences = super::rbac::strings(&review["spec"], "audiences");
    review["status"] = if admin {
        json!({"authenticated": true, "user": {"username": ADMIN_USER, "groups": ADMIN_GROUPS}})
    } else {
        match cx.tokens.review(cx.objects, &given, &audiences, jiff::Timestamp::now()) {
            Some(Ok(u)) => json!({"authenticated": true, "audiences": u.audiences,
                "user": {"username": u.username, "uid": u.uid, "groups": u.groups, "extra": u.extra}}),
            // kube-apiserver's wording for a token it signed that no longer holds.
            Some(Err(why)) => json!({"authenticated": false, "error": format!("[invalid bearer token, {why}]")}),
            None => json!({"authenticated": false, "error": "the token is not this API server's"}),
        }
    };
    Ok(review)
}

fn access(_: &Context<'_>, mut review: Value) -> Result<Value, Vec<Cause>> {
    one_of_attributes(&review)?;
    review["status"] = json!({"allowed": true, "reason": "the bearer token's holder is an administrator of this virtplug API server"});
    Ok(review)
}

fn rules(_: &Context<'_>, mut review: Value) -> Result<Value, Vec<Cause>> {
    review["status"] = json!({
        "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
        "incomplete": false,
    });
    Ok(review)
}

fn subject(_: &Context<'_>, mut review: Value) -> Result<Value, Vec<Cause>> {
    review["status"] = json!({"userInfo": {"username": ADMIN_USER, "groups": ADMIN_GROUPS}});
    Ok(review)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn objects() -> (tempfile::TempDir, crate::objects::Objects) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(&dir.path().join("store.db"), &crate::StoreConfig::default()).unwrap();
        (dir, crate::objects::Objects { store, enforce_invariants: true })
    }

    #[tokio::test]
    async fn the_token_holder_may_do_anything_and_is_named() {
        let (_dir, objects) = objects().await;
        let tokens = crate::tokens::Tokens::default();
        let cx = Context { objects: &objects, token: Some("t0ken"), tokens: &tokens };
        let r = access(&cx, json!({"spec": {"resourceAttributes": {"verb": "*", "resource": "*"}}})).unwrap();
        assert_eq!(r.pointer("/status/allowed"), Some(&json!(true)));
        assert!(access(&cx, json!({"spec": {}})).is_err());
        assert!(access(&cx, json!({"spec": {"resourceAttributes": {}, "nonResourceAttributes": {}}})).is_err());
        assert_eq!(subject(&cx, json!({})).unwrap().pointer("/status/userInfo/username"), Some(&json!(ADMIN_USER)));
        assert_eq!(rules(&cx, json!({})).unwrap().pointer("/status/resourceRules/0/verbs"), Some(&json!(["*"])));
        let ok = token(&cx, json!({"spec": {"token": "t0ken"}})).unwrap();
        assert_eq!(ok.pointer("/status/user/username"), Some(&json!(ADMIN_USER)));
        let other = token(&cx, json!({"spec": {"token": "t0keN"}})).unwrap();
        assert_eq!(other.pointer("/status/authenticated"), Some(&json!(false)));
    }

    /// A token `serviceaccounts/token` minted is its ServiceAccount in a TokenReview, with the
    /// node it is bound to in `extra`; once that Node is gone, kube-apiserver's refusal.
    #[tokio::test]
    async fn a_minted_token_is_its_service_account_until_its_bound_object_goes() {
        let (_dir, objects) = objects().await;
        let nodes = crate::registry::find("", "v1", "nodes").unwrap();
        objects.create(nodes, None, json!({"metadata": {"name": "n1"}}), false).await.unwrap();
        let namespaces = crate::registry::find("", "v1", "namespaces").unwrap();
        objects.create(namespaces, None, json!({"metadata": {"name": "ops"}}), false).await.unwrap();
        let accounts = crate::registry::find("", "v1", "serviceaccounts").unwrap();
        objects.create(accounts, Some("ops"), json!({"metadata": {"name": "agent"}}), false).await.unwrap();
        let tokens = crate::tokens::Tokens::default();
        let ask = json!({"spec": {"boundObjectRef": {"kind": "Node", "name": "n1"}}});
        let minted = tokens.mint(&objects, "ops", "agent", &ask, jiff::Timestamp::now()).unwrap();
        let cx = Context { objects: &objects, token: Some("t0ken"), tokens: &tokens };
        let review = json!({"spec": {"token": minted.pointer("/status/token").unwrap()}});
        let ok = token(&cx, review.clone()).unwrap();
        assert_eq!(ok.pointer("/status/user/username"), Some(&json!("system:serviceaccount:ops:agent")));
        assert_eq!(ok.pointer("/status/user/extra/authentication.kubernetes.io~1node-name"), Some(&json!(["n1"])));
        objects.delete(nodes, None, "n1", &crate::objects::DeleteOptions::default()).await.unwrap();
        let gone = token(&cx, review).unwrap();
        assert_eq!(gone.pointer("/status/authenticated"), Some(&json!(false)));
        let error = gone.pointer("/status/error").and_then(Value::as_str).unwrap_or_default();
        assert!(error.starts_with("[invalid bearer token, node n1 (UID ") && error.ends_with(") has been deleted]"), "{error}");
    }

    /// A SubjectAccessReview is decided by the stored RBAC objects: a RoleBinding grants in its
    /// namespace only, and a user nobody bound is denied.
    #[tokio::test]
    async fn a_subject_access_review_is_decided_by_the_stored_roles() {
        let (_dir, objects) = objects().await;
        let def = |p| crate::registry::find("rbac.authorization.k8s.io", "v1", p).unwrap();
        objects
            .create(
                def("clusterroles"),
                None,
                json!({"metadata": {"name": "kubevirt.io:console"}, "rules": [
                {"apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachineinstances/console"], "verbs": ["get"]}]}),
                false,
            )
            .await
            .unwrap();
        objects
            .create(crate::registry::find("", "v1", "namespaces").unwrap(), None, json!({"metadata": {"name": "team"}}), false)
            .await
            .unwrap();
        objects
            .create(
                def("rolebindings"),
                Some("team"),
                json!({"metadata": {"name": "alice-console"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kubevirt.io:console"},
                "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]}),
                false,
            )
            .await
            .unwrap();
        let tokens = crate::tokens::Tokens::default();
        let cx = Context { objects: &objects, token: None, tokens: &tokens };
        let ask = |user: &str, ns: &str| {
            json!({"spec": {"user": user, "groups": ["system:authenticated"], "resourceAttributes": {
                "namespace": ns, "verb": "get", "group": "subresources.kubevirt.io", "resource": "virtualmachineinstances",
                "subresource": "console", "name": "vm1"}}})
        };
        let allowed = |r: Value| r.pointer("/status/allowed") == Some(&json!(true));
        assert!(allowed(subject_access(&cx, ask("alice", "team")).unwrap()));
        assert!(!allowed(subject_access(&cx, ask("alice", "default")).unwrap()), "the binding is for namespace team");
        assert!(!allowed(subject_access(&cx, ask("bob", "team")).unwrap()), "nothing binds bob");
        assert!(subject_access(&cx, json!({"spec": {"resourceAttributes": {"verb": "get"}}})).is_err(), "no user, no group");
    }
}
