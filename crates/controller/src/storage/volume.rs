//! The PersistentVolume of a local claim: how it is written ([`build`]), how it is recognised
//! ([`provisioned_here`]), and what happens to it and its data when its claim goes
//! ([`reclaim`], and [`run`]: the PV side of Kubernetes' PV controller for this provisioner's
//! volumes).
//!
//! # Flow
//! A PV is named `pvc-<claim uid>`, annotated `pv.kubernetes.io/provisioned-by:`
//! [`PROVISIONER`], carries the claim in `spec.claimRef` (with its UID, so a claim of the same
//! name made later is never mistaken for it) and the [`PV_PROTECTION`] finalizer, and points
//! at the claim's directory (`hostPath`, type `Directory`) for a Filesystem claim or at its
//! image (`hostPath`, type `File`) for a Block claim: the loop device's number can change after
//! a reboot and a PV's source cannot, so the device is an annotation ([`super::ANN_DEVICE`]).
//!
//! When the claim is gone (deleted after the provisioner's claim finalizer let it go, or
//! removed behind its back, or while the controller was down) [`reclaim`] applies the PV's
//! policy: `Delete` detaches the loop device, removes the directory and only then the PV (the
//! PV is the record of the data until the data is gone, as a CSI external-provisioner deletes
//! the volume before the PV object); `Retain` detaches the loop device, keeps the directory and
//! sets the PV `Released`. [`run`] watches PVs (and claims' deletions) so a PV left behind is
//! reclaimed on start.
//!
//! # Guarantees
//! - Only PVs this provisioner made under this storage root are touched: the annotation, a
//!   claim UID that is a UID (never a path), and a `hostPath` that is exactly where this root
//!   keeps that UID's data ([`provisioned_here`]).
//! - [`PV_PROTECTION`] is released as Kubernetes' pv-protection controller releases it: only
//!   when the PV is not bound to a live claim, and for `Delete` only after the data is gone.
//!
//! # Errors
//! API failures and files that cannot be removed are returned with the PV's name; the caller
//! retries.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, PersistentVolumeStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use client::events::{self, EventType};

use super::class::{ReclaimPolicy, PROVISIONER};
use super::provisioner::{release_device, release_dir, ProvisionError};
use super::{claim_dir, VolumeMode, ANN_DEVICE};
use crate::runner::{Action, Runner};

/// The finalizer Kubernetes' pv-protection admission puts on every PV.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
/// Annotation: the provisioner that made the PV.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Annotation (PV and claim): the binding was made by the controller, not by hand.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Annotation (claim): the binding is complete.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Annotation (claim): the provisioner that serves it, as the PV controller writes it.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

const COMPONENT: &str = "virtplug-provisioner";

/// The phase of a PV bound to its claim.
pub const BOUND: &str = "Bound";
/// The phase of a PV whose claim is gone and whose data is kept (`Retain`).
pub const RELEASED: &str = "Released";

/// The name of the PV of the claim with `uid` (the name `spec.volumeName` gets).
#[must_use]
pub fn name_for(uid: &str) -> String {
    format!("pvc-{uid}")
}

/// Where the PV of the claim with `uid` points: its directory (Filesystem) or image (Block).
#[must_use]
pub fn source_path(root: &Path, uid: &str, mode: VolumeMode) -> PathBuf {
    match mode {
        VolumeMode::Filesystem => claim_dir(root, uid),
        VolumeMode::Block => claim_dir(root, uid).join(mode.image_name()),
    }
}

/// What a new PV is made of.
pub struct NewVolume<'a> {
    pub pvc: &'a PersistentVolumeClaim,
    pub uid: &'a str,
    pub root: &'a Path,
    pub class: Option<&'a str>,
    pub reclaim: ReclaimPolicy,
    pub capacity: Quantity,
    pub device: Option<&'a Path>,
}

