//! Local storage for the embedded deployment: a PVC provisioner ([`provisioner`]) that serves
//! the claims of its StorageClasses ([`class`]) and makes and reclaims their PersistentVolumes
//! ([`volume`]), and CDI's DataVolume import ([`import`]), all over a storage root directory on
//! this machine.
//!
//! Layout: one directory per claim, named by the claim's UID (so a name reused after a delete
//! never meets the old data, and no name from the API ever becomes a path component):
//! `ROOT/<uid>/disk.img` for `Filesystem` claims, `ROOT/<uid>/block.img` behind a loop device
//! for `Block` claims. The claim records both in annotations ([`ANN_PATH`], [`ANN_DEVICE`]) for
//! the node agent and for people; the truth about a loop device is sysfs
//! ([`loopdev::find`]).

pub mod class;
pub mod import;
pub mod loopdev;
pub mod provisioner;
pub mod volume;

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

/// Finalizer that keeps a claim until its backing is released.
pub const FINALIZER: &str = "virtplug.io/local-storage";
/// Annotation: the claim's directory.
pub const ANN_PATH: &str = "virtplug.io/local-path";
/// Annotation: the loop device of a `Block` claim.
pub const ANN_DEVICE: &str = "virtplug.io/loop-device";

/// A claim's volume mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeMode {
    Filesystem,
    Block,
}

impl VolumeMode {
    /// The claim's `spec.volumeMode` (`Filesystem` when unset, as Kubernetes defaults it).
    #[must_use]
    pub fn of(pvc: &PersistentVolumeClaim) -> VolumeMode {
        match pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) {
            Some("Block") => VolumeMode::Block,
            _ => VolumeMode::Filesystem,
        }
    }

    /// The image file's name in the claim's directory.
    #[must_use]
    pub fn image_name(self) -> &'static str {
        match self {
            VolumeMode::Filesystem => "disk.img",
            VolumeMode::Block => "block.img",
        }
    }
}

/// The directory of the claim with `uid` under `root`.
#[must_use]
pub fn claim_dir(root: &Path, uid: &str) -> PathBuf {
    root.join(uid)
}

/// Where the bytes of `pvc` live: the `disk.img` of a Filesystem claim, the loop device of a
/// Block claim (`None` while it is not attached or the claim has no UID).
#[must_use]
pub fn data_path(root: &Path, pvc: &PersistentVolumeClaim) -> Option<PathBuf> {
    let uid = pvc.uid()?;
    let image = claim_dir(root, &uid).join(VolumeMode::of(pvc).image_name());
    match VolumeMode::of(pvc) {
        VolumeMode::Filesystem => Some(image),
        VolumeMode::Block => loopdev::find(&image),
    }
}

/// Parses a Kubernetes quantity of bytes (`1Gi`, `500M`, `1073741824`, `1.5Gi`, `1e9`).
///
/// # Errors
/// A message naming the value when it is not a quantity or not a whole number of bytes ≥ 1.
pub fn parse_bytes(q: &str) -> Result<u64, String> {
    api::quantity::bytes(q)
}

/// The requested size of `pvc` in bytes.
///
/// # Errors
/// A message naming `spec.resources.requests.storage` when it is missing or not a size.
pub fn requested_bytes(pvc: &PersistentVolumeClaim) -> Result<u64, String> {
    let q = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| "spec.resources.requests.storage is required: set the claim's size, e.g. 1Gi".to_owned())?;
    parse_bytes(&q.0).map_err(|e| format!("spec.resources.requests.storage: {e}"))
}
