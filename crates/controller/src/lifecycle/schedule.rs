//! Scheduling a new VMI onto a registered node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::ResourceExt;

use api::kubevirt::VirtualMachineInstanceStatus;
use api::phases::VmiPhase;
use api::VirtualMachineInstance;

use super::{api_err, condition, deleting, set_condition, LifecycleError, NODE_LABEL};

/// Picks the node for a new VMI: `Ready`, schedulable, fewest VMIs. `None` when there is none.
///
/// # Errors
/// When listing nodes or VMIs fails.
pub async fn pick_node(client: &kube::Client) -> Result<Option<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let vmis: Api<VirtualMachineInstance> = Api::all(client.clone());
    let ready: Vec<String> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| n.labels().get("kubevirt.io/schedulable").map(String::as_str) != Some("false"))
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .map(|n| n.name_any())
        .collect();
    if ready.is_empty() {
        return Ok(None);
    }
    let mut load: BTreeMap<&str, usize> = ready.iter().map(|n| (n.as_str(), 0)).collect();
    for v in vmis.list(&ListParams::default()).await?.items {
        if let Some(n) = v.status.as_ref().and_then(|s| s.node_name.as_deref()) {
            if let Some(c) = load.get_mut(n) {
                *c += 1;
            }
        }
    }
    Ok(load.into_iter().min_by_key(|(n, c)| (*c, *n)).map(|(n, _)| n.to_owned()))
}

/// Assigns a new VMI to a node (label, then `status.nodeName` and phase `Scheduled`), or marks
/// it unschedulable.
pub(super) async fn schedule(client: &kube::Client, vmi: &VirtualMachineInstance) -> Result<(), LifecycleError> {
    let st = vmi.status.clone().unwrap_or_default();
    if deleting(vmi) || st.node_name.is_some() || !st.phase.as_ref().is_none_or(|p| *p == VmiPhase::Pending || p.as_str().is_empty()) {
        return Ok(());
    }
    let ns = vmi.namespace().unwrap_or_default();
    let name = vmi.name_any();
    let object = format!("{ns}/{name}");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    let node = pick_node(client).await.map_err(api_err(&object, "list nodes"))?;
    match node {
        Some(node) => {
            client::update(&vmis, &name, |v: &mut VirtualMachineInstance| {
                v.metadata.labels.get_or_insert_with(Default::default).insert(NODE_LABEL.to_owned(), node.clone());
            })
            .await
            .map_err(api_err(&object, "label its VMI with its node"))?;
            client::update_status(&vmis, &name, |v: &mut VirtualMachineInstance| {
                let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
                s.node_name = Some(node.clone());
                s.phase = Some(VmiPhase::Scheduled);
                set_condition(&mut s.conditions, condition("PodScheduled", true, "Scheduled", &format!("assigned to node {node}")));
            })
            .await
            .map_err(api_err(&object, "schedule its VMI"))?;
            tracing::info!(node = %node, "scheduled its VMI");
        }
        None => {
            client::update_status(&vmis, &name, |v: &mut VirtualMachineInstance| {
                let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
                s.phase = Some(VmiPhase::Pending);
                set_condition(
                    &mut s.conditions,
                    condition(
                        "PodScheduled",
                        false,
                        "Unschedulable",
                        "0 nodes are available: no Ready node is registered; start one with `virtplug node` (or run `virtplug up`)",
                    ),
                );
            })
            .await
            .map_err(api_err(&object, "mark its VMI unschedulable"))?;
        }
    }
    Ok(())
}