/// The PV for a claim (status is written separately: the server ignores it on create).
#[must_use]
pub fn build(v: &NewVolume<'_>) -> PersistentVolume {
    let mode = VolumeMode::of(v.pvc);
    let spec = v.pvc.spec.as_ref();
    let mut annotations = std::collections::BTreeMap::from([
        (ANN_PROVISIONED_BY.to_owned(), PROVISIONER.to_owned()),
        (ANN_BOUND_BY_CONTROLLER.to_owned(), "yes".to_owned()),
    ]);
    if let Some(d) = v.device {
        annotations.insert(ANN_DEVICE.to_owned(), d.to_string_lossy().into_owned());
    }
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name_for(v.uid)),
            annotations: Some(annotations),
            finalizers: Some(vec![PV_PROTECTION.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some([("storage".to_owned(), v.capacity.clone())].into_iter().collect()),
            access_modes: Some(
                spec.and_then(|s| s.access_modes.clone()).filter(|m| !m.is_empty()).unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]),
            ),
            volume_mode: Some(format!("{mode:?}")),
            host_path: Some(HostPathVolumeSource {
                path: source_path(v.root, v.uid, mode).to_string_lossy().into_owned(),
                type_: Some(match mode {
                    VolumeMode::Filesystem => "Directory".to_owned(),
                    VolumeMode::Block => "File".to_owned(),
                }),
            }),
            persistent_volume_reclaim_policy: Some(v.reclaim.as_str().to_owned()),
            storage_class_name: v.class.map(str::to_owned),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: v.pvc.namespace(),
                name: Some(v.pvc.name_any()),
                uid: Some(v.uid.to_owned()),
                resource_version: v.pvc.resource_version(),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// Whether `s` can be a UID the API server made: a UID becomes a path component, so nothing
/// else (`..`, `/`) ever does.
fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The claim UID of `pv` when this provisioner made it under `root` (see the module's
/// Guarantees), else `None`.
#[must_use]
pub fn provisioned_here(pv: &PersistentVolume, root: &Path) -> Option<String> {
    if pv.annotations().get(ANN_PROVISIONED_BY).map(String::as_str) != Some(PROVISIONER) {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    let uid = spec.claim_ref.as_ref()?.uid.clone().filter(|u| is_uid(u))?;
    let mode = if spec.volume_mode.as_deref() == Some("Block") { VolumeMode::Block } else { VolumeMode::Filesystem };
    let path = spec.host_path.as_ref()?.path.as_str();
    (Path::new(path) == source_path(root, &uid, mode)).then_some(uid)
}

/// The PV's reclaim policy.
#[must_use]
pub fn reclaim_of(pv: &PersistentVolume) -> ReclaimPolicy {
    ReclaimPolicy::parse(pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()))
}

/// The PV's phase (`None` until written).
#[must_use]
pub fn phase_of(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn pv_err(volume: &str) -> impl FnOnce(client::UpdateError<client::Never>) -> ProvisionError + '_ {
    move |e| ProvisionError::VolumeApi { volume: volume.to_owned(), source: Box::new(e) }
}

/// Sets the PV's `status.phase` (no write when it already is).
///
/// # Errors
/// When the status cannot be written.
pub async fn set_phase(api: &Api<PersistentVolume>, pv: &PersistentVolume, phase: &str) -> Result<(), ProvisionError> {
    let name = pv.name_any();
    client::update_status_from(api, pv, |p: &mut PersistentVolume| {
        p.status.get_or_insert_with(PersistentVolumeStatus::default).phase = Some(phase.to_owned());
    })
    .await
    .map_err(pv_err(&name))?;
    Ok(())
}

/// Drops [`PV_PROTECTION`] and deletes the PV (both idempotent: a PV already gone is fine).
async fn delete(api: &Api<PersistentVolume>, name: &str) -> Result<(), ProvisionError> {
    match client::update(api, name, |p: &mut PersistentVolume| {
        if let Some(f) = p.metadata.finalizers.as_mut() {
            f.retain(|x| x != PV_PROTECTION);
        }
    })
    .await
    {
        Ok(_) => {}
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(pv_err(name)(e)),
    }
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(ProvisionError::VolumeApi { volume: name.to_owned(), source: Box::new(e) }),
    }
}

