//! core/v1 `Service`, stored with kube-apiserver's defaults and validation. Nothing routes
//! Service traffic in virtplug (no kube-proxy), and no cluster IP or node port is allocated:
//! `spec.clusterIP` is what the client sent (`None` for a headless Service), so `kubectl get svc`
//! shows `<none>` where a cluster would show an address.
//!
//! # Guarantees
//! - Defaults: `type: ClusterIP`, `sessionAffinity: None`, per port `protocol: TCP` and
//!   `targetPort` = `port`; `internalTrafficPolicy: Cluster`, `ipFamilyPolicy: SingleStack`,
//!   `ipFamilies: [IPv4]` for the types that have them.
//! - Validation names each field: `type`, ports (required but for ExternalName and headless
//!   Services; 1-65535; named when more than one, names unique), `externalName`.
//! - `spec.clusterIP` cannot change once set.

use std::collections::HashSet;

use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::protobuf::message::{f, ptr, rep, Message, Ty, OBJECT_META, STR_MAP};
use crate::registry::Strategy;

static PORT: Message = Message {
    name: "ServicePort",
    fields: &[
        f(1, "name", Ty::Str),
        f(2, "protocol", Ty::Str),
        f(3, "port", Ty::Int),
        f(4, "targetPort", Ty::IntOrString),
        f(5, "nodePort", Ty::Int),
        ptr(6, "appProtocol", Ty::Str),
    ],
    skip: &[],
};
static SPEC: Message = Message {
    name: "ServiceSpec",
    fields: &[
        rep(1, "ports", Ty::Msg(&PORT)),
        f(2, "selector", STR_MAP),
        f(3, "clusterIP", Ty::Str),
        f(4, "type", Ty::Str),
        rep(5, "externalIPs", Ty::Str),
        f(7, "sessionAffinity", Ty::Str),
        f(8, "loadBalancerIP", Ty::Str),
        rep(9, "loadBalancerSourceRanges", Ty::Str),
        f(10, "externalName", Ty::Str),
        f(11, "externalTrafficPolicy", Ty::Str),
        f(12, "healthCheckNodePort", Ty::Int),
        f(13, "publishNotReadyAddresses", Ty::Bool),
        ptr(17, "ipFamilyPolicy", Ty::Str),
        rep(18, "clusterIPs", Ty::Str),
        rep(19, "ipFamilies", Ty::Str),
        ptr(20, "allocateLoadBalancerNodePorts", Ty::Bool),
        ptr(21, "loadBalancerClass", Ty::Str),
        ptr(22, "internalTrafficPolicy", Ty::Str),
    ],
    skip: &[],
};

/// `Service` (metadata 1, spec 2; status 3 is the server's), as `kubectl create service`
/// sends it from 1.32 on.
pub static PROTOBUF: Message =
    Message { name: "Service", fields: &[f(1, "metadata", Ty::Msg(&OBJECT_META)), f(2, "spec", Ty::Msg(&SPEC))], skip: &[3] };

/// The Service strategy.
pub static STRATEGY: Strategy = Strategy { normalize, validate_update, schema: super::object_schema, from_protobuf: Some(&PROTOBUF) };

const TYPES: [&str; 4] = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];

/// Kubernetes' defaults.
#[must_use]
pub fn normalize(obj: &mut Value) -> Vec<Cause> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        return Vec::new();
    }
    super::default(obj, "/spec/type", json!("ClusterIP"));
    super::default(obj, "/spec/sessionAffinity", json!("None"));
    let ty = obj.pointer("/spec/type").and_then(Value::as_str).unwrap_or_default().to_owned();
    if ty != "ExternalName" {
        super::default(obj, "/spec/internalTrafficPolicy", json!("Cluster"));
        super::default(obj, "/spec/ipFamilyPolicy", json!("SingleStack"));
        super::default(obj, "/spec/ipFamilies", json!(["IPv4"]));
    }
    if matches!(ty.as_str(), "NodePort" | "LoadBalancer") {
        super::default(obj, "/spec/externalTrafficPolicy", json!("Cluster"));
    }
    if let Some(Value::Array(ports)) = obj.pointer_mut("/spec/ports") {
        for p in ports.iter_mut().filter(|p| p.is_object()) {
            super::default(p, "/protocol", json!("TCP"));
            let port = p.get("port").cloned().unwrap_or(Value::Null);
            super::default(p, "/targetPort", port);
        }
    }
    Vec::new()
}

