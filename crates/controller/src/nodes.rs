//! Node health as the controller sees it (KubeVirt's node controller): a node whose agent stopped
//! heartbeating is taken out of scheduling, and the VMIs of a fenced node are failed so that their
//! VMs start elsewhere.
//!
//! # Flow
//! - The node agent patches [`NODE_SCHEDULABLE`]`=true` and [`NODE_HEARTBEAT`]`=<now>` on its
//!   Node every heartbeat interval (nothing else on the Node: its conditions are the kubelet's).
//! - A Node whose label is `true` and whose heartbeat is older than the timeout (or missing) gets
//!   the label `false`, written with [`client::update`] after re-checking the fresh copy (an agent
//!   that heartbeated meanwhile wins), and a `NodeUnresponsive` Warning Event. A fresh node is
//!   looked at again when its heartbeat would expire (a timed requeue per node, no polling loop).
//! - A Node tainted [`OUT_OF_SERVICE_TAINT`] by its administrator (Kubernetes' non-graceful
//!   shutdown: the machine is known to be off) whose agent is not heartbeating: its unfinished
//!   VMIs go to `Failed` (reason `NodeFenced`); the VM controller then releases their finalizer
//!   and starts `Always` VMs on another node. The taint and the silence are checked again on a
//!   fresh read of the Node first (the watched copy may predate the node's return), and each VMI
//!   is failed only if its fresh copy is still the one listed, on that node.
//!
//! # Guarantees
//! Never two QEMUs on one disk: a stale heartbeat alone fails no VMI (an agent that is down leaves
//! its guests running); only a fenced node, or a deleted Node object, does.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::ResourceExt;

use api::annotations::{NODE_HEARTBEAT, NODE_SCHEDULABLE, OUT_OF_SERVICE_TAINT};
use api::kubevirt::VirtualMachineInstanceStatus;
use api::phases::VmiPhase;
use api::VirtualMachineInstance;
use client::events::{self, EventType};

use crate::lifecycle::{condition, set_condition, NODE_LABEL};
use crate::runner::{Action, Runner};

/// KubeVirt's: virt-handler heartbeats every minute, virt-controller gives up after five.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(300);