/// Applies the reclaim policy for the claim with `uid`, whose claim is gone or going: `pv` is
/// its PV when it has one (a claim bound by an earlier version may not: then `Delete`, as
/// those versions did). Returns the policy applied.
///
/// # Errors
/// When the data cannot be released or the PV not updated or deleted.
pub async fn reclaim(
    client: &kube::Client,
    root: &Path,
    uid: &str,
    pv: Option<&PersistentVolume>,
    claim: &str,
) -> Result<ReclaimPolicy, ProvisionError> {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    let policy = pv.map_or(ReclaimPolicy::Delete, reclaim_of);
    let (r, u, c) = (root.to_owned(), uid.to_owned(), claim.to_owned());
    let blocking = tokio::task::spawn_blocking(move || match policy {
        ReclaimPolicy::Delete => release_device(&r, &u, &c).and_then(|()| release_dir(&r, &u, &c)),
        ReclaimPolicy::Retain => release_device(&r, &u, &c),
    });
    blocking.await.map_err(|e| ProvisionError::Api { claim: claim.to_owned(), source: Box::new(e) })??;
    let Some(pv) = pv else { return Ok(policy) };
    match policy {
        ReclaimPolicy::Delete => {
            delete(&api, &pv.name_any()).await?;
            tracing::info!(volume = %pv.name_any(), "deleted the volume and its data (reclaim policy Delete)");
        }
        ReclaimPolicy::Retain => {
            if phase_of(pv) != Some(RELEASED) {
                set_phase(&api, pv, RELEASED).await?;
                let msg = format!("claim {claim} is gone; the data stays in {} (reclaim policy Retain)", claim_dir(root, uid).display());
                events::publish(client, COMPONENT, pv, EventType::Normal, "VolumeReleased", &msg).await;
            }
            // Not bound any more: pv-protection lets a deleted PV go (the data stays).
            if pv.meta().deletion_timestamp.is_some() {
                client::update(&api, &pv.name_any(), |p: &mut PersistentVolume| {
                    if let Some(f) = p.metadata.finalizers.as_mut() {
                        f.retain(|x| x != PV_PROTECTION);
                    }
                })
                .await
                .map_err(pv_err(&pv.name_any()))?;
            }
        }
    }
    Ok(policy)
}

struct Ctx {
    client: kube::Client,
    root: PathBuf,
}

