//! Where a launcher pod has its VMI's boot claims (KubeVirt's virt-launcher layout, with `/run`
//! for `/var/run`): the controller writes these paths into the pod
//! (`controller::lifecycle::launcher_pod`), the node agent opens them inside it through the
//! launcher's `/proc/PID/root` (`node::source::open_in_pod`). One definition for both sides.
//!
//! `/run`, not KubeVirt's `/var/run`: in an image `/var/run` is a symlink to `/run`, and the
//! agent's in-pod open follows no symlink (`RESOLVE_NO_SYMLINKS`), so the real path is used.

use std::path::PathBuf;

/// The directory under which each Filesystem boot claim is mounted, at `DIR/<volume>`
/// (KubeVirt's `/var/run/kubevirt-private/vmi-disks`).
pub const FILESYSTEM_DIR: &str = "/run/kubevirt-private/vmi-disks";

/// The mount path of Filesystem boot claim `volume` (a VMI volume name, DNS-1123: no `/`).
#[must_use]
pub fn mount_path(volume: &str) -> PathBuf {
    PathBuf::from(FILESYSTEM_DIR).join(volume)
}

/// The disk image of Filesystem boot claim `volume`: `disk.img` in its mount (KubeVirt's; the
/// launcher creates it sparse, the claim's size, in an empty claim).
#[must_use]
pub fn image_path(volume: &str) -> PathBuf {
    mount_path(volume).join("disk.img")
}

/// The device path of Block boot claim `volume` (a `volumeDevice`; KubeVirt's `/dev/<volume>`).
#[must_use]
pub fn device_path(volume: &str) -> PathBuf {
    PathBuf::from("/dev").join(volume)
}
