//! A volume's source on this node, from its claim: the claim must be ready (bound and, for a
//! DataVolume, imported); then the local provisioner's file or loop device is opened, or — in
//! cluster mode — the volume inside the pod that has it: a hot-plugged claim in its attachment
//! pod ([`open`]), a boot claim in the VMI's launcher pod ([`open_in_launcher`]). Names from
//! the API are checked before they touch a path ([`source::check_name`], [`source::check_uid`]).
//!
//! A claim the storage watch last showed ready ([`crate::seen`]) is used as it showed it: no GET
//! on the hot-plug's path. Any other claim is read from the API, which also says why it waits.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;

use api::kubevirt::Volume;
use api::phases::{ClaimPhase, DataVolumePhase};
use api::DataVolume;

use crate::config::Shared;
use crate::seen::ReadyClaim;
use crate::source::{self, SourceError};

/// The claim a volume names ([`Volume::claim_name`]), and whether it is a DataVolume's (which
/// must also be imported before the claim is used).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub name: String,
    pub data_volume: bool,
}

impl Claim {
    /// The claim of `volume`; `None` for a source without one (emptyDisk, cloud-init).
    #[must_use]
    pub fn of(volume: &Volume) -> Option<Claim> {
        let name = volume.claim_name()?.to_owned();
        Some(Claim { name, data_volume: volume.persistent_volume_claim.is_none() })
    }
}

/// The loop device whose backing file is `backing`, from sysfs (the same lookup the
/// provisioner uses to find its devices again).
fn loop_device_of(backing: &Path) -> Option<PathBuf> {
    let backing = backing.canonicalize().ok()?;
    std::fs::read_dir("/sys/block").ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.strip_prefix("loop")?.parse::<u32>().ok()?;
        let b = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
        (Path::new(b.trim_end_matches('\n')) == backing).then(|| PathBuf::from(format!("/dev/{name}")))
    })
}

/// The claim `claim` in `ns`, if it is ready to be used: bound and, for a DataVolume, imported.
/// As the storage watch last showed it when it showed it ready, otherwise as the API has it.
async fn ready_claim(shared: &Shared, ns: &str, claim: &str, data_volume: bool) -> Result<ReadyClaim, SourceError> {
    source::check_name("claim name", claim)?;
    if let Some(ready) = shared.seen.ready(ns, claim, data_volume) {
        return Ok(ready);
    }
    let api_err = |e: kube::Error| SourceError::NotReady(format!("cannot read claim {claim}: {e}"));
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(shared.client.clone(), ns);
    // A DataVolume's two reads go out together (one round trip on the hot-plug's path, not
    // two); its state is judged first, as before.
    let (dv, pvc) = if data_volume {
        let dvs: Api<DataVolume> = Api::namespaced(shared.client.clone(), ns);
        let (dv, pvc) = tokio::join!(dvs.get_opt(claim), pvcs.get_opt(claim));
        (Some(dv), pvc)
    } else {
        (None, pvcs.get_opt(claim).await)
    };
    if let Some(dv) = dv {
        let dv = dv.map_err(api_err)?.ok_or_else(|| SourceError::NotReady(format!("DataVolume {claim} does not exist")))?;
        let st = dv.status.unwrap_or_default();
        match st.phase {
            Some(DataVolumePhase::Succeeded) => {}
            phase => {
                return Err(SourceError::NotReady(format!(
                    "DataVolume {claim} is {} ({})",
                    phase.unwrap_or(DataVolumePhase::Pending),
                    st.progress.as_deref().unwrap_or("N/A")
                )));
            }
        }
    }
    let pvc = pvc.map_err(api_err)?.ok_or_else(|| SourceError::NotReady(format!("claim {claim} does not exist")))?;
    if !ClaimPhase::is_bound(&pvc) {
        return Err(SourceError::NotReady(format!("claim {claim} is not bound yet")));
    }
    ReadyClaim::of(&pvc).ok_or_else(|| SourceError::NotReady(format!("claim {claim} has no UID")))
}

fn claim_dir(shared: &Shared, claim: &ReadyClaim) -> Result<PathBuf, SourceError> {
    source::check_uid("claim UID", &claim.uid)?;
    Ok(shared.config.storage_root.join(&claim.uid))
}

