//! core/v1 `Pod`, stored and served as kube-apiserver does (defaults, validation, the update
//! rules, the status subresource). In embedded mode nothing runs Pods: no kubelet watches them,
//! so a Pod stays `Pending` until a client writes its status (cluster mode's launcher does).
//!
//! # Guarantees
//! - Defaults as `SetDefaults_PodSpec`/`_Container` and the ServiceAccount admission plugin:
//!   `restartPolicy: Always`, `dnsPolicy: ClusterFirst`, `schedulerName: default-scheduler`,
//!   `terminationGracePeriodSeconds: 30`, `enableServiceLinks: true`,
//!   `serviceAccountName: default`, per container `imagePullPolicy` (`Always` for `:latest` or
//!   no tag, else `IfNotPresent`), `terminationMessagePath`/`Policy`, port protocol `TCP`; a new
//!   Pod's status is `phase: Pending` with its QoS class.
//! - Validation names each field: containers (at least one; unique DNS-label names; an image),
//!   `restartPolicy`, `dnsPolicy`, ports (1-65535, protocol).
//! - An update may change only what kube-apiserver lets it change (container images,
//!   `activeDeadlineSeconds`, added tolerations); anything else in `spec` is 422 Forbidden with
//!   kube-apiserver's message.
//! - Deletion is graceful as kube-apiserver's (`objects::pod_grace`): a Pod bound to a node and
//!   not finished stays, with `deletionTimestamp` (now + grace) and `deletionGracePeriodSeconds`
//!   (the `gracePeriodSeconds` asked, else its `terminationGracePeriodSeconds`), until its
//!   kubelet deletes it with grace 0; a later delete may shorten the grace, never lengthen it.
//!   Unscheduled or finished Pods, and a grace of 0, go at once. A Pod-bound token stops
//!   authenticating once the grace is over.

use std::collections::HashSet;

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::protobuf::message::{f, ptr, rep, Message, Ty, LOCAL_OBJECT_REFERENCE, OBJECT_META, RESOURCE_LIST, STR_MAP};
use crate::registry::Strategy;

/// The fields a Pod field selector may name (kube-apiserver's `PodToSelectableFields`).
pub const FIELD_LABELS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

static CONTAINER_PORT: Message = Message {
    name: "ContainerPort",
    fields: &[
        f(1, "name", Ty::Str),
        f(2, "hostPort", Ty::Int),
        f(3, "containerPort", Ty::Int),
        f(4, "protocol", Ty::Str),
        f(5, "hostIP", Ty::Str),
    ],
    skip: &[],
};
static ENV_VAR: Message = Message { name: "EnvVar", fields: &[f(1, "name", Ty::Str), f(2, "value", Ty::Str)], skip: &[] };
static RESOURCES: Message =
    Message { name: "ResourceRequirements", fields: &[f(1, "limits", RESOURCE_LIST), f(2, "requests", RESOURCE_LIST)], skip: &[] };
static CONTAINER: Message = Message {
    name: "Container",
    fields: &[
        f(1, "name", Ty::Str),
        f(2, "image", Ty::Str),
        rep(3, "command", Ty::Str),
        rep(4, "args", Ty::Str),
        f(5, "workingDir", Ty::Str),
        rep(6, "ports", Ty::Msg(&CONTAINER_PORT)),
        rep(7, "env", Ty::Msg(&ENV_VAR)),
        f(8, "resources", Ty::Msg(&RESOURCES)),
        f(13, "terminationMessagePath", Ty::Str),
        f(14, "imagePullPolicy", Ty::Str),
        f(16, "stdin", Ty::Bool),
        f(17, "stdinOnce", Ty::Bool),
        f(18, "tty", Ty::Bool),
        f(20, "terminationMessagePolicy", Ty::Str),
    ],
    skip: &[],
};
/// kubectl run sends an empty `securityContext`; one with fields is refused, not dropped.
static EMPTY_SECURITY_CONTEXT: Message = Message { name: "PodSecurityContext", fields: &[], skip: &[] };
static SPEC: Message = Message {
    name: "PodSpec",
    fields: &[
        rep(2, "containers", Ty::Msg(&CONTAINER)),
        f(3, "restartPolicy", Ty::Str),
        ptr(4, "terminationGracePeriodSeconds", Ty::Int),
        ptr(5, "activeDeadlineSeconds", Ty::Int),
        f(6, "dnsPolicy", Ty::Str),
        f(7, "nodeSelector", STR_MAP),
        f(8, "serviceAccountName", Ty::Str),
        f(9, "serviceAccount", Ty::Str),
        ptr(21, "automountServiceAccountToken", Ty::Bool),
        f(10, "nodeName", Ty::Str),
        f(11, "hostNetwork", Ty::Bool),
        rep(15, "imagePullSecrets", Ty::Msg(&LOCAL_OBJECT_REFERENCE)),
        f(16, "hostname", Ty::Str),
        f(17, "subdomain", Ty::Str),
        f(14, "securityContext", Ty::Msg(&EMPTY_SECURITY_CONTEXT)),
        f(19, "schedulerName", Ty::Str),
        f(24, "priorityClassName", Ty::Str),
        ptr(25, "priority", Ty::Int),
        ptr(30, "enableServiceLinks", Ty::Bool),
        f(31, "preemptionPolicy", Ty::Str),
    ],
    skip: &[],
};

