//! The controller's part of a running VMI's `status.volumeStatus` (DESIGN "Hot-plug volume
//! status"): `Pending` (`PVCNotReady`) and `Bound` (`PVCBound`) with the claim's info.
//!
//! # Rules
//! - A hot-plug volume in the VMI spec without an entry gets one, `Pending` until its claim is
//!   bound and, for a DataVolume, its import has succeeded, then `Bound`. A claim that waits for
//!   its first consumer ([`crate::storage::class::waits_for_consumer`]) is `Pending` with the
//!   PV controller's words for it ("waiting for first consumer to be created before binding"):
//!   its attachment pod is that consumer (`super::attachment_pod`).
//! - It only ever creates an entry or moves it `Pending` → `Bound`: an entry already in the
//!   phase it would write is left as it is (the node agent writes its own reason and message
//!   there — two writers rewriting each other's message would wake each other forever), and
//!   entries past `Bound` belong to the node agent.
//! - Except `persistentVolumeClaimInfo`, the controller's field, which it fills in once wherever
//!   it is missing (the agent may create an entry first when it reacts to the spec faster than
//!   this status write).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::ResourceExt;

use api::kubevirt::{PersistentVolumeClaimInfo, Volume};
use api::phases::{ClaimPhase, DataVolumePhase, VolumePhase};
use api::VirtualMachineInstance;

use crate::cache::{Fetched, Lookup};

/// What the controller wants in one volume's entry.
#[derive(Debug, Clone, PartialEq)]
struct Wanted {
    name: String,
    /// The phase and message to move to; `None` past `Pending` (the agent's phases).
    phase: Option<(VolumePhase, String)>,
    info: Option<PersistentVolumeClaimInfo>,
}

/// The claim info KubeVirt reports for `pvc`.
fn claim_info(claim: &str, pvc: &PersistentVolumeClaim) -> PersistentVolumeClaimInfo {
    let spec = pvc.spec.as_ref();
    PersistentVolumeClaimInfo {
        claim_name: Some(claim.to_owned()),
        access_modes: spec.and_then(|s| s.access_modes.clone()).unwrap_or_default(),
        volume_mode: Some(spec.and_then(|s| s.volume_mode.clone()).unwrap_or_else(|| "Filesystem".into())),
        capacity: pvc.status.as_ref().and_then(|s| s.capacity.clone()).unwrap_or_default().into_iter().collect(),
        requests: spec.and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.clone()).unwrap_or_default().into_iter().collect(),
        ..Default::default()
    }
}

/// What volume `v` of `vmi` wants, `None` when its entry needs nothing from the controller.
fn wanted_for(vmi: &VirtualMachineInstance, v: &Volume, lookup: &impl Lookup) -> Option<Wanted> {
    let ns = vmi.namespace().unwrap_or_default();
    let entry = vmi.status.as_ref().and_then(|s| s.volume(&v.name));
    let past_pending = entry.is_some_and(|e| !e.phase_unset() && e.phase != Some(VolumePhase::Pending));
    if past_pending && entry.is_some_and(|e| e.persistent_volume_claim_info.is_some()) {
        return None;
    }
    let claim = v.claim_name().unwrap_or_default();
    let pvc = lookup.pvc(&ns, claim);
    let bound = pvc.as_deref().is_some_and(ClaimPhase::is_bound);
    let imported = v.data_volume.is_none()
        || lookup.dv(&ns, claim).and_then(|dv| dv.status.clone()).and_then(|s| s.phase) == Some(DataVolumePhase::Succeeded);
    let waits = pvc.as_deref().is_some_and(|p| crate::storage::class::waits_for_consumer(p, lookup));
    let (phase, message) = match &pvc {
        _ if bound && imported => (VolumePhase::Bound, format!("PVC {claim} is in phase Bound")),
        None => (VolumePhase::Pending, format!("PVC {claim} does not exist yet")),
        // Kubernetes' PV controller says the same (Event WaitForFirstConsumer on the claim).
        Some(_) if waits => (
            VolumePhase::Pending,
            format!(
                "PVC {claim} is waiting for first consumer to be created before binding (volumeBindingMode \
                 WaitForFirstConsumer): its attachment pod is that consumer"
            ),
        ),
        Some(_) => (VolumePhase::Pending, format!("PVC {claim} is not ready (not bound or still importing)")),
    };
    Some(Wanted {
        name: v.name.clone(),
        // Past Pending the phase is the agent's: only the missing claim info is written.
        phase: (!past_pending).then_some((phase, message)),
        info: pvc.map(|p| claim_info(claim, &p)),
    })
}