/// Errors of one node reconcile.
#[derive(Debug, thiserror::Error)]
#[error("node {node}: cannot {what}")]
pub struct NodeError {
    node: String,
    what: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

struct Ctx {
    client: kube::Client,
    timeout: Duration,
}

/// How long ago the node's agent last heartbeated; `None` when it never did (or the annotation
/// does not parse).
fn heartbeat_age(node: &Node, now: jiff::Timestamp) -> Option<Duration> {
    let at: jiff::Timestamp = node.annotations().get(NODE_HEARTBEAT)?.parse().ok()?;
    Some(now.duration_since(at).try_into().unwrap_or(Duration::ZERO))
}

/// Whether the node's agent counts as gone: labelled schedulable but silent past `timeout`.
fn stale(node: &Node, now: jiff::Timestamp, timeout: Duration) -> bool {
    node.labels().get(NODE_SCHEDULABLE).map(String::as_str) == Some("true") && heartbeat_age(node, now).is_none_or(|age| age > timeout)
}

/// Whether an administrator fenced the node (Kubernetes' out-of-service taint).
#[must_use]
pub fn fenced(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default().iter().any(|t| t.key == OUT_OF_SERVICE_TAINT)
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, NodeError> {
    let name = node.name_any();
    let err = |what: &'static str| {
        let node = name.clone();
        move |e: Box<dyn std::error::Error + Send + Sync>| NodeError { node, what, source: e }
    };
    let now = jiff::Timestamp::now();
    if stale(&node, now, ctx.timeout) {
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        let timeout = ctx.timeout;
        let marked = client::update(&nodes, &name, |n: &mut Node| {
            if stale(n, jiff::Timestamp::now(), timeout) {
                n.metadata.labels.get_or_insert_with(Default::default).insert(NODE_SCHEDULABLE.to_owned(), "false".to_owned());
            }
        })
        .await
        .map_err(|e| err("mark it unschedulable")(e.into()))?;
        if marked.wrote {
            let last = node.annotations().get(NODE_HEARTBEAT).map_or("never".to_owned(), Clone::clone);
            let message = format!(
                "the virtplug node agent has not sent a heartbeat for more than {}s (last: {last}); no new VM is scheduled here \
                 until it is back. Its VMs keep running; if the machine is down, taint the node {OUT_OF_SERVICE_TAINT} to start them elsewhere",
                timeout.as_secs()
            );
            tracing::warn!(node = %name, "{message}");
            events::publish(&ctx.client, "virtplug-controller", &marked.object, EventType::Warning, "NodeUnresponsive", &message).await;
        }
        return Ok(Action::await_change());
    }
    if fenced_and_silent(&node) {
        // The watched copy may be older than the administrator's untainting or the agent's
        // return: failing a running node's VMIs would start their VMs a second time elsewhere.
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        match nodes.get_opt(&name).await.map_err(|e| err("read the fenced node")(e.into()))? {
            Some(fresh) if fresh.uid() == node.uid() && fenced_and_silent(&fresh) => {
                fail_vmis(&ctx.client, &name).await.map_err(err("fail the VMIs of the fenced node"))?;
            }
            // Its own watch event brings the fresh copy.
            _ => tracing::debug!(node = %name, "no longer fenced, or replaced: its VMIs are left as they are"),
        }
        return Ok(Action::await_change());
    }
    // Fresh: look again when the heartbeat would expire (a new heartbeat wakes it earlier).
    Ok(match heartbeat_age(&node, now) {
        Some(age) if node.labels().get(NODE_SCHEDULABLE).map(String::as_str) == Some("true") => {
            Action::requeue(ctx.timeout.saturating_sub(age) + Duration::from_secs(1))
        }
        _ => Action::await_change(),
    })
}

/// Whether the node is fenced and its agent is not heartbeating (see the module docs).
fn fenced_and_silent(node: &Node) -> bool {
    fenced(node) && node.labels().get(NODE_SCHEDULABLE).map(String::as_str) != Some("true")
}

/// Moves every unfinished VMI on `node` to `Failed` (the node is fenced: their QEMUs are gone).
async fn fail_vmis(client: &kube::Client, node: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let all: Api<VirtualMachineInstance> = Api::all(client.clone());
    let on_node = all.list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}"))).await?;
    for vmi in on_node.items.iter().filter(|v| !v.phase().is_some_and(VmiPhase::is_final)) {
        let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
        let message = format!("node {node} is fenced ({OUT_OF_SERVICE_TAINT}) and its agent is gone: the VM is not running");
        let failed = client::update_status(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
            // A VMI that moved (a migration's target) or a newer one of the same name is not here.
            if v.uid() != vmi.uid() || v.labels().get(NODE_LABEL).map(String::as_str) != Some(node) {
                return;
            }
            let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
            if !s.phase.as_ref().is_some_and(VmiPhase::is_final) {
                s.phase = Some(VmiPhase::Failed);
                set_condition(&mut s.conditions, condition("Ready", false, "NodeFenced", &message));
            }
        })
        .await?;
        if !failed.wrote {
            continue;
        }
        tracing::warn!(vmi = %format!("{}/{}", vmi.namespace().unwrap_or_default(), vmi.name_any()), "{message}");
        events::publish(client, "virtplug-controller", &failed.object, EventType::Warning, "NodeFenced", &message).await;
    }
    Ok(())
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(_: Arc<Node>, err: &NodeError, _: Arc<Ctx>) -> Action {
    tracing::warn!("{}", client::error_chain(err));
    Action::requeue(Duration::from_secs(5))
}

