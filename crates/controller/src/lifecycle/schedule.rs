//! Scheduling a new VMI onto a node, with kube-scheduler's node filters for what a VMI asks.
//!
//! # Rules
//! A node is a candidate when every filter passes (kube-scheduler's names in brackets):
//! - a virtplug node agent runs there: label [`NODE_SCHEDULABLE`] is `"true"` (the agent sets it
//!   with every heartbeat, the controller sets `"false"` when the heartbeat is stale);
//! - not cordoned: `spec.unschedulable` unset (NodeUnschedulable);
//! - `Ready=True` (the kubelet's condition; `up` writes it for its one node);
//! - every `NoSchedule`/`NoExecute` taint is tolerated by the VMI's `spec.tolerations`
//!   (TaintToleration);
//! - the VMI's `spec.nodeSelector` matches the node's labels, and its
//!   `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution` does (NodeAffinity:
//!   terms ORed, expressions ANDed; `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`).
//!
//! Of the candidates, the one with the fewest VMIs wins (ties: the first by name). No candidate:
//! the VMI stays `Pending` with `PodScheduled=False/Unschedulable` and a message in
//! kube-scheduler's words ("0/3 nodes are available: 1 node(s) were unschedulable, ...").
//!
//! # Caveats
//! Resource requests are not counted against a node's capacity (the agent refuses a VM that does
//! not fit its caps); preferred affinity and pod (anti-)affinity are ignored.
//!
//! # Guarantees
//! The node is written inside [`client::update`]'s mutation, which keeps a node already chosen by
//! anyone else: two controllers (a leadership hand-over) can never move one VMI between nodes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Node, NodeSelectorRequirement, Taint, Toleration};
use kube::api::Api;
use kube::ResourceExt;
use serde::de::DeserializeOwned;

use api::annotations::NODE_SCHEDULABLE;
use api::kubevirt::VirtualMachineInstanceStatus;
use api::phases::VmiPhase;
use api::VirtualMachineInstance;

use super::{api_err, condition, deleting, set_condition, LifecycleError, NODE_LABEL};
use crate::cache::Cache;

/// What a VMI asks of its node (`spec.nodeSelector`, `spec.tolerations`, `spec.affinity`).
#[derive(Debug, Default)]
pub struct Constraints {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    pub affinity: Option<Affinity>,
}

impl Constraints {
    /// Reads the VMI's constraints; `Err` names the field that does not parse.
    ///
    /// # Errors
    /// A field that is not what Kubernetes' schema says.
    pub fn of(vmi: &VirtualMachineInstance) -> Result<Constraints, String> {
        fn field<T: DeserializeOwned + Default>(vmi: &VirtualMachineInstance, name: &str) -> Result<T, String> {
            vmi.spec.extra.get(name).map_or(Ok(T::default()), |v| {
                serde_json::from_value(v.clone()).map_err(|e| format!("spec.{name} is not valid: {e}; fix it in the VM's template"))
            })
        }
        Ok(Constraints {
            node_selector: field(vmi, "nodeSelector")?,
            tolerations: field(vmi, "tolerations")?,
            affinity: field(vmi, "affinity")?,
        })
    }
}

/// Why a node is not a candidate, in kube-scheduler's words (counted per reason in the message).
fn unfit(node: &Node, c: &Constraints) -> Option<String> {
    let labels = node.labels();
    if labels.get(NODE_SCHEDULABLE).map(String::as_str) != Some("true") {
        return Some("node(s) had no running virtplug node agent".to_owned());
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Some("node(s) were unschedulable".to_owned());
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !ready {
        return Some("node(s) were not ready".to_owned());
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    if let Some(t) = taints.iter().find(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute") && !tolerated(t, &c.tolerations)) {
        let value = t.value.as_deref().map(|v| format!(": {v}")).unwrap_or_default();
        return Some(format!("node(s) had untolerated taint {{{}{value}}}", t.key));
    }
    if !c.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) || !required_affinity(labels, c.affinity.as_ref()) {
        return Some("node(s) didn't match Pod's node affinity/selector".to_owned());
    }
    None
}

/// Kubernetes' toleration match: same effect (or none), then `Exists` on the key (or every key
/// with an empty key) or `Equal` (the default) on key and value.
fn tolerated(taint: &Taint, tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| {
        let effect = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
        let key = t.key.as_deref().unwrap_or_default();
        let matches = match t.operator.as_deref() {
            Some("Exists") => key.is_empty() || key == taint.key,
            _ => key == taint.key && t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
        };
        effect && matches
    })
}

