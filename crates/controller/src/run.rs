//! The controllers, wired: VMs (lifecycle, self-heal, legacy requests, declarative hot-plug;
//! [`crate::reconcile`]), claims (local provisioner) and DataVolumes (import), each a
//! [`crate::runner::Runner`] (kube-runtime's `Controller`, without its timer on each event).
//!
//! The VM controller watches its VMs, their VMIs (same name), and the claims and DataVolumes
//! their volumes name, so nothing needs a timed re-queue (errors back off). Each watch also
//! fills a reflector store ([`crate::cache::Cache`]) that the reconcile reads instead of GETs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use api::{DataVolume, VirtualMachine, VirtualMachineInstance};

use crate::cache::Cache;
use crate::reconcile::{reconcile_vm, Ctx};
use crate::runner::{Action, Runner};
use crate::storage::import::ImportConfig;

pub use crate::reconcile::VmError;

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
    /// A node whose agent has not heartbeated for this long is taken out of scheduling
    /// ([`crate::nodes`]; default [`crate::nodes::DEFAULT_HEARTBEAT_TIMEOUT`]).
    pub node_heartbeat_timeout: Option<Duration>,
    /// How VMIs get their node ([`crate::lifecycle::Placement`]; default: the controller picks).
    pub placement: crate::lifecycle::Placement,
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(vm: Arc<VirtualMachine>, err: &VmError, _: Arc<Ctx>) -> Action {
    let object = format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
    tracing::warn!(vm = %object, "{}", client::error_chain(err));
    Action::requeue(Duration::from_secs(2))
}

