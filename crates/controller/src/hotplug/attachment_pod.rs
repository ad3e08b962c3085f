//! Attachment pods (`--placement pods` only): as KubeVirt's virt-controller, a running VMI's
//! hot-plugged claims reach its node through a pod, `hp-volume-*`, pinned to the VMI's node,
//! whose volumes are the claims. The kubelet (and the CSI driver) mount them into it; the node
//! agent finds the pod's process by its `hp.sock` and opens the volume inside the pod
//! (`crates/node/src/source.rs`). The pod's process is `virtplug attachment-holder`.
//!
//! # Layout (KubeVirt's)
//! - An `emptyDir` `hotplug-disks` at `/hotplug-disks`, where the holder listens on `hp.sock`
//!   (the agent reaches it at `PODS_DIR/<pod uid>/volumes/kubernetes.io~empty-dir/hotplug-disks`).
//! - A Filesystem claim mounted at `/<volume>` (the image is `/<volume>/disk.img`, created
//!   sparse with the claim's size by the holder when the claim is empty); a Block claim as a
//!   `volumeDevice` at `/path/<volume>/<claim uid>`.
//! - Required node affinity on `kubernetes.io/hostname` = the VMI's node (KubeVirt's; not
//!   `nodeName`, so the scheduler still runs), all taints tolerated (the VMI already runs there).
//!
//! # WaitForFirstConsumer
//! A claim whose StorageClass has `volumeBindingMode: WaitForFirstConsumer` is not bound until a
//! pod using it is scheduled: the attachment pod is that consumer, so such a claim is carried
//! while still unbound ([`crate::storage::class::waits_for_consumer`], from the controller's
//! StorageClass store). The scheduler, placing the pod by its affinity, sets the claim's
//! `volume.kubernetes.io/selected-node` to the VMI's node, the provisioner makes the volume
//! there and binds the claim, and only then binds the pod (Kubernetes' volume binding); the
//! kubelet then mounts it and the pod runs. The claim's binding changes nothing here: a pod is
//! recognised by the volume names it carries ([`carried_by`]), so the same pod stays. An
//! unbound claim of an `Immediate` class (or of no class, or a class not in the store) is not
//! carried: a pod with it could not be scheduled before a provisioner binds it anyway. Not
//! covered: a DataVolume whose claim waits for its consumer (CDI's `WaitForFirstConsumer`
//! phase) is carried only once imported, which needs a consumer first.
//!
//! # Flow (one step per reconcile; each write wakes the next)
//! 1. The wanted set: the hot-pluggable claims of the VMI spec whose claim is bound or waits
//!    for its first consumer (and, for a DataVolume, imported). No pod carries exactly that
//!    set: one is created.
//! 2. `volumeStatus[].hotplugVolume`: `attachPodName` as soon as the pod carrying the volume
//!    exists, `attachPodUID` once it is `Running`. A volume already served by an older pod keeps
//!    that pod's name and UID until the new one runs (name and UID then change together).
//! 3. An older pod is deleted only when every volume it carries is either gone from
//!    `volumeStatus` (the agent drops an entry only after `device_del` … `remove-fd`) or carried
//!    by the current pod, which runs.
//!
//! # Guarantees
//! - A pod whose volume QEMU may still hold is never deleted here: a volume's status entry
//!   outlives its device in QEMU (the agent's `DropEntry` step), and a pod swap keeps the old
//!   pod until the new one runs and carries the same claims. QEMU keeps the fd the agent opened
//!   in the old pod (the agent never reopens a volume QEMU holds), so nothing has to switch.
//! - Before a create the pods are listed from the API, not the cache: a stale cache cannot
//!   create a second pod for the same set.
//! - A finished or deleted VMI's pods are left to the garbage collector (owner reference).
//!
//! # Errors
//! A failed read or write is returned; the reconcile is retried by the controller's backoff.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use api::kubevirt::{HotplugVolumeStatus, VirtualMachineInstanceStatus};
use api::phases::{ClaimPhase, DataVolumePhase};
use api::VirtualMachineInstance;

use crate::cache::Lookup;
use crate::lifecycle::launcher_pod::{LauncherPods, APP_LABEL};
use crate::lifecycle::VM_LABEL;
use crate::storage::class::waits_for_consumer;

/// `kubevirt.io` value of an attachment pod (KubeVirt's).
pub const APP_HOTPLUG: &str = "hotplug-disk";
/// Label with the UID of the VMI an attachment pod serves.
pub const ATTACHMENT_FOR: &str = "virtplug.io/attachment-for";
/// The emptyDir holding `hp.sock`, and its mount path.
pub const SOCKET_VOLUME: &str = "hotplug-disks";

/// One claim an attachment pod carries.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Carried {
    /// The VMI's volume name (the pod volume's name too).
    pub volume: String,
    pub claim: String,
    /// Block claim (a `volumeDevice`) or Filesystem claim (a mount).
    pub block: bool,
    /// The claim's UID (a Block claim's device path).
    pub claim_uid: String,
    /// The claim's capacity in bytes (a Filesystem claim's `disk.img` size), if known.
    pub bytes: Option<u64>,
}

