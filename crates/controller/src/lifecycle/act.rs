//! Carrying out a lifecycle [`Step`]: create or delete the VMI, drop a request, halt; the
//! VM's DataVolumes from its templates.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::Value;

use api::kubevirt::{RunStrategy, StateChangeRequest};
use api::phases::StateChangeAction;
use api::{DataVolume, VirtualMachine, VirtualMachineInstance};

use super::{api_err, deleting, schedule::schedule, LifecycleError, Step, VMI_FINALIZER, VM_LABEL};
use crate::cache::{Cache, Lookup};

/// Creates the DataVolumes of `spec.dataVolumeTemplates` that do not exist (not in `lookup`),
/// owned by the VM.
///
/// # Errors
/// When a template cannot be read or a create fails for another reason than "exists".
pub async fn create_data_volumes(client: &kube::Client, lookup: &impl Lookup, vm: &VirtualMachine) -> Result<(), kube::Error> {
    let Some(templates) = vm.spec.extra.get("dataVolumeTemplates").and_then(Value::as_array) else { return Ok(()) };
    let ns = vm.namespace().unwrap_or_default();
    let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
    for t in templates {
        let Some(name) = t.pointer("/metadata/name").and_then(Value::as_str) else { continue };
        if lookup.dv(&ns, name).is_some() {
            continue;
        }
        let mut dv = serde_json::json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": t.get("metadata").cloned().unwrap_or_default(), "spec": t.get("spec").cloned().unwrap_or_default()});
        dv["metadata"]["namespace"] = Value::String(ns.clone());
        dv["metadata"]["ownerReferences"] = serde_json::to_value([owner(vm)]).map_err(kube::Error::SerdeError)?;
        let dv: DataVolume = serde_json::from_value(dv).map_err(kube::Error::SerdeError)?;
        match dvs.create(&PostParams::default(), &dv).await {
            Ok(_) => tracing::info!(datavolume = %format!("{ns}/{name}"), "created a DataVolume from the VM's dataVolumeTemplates"),
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

/// The VMI just created from `vm` booted with its one-time boot override: the VM goes back to
/// its original boot order ([`api::virtual_media::consume_once`]). Only the override that VMI
/// got is consumed; one set since then stays for the next start.
async fn consume_boot_once(vms: &Api<VirtualMachine>, vm: &VirtualMachine, object: &str) -> Result<(), LifecycleError> {
    use api::virtual_media::{boot_override, consume_once, Enabled};
    let used = boot_override(vm);
    if used.as_ref().is_none_or(|o| o.enabled != Enabled::Once) {
        return Ok(());
    }
    client::update(vms, &vm.name_any(), |v: &mut VirtualMachine| {
        if boot_override(v) == used {
            // A VM without a template cannot carry an override; nothing to restore.
            let _ = consume_once(v);
        }
    })
    .await
    .map_err(api_err(object, "restore its boot order after a one-time override"))?;
    tracing::info!("the one-time boot override was used by the new VMI; the VM's boot order is restored");
    Ok(())
}

/// Carries out `step` and places an unplaced VMI (by `placement`).
///
/// # Errors
/// When a write fails.
pub async fn apply(
    client: &kube::Client,
    cache: &Cache,
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    step: &Step,
    placement: &super::Placement,
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
                Ok(_) => {
                    tracing::info!("created its VMI");
                    consume_boot_once(&vms, vm, &object).await?;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(api_err(&object, "create its VMI")(e)),
            }
            if first.as_ref().is_some_and(|r| r.action == StateChangeAction::Start) {
                drop_first(first).await?;
            }
        }
        Step::Delete(uid) => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                ..DeleteParams::default()
            };
            match vmis.delete(&name, &dp).await {
                Ok(_) => tracing::info!(vmi.uid = %uid, "deleting its VMI"),
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
        release_orphan_finalizer(client, cache, v).await.map_err(api_err(&object, "release its VMI's finalizer"))?;
        // The one place the two placements differ.
        match placement {
            super::Placement::Direct => schedule(client, cache, v).await?,
            super::Placement::Pods(cfg) => super::launcher_pod::place(client, cache, cfg, v).await?,
        }
    }
    Ok(())
}

/// Removes [`VMI_FINALIZER`] from a deleting VMI that no node agent will ever finish: never
/// scheduled, scheduled onto a node that is no longer registered, or onto a fenced node
/// ([`crate::nodes::fenced`]) whose agent is gone (its QEMU went with the machine).
async fn release_orphan_finalizer(
    client: &kube::Client,
    cache: &Cache,
    vmi: &VirtualMachineInstance,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if !deleting(vmi) || !vmi.finalizers().iter().any(|f| f == VMI_FINALIZER) {
        return Ok(());
    }
    if let Some(node) = vmi.status.as_ref().and_then(|s| s.node_name.as_deref()) {
        // The store first; a GET confirms before a finalizer is released on its word.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let gone_or_fenced = |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.is_none_or(|n| {
                crate::nodes::fenced(n) && n.labels().get(api::annotations::NODE_SCHEDULABLE).map(String::as_str) != Some("true")
            })
        };
        if !gone_or_fenced(cache.node(node).as_deref()) || !gone_or_fenced(nodes.get_opt(node).await?.as_ref()) {
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