/// Runs the node controller until the process stops.
pub async fn run(client: kube::Client, timeout: Duration) {
    let ctx = Arc::new(Ctx { client: client.clone(), timeout });
    Runner::new(Api::<Node>::all(client), watcher::Config::default()).run(reconcile, error_policy, ctx).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(label: Option<&str>, heartbeat: Option<&str>) -> Node {
        let mut n = json!({"metadata": {"name": "n", "labels": {}, "annotations": {}}});
        if let Some(l) = label {
            n["metadata"]["labels"][NODE_SCHEDULABLE] = json!(l);
        }
        if let Some(h) = heartbeat {
            n["metadata"]["annotations"][NODE_HEARTBEAT] = json!(h);
        }
        serde_json::from_value(n).unwrap()
    }

    #[test]
    fn a_node_is_stale_only_when_labelled_and_silent_past_the_timeout() {
        let now: jiff::Timestamp = "2026-12-02T10:00:00Z".parse().unwrap();
        let t = Duration::from_secs(60);
        assert!(!stale(&node(Some("true"), Some("2026-12-02T09:59:30Z")), now, t));
        assert!(stale(&node(Some("true"), Some("2026-12-02T09:58:00Z")), now, t));
        assert!(stale(&node(Some("true"), None), now, t), "labelled without a heartbeat");
        assert!(stale(&node(Some("true"), Some("yesterday")), now, t), "an unreadable heartbeat is none");
        assert!(!stale(&node(Some("false"), Some("2026-12-02T09:00:00Z")), now, t), "already marked");
        assert!(!stale(&node(None, None), now, t), "never had an agent: nothing to take away");
    }

    /// A reconcile holding a copy of the node from before its taint was removed (and its agent
    /// came back) fails none of its VMIs; with the fresh copy still fenced, it fails them. Against
    /// the real API server, in process.
    #[tokio::test]
    async fn a_copy_from_before_the_node_came_back_fails_no_vmi() {
        let dir = tempfile::tempdir().unwrap();
        let (_server, router) = apiserver::testing::open(dir.path(), None).await;
        let client = client::in_process(router);
        let ctx = Arc::new(Ctx { client: client.clone(), timeout: DEFAULT_HEARTBEAT_TIMEOUT });
        let nodes: Api<Node> = Api::all(client.clone());
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
        let taint = json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]);
        let pp = kube::api::PostParams::default();
        let fenced_node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "labels": {NODE_SCHEDULABLE: "false"}}, "spec": {"taints": taint}}))
        .unwrap();
        let fenced_node = nodes.create(&pp, &fenced_node).await.unwrap();
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "default", "labels": {NODE_LABEL: "n"}}, "spec": {"domain": {"devices": {}}}}))
        .unwrap();
        vmis.create(&pp, &vmi).await.unwrap();
        let (patch, mp) = (kube::api::Patch::Merge, kube::api::PatchParams::default());
        vmis.patch_status("v", &mp, &patch(json!({"status": {"phase": "Running"}}))).await.unwrap();
        let phase = || async { vmis.get("v").await.unwrap().status.and_then(|s| s.phase) };

        // The node came back: untainted, its agent heartbeating.
        nodes.patch("n", &mp, &patch(json!({"metadata": {"labels": {NODE_SCHEDULABLE: "true"}}, "spec": {"taints": null}}))).await.unwrap();
        reconcile(Arc::new(fenced_node.clone()), Arc::clone(&ctx)).await.unwrap();
        assert_eq!(phase().await, Some(VmiPhase::Running), "the stale copy failed a VMI of a node that is back");

        // Fenced again, for real: the VMI fails.
        nodes
            .patch("n", &mp, &patch(json!({"metadata": {"labels": {NODE_SCHEDULABLE: "false"}}, "spec": {"taints": taint}})))
            .await
            .unwrap();
        reconcile(Arc::new(nodes.get("n").await.unwrap()), Arc::clone(&ctx)).await.unwrap();
        assert_eq!(phase().await, Some(VmiPhase::Failed));
    }

    #[test]
    fn fenced_is_the_out_of_service_taint() {
        let mut n = node(None, None);
        assert!(!fenced(&n));
        n.spec = Some(
            serde_json::from_value(json!({"taints": [{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]}))
                .unwrap(),
        );
        assert!(fenced(&n));
    }
}
