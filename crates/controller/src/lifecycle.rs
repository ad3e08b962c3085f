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
//!   `Succeeded` (hot-plug volumes are plugged when they are ready; a virtual medium, though
//!   hot-pluggable, gates the start too: the firmware must find it in the drive), and the
//!   template holds [`api::invariants`]. With launcher pods, a claim that waits for its first
//!   consumer counts as ready: the launcher pod is that consumer ([`volumes`]).
//! - A VMI created from a VM with a one-time (`Once`) boot override boots with it, and the VM
//!   goes back to its original boot order ([`api::virtual_media::consume_once`]).
//! - The VMI gets the template's metadata and spec, an owner reference to the VM (controller,
//!   block owner deletion: garbage-collected with it), the label `vm.kubevirt.io/name` and the
//!   finalizer [`VMI_FINALIZER`], which the node agent removes once QEMU is gone. A VMI that was
//!   never scheduled, or whose node is no longer registered, has nothing to wait for: the
//!   controller removes the finalizer itself.
//! - Placement ([`Placement`]): by the controller ([`schedule`], the default) or by a launcher
//!   pod per VMI that the cluster's scheduler places ([`launcher_pod`], `--placement pods`).
//! - Scheduling ([`schedule`]): a `Ready`, uncordoned node with a heartbeating node agent whose
//!   taints the VMI tolerates and whose labels match its node selector and required affinity, the
//!   one with the fewest VMIs; none → the VMI stays `Pending` with
//!   `PodScheduled=False/Unschedulable` (kube-scheduler's message) and the VM shows
//!   `ErrorUnschedulable`.
//! - Crash loops ([`start_failure`]): VMIs that fail before they run are counted in
//!   `status.startFailure` and the next one waits KubeVirt's growing delay (`CrashLoopBackOff`).
//! - A running VMI whose `Paused` condition is `True` (the node agent stopped its vCPUs at a
//!   `pause`) shows `Paused`; the condition is copied to the VM, as KubeVirt copies it.

mod act;
pub mod launcher_pod;
pub mod provisioning;
pub mod schedule;
pub mod start_failure;
mod vm_status;

use kube::ResourceExt;

use api::kubevirt::RunStrategy;
use api::phases::{ClaimPhase, DataVolumePhase, PrintableStatus, StateChangeAction, VmiPhase};
use api::{VirtualMachine, VirtualMachineInstance};

use crate::cache::Lookup;