/// [`reconcile_vm`], with a panic caught: kube-runtime polls every reconcile inside the
/// controller's own stream, so a panic on one VM's data would end `run` for every VM. Caught,
/// it is an error for that VM: logged, and requeued by [`error_policy`].
async fn guarded_reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Ctx>) -> Result<Action, VmError> {
    let object = format!("VM {}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
    let fault = injected_fault(&object);
    let r = client::panics::catch(object, "reconcile", async move {
        // Test-only fault injection (see `injected_fault`).
        assert!(!fault, "fault injected by VIRTPLUG_FAULT");
        reconcile_vm(vm, ctx).await
    })
    .await;
    if r.is_err() {
        // `reconcile_vm` counts the reconciles that end; one that panicked is an error too.
        crate::metrics::count("vm", false);
    }
    r?
}

/// Whether `VIRTPLUG_FAULT` (a comma-separated list) names `reconcile:NS/NAME` for this VM:
/// the tests' only way to make one VM's reconcile panic, as a bug on its data would. Unset in
/// production, where it costs one environment lookup per reconcile.
fn injected_fault(object: &str) -> bool {
    std::env::var("VIRTPLUG_FAULT")
        .is_ok_and(|v| v.split(',').any(|f| f.strip_prefix("reconcile:").is_some_and(|vm| object == format!("VM {vm}"))))
}

/// The VMs in the store that name `claim` (a claim or a DataVolume) in namespace `ns`.
fn vms_using(store: &Store<VirtualMachine>, ns: &str, claim: &str) -> Vec<ObjectRef<VirtualMachine>> {
    store
        .state()
        .iter()
        .filter(|vm| vm.namespace().as_deref() == Some(ns))
        .filter(|vm| vm.spec.template.spec.as_ref().is_some_and(|s| s.volumes.iter().any(|v| v.claim_name() == Some(claim))))
        .map(|vm| ObjectRef::from_obj(vm.as_ref()))
        .collect()
}

/// The VMs a StorageClass event may unblock: those naming an unbound claim of `class` when the
/// class waits for its first consumer (such a claim is then carried by an attachment pod). An
/// `Immediate` class changes no decision (a class the store does not know counts as one), and
/// `volumeBindingMode` cannot change once set: its other events wake nothing.
fn vms_using_class(vms: &Store<VirtualMachine>, pvcs: &Store<PersistentVolumeClaim>, sc: &StorageClass) -> Vec<ObjectRef<VirtualMachine>> {
    if sc.volume_binding_mode.as_deref() != Some(crate::storage::class::WAIT_FOR_FIRST_CONSUMER) {
        return Vec::new();
    }
    let class = sc.name_any();
    pvcs.state()
        .iter()
        .filter(|p| !api::phases::ClaimPhase::is_bound(p))
        .filter(|p| p.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(class.as_str()))
        .flat_map(|p| vms_using(vms, &p.namespace().unwrap_or_default(), &p.name_any()))
        .collect()
}

/// The VMs a Node change may unblock: those whose VMI waits for a node, and those whose VMI is
/// being deleted from this node (a fenced or removed node releases its finalizer).
fn vms_waiting_for(vmis: &Store<VirtualMachineInstance>, node: &str) -> Vec<ObjectRef<VirtualMachine>> {
    vmis.state()
        .iter()
        .filter(|v| {
            let on = v.status.as_ref().and_then(|s| s.node_name.as_deref());
            (on.is_none() && v.metadata.deletion_timestamp.is_none()) || (on == Some(node) && v.metadata.deletion_timestamp.is_some())
        })
        .map(|v| ObjectRef::new(&v.name_any()).within(&v.namespace().unwrap_or_default()))
        .collect()
}

/// A watch of every `K` that fills a store as it goes: the store, and the stream of touched
/// objects for [`Controller::watches_stream`].
fn stored<K>(client: &kube::Client) -> (Store<K>, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(Api::<K>::all(client.clone()), watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    (store, stream)
}

/// Runs the VM controller (and, with a storage root, the provisioner and importer) until the
/// process stops.
pub async fn run_with(client: kube::Client, config: Config) {
    run_with_storage_client(client.clone(), client, config).await;
}

/// [`run_with`], with the provisioner and importer on a client of their own, `storage`: with a
/// User-Agent of its own, the API server's audit log tells their requests from the VM
/// controller's, so a cluster role for the controller need not grant what only the embedded
/// storage does (`deploy/20-rbac.yaml`).
pub async fn run_with_storage_client(client: kube::Client, storage: kube::Client, config: Config) {
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(root) = config.storage_root.clone() {
        tasks.spawn(crate::storage::provisioner::run(storage.clone(), root.clone()));
        let (c, import) = (storage, config.import.clone());
        tasks.spawn(async move {
            if let Err(e) = crate::storage::import::run(c, root, import).await {
                tracing::error!("the DataVolume importer cannot start: {e}");
            }
        });
    }
    let (vmis, vmi_events) = stored::<VirtualMachineInstance>(&client);
    let (pvcs, pvc_events) = stored::<PersistentVolumeClaim>(&client);
    let (dvs, dv_events) = stored::<DataVolume>(&client);
    let (nodes, node_events) = stored::<Node>(&client);
    // Pods, and the StorageClasses that say whether a pod must consume a claim before it
    // binds, are watched only when the controller makes pods.
    let ((classes, class_events), (pods, pod_events)) = if config.placement == crate::lifecycle::Placement::Direct {
        ((reflector::store().0, futures::stream::empty().boxed()), (reflector::store().0, futures::stream::empty().boxed()))
    } else {
        let (class_store, class_events) = stored::<StorageClass>(&client);
        let (writer_store, writer) = reflector::store();
        // Launcher and attachment pods (`kubevirt.io` = `virt-launcher` / `hotplug-disk`).
        let selector = crate::lifecycle::launcher_pod::APP_LABEL.to_owned();
        let watch = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default().labels(&selector)).default_backoff();
        ((class_store, class_events.boxed()), (writer_store, reflector::reflector(writer, watch).touched_objects().boxed()))
    };
    let timeout = config.node_heartbeat_timeout.unwrap_or(crate::nodes::DEFAULT_HEARTBEAT_TIMEOUT);
    tasks.spawn(crate::nodes::run(client.clone(), timeout));
    let controller = Runner::new(Api::<VirtualMachine>::all(client.clone()), watcher::Config::default());
    let (s1, s2, s3, s4, claims) = (controller.store(), controller.store(), vmis.clone(), controller.store(), pvcs.clone());
    let cache = Cache { vms: controller.store(), vmis, pvcs, dvs, nodes, pods, classes };
    let ctx = Arc::new(Ctx { client, legacy_volume_requests: config.legacy_volume_requests, cache, placement: config.placement });
    controller
        // A VMI wakes the VM of the same name (its owner in KubeVirt's naming).
        .watches_stream(vmi_events, |vmi| Some(ObjectRef::new(&vmi.name_any()).within(&vmi.namespace().unwrap_or_default())))
        .watches_stream(pvc_events, move |p| vms_using(&s1, &p.namespace().unwrap_or_default(), &p.name_any()))
        .watches_stream(dv_events, move |d| vms_using(&s2, &d.namespace().unwrap_or_default(), &d.name_any()))
        .watches_stream(node_events, move |n| vms_waiting_for(&s3, &n.name_any()))
        // A class created or changed after its claims: their VMs decide again.
        .watches_stream(class_events, move |sc: StorageClass| vms_using_class(&s4, &claims, &sc))
        // A launcher or attachment pod wakes the VM its label names (the VMI's name is the VM's).
        .watches_stream(pod_events, |p: Pod| {
            let vm = p.labels().get(crate::lifecycle::VM_LABEL)?.clone();
            Some(ObjectRef::new(&vm).within(&p.namespace().unwrap_or_default()))
        })
        .run(guarded_reconcile, error_policy, ctx)
        .await;
    tasks.shutdown().await;
}

/// Runs the VM controller with the defaults (cluster mode: no local storage).
pub async fn run(client: kube::Client) {
    run_with(client, Config::default()).await;
}