/// Applies `wanted` to the VMI `cur` (a fresh copy), by the rules in the module docs.
fn apply(cur: &mut VirtualMachineInstance, wanted: &[Wanted]) {
    let names: Vec<String> = cur.spec.volumes.iter().map(|v| v.name.clone()).collect();
    let st = cur.status.get_or_insert_with(Default::default);
    for w in wanted {
        if !names.contains(&w.name) {
            continue; // unplugged meanwhile
        }
        let Some((phase, message)) = &w.phase else {
            if let Some(e) = st.volume_status.iter_mut().find(|e| e.name == w.name && e.persistent_volume_claim_info.is_none()) {
                e.persistent_volume_claim_info.clone_from(&w.info);
            }
            continue;
        };
        let e = st.volume_entry(&w.name);
        // Create, or Pending → Bound; nothing else (see the module docs).
        if !(e.phase_unset() || (e.phase == Some(VolumePhase::Pending) && *phase == VolumePhase::Bound)) {
            continue;
        }
        e.transition(phase.clone(), phase.reason(), message);
        if w.info.is_some() {
            e.persistent_volume_claim_info.clone_from(&w.info);
        }
    }
}

/// Reports the VMI's hot-plug volumes (see the module docs), looking claims and DataVolumes up
/// in `lookup`. `vmi` is the caller's copy (a store's): nothing is read or written unless it
/// needs a change.
///
/// # Errors
/// When the status write fails.
pub async fn report_claims_with(
    client: &kube::Client,
    vmi: &VirtualMachineInstance,
    lookup: &impl Lookup,
) -> Result<(), client::UpdateError<client::Never>> {
    if !vmi.is_running() || vmi.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let wanted: Vec<Wanted> = vmi.spec.volumes.iter().filter(|v| v.is_hotpluggable()).filter_map(|v| wanted_for(vmi, v, lookup)).collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    client::update_status_from(&vmis, vmi, |cur| apply(cur, &wanted)).await.map(|_| ())
}