pub use act::{apply, create_data_volumes, new_vmi};
pub use launcher_pod::{LauncherPods, Placement};
pub use schedule::pick_node;
pub use vm_status::{condition, set_condition, write_status};

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
    pub(crate) fn printable(&self) -> Option<(PrintableStatus, &str)> {
        match self {
            Volumes::Ready => None,
            Volumes::Provisioning(m) => Some((PrintableStatus::Provisioning, m)),
            Volumes::WaitingForBinding(m) => Some((PrintableStatus::WaitingForVolumeBinding, m)),
            Volumes::NotFound(m) => Some((PrintableStatus::ErrorPvcNotFound, m)),
            Volumes::Failed(m) => Some((PrintableStatus::DataVolumeError, m)),
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

fn finished(vmi: &VirtualMachineInstance) -> bool {
    vmi.phase().is_some_and(VmiPhase::is_final)
}

pub(crate) fn deleting(vmi: &VirtualMachineInstance) -> bool {
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
        return match (&req.action, vmi) {
            (StateChangeAction::Stop, Some(v)) if req.uid.is_none() || req.uid == v.uid() => delete(v),
            (StateChangeAction::Stop, _) => Step::DropRequest,
            (StateChangeAction::Start, Some(v)) if deleting(v) => Step::Nothing,
            (StateChangeAction::Start, Some(_)) => Step::DropRequest,
            (StateChangeAction::Start, None) if can_start => Step::Create,
            (StateChangeAction::Start, None) => Step::Nothing,
            (StateChangeAction::Other(_), _) => Step::DropRequest, // an unknown action: KubeVirt ignores it too
        };
    }
    match (vm.spec.effective_run_strategy(), vmi) {
        (RunStrategy::Halted | RunStrategy::WaitAsReceiver, Some(v)) => delete(v),
        (RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once, None) if can_start => Step::Create,
        (RunStrategy::Always, Some(v)) if finished(v) => delete(v),
        (RunStrategy::RerunOnFailure, Some(v)) if v.phase() == Some(&VmiPhase::Failed) => delete(v),
        (RunStrategy::Once, Some(v)) if finished(v) => Step::Halt,
        _ => Step::Nothing,
    }
}

/// Whether the VM wants a VMI right now (for `printableStatus` while none exists).
fn wants_vmi(vm: &VirtualMachine) -> bool {
    let requests = vm.status.as_ref().map(|s| s.state_change_requests.as_slice()).unwrap_or_default();
    if requests.first().is_some_and(|r| r.action == StateChangeAction::Start) {
        return true;
    }
    matches!(vm.spec.effective_run_strategy(), RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once)
}

/// `status.printableStatus` of the VM (KubeVirt's values, in KubeVirt's order of precedence).
#[must_use]
pub fn printable_status(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>, volumes: &Volumes) -> PrintableStatus {
    if vm.metadata.deletion_timestamp.is_some() {
        return PrintableStatus::Terminating;
    }
    let looping = start_failure::crash_looping(vm);
    match vmi {
        Some(v) if deleting(v) => PrintableStatus::Stopping,
        Some(v) if v.is_running() && paused(v) => PrintableStatus::Paused,
        Some(v) if v.is_running() => PrintableStatus::Running,
        Some(v) if finished(v) && looping => PrintableStatus::CrashLoopBackOff,
        Some(v) if finished(v) => PrintableStatus::Stopped,
        Some(v) if unschedulable(v) => PrintableStatus::ErrorUnschedulable,
        Some(_) => PrintableStatus::Starting,
        None => match volumes.printable() {
            Some((s, _)) if wants_vmi(vm) => s,
            _ if wants_vmi(vm) && looping => PrintableStatus::CrashLoopBackOff,
            _ if wants_vmi(vm) => PrintableStatus::Starting,
            _ => PrintableStatus::Stopped,
        },
    }
}

/// The VMI's `Paused` condition, when it is `True` (set by the node agent once QEMU's vCPUs
/// are stopped).
pub(crate) fn paused_condition(vmi: &VirtualMachineInstance) -> Option<&api::kubevirt::Condition> {
    vmi.status.as_ref()?.conditions.iter().find(|c| c.type_ == api::vmi_requests::PAUSED_CONDITION && c.status == "True")
}

fn paused(vmi: &VirtualMachineInstance) -> bool {
    paused_condition(vmi).is_some()
}

fn unschedulable(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False"))
}

/// Errors of one lifecycle reconcile.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    // The object is in the message: an error travels beyond the reconcile's span.
    #[error("VM {object}: cannot {what}")]
    Api {
        object: String,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

pub(crate) fn api_err<'a, E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    object: &'a str,
    what: &'static str,
) -> impl FnOnce(E) -> LifecycleError + 'a {
    move |e| LifecycleError::Api { object: object.to_owned(), what, source: e.into() }
}