/// `Pod` (metadata 1, spec 2; status 3 is the server's), with the fields `kubectl run` sets.
/// Anything else is refused with the advice to send JSON, never dropped.
pub static PROTOBUF: Message =
    Message { name: "Pod", fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&SPEC))], skip: &[3] };

/// The Pod strategy.
pub static STRATEGY: Strategy = Strategy { normalize, validate_update, schema: super::object_schema, from_protobuf: Some(&PROTOBUF) };

/// Kubernetes' defaults, and the status of a new Pod.
#[must_use]
pub fn normalize(obj: &mut Value) -> Vec<Cause> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        return Vec::new();
    }
    for (ptr, v) in [
        ("/spec/restartPolicy", json!("Always")),
        ("/spec/dnsPolicy", json!("ClusterFirst")),
        ("/spec/schedulerName", json!("default-scheduler")),
        ("/spec/terminationGracePeriodSeconds", json!(30)),
        ("/spec/enableServiceLinks", json!(true)),
        ("/spec/serviceAccountName", json!(super::serviceaccount::DEFAULT)),
        ("/spec/securityContext", json!({})),
    ] {
        super::default(obj, ptr, v);
    }
    let sa = obj.pointer("/spec/serviceAccountName").cloned().unwrap_or(Value::Null);
    super::default(obj, "/spec/serviceAccount", sa);
    for list in ["containers", "initContainers"] {
        let Some(Value::Array(cs)) = obj.pointer_mut(&format!("/spec/{list}")) else { continue };
        for c in cs.iter_mut().filter(|c| c.is_object()) {
            let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
            let pull = if image_tag(image).is_none_or(|t| t == "latest") { "Always" } else { "IfNotPresent" };
            super::default(c, "/imagePullPolicy", json!(pull));
            super::default(c, "/terminationMessagePath", json!("/dev/termination-log"));
            super::default(c, "/terminationMessagePolicy", json!("File"));
            super::default(c, "/resources", json!({}));
            if let Some(Value::Array(ports)) = c.get_mut("ports") {
                for p in ports.iter_mut().filter(|p| p.is_object()) {
                    super::default(p, "/protocol", json!("TCP"));
                }
            }
        }
    }
    if obj.get("status").is_none_or(Value::is_null) {
        let qos = qos_class(obj);
        obj["status"] = json!({"phase": "Pending", "qosClass": qos});
    }
    Vec::new()
}

