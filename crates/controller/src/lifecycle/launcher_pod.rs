//! Placement by launcher pod (`virtplug controller --placement pods`): as KubeVirt's
//! virt-controller, each VMI gets a Pod that the cluster's scheduler places and in which QEMU
//! runs (`virtplug launcher`); the VMI's node comes from the pod. The other placement,
//! [`Placement::Direct`], is [`super::schedule`]: the controller picks the node itself (`up`).
//!
//! # Flow (one step per reconcile; each write wakes the next)
//! 1. A new VMI (`Pending`, no node) without a launcher pod: the pod is created
//!    ([`pod_for`]: `generateName: virt-launcher-NAME-`, owned by the VMI, resources,
//!    nodeSelector, affinity and tolerations from the VMI, plus KubeVirt's node selector on the
//!    agent's heartbeat label `virtplug.io/schedulable: "true"`), and the VMI goes `Scheduling`.
//! 2. The pod is bound (`spec.nodeName`, by the scheduler): the VMI gets the label
//!    `kubevirt.io/nodeName`, `status.nodeName` and `Scheduled` — inside [`client::update`]'s
//!    mutation, so a VMI already placed is never moved.
//! 3. The pod gone or `Failed` while the VMI is placed and unfinished: the VMI goes `Failed`
//!    (its QEMU went with the pod), reason `LauncherPodGone` / `LauncherPodFailed`.
//!
//! # Guarantees
//! - One pod per VMI: before creating, the controller lists the pods labelled with the VMI's
//!   UID (a GET-level check, not the cache), so a stale cache cannot create a second one.
//! - A deleted VMI's pod is never deleted here: the garbage collector removes it by owner
//!   reference once the VMI is gone, which is after the node agent has stopped QEMU and removed
//!   the VMI's finalizer. QEMU is never killed under a guest that is still being stopped.
//!
//! # Assumptions
//! The run dir `RUN_ROOT/UID` is a hostPath mounted at the same path in the pod, and the node
//! agent's run dirs are there too (its `DATA_DIR/node/vmis`): QEMU's arguments (written by the
//! agent) name host paths.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use api::kubevirt::VirtualMachineInstanceStatus;
use api::phases::VmiPhase;
use api::VirtualMachineInstance;

use super::schedule::Constraints;
use super::{api_err, condition, deleting, set_condition, LifecycleError, NODE_LABEL, VM_LABEL};
use crate::cache::Cache;

/// Label of a launcher pod (KubeVirt's `kubevirt.io: virt-launcher`).
pub const APP_LABEL: &str = "kubevirt.io";
/// Its value.
pub const APP_LAUNCHER: &str = "virt-launcher";
/// Label with the UID of the VMI a launcher pod runs (KubeVirt's).
pub const CREATED_BY: &str = "kubevirt.io/created-by";

/// How a VMI gets its node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// The controller picks the node ([`super::schedule`]); the node agent starts QEMU.
    #[default]
    Direct,
    /// A launcher pod per VMI, placed by the cluster's scheduler; QEMU runs in it.
    Pods(LauncherPods),
}

/// What launcher pods are made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LauncherPods {
    /// The image with `virtplug` and QEMU.
    pub image: String,
    /// The node agents' run dirs (`DATA_DIR/node/vmis` of the agent): `RUN_ROOT/UID` is the
    /// pod's hostPath.
    pub run_root: PathBuf,
}