/// [`report_claims_with`] for a caller without stores: the claims and DataVolumes are read
/// first.
///
/// # Errors
/// When a read or the status write fails.
pub async fn report_claims(client: &kube::Client, vmi: &VirtualMachineInstance) -> Result<(), client::UpdateError<client::Never>> {
    if !vmi.is_running() || vmi.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let fetched = Fetched::for_vmi(client, vmi).await.map_err(|source| client::UpdateError::Api {
        kind: "VirtualMachineInstance".into(),
        object: format!("{}/{}", vmi.namespace().unwrap_or_default(), vmi.name_any()),
        source,
    })?;
    report_claims_with(client, vmi, &fetched).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    struct Claims(Option<PersistentVolumeClaim>);
    impl Lookup for Claims {
        fn pvc(&self, _: &str, _: &str) -> Option<Arc<PersistentVolumeClaim>> {
            self.0.clone().map(Arc::new)
        }
        fn dv(&self, _: &str, _: &str) -> Option<Arc<api::DataVolume>> {
            None
        }
    }

    fn vmi(entry: &serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v", "namespace": "d"},
            "spec": {"domain": {}, "volumes": [{"name": "hp", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]},
            "status": {"phase": "Running", "volumeStatus": entry}}),
        )
        .unwrap()
    }

    fn bound() -> Claims {
        Claims(Some(serde_json::from_value(json!({"metadata": {"name": "c"}, "status": {"phase": "Bound"}})).unwrap()))
    }

    fn entry(v: &VirtualMachineInstance) -> api::kubevirt::VolumeStatus {
        v.status.as_ref().unwrap().volume_status[0].clone()
    }

    #[test]
    fn a_new_volume_is_pending_until_its_claim_is_bound_then_bound() {
        let mut v = vmi(&json!([]));
        let w = wanted_for(&v, &v.spec.volumes[0], &Claims(None)).unwrap();
        apply(&mut v, &[w]);
        assert_eq!((entry(&v).phase, entry(&v).reason), (Some(VolumePhase::Pending), Some(api::phases::VolumeReason::PvcNotReady)));
        let w = wanted_for(&v, &v.spec.volumes[0], &bound()).unwrap();
        apply(&mut v, &[w]);
        assert_eq!((entry(&v).phase, entry(&v).reason), (Some(VolumePhase::Bound), Some(api::phases::VolumeReason::PvcBound)));
        assert_eq!(entry(&v).persistent_volume_claim_info.unwrap().claim_name.as_deref(), Some("c"));
        assert_eq!(wanted_for(&v, &v.spec.volumes[0], &bound()), None, "nothing more to do");
    }

    /// A class lookup on top of [`Claims`]: every class is `WaitForFirstConsumer`.
    struct Waiting(Claims);
    impl Lookup for Waiting {
        fn pvc(&self, ns: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
            self.0.pvc(ns, name)
        }
        fn dv(&self, _: &str, _: &str) -> Option<Arc<api::DataVolume>> {
            None
        }
        fn storage_class(&self, name: &str) -> Option<Arc<k8s_openapi::api::storage::v1::StorageClass>> {
            let sc = json!({"metadata": {"name": name}, "provisioner": "csi.example.com", "volumeBindingMode": "WaitForFirstConsumer"});
            Some(Arc::new(serde_json::from_value(sc).unwrap()))
        }
    }

    #[test]
    fn a_claim_waiting_for_its_first_consumer_is_pending_and_says_so() {
        let mut v = vmi(&json!([]));
        let pending = json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "wffc"}, "status": {"phase": "Pending"}});
        let w = wanted_for(&v, &v.spec.volumes[0], &Waiting(Claims(Some(serde_json::from_value(pending).unwrap())))).unwrap();
        apply(&mut v, &[w]);
        let e = entry(&v);
        assert_eq!((e.phase, e.reason), (Some(VolumePhase::Pending), Some(api::phases::VolumeReason::PvcNotReady)));
        assert_eq!(
            e.message.as_deref(),
            Some("PVC c is waiting for first consumer to be created before binding (volumeBindingMode WaitForFirstConsumer): its attachment pod is that consumer")
        );
        let w = wanted_for(&v, &v.spec.volumes[0], &Waiting(bound())).unwrap();
        apply(&mut v, &[w]);
        assert_eq!(entry(&v).phase, Some(VolumePhase::Bound), "bound by its consumer's node: Bound as any claim");
    }

    #[test]
    fn an_entry_past_bound_keeps_the_agents_phase_and_message_and_gets_only_the_claim_info() {
        let mut v = vmi(&json!([{"name": "hp", "phase": "AttachedToNode", "reason": "SuccessfulCreate", "message": "opened"}]));
        let w = wanted_for(&v, &v.spec.volumes[0], &bound()).unwrap();
        assert_eq!(w.phase, None);
        apply(&mut v, &[w]);
        let e = entry(&v);
        assert_eq!((e.phase, e.message.as_deref()), (Some(VolumePhase::AttachedToNode), Some("opened")));
        assert!(e.persistent_volume_claim_info.is_some());
    }
}
