//! The controllers, wired: VMs (lifecycle, self-heal, legacy requests, declarative hot-plug),
//! claims (local provisioner) and DataVolumes (import), each a kube-runtime `Controller`.
//!
//! # The VM reconcile, in order
//! 1. self-heal: re-add the drive of a marked virtual-media volume that lost it;
//! 2. legacy `status.volumeRequests`: applied (legacy gate on) or reported;
//! 3. `dataVolumeTemplates` → DataVolumes;
//! 4. lifecycle: one [`lifecycle::Step`], and scheduling of a new VMI;
//! 5. declarative hot-plug of the running VMI, and its volumes' `Pending`/`Bound` status;
//! 6. the VM's status, with the `SpecValid` and `VolumeRequestsPending` conditions.
//!
//! Every input is watched — the VM, its VMI (same name), the claims and DataVolumes its
//! volumes name — so nothing needs a timed re-queue; errors back off.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::ResourceExt;
use serde_json::Value;

use api::{DataVolume, VirtualMachine, VirtualMachineInstance};
use client::events::{self, EventType};

use crate::lifecycle::{self, condition};
use crate::storage::import::ImportConfig;
use crate::{selfheal, volume_requests};

/// Conflict re-plans per hot-plug reconcile before backing off.
const ATTEMPTS: u32 = 5;
const COMPONENT: &str = "virtplug-controller";

/// What the controller runs with.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Process legacy `status.volumeRequests` (KubeVirt's `HotplugVolumes` gate). Default off:
    /// declarative hot-plug, and pending requests are reported.
    pub legacy_volume_requests: bool,
    /// Run the local provisioner and DataVolume import over this directory (embedded
    /// deployment). `None` in cluster mode, where a CSI driver and CDI do that.
    pub storage_root: Option<PathBuf>,
    pub import: ImportConfig,
}

struct Ctx {
    client: kube::Client,
    config: Config,
}