/// The claims `vmi`'s attachment pod should carry (see the module docs), sorted by volume. A
/// claim that waits for its consumer has no capacity yet: its `bytes` are its request.
pub fn wanted(vmi: &VirtualMachineInstance, lookup: &impl Lookup) -> Vec<Carried> {
    let ns = vmi.namespace().unwrap_or_default();
    let mut out: Vec<Carried> = vmi
        .spec
        .volumes
        .iter()
        .filter(|v| v.is_hotpluggable())
        .filter_map(|v| {
            let claim = v.claim_name()?;
            // A claim waiting for its first consumer binds only once this pod is scheduled.
            let pvc = lookup.pvc(&ns, claim).filter(|p| ClaimPhase::is_bound(p) || waits_for_consumer(p, lookup))?;
            let imported = v.data_volume.is_none()
                || lookup.dv(&ns, claim).and_then(|dv| dv.status.clone()).and_then(|s| s.phase) == Some(DataVolumePhase::Succeeded);
            imported.then(|| carried(&v.name, claim, &pvc))
        })
        .collect();
    out.sort();
    out
}

/// What a pod carrying claim `claim` as volume `volume` needs to know of it (attachment pods
/// here, launcher pods for boot claims: `crate::lifecycle::launcher_pod`).
pub(crate) fn carried(volume: &str, claim: &str, pvc: &PersistentVolumeClaim) -> Carried {
    let block = pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let bytes = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .or_else(|| pvc.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .and_then(|q| api::quantity::bytes(&q.0).ok());
    Carried { volume: volume.to_owned(), claim: claim.to_owned(), block, claim_uid: pvc.uid().unwrap_or_default(), bytes }
}

/// The attachment pod carrying `set` for `vmi` on `node` (to create).
///
/// # Errors
/// Only if the built object does not deserialize as a Pod (a bug).
pub fn pod_for(vmi: &VirtualMachineInstance, node: &str, set: &[Carried], cfg: &LauncherPods) -> Result<Pod, String> {
    let (ns, name, uid) = (vmi.namespace().unwrap_or_default(), vmi.name_any(), vmi.uid().unwrap_or_default());
    let socket_dir = format!("/{SOCKET_VOLUME}");
    let mut command = vec!["virtplug".to_owned(), "attachment-holder".to_owned(), "--socket".to_owned(), format!("{socket_dir}/hp.sock")];
    let mut volumes = vec![json!({"name": SOCKET_VOLUME, "emptyDir": {}})];
    let mut mounts = vec![json!({"name": SOCKET_VOLUME, "mountPath": socket_dir})];
    let mut devices = Vec::new();
    for c in set {
        volumes.push(json!({"name": c.volume, "persistentVolumeClaim": {"claimName": c.claim}}));
        if c.block {
            devices.push(json!({"name": c.volume, "devicePath": format!("/path/{}/{}", c.volume, c.claim_uid)}));
        } else {
            mounts.push(json!({"name": c.volume, "mountPath": format!("/{}", c.volume)}));
            if let Some(b) = c.bytes {
                command.extend(["--disk".to_owned(), format!("/{}/disk.img={b}", c.volume)]);
            }
        }
    }
    let mut container = json!({
        "name": "hotplug-disk", "image": cfg.image, "command": command, "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "10m", "memory": "2M"}, "limits": {"cpu": "100m", "memory": "80M"}},
    });
    if !devices.is_empty() {
        container["volumeDevices"] = json!(devices);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "hp-volume-", "namespace": ns,
            "labels": {APP_LABEL: APP_HOTPLUG, ATTACHMENT_FOR: uid, VM_LABEL: name},
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": name, "uid": uid,
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "restartPolicy": "Never",
            // The holder only sleeps: nothing to drain; QEMU's fds outlive the pod's process.
            "terminationGracePeriodSeconds": 0,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            "volumes": volumes,
        },
    }))
    .map_err(|e| format!("cannot build the attachment pod: {e}"))
}

/// The VMI volumes an attachment pod carries (its claim volumes' names).
#[must_use]
pub fn carried_by(pod: &Pod) -> BTreeSet<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.persistent_volume_claim.is_some())
        .map(|v| v.name.clone())
        .collect()
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// One step of [`decide`].
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Create the pod carrying this set.
    Create(Vec<Carried>),
    /// Write `(volume, attachPodName, attachPodUID)` into these status entries.
    Status(Vec<(String, String, Option<String>)>),
    /// Delete this older pod (every volume it carried is unplugged or carried by the current one).
    Delete(String),
}