/// The launcher pod of `vmi` (to create).
///
/// # Errors
/// A constraint field of the VMI that does not parse.
pub fn pod_for(vmi: &VirtualMachineInstance, cfg: &LauncherPods) -> Result<Pod, String> {
    let c = Constraints::of(vmi)?;
    let (ns, name, uid) = (vmi.namespace().unwrap_or_default(), vmi.name_any(), vmi.uid().unwrap_or_default());
    let run_dir = cfg.run_root.join(&uid).display().to_string();
    let domain = &vmi.spec.domain;
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if let Some(r) = &domain.resources {
        for key in ["memory", "cpu"] {
            if let Some(q) = r.requests.get(key) {
                requests.insert(key, json!(q));
            }
            if let Some(q) = r.limits.get(key) {
                limits.insert(key, json!(q));
            }
        }
    }
    if let (false, Some(guest)) = (requests.contains_key("memory"), domain.memory.as_ref().and_then(|m| m.guest.as_ref())) {
        requests.insert("memory", json!(guest));
    }
    let grace = vmi.spec.extra.get("terminationGracePeriodSeconds").and_then(serde_json::Value::as_i64).unwrap_or(30).max(0);
    let mut spec = json!({
        "restartPolicy": "Never",
        // The guest's grace is the launcher's (`--grace-period-seconds`: ACPI power-off, then
        // QEMU stopped, then killed after QUIT_DEADLINE); the pod's is a backstop after all
        // of it, as KubeVirt gives its launcher pods a margin over the VMI's grace.
        "terminationGracePeriodSeconds": grace + 15,
        "containers": [{
            "name": "compute",
            "image": cfg.image,
            "command": ["virtplug", "launcher", "--uid", uid, "--run-dir", run_dir, "--grace-period-seconds", grace.to_string()],
            "resources": {"requests": requests, "limits": limits},
            "volumeMounts": [{"name": "run", "mountPath": run_dir}],
        }],
        "volumes": [{"name": "run", "hostPath": {"path": run_dir, "type": "DirectoryOrCreate"}}],
    });
    // KubeVirt's way of keeping launchers off nodes without a node agent: the agent's
    // heartbeat label, which the controller turns "false" when the heartbeat is stale.
    let mut selector = c.node_selector.clone();
    selector.insert(api::annotations::NODE_SCHEDULABLE.to_owned(), "true".to_owned());
    spec["nodeSelector"] = json!(selector);
    if !c.tolerations.is_empty() {
        spec["tolerations"] = json!(c.tolerations);
    }
    if let Some(a) = &c.affinity {
        spec["affinity"] = json!(a);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": format!("virt-launcher-{name}-"), "namespace": ns,
            "labels": {APP_LABEL: APP_LAUNCHER, CREATED_BY: uid, VM_LABEL: name},
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": name, "uid": uid,
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": spec,
    }))
    .map_err(|e| format!("cannot build the launcher pod: {e}"))
}

/// A failed write (an API error, or a conflict that did not settle).
type WriteError = Box<dyn std::error::Error + Send + Sync>;

/// The launcher pod of VMI `uid` in the cache.
fn cached_pod(cache: &Cache, ns: &str, uid: &str) -> Option<std::sync::Arc<Pod>> {
    cache.pods.state().into_iter().find(|p| {
        p.namespace().as_deref() == Some(ns)
            && p.labels().get(APP_LABEL).map(String::as_str) == Some(APP_LAUNCHER)
            && p.labels().get(CREATED_BY).map(String::as_str) == Some(uid)
    })
}

/// The launcher pod of VMI `uid`, read from the API (before a create or a verdict of "gone").
async fn fresh_pod(pods: &Api<Pod>, uid: &str) -> Result<Option<Pod>, kube::Error> {
    let list = pods.list(&ListParams::default().labels(&format!("{CREATED_BY}={uid}"))).await?;
    Ok(list.items.into_iter().next())
}

fn pod_phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// One placement step for `vmi` (see the module docs).
///
/// # Errors
/// When a read or write fails.
pub(super) async fn place(
    client: &kube::Client,
    cache: &Cache,
    cfg: &LauncherPods,
    vmi: &VirtualMachineInstance,
) -> Result<(), LifecycleError> {
    let st = vmi.status.clone().unwrap_or_default();
    if deleting(vmi) || st.phase.as_ref().is_some_and(VmiPhase::is_final) {
        return Ok(());
    }
    let (ns, name, uid) = (vmi.namespace().unwrap_or_default(), vmi.name_any(), vmi.uid().unwrap_or_default());
    let object = format!("{ns}/{name}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    let pod = match cached_pod(cache, &ns, &uid) {
        Some(p) => Some((*p).clone()),
        None => fresh_pod(&pods, &uid).await.map_err(api_err(&object, "list its VMI's launcher pod"))?,
    };
    let placed = st.node_name.is_some();
    match pod {
        None if placed => {
            fail(client, vmi, "LauncherPodGone", "the launcher pod is gone: the VM's QEMU went with it")
                .await
                .map_err(api_err(&object, "fail its VMI"))?;
        }
        None => {
            let pod = match pod_for(vmi, cfg) {
                Ok(p) => p,
                Err(why) => return unschedulable(&vmis, &name, &why).await.map_err(api_err(&object, "mark its VMI unschedulable")),
            };
            let created = pods.create(&PostParams::default(), &pod).await.map_err(api_err(&object, "create its VMI's launcher pod"))?;
            tracing::info!(pod = %created.name_any(), "created the launcher pod");
            client::update_status(&vmis, &name, |v: &mut VirtualMachineInstance| {
                let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
                if s.node_name.is_none() && s.phase.as_ref().is_none_or(|p| *p == VmiPhase::Pending || p.as_str().is_empty()) {
                    s.phase = Some(VmiPhase::Scheduling);
                }
            })
            .await
            .map_err(api_err(&object, "mark its VMI Scheduling"))?;
        }
        Some(p) if placed => {
            if pod_phase(&p) == "Failed" {
                let msg = format!("the launcher pod {} failed: the VM's QEMU exited", p.name_any());
                fail(client, vmi, "LauncherPodFailed", &msg).await.map_err(api_err(&object, "fail its VMI"))?;
            }
        }
        Some(p) => {
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                return Ok(()); // the scheduler has not bound it yet: its binding wakes us
            };
            bind(&vmis, &name, &uid, &node).await.map_err(api_err(&object, "schedule its VMI"))?;
            tracing::info!(%node, pod = %p.name_any(), "scheduled its VMI where its launcher pod is");
        }
    }
    Ok(())
}