fn required_affinity(labels: &BTreeMap<String, String>, affinity: Option<&Affinity>) -> bool {
    let Some(required) =
        affinity.and_then(|a| a.node_affinity.as_ref()).and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
    else {
        return true;
    };
    // Terms are ORed; an empty term matches nothing (Kubernetes' rule).
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        !exprs.is_empty() && exprs.iter().all(|e| requirement(labels, e))
    })
}

fn requirement(labels: &BTreeMap<String, String>, r: &NodeSelectorRequirement) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(want)) = (value.and_then(|v| number(v)), values.first().and_then(|v| number(v))) else { return false };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}

/// Picks a node for a VMI with `constraints` from `nodes`, given how many VMIs each node runs.
///
/// # Errors
/// No node fits: the message says why for every node, counted per reason.
pub fn pick(nodes: &[std::sync::Arc<Node>], load: &BTreeMap<String, usize>, constraints: &Constraints) -> Result<String, String> {
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut best: Option<(usize, String)> = None;
    for n in nodes {
        let name = n.name_any();
        match unfit(n, constraints) {
            Some(why) => *reasons.entry(why).or_default() += 1,
            None => {
                let l = load.get(&name).copied().unwrap_or(0);
                if best.as_ref().is_none_or(|(bl, bn)| (l, &name) < (*bl, bn)) {
                    best = Some((l, name));
                }
            }
        }
    }
    if let Some((_, name)) = best {
        return Ok(name);
    }
    if nodes.is_empty() {
        return Err("0 nodes are available: no node is registered; start one with `virtplug node` (or run `virtplug up`)".to_owned());
    }
    let why: Vec<String> = reasons.into_iter().map(|(r, n)| format!("{n} {r}")).collect();
    Err(format!("0/{} nodes are available: {}.", nodes.len(), why.join(", ")))
}

/// The node for `vmi` from the controller's stores.
///
/// # Errors
/// As [`pick`], or the VMI's constraints do not parse.
pub fn pick_node(cache: &Cache, vmi: &VirtualMachineInstance) -> Result<String, String> {
    let constraints = Constraints::of(vmi)?;
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for v in cache.vmis.state() {
        if let Some(n) = v.status.as_ref().and_then(|s| s.node_name.as_deref()) {
            *load.entry(n.to_owned()).or_default() += 1;
        }
    }
    pick(&cache.nodes.state(), &load, &constraints)
}