/// Errors of one VM reconcile.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error(transparent)]
    Lifecycle(#[from] lifecycle::LifecycleError),
    #[error(transparent)]
    Hotplug(#[from] crate::hotplug::ReconcileError),
    #[error("VM {object}: cannot {what}")]
    Api {
        object: String,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn api_err<'a, E: Into<Box<dyn std::error::Error + Send + Sync>>>(object: &'a str, what: &'static str) -> impl FnOnce(E) -> VmError + 'a {
    move |e| VmError::Api { object: object.to_owned(), what, source: e.into() }
}

async fn reconcile_vm(vm: Arc<VirtualMachine>, ctx: Arc<Ctx>) -> Result<Action, VmError> {
    let r = reconcile_vm_once(vm, ctx).await;
    crate::metrics::count("vm", r.is_ok());
    r
}

async fn reconcile_vm_once(vm: Arc<VirtualMachine>, ctx: Arc<Ctx>) -> Result<Action, VmError> {
    let client = &ctx.client;
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let object = format!("{ns}/{name}");
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);

    // 1. Self-heal: a marked virtual-media volume that lost its drive gets it back.
    let raw = serde_json::to_value(vm.as_ref()).unwrap_or(Value::Null);
    let drives = selfheal::missing_drives(&raw);
    if !drives.is_empty() {
        let names: Vec<String> = drives.iter().filter_map(|d| d["name"].as_str().map(str::to_owned)).collect();
        client::update(&vms, &name, |v: &mut VirtualMachine| {
            let Some(spec) = v.spec.template.spec.as_mut() else { return };
            for d in &drives {
                let n = d["name"].as_str().unwrap_or_default();
                if !spec.domain.devices.disks.iter().any(|x| x.name == n) && spec.volumes.iter().any(|x| x.name == n) {
                    if let Ok(disk) = serde_json::from_value(d.clone()) {
                        spec.domain.devices.disks.push(disk);
                    }
                }
            }
        })
        .await
        .map_err(api_err(&object, "restore a virtual-media drive"))?;
        let msg = format!("re-added the CD-ROM drive of virtual-media volume(s) {} (their disk was missing)", names.join(", "));
        events::publish(client, COMPONENT, vm.as_ref(), EventType::Normal, "VirtualMediaDriveRestored", &msg).await;
        return Ok(Action::await_change()); // the write wakes a fresh reconcile
    }
    let violations = selfheal::violations(&vm);
    let spec_cond = condition(selfheal::CONDITION, false, "InvariantViolated", &selfheal::describe(&violations));
    let had = vm.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == selfheal::CONDITION)).and_then(|c| c.message.clone());
    if !violations.is_empty() && had.as_ref() != spec_cond.message.as_ref() {
        events::publish(
            client,
            COMPONENT,
            vm.as_ref(),
            EventType::Warning,
            "InvariantViolated",
            spec_cond.message.as_deref().unwrap_or_default(),
        )
        .await;
    }

    // 2. Legacy volume requests.
    let requests = vm.status.as_ref().map(|s| s.volume_requests.clone()).unwrap_or_default();
    let mut requests_pending = false;
    if !requests.is_empty() {
        if ctx.config.legacy_volume_requests {
            let mut refused = Vec::new();
            client::update(&vms, &name, |v: &mut VirtualMachine| {
                refused.clear();
                let mut t = serde_json::to_value(v.spec.template.spec.clone()).unwrap_or(Value::Null);
                for r in &requests {
                    if let volume_requests::Outcome::Refused(m) = volume_requests::apply(&mut t, r) {
                        refused.push(m);
                    }
                }
                if let Ok(spec) = serde_json::from_value(t) {
                    v.spec.template.spec = Some(spec);
                }
            })
            .await
            .map_err(api_err(&object, "apply its volume requests"))?;
            client::update_status(&vms, &name, |v: &mut VirtualMachine| {
                if let Some(s) = v.status.as_mut() {
                    s.volume_requests.retain(|r| !requests.contains(r));
                }
            })
            .await
            .map_err(api_err(&object, "clear its volume requests"))?;
            for m in refused {
                events::publish(client, COMPONENT, vm.as_ref(), EventType::Warning, "VolumeRequestRefused", &m).await;
            }
            return Ok(Action::await_change());
        }
        requests_pending = true;
    }

    // 3. DataVolumes from templates.
    lifecycle::create_data_volumes(client, &vm).await.map_err(api_err(&object, "create its DataVolumes"))?;

    // 4. Lifecycle.
    let vmi = vmis.get_opt(&name).await.map_err(api_err(&object, "read its VMI"))?;
    let vol = lifecycle::volumes(client, &vm).await.map_err(api_err(&object, "read its volumes"))?;
    let step = lifecycle::decide(&vm, vmi.as_ref(), vol == lifecycle::Volumes::Ready && violations.is_empty());
    lifecycle::apply(client, &vm, vmi.as_ref(), &step).await?;
    let vmi = if step == lifecycle::Step::Nothing { vmi } else { vmis.get_opt(&name).await.map_err(api_err(&object, "read its VMI"))? };

    // 5. Hot-plug into the running VMI (only one the VM owns).
    if let Some(v) = &vmi {
        let owned = v.owner_references().iter().any(|o| o.kind == "VirtualMachine" && Some(&o.uid) == vm.uid().as_ref());
        if owned {
            crate::hotplug::reconcile(client, &ns, &name, ATTEMPTS, None).await?;
            if let Some(fresh) = vmis.get_opt(&name).await.map_err(api_err(&object, "read its VMI"))? {
                crate::hotplug::report_claims(client, &fresh).await.map_err(api_err(&object, "report its hot-plug volumes"))?;
            }
        }
    }

    // 6. Status.
    let fresh = vms.get_opt(&name).await.map_err(api_err(&object, "read it"))?;
    let Some(fresh) = fresh else { return Ok(Action::await_change()) };
    let extra = [
        (spec_cond, !violations.is_empty()),
        (
            condition(
                volume_requests::CONDITION,
                true,
                "DeclarativeHotplugEnabled",
                &volume_requests::pending_message(&ns, &name, requests.len()),
            ),
            requests_pending,
        ),
    ];
    lifecycle::write_status(client, &fresh, vmi.as_ref(), &vol, &extra).await?;
    Ok(Action::await_change())
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(vm: Arc<VirtualMachine>, err: &VmError, _: Arc<Ctx>) -> Action {
    tracing::warn!("VM {}/{}: {}", vm.namespace().unwrap_or_default(), vm.name_any(), client::error_chain(err));
    Action::requeue(Duration::from_secs(2))
}

/// The VMs in the store that name `claim` (a claim or a DataVolume) in namespace `ns`.
fn vms_using(store: &kube::runtime::reflector::Store<VirtualMachine>, ns: &str, claim: &str) -> Vec<ObjectRef<VirtualMachine>> {
    store
        .state()
        .iter()
        .filter(|vm| vm.namespace().as_deref() == Some(ns))
        .filter(|vm| {
            vm.spec.template.spec.as_ref().is_some_and(|s| {
                s.volumes.iter().any(|v| {
                    v.persistent_volume_claim.as_ref().is_some_and(|p| p.claim_name == claim)
                        || v.data_volume.as_ref().is_some_and(|d| d.name == claim)
                })
            })
        })
        .map(|vm| ObjectRef::from_obj(vm.as_ref()))
        .collect()
}

/// Runs the VM controller (and, with a storage root, the provisioner and importer) until the
/// process stops.
pub async fn run_with(client: kube::Client, config: Config) {
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(root) = config.storage_root.clone() {
        tasks.spawn(crate::storage::provisioner::run(client.clone(), root.clone()));
        let (c, import) = (client.clone(), config.import.clone());
        tasks.spawn(async move {
            if let Err(e) = crate::storage::import::run(c, root, import).await {
                tracing::error!("the DataVolume importer cannot start: {e}");
            }
        });
    }
    let vms: Api<VirtualMachine> = Api::all(client.clone());
    let vmis: Api<VirtualMachineInstance> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let dvs: Api<DataVolume> = Api::all(client.clone());
    let ctx = Arc::new(Ctx { client, config });
    let controller = Controller::new(vms, watcher::Config::default());
    let (s1, s2) = (controller.store(), controller.store());
    controller
        // A VMI wakes the VM of the same name (its owner in KubeVirt's naming).
        .watches(vmis, watcher::Config::default(), |vmi| Some(ObjectRef::new(&vmi.name_any()).within(&vmi.namespace().unwrap_or_default())))
        .watches(pvcs, watcher::Config::default(), move |p| vms_using(&s1, &p.namespace().unwrap_or_default(), &p.name_any()))
        .watches(dvs, watcher::Config::default(), move |d| vms_using(&s2, &d.namespace().unwrap_or_default(), &d.name_any()))
        .run(reconcile_vm, error_policy, ctx)
        .for_each(|_| async {})
        .await;
    tasks.shutdown().await;
}

/// Runs the VM controller with the defaults (cluster mode: no local storage).
pub async fn run(client: kube::Client) {
    run_with(client, Config::default()).await;
}