/// Checks the VM's non-hot-plug PVC and DataVolume volumes, looked up in `lookup`.
///
/// An unbound claim of a `WaitForFirstConsumer` class does not block the start
/// ([`crate::storage::class::waits_for_consumer`]): it binds only once a pod using it is
/// scheduled, and with launcher pods the VMI's launcher pod is that consumer (it carries the
/// boot claims, [`launcher_pod`]; the scheduler binds the claim on the pod's node). Only pods
/// placement has StorageClasses in its cache: with direct placement (`up`) `lookup` knows no
/// class, so every unbound claim waits for its binding as before.
#[must_use]
pub fn volumes(lookup: &impl Lookup, vm: &VirtualMachine) -> Volumes {
    let ns = vm.namespace().unwrap_or_default();
    let Some(spec) = vm.spec.template.spec.as_ref() else { return Volumes::Ready };
    // A virtual medium is hot-pluggable (it is swapped in a running guest) but must be in its
    // drive when the firmware looks: it gates the start like a boot disk.
    let media = api::virtual_media::marked(vm);
    for v in spec.volumes.iter().filter(|v| !v.is_hotpluggable() || media.contains(&v.name)) {
        if let Some(p) = &v.persistent_volume_claim {
            match lookup.pvc(&ns, &p.claim_name) {
                None => return Volumes::NotFound(format!("claim {} of volume {} does not exist; create it", p.claim_name, v.name)),
                Some(c) if !ClaimPhase::is_bound(&c) && !crate::storage::class::waits_for_consumer(&c, lookup) => {
                    return Volumes::WaitingForBinding(format!("claim {} of volume {} is not bound yet", p.claim_name, v.name));
                }
                Some(_) => {}
            }
        }
        if let Some(d) = &v.data_volume {
            match lookup.dv(&ns, &d.name) {
                None => return Volumes::NotFound(format!("DataVolume {} of volume {} does not exist; create it", d.name, v.name)),
                Some(dv) => match dv.status.as_ref().and_then(|s| s.phase.as_ref()) {
                    Some(DataVolumePhase::Succeeded) => {}
                    // CDI's phase while its claim waits for the first consumer: with launcher
                    // pods the VMI is created and a temporary pod consumes the claim
                    // ([`provisioning`]); CDI imports once the claim binds.
                    Some(DataVolumePhase::WaitForFirstConsumer | DataVolumePhase::PendingPopulation)
                        if lookup.pvc(&ns, &d.name).is_some_and(|c| crate::storage::class::waits_for_consumer(&c, lookup)) => {}
                    Some(DataVolumePhase::Failed) => {
                        let why = dv
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Running"))
                            .and_then(|c| c.message.clone());
                        return Volumes::Failed(format!("DataVolume {} failed: {}", d.name, why.unwrap_or_default()));
                    }
                    p => {
                        let p = p.map_or(DataVolumePhase::Pending.as_str(), DataVolumePhase::as_str);
                        return Volumes::Provisioning(format!("DataVolume {} is {p}", d.name));
                    }
                },
            }
        }
    }
    Volumes::Ready
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

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
        assert_eq!(printable_status(&v, None, &Volumes::Ready), PrintableStatus::Starting);
        assert_eq!(printable_status(&v, None, &Volumes::WaitingForBinding(String::new())), PrintableStatus::WaitingForVolumeBinding);
        assert_eq!(printable_status(&v, None, &Volumes::Provisioning(String::new())), PrintableStatus::Provisioning);
        assert_eq!(printable_status(&v, Some(&vmi("Running", "a")), &Volumes::Ready), PrintableStatus::Running);
        assert_eq!(printable_status(&vm("Halted", json!([])), None, &Volumes::NotFound(String::new())), PrintableStatus::Stopped);
        let mut unsched = vmi("Pending", "a");
        unsched.status.as_mut().unwrap().conditions.push(condition("PodScheduled", false, "Unschedulable", ""));
        assert_eq!(printable_status(&v, Some(&unsched), &Volumes::Ready), PrintableStatus::ErrorUnschedulable);
        let mut stopping = vmi("Running", "a");
        stopping.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(printable_status(&v, Some(&stopping), &Volumes::Ready), PrintableStatus::Stopping);
        let mut paused = vmi("Running", "a");
        paused.status.as_mut().unwrap().conditions.push(condition("Paused", true, "PausedByUser", ""));
        assert_eq!(printable_status(&v, Some(&paused), &Volumes::Ready), PrintableStatus::Paused);
        paused.status.as_mut().unwrap().conditions[0].status = "False".into();
        assert_eq!(printable_status(&v, Some(&paused), &Volumes::Ready), PrintableStatus::Running);
    }

    /// Claims `c-*` in phase `Pending` (class `wffc` or `now`), and the two classes when
    /// `classes` (pods placement's cache) — none otherwise (direct placement's).
    struct Pending {
        classes: bool,
    }
    impl Lookup for Pending {
        fn pvc(&self, _: &str, name: &str) -> Option<std::sync::Arc<k8s_openapi::api::core::v1::PersistentVolumeClaim>> {
            let class = name.strip_prefix("c-")?;
            let pvc = json!({"metadata": {"name": name}, "spec": {"storageClassName": class}, "status": {"phase": "Pending"}});
            Some(std::sync::Arc::new(serde_json::from_value(pvc).unwrap()))
        }
        fn dv(&self, _: &str, _: &str) -> Option<std::sync::Arc<api::DataVolume>> {
            None
        }
        fn storage_class(&self, name: &str) -> Option<std::sync::Arc<k8s_openapi::api::storage::v1::StorageClass>> {
            let mode = match name {
                "wffc" if self.classes => "WaitForFirstConsumer",
                "now" if self.classes => "Immediate",
                _ => return None,
            };
            let sc = json!({"metadata": {"name": name}, "provisioner": "csi.example.com", "volumeBindingMode": mode});
            Some(std::sync::Arc::new(serde_json::from_value(sc).unwrap()))
        }
    }

    fn vm_with_claim(claim: &str) -> VirtualMachine {
        let mut v = vm("Always", json!([]));
        let spec: api::kubevirt::VirtualMachineInstanceSpec =
            serde_json::from_value(json!({"domain": {}, "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": claim}}]}))
                .unwrap();
        v.spec.template.spec = Some(spec);
        v
    }

    /// Issue 19: with launcher pods, an unbound boot claim of a `WaitForFirstConsumer` class
    /// does not hold the VMI back (its launcher pod is the consumer that binds it); an
    /// `Immediate` class's unbound claim still does; with direct placement (no classes in the
    /// cache) both wait, as before.
    #[test]
    fn a_boot_claim_waiting_for_its_consumer_does_not_block_a_launcher_pods_start() {
        let pods = Pending { classes: true };
        assert_eq!(volumes(&pods, &vm_with_claim("c-wffc")), Volumes::Ready);
        assert!(matches!(volumes(&pods, &vm_with_claim("c-now")), Volumes::WaitingForBinding(m) if m.contains("c-now")));
        let direct = Pending { classes: false };
        assert!(matches!(volumes(&direct, &vm_with_claim("c-wffc")), Volumes::WaitingForBinding(_)));
        assert!(matches!(volumes(&direct, &vm_with_claim("c-now")), Volumes::WaitingForBinding(_)));
    }

    #[test]
    fn a_crash_loop_shows_while_no_vmi_runs() {
        let mut v = vm("Always", json!([]));
        v.status.as_mut().unwrap().start_failure = Some(api::kubevirt::StartFailure { consecutive_fail_count: 1, ..Default::default() });
        assert_eq!(printable_status(&v, None, &Volumes::Ready), PrintableStatus::CrashLoopBackOff);
        assert_eq!(printable_status(&v, Some(&vmi("Failed", "a")), &Volumes::Ready), PrintableStatus::CrashLoopBackOff);
        assert_eq!(printable_status(&v, Some(&vmi("Scheduled", "b")), &Volumes::Ready), PrintableStatus::Starting);
        assert_eq!(
            printable_status(&v, None, &Volumes::WaitingForBinding(String::new())),
            PrintableStatus::WaitingForVolumeBinding,
            "the volumes come first, as in KubeVirt"
        );
        v.spec.run_strategy = Some("Halted".into());
        assert_eq!(printable_status(&v, None, &Volumes::Ready), PrintableStatus::Stopped);
    }
}
