//! The access reviews kubectl's `auth can-i` and `auth whoami` create: `authorization.k8s.io/v1`
//! `SelfSubjectAccessReview` and `SelfSubjectRulesReview`, `authentication.k8s.io`
//! `SelfSubjectReview`. They are answered, never stored.
//!
//! The server has one credential, the bearer token in the kubeconfig, and its holder is an
//! administrator: every access review is allowed, the rules review lists `*` for everything,
//! and the subject review names the kubeconfig's user ([`ADMIN_USER`]) in `system:masters`.
//!
//! # Guarantees
//! A SelfSubjectAccessReview names exactly one of `resourceAttributes` and
//! `nonResourceAttributes` (422 naming `spec` otherwise, as kube-apiserver).

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::protobuf::message::{f, Message, Ty, OBJECT_META};

/// The user the kubeconfig names and the subject review reports.
pub const ADMIN_USER: &str = "virtplug-admin";
/// The groups of [`ADMIN_USER`].
pub const ADMIN_GROUPS: [&str; 2] = ["system:masters", "system:authenticated"];

/// A review kind: its protobuf message and its answer.
#[derive(Debug)]
pub struct Review {
    pub protobuf: &'static Message,
    /// The review with its `status`, or what is wrong with the request.
    pub answer: fn(Value) -> Result<Value, Vec<Cause>>,
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
static SUBJECT_PROTOBUF: Message = Message { name: "SelfSubjectReview", fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META))], skip: &[2] };

/// `SelfSubjectAccessReview`: allowed.
pub static ACCESS: Review = Review { protobuf: &ACCESS_PROTOBUF, answer: access };
/// `SelfSubjectRulesReview`: everything.
pub static RULES: Review = Review { protobuf: &RULES_PROTOBUF, answer: rules };
/// `SelfSubjectReview`: the administrator.
pub static SUBJECT: Review = Review { protobuf: &SUBJECT_PROTOBUF, answer: subject };

fn access(mut review: Value) -> Result<Value, Vec<Cause>> {
    let has = |f: &str| review.pointer(&format!("/spec/{f}")).is_some_and(|v| !v.is_null());
    if has("resourceAttributes") == has("nonResourceAttributes") {
        return Err(vec![Cause::new(
            CauseType::Invalid,
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )]);
    }
    review["status"] = json!({"allowed": true, "reason": "the bearer token's holder is an administrator of this virtplug API server"});
    Ok(review)
}

fn rules(mut review: Value) -> Result<Value, Vec<Cause>> {
    review["status"] = json!({
        "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
        "incomplete": false,
    });
    Ok(review)
}

fn subject(mut review: Value) -> Result<Value, Vec<Cause>> {
    review["status"] = json!({"userInfo": {"username": ADMIN_USER, "groups": ADMIN_GROUPS}});
    Ok(review)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_holder_may_do_anything_and_is_named() {
        let r = access(json!({"spec": {"resourceAttributes": {"verb": "*", "resource": "*"}}})).unwrap();
        assert_eq!(r.pointer("/status/allowed"), Some(&json!(true)));
        assert!(access(json!({"spec": {}})).is_err());
        assert!(access(json!({"spec": {"resourceAttributes": {}, "nonResourceAttributes": {}}})).is_err());
        assert_eq!(subject(json!({})).unwrap().pointer("/status/userInfo/username"), Some(&json!(ADMIN_USER)));
        assert_eq!(rules(json!({})).unwrap().pointer("/status/resourceRules/0/verbs"), Some(&json!(["*"])));
    }
}