/// Validates a whole Service.
#[must_use]
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = super::typed_causes::<k8s_openapi::api::core::v1::Service>(obj);
    if !causes.is_empty() {
        return causes;
    }
    let ty = obj.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP");
    if !TYPES.contains(&ty) {
        causes.push(Cause::new(
            CauseType::NotSupported,
            "spec.type",
            "supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
        ));
    }
    let ports = obj.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
    let headless = obj.pointer("/spec/clusterIP").and_then(Value::as_str) == Some("None");
    if ty == "ExternalName" {
        if obj.pointer("/spec/externalName").and_then(Value::as_str).is_none_or(str::is_empty) {
            causes.push(Cause::new(CauseType::Required, "spec.externalName", "an ExternalName Service names the DNS name it aliases"));
        }
    } else if ports.is_empty() && !headless {
        causes.push(Cause::new(CauseType::Required, "spec.ports", "a Service needs at least one port (e.g. --tcp=80:8080)"));
    }
    let mut names = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = format!("spec.ports[{i}]");
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        if ports.len() > 1 && name.is_empty() {
            causes.push(Cause::new(
                CauseType::Required,
                format!("{at}.name"),
                "every port of a Service with more than one port needs a name",
            ));
        }
        if !name.is_empty() {
            causes.extend(api::validation::dns1123_label(name, &format!("{at}.name")));
            if !names.insert(name.to_owned()) {
                causes.push(Cause::new(CauseType::Duplicate, format!("{at}.name"), format!("{name:?} names another port too")));
            }
        }
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&port) {
            causes.push(Cause::new(CauseType::Invalid, format!("{at}.port"), "must be between 1 and 65535, inclusive"));
        }
        match p.get("targetPort") {
            Some(Value::Number(n)) if !n.as_i64().is_some_and(|n| (1..=65535).contains(&n)) => {
                causes.push(Cause::new(CauseType::Invalid, format!("{at}.targetPort"), "must be between 1 and 65535, inclusive"));
            }
            Some(Value::String(s)) if s.is_empty() || s.len() > 15 => {
                causes.push(Cause::new(CauseType::Invalid, format!("{at}.targetPort"), "a named port has 1 to 15 characters"));
            }
            _ => {}
        }
        causes.extend(super::pod::protocol(p, &format!("{at}.protocol")));
    }
    causes
}

/// `spec.clusterIP` cannot change once set.
#[must_use]
pub fn validate_update(old: &Value, new: &Value) -> Vec<Cause> {
    let ip = |o: &Value| o.pointer("/spec/clusterIP").and_then(Value::as_str).unwrap_or_default().to_owned();
    if !ip(old).is_empty() && ip(old) != ip(new) {
        return vec![Cause::new(CauseType::Invalid, "spec.clusterIP", "field is immutable")];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| c.field.clone()).collect()
    }

    #[test]
    fn defaults_and_validation_follow_kube_apiserver() {
        let mut s = json!({"spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}});
        assert!(normalize(&mut s).is_empty());
        assert_eq!(s.pointer("/spec/type"), Some(&json!("ClusterIP")));
        assert_eq!(s.pointer("/spec/ports/0"), Some(&json!({"port": 80, "protocol": "TCP", "targetPort": 80})));
        assert!(validate(&s).is_empty());
        let bad = json!({"spec": {"type": "Magic", "ports": [{"port": 0}, {"name": "b", "port": 1, "targetPort": 70000}]}});
        assert_eq!(fields(&validate(&bad)), ["spec.type", "spec.ports[0].name", "spec.ports[0].port", "spec.ports[1].targetPort"]);
        assert_eq!(fields(&validate(&json!({"spec": {}}))), ["spec.ports"]);
        assert!(validate(&json!({"spec": {"clusterIP": "None"}})).is_empty());
        assert_eq!(fields(&validate(&json!({"spec": {"type": "ExternalName"}}))), ["spec.externalName"]);
    }
}