/// The host path of a claim (for volumes present from boot, which a QEMU the agent starts
/// opens by path; with launcher pods they are opened in the pod: [`open_in_launcher`]).
///
/// # Errors
/// When the claim is not ready or its data is not there.
pub async fn claim_path(shared: &Shared, ns: &str, claim: &Claim) -> Result<PathBuf, SourceError> {
    let ready = ready_claim(shared, ns, &claim.name, claim.data_volume).await?;
    let dir = claim_dir(shared, &ready)?;
    if !ready.block {
        return Ok(dir.join("disk.img"));
    }
    let missing = || SourceError::NotReady(format!("claim {} has no loop device yet", claim.name));
    // sysfs reads: off the async threads.
    tokio::task::spawn_blocking(move || loop_device_of(&dir.join("block.img"))).await.ok().flatten().ok_or_else(missing)
}

/// Launcher pods: opens boot claim `claim` of volume `volume` inside the VMI's launcher pod
/// (process `launcher_pid`, as this process sees it), where the kubelet mounted it — a
/// Filesystem claim's `disk.img` or a Block claim's device at the paths the controller gave
/// the pod ([`api::launcher_disks`]) — with the resolve rules of [`source::open_in_pod`]. The
/// claim is read first (bound and, for a DataVolume, imported) for its volume mode.
///
/// # Errors
/// As [`source::open_in_pod`]; `NotReady` while the claim is not ready.
pub(crate) async fn open_in_launcher(
    shared: &Shared,
    ns: &str,
    volume: &str,
    claim: &Claim,
    launcher_pid: i32,
    readonly: bool,
) -> Result<source::Opened, SourceError> {
    source::check_name("volume name", volume)?;
    let ready = ready_claim(shared, ns, &claim.name, claim.data_volume).await?;
    let block = ready.block;
    let path = if block { api::launcher_disks::device_path(volume) } else { api::launcher_disks::image_path(volume) };
    tokio::task::spawn_blocking(move || source::open_in_pod(launcher_pid, &path, readonly, block))
        .await
        .map_err(|e| SourceError::NotReady(e.to_string()))?
}

/// Opens the source of a hot-plug volume: from the local provisioner's storage root, or — in
/// cluster mode, when the volume's status names its attachment pod (`attachPodUID`, published
/// by KubeVirt's virt-controller or virtplug's with `--placement pods`; with `--launcher-pods`
/// it is waited for) — inside that pod: a Filesystem claim's `disk.img` at
/// `/<volume>/disk.img`, a Block claim's device at `/path/<volume>/<claim uid>` (where
/// KubeVirt's attachment pod has them).
pub(crate) async fn open(
    shared: &Shared,
    ns: &str,
    volume: &str,
    claim: &Claim,
    readonly: bool,
    attach_pod: Option<String>,
) -> Result<source::Opened, SourceError> {
    source::check_name("volume name", volume)?;
    let ready = ready_claim(shared, ns, &claim.name, claim.data_volume).await?;
    // Launcher pods: a claim reaches this node only through its attachment pod (the claim may
    // be a CSI volume that is mounted nowhere else); wait until the controller names it.
    if attach_pod.is_none() && shared.config.launcher_pods {
        return Err(SourceError::NotReady(format!("volume {volume} waits for its attachment pod (attachPodUID)")));
    }
    if let Some(pod) = attach_pod {
        let pods_dir = shared.config.kubelet_pods_dir.clone();
        let block = ready.block;
        source::check_uid("claim UID", &ready.uid)?;
        let path =
            if block { PathBuf::from("/path").join(volume).join(&ready.uid) } else { PathBuf::from("/").join(volume).join("disk.img") };
        return tokio::task::spawn_blocking(move || {
            let pid = source::attachment_pod_pid(&pods_dir, &pod)?;
            source::open_in_pod(pid, &path, readonly, block)
        })
        .await
        .map_err(|e| SourceError::NotReady(e.to_string()))?;
    }
    let dir = claim_dir(shared, &ready)?;
    tokio::task::spawn_blocking(move || {
        if ready.block {
            let backing = dir.join("block.img");
            source::open_block(loop_device_of(&backing), &backing, readonly)
        } else {
            source::open_image(&dir, readonly)
        }
    })
    .await
    .map_err(|e| SourceError::NotReady(e.to_string()))?
}
