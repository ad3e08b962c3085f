//! Placement by launcher pod (`virtplug controller --placement pods`): as KubeVirt's
//! virt-controller, each VMI gets a Pod that the cluster's scheduler places and in which QEMU
//! runs (`virtplug launcher`); the VMI's node comes from the pod. The other placement,
//! [`Placement::Direct`], is [`super::schedule`]: the controller picks the node itself (`up`).
//!
//! # Flow (one step per reconcile; each write wakes the next)
//! 0. A new VMI whose boot DataVolumes are not all imported gets no launcher pod yet: it stays
//!    `Pending` with a `Provisioning` condition, and while a DataVolume's claim waits for its
//!    first consumer a temporary pod consumes it ([`super::provisioning`]); the temporary pod
//!    is deleted once they are imported.
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
//! # Boot claims (KubeVirt's layout, [`api::launcher_disks`])
//! Each non-hot-plug `persistentVolumeClaim` or `dataVolume` volume is a volume of the pod (a
//! DataVolume's claim has the DataVolume's name), so the kubelet and the CSI driver attach and
//! mount it on the pod's node — the one place a CSI volume is reachable. A Filesystem claim is
//! mounted at `/run/kubevirt-private/vmi-disks/<volume>` and the launcher creates its
//! `disk.img` sparse, the claim's size, when the claim is empty (`--disk PATH=BYTES`, as
//! KubeVirt's virt-launcher does); a Block claim is a `volumeDevice` at `/dev/<volume>`. The
//! node agent opens them inside the pod and hands the fds to QEMU through the launcher.
//! A claim that waits for its first consumer (`WaitForFirstConsumer`) is unbound when the pod
//! is made: the pod is that consumer, so the scheduler binds the claim on the pod's node.
//!
//! # Assumptions
//! The run dir `RUN_ROOT/UID` is a hostPath mounted at the same path in the pod, and the node
//! agent's run dirs are there too (its `DATA_DIR/node/vmis`): QEMU's arguments (written by the
//! agent) name host paths. Every boot claim is in the controller's claim store when the pod is
//! made (the VM controller creates a VMI only once its claims exist, [`super::volumes`]); a
//! VMI whose claim is not there stays `Pending`, unschedulable, with the claim named.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use api::kubevirt::VirtualMachineInstanceStatus;
use api::phases::VmiPhase;
use api::VirtualMachineInstance;

use super::provisioning::{self, is_temporary};
use super::schedule::Constraints;
use super::{api_err, condition, deleting, set_condition, LifecycleError, NODE_LABEL, VM_LABEL};
use crate::cache::{Cache, Lookup};
use crate::hotplug::attachment_pod::{carried, Carried};

/// Label of a launcher pod (KubeVirt's `kubevirt.io: virt-launcher`).
pub const APP_LABEL: &str = "kubevirt.io";
/// Its value.
pub const APP_LAUNCHER: &str = "virt-launcher";
/// Label with the UID of the VMI a launcher pod runs (KubeVirt's).
pub const CREATED_BY: &str = "kubevirt.io/created-by";
/// The VMI condition of a VMI waiting for its DataVolumes (KubeVirt's `Provisioning`).
pub const PROVISIONING: &str = "Provisioning";

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

/// The boot claims of `vmi` (its non-hot-plug claim and DataVolume volumes), in volume order,
/// as [`pod_for`] makes them pod volumes.
///
/// # Errors
/// A claim not in `lookup`, named with its volume: its volume mode decides how it is mounted.
pub fn boot_claims(vmi: &VirtualMachineInstance, lookup: &impl Lookup) -> Result<Vec<Carried>, String> {
    let ns = vmi.namespace().unwrap_or_default();
    vmi.spec
        .volumes
        .iter()
        .filter(|v| !v.is_hotpluggable())
        .filter_map(|v| Some((v, v.claim_name()?)))
        .map(|(v, claim)| {
            let pvc = lookup.pvc(&ns, claim).ok_or_else(|| {
                format!(
                    "claim {claim} of volume {} does not exist; create it (its volume mode decides how the launcher pod gets it)",
                    v.name
                )
            })?;
            Ok(carried(&v.name, claim, &pvc))
        })
        .collect()
}

