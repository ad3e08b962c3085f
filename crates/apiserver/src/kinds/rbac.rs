//! `rbac.authorization.k8s.io/v1`: Roles, ClusterRoles and their bindings are stored as any
//! object, and [`authorize`] evaluates them as kube-apiserver's RBAC authorizer does, for the
//! `SubjectAccessReview`s an aggregated API server (`virtplug subresources-api`) sends.
//!
//! # Guarantees
//! - Members of `system:masters` are allowed everything (kube-apiserver's privileged group; the
//!   kubeconfig's user is one).
//! - Otherwise a request is allowed only by a rule of a role bound to the user, one of its
//!   groups, or its ServiceAccount (`system:serviceaccount:NS:NAME`): ClusterRoleBindings
//!   everywhere, RoleBindings in their namespace. Rules match as RBAC's do: `*` for any verb,
//!   group or resource, `resource/subresource` and `resource/*` for subresources, `resourceNames`
//!   only for a named object, `nonResourceURLs` exactly or by a trailing `*` prefix.
//! - A ClusterRole with an `aggregationRule` has the rules of every ClusterRole whose labels
//!   match one of its selectors' `matchLabels` (the aggregation controller's result, computed
//!   at each check).
//!
//! # Caveats
//! No default roles (`system:discovery`, `system:auth-delegator`, ...) exist unless created;
//! aggregation selectors' `matchExpressions` are not evaluated (a selector with them matches
//! nothing).

use serde_json::Value;

use crate::objects::Objects;
use crate::registry;

/// What a request asks, in RBAC's terms.
#[derive(Debug, Default)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    /// `resourceAttributes`; `None` for a non-resource request.
    pub resource: Option<ResourceAttributes<'a>>,
    /// The non-resource request's path.
    pub path: &'a str,
}

/// A resource request's attributes.
#[derive(Debug, Default)]
pub struct ResourceAttributes<'a> {
    pub namespace: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
}

/// Who asks.
#[derive(Debug)]
pub struct Subject<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
}

/// The strings of the array `v[key]` (none when it is missing or not an array).
pub(super) fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key).and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect()).unwrap_or_default()
}

fn text<'v>(v: &'v Value, ptr: &str) -> &'v str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// Whether `rule` grants `attrs`.
fn rule_allows(rule: &Value, attrs: &Attributes<'_>) -> bool {
    let any = |list: &[String], want: &str| list.iter().any(|x| x == "*" || x == want);
    if !any(&strings(rule, "verbs"), attrs.verb) {
        return false;
    }
    match &attrs.resource {
        Some(r) => {
            if !any(&strings(rule, "apiGroups"), r.group) {
                return false;
            }
            let resources = strings(rule, "resources");
            let hit = resources.iter().any(|x| {
                if r.subresource.is_empty() {
                    x == "*" || x == r.resource
                } else {
                    x == "*"
                        || *x == format!("{}/{}", r.resource, r.subresource)
                        || *x == format!("{}/*", r.resource)
                        || *x == format!("*/{}", r.subresource)
                }
            });
            let names = strings(rule, "resourceNames");
            hit && (names.is_empty() || (!r.name.is_empty() && names.iter().any(|n| n == r.name)))
        }
        None => strings(rule, "nonResourceURLs")
            .iter()
            .any(|u| u == "*" || u == attrs.path || u.strip_suffix('*').is_some_and(|prefix| attrs.path.starts_with(prefix))),
    }
}

/// Whether one of `binding`'s subjects is `who`.
fn binds(binding: &Value, who: &Subject<'_>) -> bool {
    binding.get("subjects").and_then(Value::as_array).into_iter().flatten().any(|s| {
        let name = text(s, "/name");
        match text(s, "/kind") {
            "User" => name == who.user,
            "Group" => who.groups.iter().any(|g| g == name),
            "ServiceAccount" => who.user == format!("system:serviceaccount:{}:{name}", text(s, "/namespace")),
            _ => false,
        }
    })
}

/// The rules of a ClusterRole, with those its `aggregationRule` selects.
fn cluster_role_rules(objects: &Objects, role: &Value) -> Vec<Value> {
    let mut rules: Vec<Value> = role.get("rules").and_then(Value::as_array).cloned().unwrap_or_default();
    let selectors = role.pointer("/aggregationRule/clusterRoleSelectors").and_then(Value::as_array).cloned().unwrap_or_default();
    if selectors.is_empty() {
        return rules;
    }
    let Some(def) = registry::find("rbac.authorization.k8s.io", "v1", "clusterroles") else { return rules };
    for (_, other) in objects.list(def, None, None).1 {
        let other = other.value();
        let labels = other.pointer("/metadata/labels").and_then(Value::as_object);
        let selected = selectors.iter().any(|sel| {
            let Some(want) = sel.get("matchLabels").and_then(Value::as_object) else { return false };
            sel.get("matchExpressions").is_none() && want.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        });
        if selected && text(&other, "/metadata/name") != text(role, "/metadata/name") {
            rules.extend(other.get("rules").and_then(Value::as_array).cloned().unwrap_or_default());
        }
    }
    rules
}

