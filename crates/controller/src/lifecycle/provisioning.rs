//! DataVolumes that wait for their first consumer, with launcher pods (KubeVirt's
//! "ephemeral provisioning"). CDI leaves a DataVolume of a `WaitForFirstConsumer` class in
//! phase `WaitForFirstConsumer` (`PendingPopulation` with volume populators) until its claim
//! binds, and a claim of such a class binds only once a pod using it is scheduled. The launcher
//! pod cannot be that pod: it would start QEMU on a disk CDI has not written yet. So, as
//! KubeVirt's virt-controller does, the VMI (already created, [`super::volumes`]) stays
//! `Pending` while a *temporary pod* — the launcher pod's volumes, node constraints and
//! resources, annotated `kubevirt.io/ephemeral-provisioning: "true"`, whose container only
//! exits — is the consumer: the scheduler binds the claims on a node where the VMI can run,
//! CDI imports, and once every boot DataVolume has `Succeeded` the temporary pod is deleted and
//! the real launcher pod created.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use api::phases::DataVolumePhase;
use api::VirtualMachineInstance;

use super::launcher_pod::{pod_for, LauncherPods};
use crate::cache::{Cache, Lookup};

/// Annotation of a temporary pod (KubeVirt's).
pub const EPHEMERAL: &str = "kubevirt.io/ephemeral-provisioning";

/// The boot DataVolumes of `vmi` not imported yet, with why (`DataVolume NAME is PHASE`), and
/// whether one of them waits for a consumer (its claim unbound, of a `WaitForFirstConsumer`
/// class): the temporary pod is needed only then.
#[must_use]
pub fn unimported(vmi: &VirtualMachineInstance, lookup: &impl Lookup) -> (Vec<String>, bool) {
    let ns = vmi.namespace().unwrap_or_default();
    let mut waiting = Vec::new();
    let mut consumer = false;
    for d in vmi.spec.volumes.iter().filter(|v| !v.is_hotpluggable()).filter_map(|v| v.data_volume.as_ref()) {
        let phase = lookup.dv(&ns, &d.name).and_then(|dv| dv.status.clone()).and_then(|s| s.phase);
        if phase == Some(DataVolumePhase::Succeeded) {
            continue;
        }
        consumer |= lookup.pvc(&ns, &d.name).is_some_and(|c| crate::storage::class::waits_for_consumer(&c, lookup));
        waiting.push(format!("DataVolume {} is {}", d.name, phase.as_ref().map_or("Pending", DataVolumePhase::as_str)));
    }
    (waiting, consumer)
}

/// Whether `pod` is a temporary pod.
#[must_use]
pub fn is_temporary(pod: &Pod) -> bool {
    pod.annotations().get(EPHEMERAL).map(String::as_str) == Some("true")
}

/// The temporary pod of `vmi` (to create): its launcher pod ([`pod_for`]) without the run dir
/// (nothing of the VMI runs in it), annotated [`EPHEMERAL`], whose container exits at once.
///
/// # Errors
/// As [`pod_for`].
pub fn temporary_pod(vmi: &VirtualMachineInstance, cfg: &LauncherPods, lookup: &impl Lookup) -> Result<Pod, String> {
    let mut pod = pod_for(vmi, cfg, lookup)?;
    pod.metadata.annotations.get_or_insert_with(Default::default).insert(EPHEMERAL.to_owned(), "true".to_owned());
    let spec = pod.spec.as_mut().ok_or("the launcher pod has no spec")?;
    if let Some(volumes) = spec.volumes.as_mut() {
        volumes.retain(|v| v.host_path.is_none());
    }
    let c = spec.containers.first_mut().ok_or("the launcher pod has no container")?;
    c.command = Some(vec!["virtplug".to_owned(), "--version".to_owned()]);
    c.args = None;
    if let Some(mounts) = c.volume_mounts.as_mut() {
        let kept: Vec<String> = spec.volumes.iter().flatten().map(|v| v.name.clone()).collect();
        mounts.retain(|m| kept.contains(&m.name));
    }
    Ok(pod)
}

