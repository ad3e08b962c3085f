//! The controller loop. For now it runs declarative hot-plug: a kube-runtime `Controller` over
//! VirtualMachines, woken by changes to a VM and to the VMI of the same name, that calls
//! [`crate::hotplug::reconcile`] for the VMI. VM lifecycle (creating and deleting VMIs) comes
//! with the rest of the controller.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::ResourceExt;

use api::{VirtualMachine, VirtualMachineInstance};

/// Conflict re-plans per reconcile before backing off.
const ATTEMPTS: u32 = 5;

struct Ctx {
    client: kube::Client,
}

async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Ctx>) -> Result<Action, crate::hotplug::ReconcileError> {
    let ns = vm.namespace().unwrap_or_default();
    crate::hotplug::reconcile(&ctx.client, &ns, &vm.name_any(), ATTEMPTS, None).await?;
    // Every input is watched (the VM and its VMI), so nothing needs a timed re-queue.
    Ok(Action::await_change())
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(vm: Arc<VirtualMachine>, err: &crate::hotplug::ReconcileError, _: Arc<Ctx>) -> Action {
    tracing::warn!("declarative hot-plug of VM {}/{} failed: {err}", vm.namespace().unwrap_or_default(), vm.name_any());
    Action::requeue(Duration::from_secs(5))
}

/// Runs until the process stops.
pub async fn run(client: kube::Client) {
    let vms: Api<VirtualMachine> = Api::all(client.clone());
    let vmis: Api<VirtualMachineInstance> = Api::all(client.clone());
    let ctx = Arc::new(Ctx { client });
    Controller::new(vms, watcher::Config::default())
        // A VMI wakes the VM of the same name (its owner in KubeVirt's naming).
        .watches(vmis, watcher::Config::default(), |vmi| Some(ObjectRef::new(&vmi.name_any()).within(&vmi.namespace().unwrap_or_default())))
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