/// Decides `attrs` for `who` from the stored RBAC objects: `Ok(reason)` when allowed (naming
/// the binding and role), `Err(reason)` when not.
///
/// # Errors
/// The denial's reason (empty, as RBAC's: it denies by having no rule).
pub fn authorize(objects: &Objects, who: &Subject<'_>, attrs: &Attributes<'_>) -> Result<String, String> {
    if who.groups.iter().any(|g| g == "system:masters") {
        return Ok(format!("{} is in system:masters", who.user));
    }
    let find = |plural| registry::find("rbac.authorization.k8s.io", "v1", plural);
    let (Some(crb), Some(rb), Some(cr), Some(role)) =
        (find("clusterrolebindings"), find("rolebindings"), find("clusterroles"), find("roles"))
    else {
        return Err(String::new());
    };
    let ns = attrs.resource.as_ref().map_or("", |r| r.namespace);
    let mut bindings: Vec<(&str, Value)> =
        objects.list(crb, None, None).1.into_iter().map(|(_, b)| ("ClusterRoleBinding", b.value())).collect();
    if !ns.is_empty() {
        bindings.extend(objects.list(rb, Some(ns), None).1.into_iter().map(|(_, b)| ("RoleBinding", b.value())));
    }
    for (binding_kind, binding) in bindings.iter().filter(|(_, b)| binds(b, who)) {
        let role_kind = text(binding, "/roleRef/kind");
        let role_name = text(binding, "/roleRef/name");
        let rules = match role_kind {
            "ClusterRole" => objects.get(cr, None, role_name).map(|s| cluster_role_rules(objects, &s.object.value())),
            // A RoleBinding's Role is in the binding's namespace; a ClusterRoleBinding names none.
            "Role" if *binding_kind == "RoleBinding" => objects
                .get(role, Some(ns), role_name)
                .map(|s| s.object.value().get("rules").and_then(Value::as_array).cloned().unwrap_or_default()),
            _ => continue,
        };
        if rules.unwrap_or_default().iter().any(|r| rule_allows(r, attrs)) {
            return Ok(format!(
                "RBAC: allowed by {binding_kind} {:?} of {role_kind} {role_name:?} to {}",
                text(binding, "/metadata/name"),
                who.user
            ));
        }
    }
    Err(String::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn console(verb: &'static str, name: &'static str) -> Attributes<'static> {
        Attributes {
            verb,
            resource: Some(ResourceAttributes {
                namespace: "default",
                group: "subresources.kubevirt.io",
                resource: "virtualmachineinstances",
                subresource: "console",
                name,
            }),
            path: "",
        }
    }

    /// Each rule form KubeVirt's and virtplug's roles use, and what it must not grant.
    #[test]
    fn rules_match_as_rbac_does() {
        let exact = json!({"apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachineinstances/console"], "verbs": ["get"]});
        assert!(rule_allows(&exact, &console("get", "vm")));
        assert!(!rule_allows(&exact, &console("update", "vm")), "another verb");
        let vnc = json!({"apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachineinstances/vnc"], "verbs": ["get"]});
        assert!(!rule_allows(&vnc, &console("get", "vm")), "another subresource");
        let main = json!({"apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachineinstances"], "verbs": ["get"]});
        assert!(!rule_allows(&main, &console("get", "vm")), "the resource does not grant its subresources");
        let star = json!({"apiGroups": ["*"], "resources": ["virtualmachineinstances/*"], "verbs": ["*"]});
        assert!(rule_allows(&star, &console("update", "vm")));
        let named = json!({"apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachineinstances/console"], "verbs": ["get"], "resourceNames": ["a"]});
        assert!(rule_allows(&named, &console("get", "a")));
        assert!(!rule_allows(&named, &console("get", "b")));
        let urls = json!({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]});
        assert!(rule_allows(&urls, &Attributes { verb: "get", resource: None, path: "/apis/subresources.kubevirt.io" }));
        assert!(!rule_allows(&urls, &Attributes { verb: "get", resource: None, path: "/api" }));
        assert!(!rule_allows(&urls, &console("get", "vm")), "a URL rule grants no resource");
    }

    #[test]
    fn subjects_bind_by_user_group_and_service_account() {
        let b = json!({"subjects": [
            {"kind": "User", "name": "alice"},
            {"kind": "Group", "name": "ops"},
            {"kind": "ServiceAccount", "name": "agent", "namespace": "virtplug"},
        ]});
        let none: Vec<String> = Vec::new();
        assert!(binds(&b, &Subject { user: "alice", groups: &none }));
        assert!(binds(&b, &Subject { user: "bob", groups: &["ops".to_owned()] }));
        assert!(binds(&b, &Subject { user: "system:serviceaccount:virtplug:agent", groups: &none }));
        assert!(!binds(&b, &Subject { user: "system:serviceaccount:default:agent", groups: &none }));
        assert!(!binds(&b, &Subject { user: "bob", groups: &none }));
    }
}
