//! VM lifecycle (KubeVirt's VM controller): keep a VM's VMI in line with its `runStrategy` and
//! its start/stop/restart requests, schedule new VMIs onto a registered node, and report the
//! VM's `status` (`printableStatus`, `ready`, `created`, conditions).
//!
//! # Flow
//! [`decide`] is pure: from the VM, its VMI and whether the VM's volumes can be provided it
//! picks at most one [`Step`]; [`reconcile`] carries it out and writes the status. Every step is
//! one write whose result wakes the next reconcile (the controller watches VMs and VMIs), so a
//! crash between steps resumes where it stopped.
//!
//! # Rules (KubeVirt's)
//! - Requests in `status.stateChangeRequests` come first, oldest first: `Stop` deletes the VMI
//!   whose UID it names (a newer VMI is left alone) and is dropped when that VMI is gone;
//!   `Start` creates a VMI when none exists and is dropped once one does.
//! - Then the strategy: `Always` keeps a VMI (a finished one is replaced); `RerunOnFailure`
//!   replaces only a `Failed` one; `Once` runs one VMI and then sets the VM to `Halted`;
//!   `Halted` deletes the VMI; `Manual` does nothing on its own.
//! - A VMI is created only when every non-hot-plug PVC is `Bound` and every DataVolume has
//!   `Succeeded` (hot-plug volumes are plugged when they are ready), and the template holds
//!   [`api::invariants`].
//! - The VMI gets the template's metadata and spec, an owner reference to the VM (controller,
//!   block owner deletion: garbage-collected with it), the label `vm.kubevirt.io/name` and the
//!   finalizer [`VMI_FINALIZER`], which the node agent removes once QEMU is gone. A VMI that was
//!   never scheduled, or whose node is no longer registered, has nothing to wait for: the
//!   controller removes the finalizer itself.
//! - Scheduling: a `Ready` node that is not marked `kubevirt.io/schedulable=false`, the one with
//!   the fewest VMIs; none → the VMI stays `Pending` with `PodScheduled=False/Unschedulable` and
//!   the VM shows `ErrorUnschedulable`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::Value;

use api::kubevirt::{Condition, RunStrategy, StateChangeRequest, VirtualMachineInstanceStatus};
use api::{DataVolume, VirtualMachine, VirtualMachineInstance};

/// VMI finalizer removed by the node agent once the VM's QEMU has exited.
pub const VMI_FINALIZER: &str = "kubevirt.io/foregroundDeleteVirtualMachine";
/// Label with the node a VMI runs on (KubeVirt's; the node agent selects on it).
pub const NODE_LABEL: &str = "kubevirt.io/nodeName";
/// Label with the VM a VMI belongs to.
pub const VM_LABEL: &str = "vm.kubevirt.io/name";

/// Whether the VM's volumes can be provided (non-hot-plug ones; those block the start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Volumes {
    Ready,
    /// A DataVolume is still importing or being created (`Provisioning`).
    Provisioning(String),
    /// A claim is not bound yet (`WaitingForVolumeBinding`).
    WaitingForBinding(String),
    /// A claim or DataVolume does not exist (`ErrorPvcNotFound`).
    NotFound(String),
    /// A DataVolume failed (`DataVolumeError`).
    Failed(String),
}

impl Volumes {
    fn printable(&self) -> Option<(&'static str, &str)> {
        match self {
            Volumes::Ready => None,
            Volumes::Provisioning(m) => Some(("Provisioning", m)),
            Volumes::WaitingForBinding(m) => Some(("WaitingForVolumeBinding", m)),
            Volumes::NotFound(m) => Some(("ErrorPvcNotFound", m)),
            Volumes::Failed(m) => Some(("DataVolumeError", m)),
        }
    }
}

/// The one thing a reconcile does to the VM's VMI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Create the VMI; then drop the first request if it is a `Start`.
    Create,
    /// Delete the VMI with this UID.
    Delete(String),
    /// Drop the first state change request (carried out or moot).
    DropRequest,
    /// Set `runStrategy: Halted` (a `Once` VM whose run is over).
    Halt,
}