/// The temporary pods of VMI `uid` in `ns` in the cache.
#[must_use]
pub fn cached(cache: &Cache, ns: &str, uid: &str) -> Vec<Arc<Pod>> {
    super::launcher_pod::cached_pods(cache, ns, uid).filter(|p| is_temporary(p)).collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::api::storage::v1::StorageClass;
    use serde_json::json;

    use super::*;

    /// DataVolume `dv-PHASE` in phase PHASE, its claim `dv-PHASE` unbound of class `wffc`
    /// (or bound when the phase is `Succeeded`); classes when `classes` (pods placement's cache).
    struct World {
        classes: bool,
    }
    impl Lookup for World {
        fn pvc(&self, _: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
            let phase = if name == "dv-Succeeded" { "Bound" } else { "Pending" };
            let pvc = json!({"metadata": {"name": name, "uid": format!("uid-{name}")},
                "spec": {"storageClassName": "wffc", "volumeMode": "Filesystem", "resources": {"requests": {"storage": "64Mi"}}},
                "status": {"phase": phase}});
            Some(Arc::new(serde_json::from_value(pvc).unwrap()))
        }
        fn dv(&self, _: &str, name: &str) -> Option<Arc<api::DataVolume>> {
            let phase = name.strip_prefix("dv-")?;
            let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
                "spec": {"source": {"blank": {}}}, "status": {"phase": phase}});
            Some(Arc::new(serde_json::from_value(dv).unwrap()))
        }
        fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
            let sc = json!({"metadata": {"name": name}, "provisioner": "csi.example.com", "volumeBindingMode": "WaitForFirstConsumer"});
            (self.classes && name == "wffc").then(|| Arc::new(serde_json::from_value(sc).unwrap()))
        }
    }

    fn vmi(dvs: &[&str]) -> VirtualMachineInstance {
        let volumes: Vec<_> = dvs.iter().map(|d| json!({"name": format!("v-{d}"), "dataVolume": {"name": d}})).collect();
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "ns", "uid": "u1"},
            "spec": {"domain": {}, "nodeSelector": {"zone": "a"}, "volumes": volumes}}))
        .unwrap()
    }

    #[test]
    fn only_unimported_data_volumes_wait_and_only_an_unbound_wffc_claim_needs_a_consumer() {
        let pods = World { classes: true };
        assert_eq!(unimported(&vmi(&["dv-Succeeded"]), &pods), (vec![], false));
        let (waiting, consumer) = unimported(&vmi(&["dv-Succeeded", "dv-WaitForFirstConsumer"]), &pods);
        assert_eq!(waiting, ["DataVolume dv-WaitForFirstConsumer is WaitForFirstConsumer"]);
        assert!(consumer);
        let (waiting, consumer) = unimported(&vmi(&["dv-ImportInProgress"]), &World { classes: false });
        assert_eq!(waiting, ["DataVolume dv-ImportInProgress is ImportInProgress"]);
        assert!(!consumer, "no class known (direct placement): the claim binds without a consumer");
        let (waiting, _) = unimported(&vmi(&["absent"]), &pods);
        assert_eq!(waiting, ["DataVolume absent is Pending"], "a DataVolume not there yet waits too");
    }

    /// KubeVirt's temporary pod: the launcher pod's claims, constraints and owner, annotated,
    /// without the run dir, a container that only exits; the launcher pod lookups skip it.
    #[test]
    fn the_temporary_pod_consumes_the_claims_where_the_vmi_may_run_and_runs_nothing() {
        let cfg = LauncherPods { image: "virtplug:dev".into(), run_root: PathBuf::from("/var/lib/virtplug/node/vmis") };
        let pod = temporary_pod(&vmi(&["dv-WaitForFirstConsumer"]), &cfg, &World { classes: true }).unwrap();
        assert!(is_temporary(&pod));
        let v = serde_json::to_value(&pod).unwrap();
        assert_eq!(v["metadata"]["labels"][super::super::launcher_pod::CREATED_BY], "u1");
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(
            v["spec"]["volumes"],
            json!([{"name": "v-dv-WaitForFirstConsumer", "persistentVolumeClaim": {"claimName": "dv-WaitForFirstConsumer"}}])
        );
        assert_eq!(v["spec"]["containers"][0]["command"], json!(["virtplug", "--version"]));
        assert_eq!(v["spec"]["containers"][0]["volumeMounts"].as_array().unwrap().len(), 1, "{v}");
        assert_eq!(v["spec"]["nodeSelector"]["zone"], "a", "bound where the VMI may run");
        let launcher = pod_for(&vmi(&["dv-WaitForFirstConsumer"]), &cfg, &World { classes: true }).unwrap();
        assert!(!is_temporary(&launcher));
    }
}