/// Assigns a new VMI to a node (label, then `status.nodeName` and phase `Scheduled`), or marks
/// it unschedulable.
pub(super) async fn schedule(client: &kube::Client, cache: &Cache, vmi: &VirtualMachineInstance) -> Result<(), LifecycleError> {
    let st = vmi.status.clone().unwrap_or_default();
    if deleting(vmi) || st.node_name.is_some() || !st.phase.as_ref().is_none_or(|p| *p == VmiPhase::Pending || p.as_str().is_empty()) {
        return Ok(());
    }
    let ns = vmi.namespace().unwrap_or_default();
    let name = vmi.name_any();
    let object = format!("{ns}/{name}");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    match pick_node(cache, vmi) {
        Ok(node) => {
            // Decided on the fresh copy: a node label someone else wrote first is kept.
            let labelled = client::update(&vmis, &name, |v: &mut VirtualMachineInstance| {
                let labels = v.metadata.labels.get_or_insert_with(Default::default);
                if !labels.contains_key(NODE_LABEL) && v.status.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                    labels.insert(NODE_LABEL.to_owned(), node.clone());
                }
            })
            .await
            .map_err(api_err(&object, "label its VMI with its node"))?;
            let chosen = labelled.object.labels().get(NODE_LABEL).cloned().unwrap_or_else(|| node.clone());
            client::update_status(&vmis, &name, |v: &mut VirtualMachineInstance| {
                if v.labels().get(NODE_LABEL) != Some(&chosen) {
                    return; // the label moved since (another controller): its status write follows it
                }
                let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
                if s.node_name.is_some() {
                    return;
                }
                s.node_name = Some(chosen.clone());
                s.phase = Some(VmiPhase::Scheduled);
                set_condition(&mut s.conditions, condition("PodScheduled", true, "Scheduled", &format!("assigned to node {chosen}")));
            })
            .await
            .map_err(api_err(&object, "schedule its VMI"))?;
            tracing::info!(node = %chosen, "scheduled its VMI");
        }
        Err(why) => {
            client::update_status(&vmis, &name, |v: &mut VirtualMachineInstance| {
                let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
                if s.node_name.is_some() {
                    return;
                }
                s.phase = Some(VmiPhase::Pending);
                set_condition(&mut s.conditions, condition("PodScheduled", false, "Unschedulable", &why));
            })
            .await
            .map_err(api_err(&object, "mark its VMI unschedulable"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn node(name: &str, extra: &serde_json::Value) -> Arc<Node> {
        let mut n = json!({"metadata": {"name": name, "labels": {NODE_SCHEDULABLE: "true", "zone": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        json_patch::merge(&mut n, extra);
        Arc::new(serde_json::from_value(n).unwrap())
    }
    #[allow(clippy::needless_pass_by_value)]
    fn constraints(spec: serde_json::Value) -> Constraints {
        let vmi: VirtualMachineInstance = serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v"}, "spec": spec}),
        )
        .unwrap();
        Constraints::of(&vmi).unwrap()
    }
    fn none() -> Constraints {
        Constraints::default()
    }

    #[test]
    fn fewest_vmis_wins_and_ties_go_by_name() {
        let nodes = [node("b", &json!({})), node("a", &json!({}))];
        assert_eq!(pick(&nodes, &BTreeMap::new(), &none()), Ok("a".to_owned()));
        let load = BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)]);
        assert_eq!(pick(&nodes, &load, &none()), Ok("b".to_owned()));
    }

    #[test]
    fn cordoned_unready_agentless_and_tainted_nodes_are_skipped_with_reasons() {
        let nodes = [
            node("cordoned", &json!({"spec": {"unschedulable": true}})),
            node("unready", &json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
            node("no-agent", &json!({"metadata": {"labels": {NODE_SCHEDULABLE: "false"}}})),
            node("tainted", &json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}})),
            node("prefer", &json!({"spec": {"taints": [{"key": "soft", "effect": "PreferNoSchedule"}]}})),
        ];
        assert_eq!(pick(&nodes, &BTreeMap::new(), &none()), Ok("prefer".to_owned()), "PreferNoSchedule does not filter");
        let err = pick(&nodes[..4], &BTreeMap::new(), &none()).unwrap_err();
        assert_eq!(
            err,
            "0/4 nodes are available: 1 node(s) had no running virtplug node agent, 1 node(s) had untolerated taint {dedicated: db}, \
             1 node(s) were not ready, 1 node(s) were unschedulable."
        );
    }

    #[test]
    fn tolerations_follow_kubernetes_matching() {
        let tainted = [node("t", &json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}))];
        let pick1 =
            |tol: serde_json::Value| pick(&tainted, &BTreeMap::new(), &constraints(json!({"domain": {}, "tolerations": tol}))).is_ok();
        assert!(pick1(json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])));
        assert!(pick1(json!([{"key": "dedicated", "operator": "Exists"}])), "Exists on the key, any effect");
        assert!(pick1(json!([{"operator": "Exists"}])), "an empty key with Exists tolerates everything");
        assert!(!pick1(json!([{"key": "dedicated", "value": "web", "effect": "NoSchedule"}])), "another value");
        assert!(!pick1(json!([{"key": "dedicated", "value": "db", "effect": "NoExecute"}])), "another effect");
    }

    #[test]
    fn node_selector_and_required_affinity_filter() {
        let nodes = [node("a", &json!({})), node("b", &json!({"metadata": {"labels": {"zone": "b", "gpu": "3"}}}))];
        let on = |spec: serde_json::Value| pick(&nodes, &BTreeMap::new(), &constraints(spec));
        assert_eq!(on(json!({"domain": {}, "nodeSelector": {"zone": "b"}})), Ok("b".to_owned()));
        let term = |e: serde_json::Value| json!({"domain": {}, "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": e}]}}}});
        assert_eq!(on(term(json!([{"key": "gpu", "operator": "Exists"}]))), Ok("b".to_owned()));
        assert_eq!(on(term(json!([{"key": "gpu", "operator": "DoesNotExist"}]))), Ok("a".to_owned()));
        assert_eq!(on(term(json!([{"key": "gpu", "operator": "Gt", "values": ["2"]}]))), Ok("b".to_owned()));
        assert_eq!(on(term(json!([{"key": "zone", "operator": "NotIn", "values": ["a"]}]))), Ok("b".to_owned()));
        assert!(on(term(json!([{"key": "zone", "operator": "In", "values": ["c"]}]))).unwrap_err().contains("2 node(s) didn't match"));
    }

    #[test]
    fn a_malformed_constraint_names_its_field() {
        let vmi: VirtualMachineInstance = serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v"}, "spec": {"domain": {}, "tolerations": "x"}}),
        )
        .unwrap();
        assert!(Constraints::of(&vmi).unwrap_err().starts_with("spec.tolerations is not valid"));
    }

    #[test]
    fn no_node_says_how_to_get_one() {
        assert!(pick(&[], &BTreeMap::new(), &none()).unwrap_err().contains("virtplug node"));
    }
}