/// The tag of an image reference (`nginx:1.27` -> `1.27`; none for `nginx` or a digest).
fn image_tag(image: &str) -> Option<&str> {
    if image.contains('@') {
        return Some("digest");
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split_once(':').map(|(_, t)| t)
}

/// `BestEffort` without requests or limits, `Guaranteed` when every container's cpu and memory
/// limits equal its requests, `Burstable` otherwise.
fn qos_class(obj: &Value) -> &'static str {
    let cs: Vec<&Value> = obj.pointer("/spec/containers").and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default();
    let set = |c: &Value, k: &str| c.pointer(&format!("/resources/{k}")).and_then(Value::as_object).is_some_and(|m| !m.is_empty());
    if cs.iter().all(|c| !set(c, "limits") && !set(c, "requests")) {
        return "BestEffort";
    }
    let guaranteed = cs.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let limit = c.pointer(&format!("/resources/limits/{r}"));
            let request = c.pointer(&format!("/resources/requests/{r}")).or(limit);
            limit.is_some() && limit == request
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Validates a whole Pod.
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = super::typed_causes::<k8s_openapi::api::core::v1::Pod>(obj);
    if !causes.is_empty() {
        return causes;
    }
    let containers = obj.pointer("/spec/containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        causes.push(Cause::new(CauseType::Required, "spec.containers", "a Pod needs at least one container (name and image)"));
    }
    let mut names = HashSet::new();
    for list in ["initContainers", "containers"] {
        let Some(cs) = obj.pointer(&format!("/spec/{list}")).and_then(Value::as_array) else { continue };
        for (i, c) in cs.iter().enumerate() {
            let at = format!("spec.{list}[{i}]");
            match c.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) {
                None => causes.push(Cause::new(CauseType::Required, format!("{at}.name"), "every container needs a name")),
                Some(n) => {
                    causes.extend(api::validation::dns1123_label(n, &format!("{at}.name")));
                    if !names.insert(n.to_owned()) {
                        causes.push(Cause::new(CauseType::Duplicate, format!("{at}.name"), format!("{n:?} names another container too")));
                    }
                }
            }
            if c.get("image").and_then(Value::as_str).is_none_or(|i| i.trim().is_empty()) {
                causes.push(Cause::new(CauseType::Required, format!("{at}.image"), "every container needs an image"));
            }
            for (j, p) in c.get("ports").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let port = p.get("containerPort").and_then(Value::as_i64).unwrap_or(0);
                if !(1..=65535).contains(&port) {
                    causes.push(Cause::new(
                        CauseType::Invalid,
                        format!("{at}.ports[{j}].containerPort"),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
                causes.extend(protocol(p, &format!("{at}.ports[{j}].protocol")));
            }
        }
    }
    for (field, allowed) in [
        ("restartPolicy", &["Always", "OnFailure", "Never"][..]),
        ("dnsPolicy", &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"]),
    ] {
        if let Some(v) = obj.pointer(&format!("/spec/{field}")).and_then(Value::as_str) {
            if !allowed.contains(&v) {
                causes.push(Cause::new(CauseType::NotSupported, format!("spec.{field}"), format!("supported values: {}", quoted(allowed))));
            }
        }
    }
    causes
}

/// A port's `protocol`: `TCP`, `UDP` or `SCTP`.
#[must_use]
pub fn protocol(port: &Value, field: &str) -> Option<Cause> {
    let p = port.get("protocol").and_then(Value::as_str)?;
    (!["TCP", "UDP", "SCTP"].contains(&p))
        .then(|| Cause::new(CauseType::NotSupported, field, "supported values: \"SCTP\", \"TCP\", \"UDP\""))
}

fn quoted(values: &[&str]) -> String {
    values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")
}

/// kube-apiserver's `ValidatePodUpdate`: only images, `activeDeadlineSeconds` and added
/// tolerations may change in `spec`.
#[must_use]
pub fn validate_update(old: &Value, new: &Value) -> Vec<Cause> {
    let mask = |o: &Value| {
        let mut spec = o.get("spec").cloned().unwrap_or(Value::Null);
        for list in ["containers", "initContainers"] {
            if let Some(Value::Array(cs)) = spec.get_mut(list) {
                for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("image");
                }
            }
        }
        if let Some(m) = spec.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
        }
        spec
    };
    let tolerations = |o: &Value| o.pointer("/spec/tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    let (before, after) = (tolerations(old), tolerations(new));
    let removed = before.iter().any(|t| !after.contains(t));
    if mask(old) == mask(new) && !removed {
        return Vec::new();
    }
    vec![Cause::new(
        CauseType::Forbidden,
        "spec",
        "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,\
         `spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations)",
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn a_pod_gets_kubernetes_defaults_and_a_pending_status() {
        let mut p = json!({"spec": {"containers": [{"name": "a", "image": "nginx"}, {"name": "b", "image": "r.io/x/y:1.2", "ports": [{"containerPort": 80}]}]}});
        assert!(normalize(&mut p).is_empty());
        assert_eq!(p.pointer("/spec/restartPolicy"), Some(&json!("Always")));
        assert_eq!(p.pointer("/spec/serviceAccountName"), Some(&json!("default")));
        assert_eq!(p.pointer("/spec/containers/0/imagePullPolicy"), Some(&json!("Always")));
        assert_eq!(p.pointer("/spec/containers/1/imagePullPolicy"), Some(&json!("IfNotPresent")));
        assert_eq!(p.pointer("/spec/containers/1/ports/0/protocol"), Some(&json!("TCP")));
        assert_eq!(p["status"], json!({"phase": "Pending", "qosClass": "BestEffort"}));
        assert!(validate(&p).is_empty(), "{:?}", validate(&p));
    }

    #[test]
    fn bad_pods_name_each_field() {
        let p = json!({"spec": {"containers": [{"name": "A"}, {"name": "b", "image": "x", "ports": [{"containerPort": 0, "protocol": "ICMP"}]}, {"name": "b", "image": "y"}],
                                 "restartPolicy": "Sometimes"}});
        assert_eq!(
            fields(&validate(&p)),
            [
                "spec.containers[0].name",
                "spec.containers[0].image",
                "spec.containers[1].ports[0].containerPort",
                "spec.containers[1].ports[0].protocol",
                "spec.containers[2].name",
                "spec.restartPolicy"
            ]
        );
        assert_eq!(fields(&validate(&json!({"spec": {}}))), ["spec.containers"]);
        assert_eq!(fields(&validate(&json!({"spec": {"containers": "no"}}))), ["spec.containers"]);
    }

    #[test]
    fn only_images_deadlines_and_added_tolerations_may_change() {
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x:1"}], "tolerations": [{"key": "k"}]}});
        let image = json!({"spec": {"containers": [{"name": "a", "image": "x:2"}], "tolerations": [{"key": "k"}, {"key": "j"}], "activeDeadlineSeconds": 5}});
        assert!(validate_update(&old, &image).is_empty());
        let cmd = json!({"spec": {"containers": [{"name": "a", "image": "x:1", "args": ["-v"]}], "tolerations": [{"key": "k"}]}});
        assert_eq!(fields(&validate_update(&old, &cmd)), ["spec"]);
        let dropped = json!({"spec": {"containers": [{"name": "a", "image": "x:1"}]}});
        assert_eq!(fields(&validate_update(&old, &dropped)), ["spec"]);
    }
}