/// The launcher pod of `vmi` (to create), with its boot claims (from `lookup`) as volumes.
///
/// # Errors
/// A constraint field of the VMI that does not parse; a boot claim that is not in `lookup`.
pub fn pod_for(vmi: &VirtualMachineInstance, cfg: &LauncherPods, lookup: &impl Lookup) -> Result<Pod, String> {
    let c = Constraints::of(vmi)?;
    let boot = boot_claims(vmi, lookup)?;
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
    let mut command =
        vec!["virtplug".to_owned(), "launcher".to_owned(), "--uid".to_owned(), uid.clone(), "--run-dir".to_owned(), run_dir.clone()];
    command.extend(["--grace-period-seconds".to_owned(), grace.to_string()]);
    let mut volumes = vec![json!({"name": "run", "hostPath": {"path": run_dir, "type": "DirectoryOrCreate"}})];
    let mut mounts = vec![json!({"name": "run", "mountPath": run_dir})];
    let mut devices = Vec::new();
    for b in &boot {
        volumes.push(json!({"name": b.volume, "persistentVolumeClaim": {"claimName": b.claim}}));
        if b.block {
            devices.push(json!({"name": b.volume, "devicePath": api::launcher_disks::device_path(&b.volume)}));
        } else {
            mounts.push(json!({"name": b.volume, "mountPath": api::launcher_disks::mount_path(&b.volume)}));
            // No size known (a claim without request or capacity): the claim must hold its
            // disk.img already; the agent waits for it.
            if let Some(bytes) = b.bytes {
                command.extend(["--disk".to_owned(), format!("{}={bytes}", api::launcher_disks::image_path(&b.volume).display())]);
            }
        }
    }
    let mut spec = json!({
        "restartPolicy": "Never",
        // The guest's grace is the launcher's (`--grace-period-seconds`: ACPI power-off, then
        // QEMU stopped, then killed after QUIT_DEADLINE); the pod's is a backstop after all
        // of it, as KubeVirt gives its launcher pods a margin over the VMI's grace.
        "terminationGracePeriodSeconds": grace + 15,
        "containers": [{
            "name": "compute",
            "image": cfg.image,
            "command": command,
            "resources": {"requests": requests, "limits": limits},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    });
    if !devices.is_empty() {
        spec["containers"][0]["volumeDevices"] = json!(devices);
    }
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

/// The pods made for VMI `uid` in `ns` (its launcher pod and temporary pods) in the cache.
pub(super) fn cached_pods(cache: &Cache, ns: &str, uid: &str) -> impl Iterator<Item = std::sync::Arc<Pod>> {
    let (ns, uid) = (ns.to_owned(), uid.to_owned());
    cache.pods.state().into_iter().filter(move |p| {
        p.namespace().as_deref() == Some(ns.as_str())
            && p.labels().get(APP_LABEL).map(String::as_str) == Some(APP_LAUNCHER)
            && p.labels().get(CREATED_BY) == Some(&uid)
    })
}

/// The launcher pod of VMI `uid` in the cache.
fn cached_pod(cache: &Cache, ns: &str, uid: &str) -> Option<std::sync::Arc<Pod>> {
    cached_pods(cache, ns, uid).find(|p| !is_temporary(p))
}

/// The launcher pod of VMI `uid`, read from the API (before a create or a verdict of "gone").
async fn fresh_pod(pods: &Api<Pod>, uid: &str) -> Result<Option<Pod>, kube::Error> {
    Ok(fresh_pods(pods, uid).await?.into_iter().find(|p| !is_temporary(p)))
}

/// Every pod made for VMI `uid` (launcher and temporary), read from the API.
async fn fresh_pods(pods: &Api<Pod>, uid: &str) -> Result<Vec<Pod>, kube::Error> {
    Ok(pods.list(&ListParams::default().labels(&format!("{CREATED_BY}={uid}"))).await?.items)
}

/// The temporary pod step of an unplaced VMI whose boot DataVolumes are not imported
/// (`waiting` says which, see [`super::provisioning`]): one temporary pod while a claim waits
/// for its consumer (a GET-level check before the create, as for the launcher pod), and the
/// VMI's `Provisioning` condition saying what it waits for.
async fn provision(
    client: &kube::Client,
    cache: &Cache,
    cfg: &LauncherPods,
    vmi: &VirtualMachineInstance,
    waiting: &[String],
    consumer: bool,
) -> Result<(), WriteError> {
    let (ns, name, uid) = (vmi.namespace().unwrap_or_default(), vmi.name_any(), vmi.uid().unwrap_or_default());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    if consumer && provisioning::cached(cache, &ns, &uid).is_empty() && !fresh_pods(&pods, &uid).await?.iter().any(is_temporary) {
        match provisioning::temporary_pod(vmi, cfg, cache) {
            Ok(pod) => {
                let created = pods.create(&PostParams::default(), &pod).await?;
                tracing::info!(pod = %created.name_any(), "created a temporary pod: its DataVolumes' claims wait for their first consumer");
            }
            Err(why) => return unschedulable(&vmis, &name, &why).await,
        }
    }
    let why = waiting.join("; ");
    client::update_status(&vmis, &name, |v: &mut VirtualMachineInstance| {
        if v.uid().as_deref() != Some(uid.as_str()) {
            return;
        }
        let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
        if s.node_name.is_none() {
            set_condition(&mut s.conditions, condition(PROVISIONING, true, "DataVolumesNotReady", &why));
        }
    })
    .await?;
    Ok(())
}

/// Deletes the temporary pods of VMI `uid` in the cache (their DataVolumes are imported).
async fn remove_temporary(pods: &Api<Pod>, cache: &Cache, ns: &str, uid: &str) -> Result<(), kube::Error> {
    for p in provisioning::cached(cache, ns, uid).iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        match pods.delete(&p.name_any(), &kube::api::DeleteParams::default()).await {
            Ok(_) => tracing::info!(pod = %p.name_any(), "deleted the temporary pod: its DataVolumes are imported"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
    let (waiting, consumer) = provisioning::unimported(vmi, cache);
    if waiting.is_empty() {
        remove_temporary(&pods, cache, &ns, &uid).await.map_err(api_err(&object, "delete its VMI's temporary pod"))?;
    }
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
        None if !waiting.is_empty() => {
            provision(client, cache, cfg, vmi, &waiting, consumer).await.map_err(api_err(&object, "provision its DataVolumes"))?;
        }
        None => {
            let pod = match pod_for(vmi, cfg, cache) {
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
                s.conditions.retain(|c| c.type_ != PROVISIONING);
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
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    use super::*;

    /// Claims by name, and no DataVolumes or classes.
    struct Claims(Vec<PersistentVolumeClaim>);
    impl Lookup for Claims {
        fn pvc(&self, _: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
            self.0.iter().find(|p| p.metadata.name.as_deref() == Some(name)).cloned().map(Arc::new)
        }
        fn dv(&self, _: &str, _: &str) -> Option<Arc<api::DataVolume>> {
            None
        }
    }

    fn claim(name: &str, mode: &str, status: &serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {"volumeMode": mode, "resources": {"requests": {"storage": "16Mi"}}}, "status": status}))
        .unwrap()
    }

    fn cfg() -> LauncherPods {
        LauncherPods { image: "virtplug:dev".into(), run_root: PathBuf::from("/var/lib/virtplug/node/vmis") }
    }

    /// Boot claims (issue 19): each non-hot-plug claim or DataVolume volume is a pod volume of
    /// its claim; a Filesystem one mounted under KubeVirt's vmi-disks dir (on `/run`, no
    /// symlink) with a `--disk` of its capacity (its request while it waits for its consumer),
    /// a Block one a device at `/dev/<volume>`; hot-pluggable claims, emptyDisks and
    /// cloud-init are not the launcher pod's. The run dir's hostPath stays first.
    #[test]
    fn boot_claims_are_pod_volumes_mounted_or_devices_by_their_mode() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "ns", "uid": "u1"},
            "spec": {"domain": {}, "terminationGracePeriodSeconds": 5, "volumes": [
                {"name": "root", "persistentVolumeClaim": {"claimName": "c-root"}},
                {"name": "raw", "persistentVolumeClaim": {"claimName": "c-raw"}},
                {"name": "imported", "dataVolume": {"name": "dv1"}},
                {"name": "late", "persistentVolumeClaim": {"claimName": "c-late"}},
                {"name": "hot", "persistentVolumeClaim": {"claimName": "c-hot", "hotpluggable": true}},
                {"name": "scratch", "emptyDisk": {"capacity": "1Mi"}}]}}))
        .unwrap();
        let bound = |bytes: &str| json!({"phase": "Bound", "capacity": {"storage": bytes}});
        let claims = Claims(vec![
            claim("c-root", "Filesystem", &bound("32Mi")),
            claim("c-raw", "Block", &bound("8Mi")),
            claim("dv1", "Filesystem", &bound("1Gi")),
            claim("c-late", "Filesystem", &json!({"phase": "Pending"})),
            claim("c-hot", "Filesystem", &bound("1Mi")),
        ]);
        let pod = serde_json::to_value(pod_for(&vmi, &cfg(), &claims).unwrap()).unwrap();
        let run = "/var/lib/virtplug/node/vmis/u1";
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "run", "hostPath": {"path": run, "type": "DirectoryOrCreate"}},
                   {"name": "root", "persistentVolumeClaim": {"claimName": "c-root"}},
                   {"name": "raw", "persistentVolumeClaim": {"claimName": "c-raw"}},
                   {"name": "imported", "persistentVolumeClaim": {"claimName": "dv1"}},
                   {"name": "late", "persistentVolumeClaim": {"claimName": "c-late"}}])
        );
        let c = &pod["spec"]["containers"][0];
        assert_eq!(
            c["volumeMounts"],
            json!([{"name": "run", "mountPath": run},
                   {"name": "root", "mountPath": "/run/kubevirt-private/vmi-disks/root"},
                   {"name": "imported", "mountPath": "/run/kubevirt-private/vmi-disks/imported"},
                   {"name": "late", "mountPath": "/run/kubevirt-private/vmi-disks/late"}])
        );
        assert_eq!(c["volumeDevices"], json!([{"name": "raw", "devicePath": "/dev/raw"}]));
        assert_eq!(
            c["command"],
            json!([
                "virtplug",
                "launcher",
                "--uid",
                "u1",
                "--run-dir",
                run,
                "--grace-period-seconds",
                "5",
                "--disk",
                format!("/run/kubevirt-private/vmi-disks/root/disk.img={}", 32 << 20),
                "--disk",
                format!("/run/kubevirt-private/vmi-disks/imported/disk.img={}", 1 << 30),
                "--disk",
                format!("/run/kubevirt-private/vmi-disks/late/disk.img={}", 16 << 20)
            ]),
            "one --disk per Filesystem boot claim: its capacity, or its request while unbound"
        );
        let missing = Claims(vec![]);
        let e = pod_for(&vmi, &cfg(), &missing).unwrap_err();
        assert!(e.contains("claim c-root of volume root does not exist"), "{e}");
    }

    #[test]
    fn the_pod_carries_the_vmis_constraints_resources_and_owner() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "ns", "uid": "u1"},
            "spec": {"domain": {"resources": {"requests": {"memory": "200Mi", "cpu": "1"}, "limits": {"memory": "300Mi"}}},
                     "nodeSelector": {"kubernetes.io/hostname": "n1"}, "tolerations": [{"key": "k", "operator": "Exists"}],
                     "terminationGracePeriodSeconds": 5}}))
        .unwrap();
        let pod = serde_json::to_value(pod_for(&vmi, &cfg(), &Claims(vec![])).unwrap()).unwrap();
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
        assert!(c.get("volumeDevices").is_none(), "no Block boot claim, no devices");
    }
}