/// What to do for `vmi`, given the wanted set and its attachment pods (not being deleted), in
/// order: each step is written before the next is decided (see the module docs).
#[must_use]
pub fn decide(vmi: &VirtualMachineInstance, wanted: &[Carried], pods: &[Pod]) -> Vec<Step> {
    let names: BTreeSet<String> = wanted.iter().map(|c| c.volume.clone()).collect();
    let mut pods: Vec<&Pod> = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    // Newest last: of several pods carrying the wanted set (a race), the newest is current.
    pods.sort_by_key(|p| (p.metadata.creation_timestamp.clone().map(|t| t.0), p.name_any()));
    let current = pods.iter().rev().find(|p| carried_by(p) == names).copied();
    let mut steps = Vec::new();
    if current.is_none() && !names.is_empty() {
        steps.push(Step::Create(wanted.to_vec()));
    }
    let st = vmi.status.clone().unwrap_or_default();
    let pod_by_uid = |uid: &str| pods.iter().find(|p| p.uid().as_deref() == Some(uid)).copied();
    let mut writes = Vec::new();
    if let Some(cur) = current {
        let uid = running(cur).then(|| cur.uid().unwrap_or_default());
        for e in st.volume_status.iter().filter(|e| names.contains(&e.name)) {
            let had = e.hotplug_volume.as_ref();
            let had_uid = had.and_then(|h| h.attach_pod_uid.as_deref());
            // Served by an older pod that still exists: keep it until the current one runs.
            if uid.is_none() && had_uid.is_some_and(|u| pod_by_uid(u).is_some()) {
                continue;
            }
            let want = (Some(cur.name_any()), uid.clone());
            if (had.and_then(|h| h.attach_pod_name.clone()), had_uid.map(str::to_owned)) != want {
                writes.push((e.name.clone(), cur.name_any(), uid.clone()));
            }
        }
    }
    if !writes.is_empty() {
        steps.push(Step::Status(writes));
    }
    let current_runs = current.is_some_and(running);
    for old in pods.iter().filter(|p| current.is_none_or(|c| c.uid() != p.uid())) {
        let safe = carried_by(old).iter().all(|v| {
            let unplugged = st.volume(v).is_none();
            unplugged || (current_runs && names.contains(v))
        });
        if safe {
            steps.push(Step::Delete(old.name_any()));
        }
    }
    steps
}

/// Errors of [`reconcile`].
#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    #[error("VMI {object}: cannot {what}")]
    Api {
        object: String,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// One attachment-pod pass for `vmi` (see the module docs): decides on the pods read from the
/// API and applies the steps. Returns whether it wrote.
///
/// # Errors
/// A failed list, create, delete or status write.
pub async fn reconcile(
    client: &kube::Client,
    lookup: &impl Lookup,
    cfg: &LauncherPods,
    vmi: &VirtualMachineInstance,
) -> Result<bool, AttachmentError> {
    let Some(node) = vmi.status.as_ref().and_then(|s| s.node_name.clone()) else { return Ok(false) };
    if !vmi.is_running() || vmi.metadata.deletion_timestamp.is_some() {
        return Ok(false);
    }
    let (ns, name, uid) = (vmi.namespace().unwrap_or_default(), vmi.name_any(), vmi.uid().unwrap_or_default());
    let object = format!("{ns}/{name}");
    let err = |what: &'static str| {
        let object = object.clone();
        move |e: Box<dyn std::error::Error + Send + Sync>| AttachmentError::Api { object, what, source: e }
    };
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let list = pods_api
        .list(&ListParams::default().labels(&format!("{ATTACHMENT_FOR}={uid}")))
        .await
        .map_err(|e| err("list its attachment pods")(e.into()))?;
    let want = wanted(vmi, lookup);
    let steps = decide(vmi, &want, &list.items);
    for step in &steps {
        match step {
            Step::Create(set) => {
                let pod = pod_for(vmi, &node, set, cfg).map_err(|e| err("build its attachment pod")(e.into()))?;
                let created =
                    pods_api.create(&PostParams::default(), &pod).await.map_err(|e| err("create its attachment pod")(e.into()))?;
                let vols: Vec<&str> = set.iter().map(|c| c.volume.as_str()).collect();
                tracing::info!(pod = %created.name_any(), %node, volumes = ?vols, "created the attachment pod");
                // Its creation wakes the next pass, which writes the name.
                return Ok(true);
            }
            Step::Status(writes) => {
                let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
                client::update_status_from(&vmis, vmi, |cur: &mut VirtualMachineInstance| {
                    if cur.uid().as_deref() != Some(uid.as_str()) {
                        return;
                    }
                    let st = cur.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
                    for (volume, pod, pod_uid) in writes {
                        if let Some(e) = st.volume_status.iter_mut().find(|e| &e.name == volume) {
                            let h = e.hotplug_volume.get_or_insert_with(HotplugVolumeStatus::default);
                            h.attach_pod_name = Some(pod.clone());
                            h.attach_pod_uid.clone_from(pod_uid);
                        }
                    }
                })
                .await
                .map_err(|e| err("write its volumes' attachment pod")(e.into()))?;
            }
            Step::Delete(pod) => {
                match pods_api.delete(pod, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {} // gone meanwhile
                    Err(e) => return Err(err("delete an attachment pod it no longer needs")(e.into())),
                }
                tracing::info!(%pod, "deleted the attachment pod: none of its volumes is held by QEMU through it any more");
            }
        }
    }
    Ok(!steps.is_empty())
}

#[cfg(test)]
#[path = "attachment_pod_tests.rs"]
mod tests;