/// One PV: reclaimed when this provisioner made it and its claim is gone; otherwise the claim's
/// reconcile owns it (a bound PV being deleted waits for its claim, as with pv-protection).
async fn reconcile(pv: Arc<PersistentVolume>, ctx: Arc<Ctx>) -> Result<Action, ProvisionError> {
    let Some(uid) = provisioned_here(&pv, &ctx.root) else { return Ok(Action::await_change()) };
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else { return Ok(Action::await_change()) };
    let (ns, name) = (claim_ref.namespace.clone().unwrap_or_default(), claim_ref.name.clone().unwrap_or_default());
    let claim = format!("{ns}/{name}");
    // A claimRef without a name names no claim (this provisioner always writes both).
    let live = !ns.is_empty()
        && !name.is_empty()
        && Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(|e| ProvisionError::VolumeApi { volume: pv.name_any(), source: Box::new(e) })?
            .is_some_and(|c| c.uid().as_deref() == Some(uid.as_str()));
    if live {
        return Ok(Action::await_change());
    }
    let span = tracing::info_span!("volume", volume = %pv.name_any(), claim = %claim);
    reclaim(&ctx.client, &ctx.root, &uid, Some(&pv), &claim).instrument(span).await?;
    Ok(Action::await_change())
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(pv: Arc<PersistentVolume>, err: &ProvisionError, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(volume = %pv.name_any(), "{}", client::error_chain(err));
    let client = ctx.client.clone();
    let msg = client::error_chain(err);
    // Kubernetes' reasons: the deleter's failure, or (Retain) the release's.
    let reason = match reclaim_of(&pv) {
        ReclaimPolicy::Delete => "VolumeFailedDelete",
        ReclaimPolicy::Retain => "VolumeFailedRelease",
    };
    tokio::spawn(async move { events::publish(&client, COMPONENT, pv.as_ref(), EventType::Warning, reason, &msg).await });
    Action::requeue(Duration::from_secs(5))
}

/// Runs the PV side until the process stops: every PV this provisioner made under `root` whose
/// claim is gone is reclaimed, on start (the initial list) and when a claim goes.
pub async fn run(client: kube::Client, root: PathBuf) {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let ctx = Arc::new(Ctx { client, root });
    // A claim's deletion wakes its PV (by the name the provisioner gives it).
    let claims = watcher(pvcs, watcher::Config::default()).default_backoff().touched_objects();
    Runner::new(pvs, watcher::Config::default())
        .watches_stream(claims, |pvc: PersistentVolumeClaim| pvc.uid().map(|u| ObjectRef::new(&name_for(&u))))
        .run(reconcile, error_policy, ctx)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "0b9e2f4c-1d2e-4f60-9a7b-3c4d5e6f7a8b";

    fn claim(mode: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "vms", "uid": UID, "resourceVersion": "7"},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeMode": mode, "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap()
    }

    fn pv(mode: &str, root: &Path) -> PersistentVolume {
        let pvc = claim(mode);
        build(&NewVolume {
            pvc: &pvc,
            uid: UID,
            root,
            class: Some("local"),
            reclaim: ReclaimPolicy::Retain,
            capacity: Quantity("1Gi".into()),
            device: (mode == "Block").then_some(Path::new("/dev/loop3")),
        })
    }

    #[test]
    fn a_filesystem_pv_points_at_the_claims_directory_and_a_block_pv_at_its_image() {
        let root = Path::new("/var/lib/virtplug/storage");
        let fs = serde_json::to_value(pv("Filesystem", root)).unwrap();
        assert_eq!(fs["metadata"]["name"], format!("pvc-{UID}"));
        assert_eq!(fs["metadata"]["annotations"][ANN_PROVISIONED_BY], PROVISIONER);
        assert_eq!(fs["metadata"]["finalizers"], json!([PV_PROTECTION]));
        assert_eq!(fs["spec"]["hostPath"], json!({"path": format!("/var/lib/virtplug/storage/{UID}"), "type": "Directory"}));
        assert_eq!(fs["spec"]["capacity"], json!({"storage": "1Gi"}));
        assert_eq!(fs["spec"]["accessModes"], json!(["ReadWriteMany"]));
        assert_eq!(fs["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(fs["spec"]["storageClassName"], "local");
        assert_eq!(
            fs["spec"]["claimRef"],
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "vms", "name": "data", "uid": UID, "resourceVersion": "7"})
        );
        let block = serde_json::to_value(pv("Block", root)).unwrap();
        assert_eq!(block["spec"]["hostPath"], json!({"path": format!("/var/lib/virtplug/storage/{UID}/block.img"), "type": "File"}));
        assert_eq!(block["spec"]["volumeMode"], "Block");
        assert_eq!(block["metadata"]["annotations"][ANN_DEVICE], "/dev/loop3");
    }

    #[test]
    fn only_pvs_made_here_for_a_real_uid_are_recognised() {
        let root = Path::new("/srv/storage");
        assert_eq!(provisioned_here(&pv("Filesystem", root), root).as_deref(), Some(UID));
        assert_eq!(provisioned_here(&pv("Block", root), root).as_deref(), Some(UID));
        // Another storage root's PV, someone else's PV, and a claimRef UID that is a path.
        assert_eq!(provisioned_here(&pv("Filesystem", Path::new("/elsewhere")), root), None);
        let mut other = pv("Filesystem", root);
        other.metadata.annotations.as_mut().unwrap().insert(ANN_PROVISIONED_BY.into(), "example.com/nfs".into());
        assert_eq!(provisioned_here(&other, root), None);
        let mut sneaky = pv("Filesystem", root);
        let spec = sneaky.spec.as_mut().unwrap();
        spec.claim_ref.as_mut().unwrap().uid = Some("..".into());
        spec.host_path.as_mut().unwrap().path = "/srv".into();
        assert_eq!(provisioned_here(&sneaky, root), None);
    }
}