fn phase(vmi: &VirtualMachineInstance) -> &str {
    vmi.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn finished(vmi: &VirtualMachineInstance) -> bool {
    matches!(phase(vmi), "Succeeded" | "Failed")
}

fn deleting(vmi: &VirtualMachineInstance) -> bool {
    vmi.metadata.deletion_timestamp.is_some()
}

/// Decides the next step for `vm` given its VMI. `can_start`: volumes ready and spec valid.
#[must_use]
pub fn decide(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>, can_start: bool) -> Step {
    let delete = |v: &VirtualMachineInstance| if deleting(v) { Step::Nothing } else { Step::Delete(v.uid().unwrap_or_default()) };
    if vm.metadata.deletion_timestamp.is_some() {
        return vmi.map_or(Step::Nothing, delete);
    }
    let requests = vm.status.as_ref().map(|s| s.state_change_requests.as_slice()).unwrap_or_default();
    if let Some(req) = requests.first() {
        return match (req.action.as_str(), vmi) {
            ("Stop", Some(v)) if req.uid.is_none() || req.uid == v.uid() => delete(v),
            ("Stop", _) => Step::DropRequest,
            ("Start", Some(v)) if deleting(v) => Step::Nothing,
            ("Start", Some(_)) => Step::DropRequest,
            ("Start", None) if can_start => Step::Create,
            ("Start", None) => Step::Nothing,
            _ => Step::DropRequest, // an unknown action: KubeVirt ignores it too
        };
    }
    match (vm.spec.effective_run_strategy(), vmi) {
        (RunStrategy::Halted | RunStrategy::WaitAsReceiver, Some(v)) => delete(v),
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) if can_start => Step::Create,
        (RunStrategy::Always, Some(v)) if finished(v) => delete(v),
        (RunStrategy::RerunOnFailure, Some(v)) if phase(v) == "Failed" => delete(v),
        (RunStrategy::Once, Some(v)) if finished(v) => Step::Halt,
        _ => Step::Nothing,
    }
}

/// Whether the VM wants a VMI right now (for `printableStatus` while none exists).
fn wants_vmi(vm: &VirtualMachine) -> bool {
    let requests = vm.status.as_ref().map(|s| s.state_change_requests.as_slice()).unwrap_or_default();
    if requests.first().is_some_and(|r| r.action == "Start") {
        return true;
    }
    matches!(vm.spec.effective_run_strategy(), RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once)
}

/// `status.printableStatus` of the VM (KubeVirt's values).
#[must_use]
pub fn printable_status(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>, volumes: &Volumes) -> &'static str {
    if vm.metadata.deletion_timestamp.is_some() {
        return "Terminating";
    }
    match vmi {
        Some(v) if deleting(v) => "Stopping",
        Some(v) => match phase(v) {
            "Running" => "Running",
            "Succeeded" | "Failed" => "Stopped",
            _ if unschedulable(v) => "ErrorUnschedulable",
            _ => "Starting",
        },
        None => match volumes.printable() {
            Some((s, _)) if wants_vmi(vm) => s,
            _ if wants_vmi(vm) => "Starting",
            _ => "Stopped",
        },
    }
}

fn unschedulable(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False"))
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Sets condition `c` in `conds`, keeping `lastTransitionTime` when the status did not change.
pub fn set_condition(conds: &mut Vec<Condition>, mut c: Condition) {
    match conds.iter_mut().find(|x| x.type_ == c.type_) {
        Some(x) => {
            c.last_transition_time = if x.status == c.status { x.last_transition_time.clone() } else { Some(now()) };
            *x = c;
        }
        None => {
            c.last_transition_time = Some(now());
            conds.push(c);
        }
    }
}

/// A condition with `type_`, `status`, `reason` and `message`.
#[must_use]
pub fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        ..Condition::default()
    }
}

/// Checks the VM's non-hot-plug PVC and DataVolume volumes.
///
/// # Errors
/// When a read fails.
pub async fn volumes(client: &kube::Client, vm: &VirtualMachine) -> Result<Volumes, kube::Error> {
    let ns = vm.namespace().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    let Some(spec) = vm.spec.template.spec.as_ref() else { return Ok(Volumes::Ready) };
    for v in spec.volumes.iter().filter(|v| !v.is_hotpluggable()) {
        if let Some(p) = &v.persistent_volume_claim {
            match pvcs.get_opt(&p.claim_name).await? {
                None => return Ok(Volumes::NotFound(format!("claim {} of volume {} does not exist; create it", p.claim_name, v.name))),
                Some(c) if c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") => {
                    return Ok(Volumes::WaitingForBinding(format!("claim {} of volume {} is not bound yet", p.claim_name, v.name)));
                }
                Some(_) => {}
            }
        }
        if let Some(d) = &v.data_volume {
            match dvs.get_opt(&d.name).await? {
                None => return Ok(Volumes::NotFound(format!("DataVolume {} of volume {} does not exist; create it", d.name, v.name))),
                Some(dv) => match dv.status.as_ref().and_then(|s| s.phase.as_deref()) {
                    Some("Succeeded") => {}
                    Some("Failed") => {
                        let why = dv
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Running"))
                            .and_then(|c| c.message.clone());
                        return Ok(Volumes::Failed(format!("DataVolume {} failed: {}", d.name, why.unwrap_or_default())));
                    }
                    p => return Ok(Volumes::Provisioning(format!("DataVolume {} is {}", d.name, p.unwrap_or("Pending")))),
                },
            }
        }
    }
    Ok(Volumes::Ready)
}