/// The VMI takes the node of its launcher pod: label, then `status.nodeName` and `Scheduled`
/// (both writes keep a node already set: a placed VMI never moves).
async fn bind(vmis: &Api<VirtualMachineInstance>, name: &str, uid: &str, node: &str) -> Result<(), WriteError> {
    let same = |v: &VirtualMachineInstance| v.uid().as_deref() == Some(uid);
    client::update(vmis, name, |v: &mut VirtualMachineInstance| {
        let placed = v.status.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
        if same(v) && !placed {
            v.metadata.labels.get_or_insert_with(Default::default).entry(NODE_LABEL.to_owned()).or_insert_with(|| node.to_owned());
        }
    })
    .await?;
    client::update_status(vmis, name, |v: &mut VirtualMachineInstance| {
        if !same(v) || v.labels().get(NODE_LABEL).map(String::as_str) != Some(node) {
            return;
        }
        let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
        if s.node_name.is_some() {
            return;
        }
        s.node_name = Some(node.to_owned());
        s.phase = Some(VmiPhase::Scheduled);
        set_condition(&mut s.conditions, condition("PodScheduled", true, "Scheduled", &format!("its launcher pod runs on node {node}")));
    })
    .await?;
    Ok(())
}

/// The VMI `uid` goes `Failed` (unless it has finished already).
async fn fail(client: &kube::Client, vmi: &VirtualMachineInstance, reason: &str, message: &str) -> Result<(), WriteError> {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    let uid = vmi.uid().unwrap_or_default();
    client::update_status(&vmis, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
        if v.uid() != Some(uid.clone()) {
            return;
        }
        let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
        if !s.phase.as_ref().is_some_and(VmiPhase::is_final) {
            s.phase = Some(VmiPhase::Failed);
            s.reason = Some(reason.to_owned());
            set_condition(&mut s.conditions, condition("Ready", false, reason, message));
        }
    })
    .await?;
    tracing::warn!("{message}");
    client::events::publish(client, "virtplug-controller", vmi, client::events::EventType::Warning, reason, message).await;
    Ok(())
}

async fn unschedulable(vmis: &Api<VirtualMachineInstance>, name: &str, why: &str) -> Result<(), WriteError> {
    client::update_status(vmis, name, |v: &mut VirtualMachineInstance| {
        let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
        if s.node_name.is_none() {
            s.phase = Some(VmiPhase::Pending);
            set_condition(&mut s.conditions, condition("PodScheduled", false, "Unschedulable", why));
        }
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_carries_the_vmis_constraints_resources_and_owner() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "ns", "uid": "u1"},
            "spec": {"domain": {"resources": {"requests": {"memory": "200Mi", "cpu": "1"}, "limits": {"memory": "300Mi"}}},
                     "nodeSelector": {"kubernetes.io/hostname": "n1"}, "tolerations": [{"key": "k", "operator": "Exists"}],
                     "terminationGracePeriodSeconds": 5}}))
        .unwrap();
        let cfg = LauncherPods { image: "virtplug:dev".into(), run_root: PathBuf::from("/var/lib/virtplug/node/vmis") };
        let pod = serde_json::to_value(pod_for(&vmi, &cfg).unwrap()).unwrap();
        assert_eq!(pod["metadata"]["generateName"], "virt-launcher-vm1-");
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": "u1", "vm.kubevirt.io/name": "vm1"})
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(pod["spec"]["nodeSelector"], json!({"kubernetes.io/hostname": "n1", "virtplug.io/schedulable": "true"}));
        assert_eq!(pod["spec"]["tolerations"], json!([{"key": "k", "operator": "Exists"}]));
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 20);
        let c = &pod["spec"]["containers"][0];
        assert_eq!(
            c["command"],
            json!(["virtplug", "launcher", "--uid", "u1", "--run-dir", "/var/lib/virtplug/node/vmis/u1", "--grace-period-seconds", "5"]),
            "the launcher gets the VMI's grace"
        );
        assert_eq!(c["resources"], json!({"requests": {"memory": "200Mi", "cpu": "1"}, "limits": {"memory": "300Mi"}}));
        assert_eq!(c["volumeMounts"][0]["mountPath"], pod["spec"]["volumes"][0]["hostPath"]["path"], "same path inside and out");
    }
}