/// Creates the DataVolumes of `spec.dataVolumeTemplates` that do not exist, owned by the VM.
///
/// # Errors
/// When a template cannot be read or a create fails for another reason than "exists".
pub async fn create_data_volumes(client: &kube::Client, vm: &VirtualMachine) -> Result<(), kube::Error> {
    let Some(templates) = vm.spec.extra.get("dataVolumeTemplates").and_then(Value::as_array) else { return Ok(()) };
    let ns = vm.namespace().unwrap_or_default();
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    for t in templates {
        let Some(name) = t.pointer("/metadata/name").and_then(Value::as_str) else { continue };
        if dvs.get_opt(name).await?.is_some() {
            continue;
        }
        let mut dv = serde_json::json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": t.get("metadata").cloned().unwrap_or_default(), "spec": t.get("spec").cloned().unwrap_or_default()});
        dv["metadata"]["namespace"] = Value::String(ns.clone());
        dv["metadata"]["ownerReferences"] = serde_json::to_value([owner(vm)]).map_err(kube::Error::SerdeError)?;
        let dv: DataVolume = serde_json::from_value(dv).map_err(kube::Error::SerdeError)?;
        match dvs.create(&PostParams::default(), &dv).await {
            Ok(_) => tracing::info!("created DataVolume {ns}/{name} from VM {}'s dataVolumeTemplates", vm.name_any()),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn owner(vm: &VirtualMachine) -> OwnerReference {
    OwnerReference {
        api_version: VirtualMachine::api_version(&()).into_owned(),
        kind: VirtualMachine::kind(&()).into_owned(),
        name: vm.name_any(),
        uid: vm.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The VMI that `vm` starts.
#[must_use]
pub fn new_vmi(vm: &VirtualMachine) -> VirtualMachineInstance {
    let tmeta = vm.spec.template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.insert(VM_LABEL.to_owned(), vm.name_any());
    VirtualMachineInstance {
        metadata: ObjectMeta {
            name: Some(vm.name_any()),
            namespace: vm.namespace(),
            labels: Some(labels),
            annotations: tmeta.annotations,
            owner_references: Some(vec![owner(vm)]),
            finalizers: Some(vec![VMI_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: vm.spec.template.spec.clone().unwrap_or_default(),
        status: None,
    }
}

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

/// Errors of one lifecycle reconcile.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("VM {object}: cannot {what}")]
    Api {
        object: String,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn api_err<'a, E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    object: &'a str,
    what: &'static str,
) -> impl FnOnce(E) -> LifecycleError + 'a {
    move |e| LifecycleError::Api { object: object.to_owned(), what, source: e.into() }
}

/// Carries out `step` and schedules an unscheduled VMI.
///
/// # Errors
/// When a write fails.
pub async fn apply(
    client: &kube::Client,
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    step: &Step,
) -> Result<(), LifecycleError> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let object = format!("{ns}/{name}");
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    let first = vm.status.as_ref().and_then(|s| s.state_change_requests.first()).cloned();
    let drop_first = |first: Option<StateChangeRequest>| {
        let vms = vms.clone();
        let object = object.clone();
        let name = name.clone();
        async move {
            let Some(first) = first else { return Ok(()) };
            client::update_status(&vms, &name, |v: &mut VirtualMachine| {
                if let Some(s) = v.status.as_mut() {
                    if s.state_change_requests.first() == Some(&first) {
                        s.state_change_requests.remove(0);
                    }
                }
            })
            .await
            .map(|_| ())
            .map_err(api_err(&object, "drop a state change request"))
        }
    };
    match step {
        Step::Nothing => {}
        Step::Create => {
            match vmis.create(&PostParams::default(), &new_vmi(vm)).await {
                Ok(_) => tracing::info!("VM {object}: created its VMI"),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(api_err(&object, "create its VMI")(e)),
            }
            if first.as_ref().is_some_and(|r| r.action == "Start") {
                drop_first(first).await?;
            }
        }
        Step::Delete(uid) => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            match vmis.delete(&name, &dp).await {
                Ok(_) => tracing::info!("VM {object}: deleting its VMI {uid}"),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(api_err(&object, "delete its VMI")(e)),
            }
        }
        Step::DropRequest => drop_first(first).await?,
        Step::Halt => {
            client::update(&vms, &name, |v: &mut VirtualMachine| {
                if v.spec.running.is_some() {
                    v.spec.running = Some(false);
                } else {
                    v.spec.run_strategy = Some(RunStrategy::Halted.as_str().to_owned());
                }
            })
            .await
            .map_err(api_err(&object, "set runStrategy Halted after its one run"))?;
        }
    }
    if let Some(v) = vmi {
        release_orphan_finalizer(client, v).await.map_err(api_err(&object, "release its VMI's finalizer"))?;
        schedule(client, v).await?;
    }
    Ok(())
}

/// Removes [`VMI_FINALIZER`] from a deleting VMI that no node agent will ever finish: never
/// scheduled, or scheduled onto a node that is no longer registered.
async fn release_orphan_finalizer(
    client: &kube::Client,
    vmi: &VirtualMachineInstance,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if !deleting(vmi) || !vmi.finalizers().iter().any(|f| f == VMI_FINALIZER) {
        return Ok(());
    }
    if let Some(node) = vmi.status.as_ref().and_then(|s| s.node_name.as_deref()) {
        let nodes: Api<Node> = Api::all(client.clone());
        if nodes.get_opt(node).await?.is_some() {
            return Ok(()); // its node agent stops QEMU and removes the finalizer
        }
    }
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    client::update(&vmis, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
        if let Some(f) = v.metadata.finalizers.as_mut() {
            f.retain(|x| x != VMI_FINALIZER);
        }
    })
    .await?;
    Ok(())
}

/// Assigns a new VMI to a node (label, then `status.nodeName` and phase `Scheduled`), or marks
/// it unschedulable.
async fn schedule(client: &kube::Client, vmi: &VirtualMachineInstance) -> Result<(), LifecycleError> {
    let st = vmi.status.clone().unwrap_or_default();
    if deleting(vmi) || st.node_name.is_some() || !matches!(st.phase.as_deref(), None | Some("" | "Pending")) {
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
                s.phase = Some("Scheduled".to_owned());
                set_condition(&mut s.conditions, condition("PodScheduled", true, "Scheduled", &format!("assigned to node {node}")));
            })
            .await
            .map_err(api_err(&object, "schedule its VMI"))?;
            tracing::info!("VMI {object}: scheduled onto node {node}");
        }
        None => {
            client::update_status(&vmis, &name, |v: &mut VirtualMachineInstance| {
                let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
                s.phase = Some("Pending".to_owned());
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

/// Writes the VM's `status` from what was observed (after the step).
///
/// # Errors
/// When the write fails.
pub async fn write_status(
    client: &kube::Client,
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    volumes: &Volumes,
    extra: &[(Condition, bool)],
) -> Result<(), LifecycleError> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let object = format!("{ns}/{name}");
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let printable = printable_status(vm, vmi, volumes);
    let ready = vmi.is_some_and(|v| phase(v) == "Running" && !deleting(v));
    let ready_cond = match vmi {
        None => condition("Ready", false, "VMINotExists", "VMI does not exist"),
        Some(v) if ready => condition("Ready", true, "", &format!("VMI {} is running", v.name_any())),
        Some(v) => {
            condition("Ready", false, "VMINotRunning", &format!("VMI is {}", if phase(v).is_empty() { "Pending" } else { phase(v) }))
        }
    };
    let volumes_cond = match volumes {
        Volumes::Ready => None,
        other => other.printable().map(|(s, m)| condition("DataVolumesReady", false, s, m)),
    };
    client::update_status(&vms, &name, |v: &mut VirtualMachine| {
        let s = v.status.get_or_insert_with(Default::default);
        s.printable_status = Some(printable.to_owned());
        s.ready = Some(ready);
        s.created = Some(vmi.is_some());
        let mut rc = ready_cond.clone();
        if rc.reason.as_deref() == Some("") {
            rc.reason = None;
        }
        set_condition(&mut s.conditions, rc);
        match &volumes_cond {
            Some(c) => set_condition(&mut s.conditions, c.clone()),
            None => s.conditions.retain(|c| c.type_ != "DataVolumesReady"),
        }
        for (c, present) in extra {
            if *present {
                set_condition(&mut s.conditions, c.clone());
            } else {
                s.conditions.retain(|x| x.type_ != c.type_);
            }
        }
    })
    .await
    .map_err(api_err(&object, "write its status"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[allow(clippy::needless_pass_by_value)]
    fn vm(strategy: &str, requests: Value) -> VirtualMachine {
        serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "v", "namespace": "d", "uid": "vm-uid"},
            "spec": {"runStrategy": strategy, "template": {"spec": {"domain": {}}}}, "status": {"stateChangeRequests": requests}}),
        )
        .unwrap()
    }
    fn vmi(phase: &str, uid: &str) -> VirtualMachineInstance {
        serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v", "uid": uid},
            "spec": {"domain": {}}, "status": {"phase": phase}}),
        )
        .unwrap()
    }

    #[test]
    fn strategies_create_replace_and_delete() {
        let none = json!([]);
        assert_eq!(decide(&vm("Always", none.clone()), None, true), Step::Create);
        assert_eq!(decide(&vm("Always", none.clone()), None, false), Step::Nothing, "waits for its volumes");
        assert_eq!(decide(&vm("Always", none.clone()), Some(&vmi("Succeeded", "a")), true), Step::Delete("a".into()));
        assert_eq!(decide(&vm("RerunOnFailure", none.clone()), Some(&vmi("Succeeded", "a")), true), Step::Nothing);
        assert_eq!(decide(&vm("RerunOnFailure", none.clone()), Some(&vmi("Failed", "a")), true), Step::Delete("a".into()));
        assert_eq!(decide(&vm("Once", none.clone()), Some(&vmi("Failed", "a")), true), Step::Halt);
        assert_eq!(decide(&vm("Halted", none.clone()), Some(&vmi("Running", "a")), true), Step::Delete("a".into()));
        assert_eq!(decide(&vm("Manual", none.clone()), None, true), Step::Nothing);
        assert_eq!(decide(&vm("Manual", none), Some(&vmi("Failed", "a")), true), Step::Nothing);
    }

    #[test]
    fn requests_stop_only_the_vmi_they_name_then_start() {
        let restart = json!([{"action": "Stop", "uid": "a"}, {"action": "Start"}]);
        assert_eq!(decide(&vm("Manual", restart.clone()), Some(&vmi("Running", "a")), true), Step::Delete("a".into()));
        assert_eq!(
            decide(&vm("Manual", restart.clone()), Some(&vmi("Running", "b")), true),
            Step::DropRequest,
            "a newer VMI is left alone"
        );
        assert_eq!(decide(&vm("Manual", restart), None, true), Step::DropRequest);
        assert_eq!(decide(&vm("Always", json!([{"action": "Start"}])), None, true), Step::Create);
        assert_eq!(decide(&vm("Manual", json!([{"action": "Start"}])), Some(&vmi("Running", "b")), true), Step::DropRequest);
    }

    #[test]
    fn printable_status_follows_the_vmi_and_the_volumes() {
        let v = vm("Always", json!([]));
        assert_eq!(printable_status(&v, None, &Volumes::Ready), "Starting");
        assert_eq!(printable_status(&v, None, &Volumes::WaitingForBinding(String::new())), "WaitingForVolumeBinding");
        assert_eq!(printable_status(&v, None, &Volumes::Provisioning(String::new())), "Provisioning");
        assert_eq!(printable_status(&v, Some(&vmi("Running", "a")), &Volumes::Ready), "Running");
        assert_eq!(printable_status(&vm("Halted", json!([])), None, &Volumes::NotFound(String::new())), "Stopped");
        let mut unsched = vmi("Pending", "a");
        unsched.status.as_mut().unwrap().conditions.push(condition("PodScheduled", false, "Unschedulable", ""));
        assert_eq!(printable_status(&v, Some(&unsched), &Volumes::Ready), "ErrorUnschedulable");
        let mut stopping = vmi("Running", "a");
        stopping.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(printable_status(&v, Some(&stopping), &Volumes::Ready), "Stopping");
    }
}
