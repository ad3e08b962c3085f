//! Declarative hot-plug (KubeVirt's `DeclarativeHotplugVolumes`): make a running VMI's
//! hot-pluggable DataVolume/PVC volumes, and their disks, match its VM's template, by name.
//!
//! [`plan`] is the algorithm, pure and typed (every field, modelled or not, is carried verbatim
//! through the structs' `extra`); [`reconcile`] sends its patch to the VMI through
//! [`client::patch_if`]; [`status`] reports the volumes' `Pending`/`Bound` phases. Port of
//! KubeVirt v1.9's `pkg/storage/hotplug` (research notes: `reference/declarative-hotplug.md` §2).
//!
//! # Rules
//! 1. Kept VMI volumes, in VMI order: every volume that is not declarative-hot-pluggable; a
//!    hot-pluggable one only while the VM has a volume of that name that is either not
//!    hot-pluggable or equal to it (a changed source is dropped now and re-added later).
//! 2. New VM volumes, in VM order: hot-pluggable VM volumes named neither in the VMI spec nor in
//!    `status.volumeStatus` (so a re-add waits until the previous unplug has finished).
//! 3. Kept VMI disks: those with a volume in the result; otherwise kept only if the VM still has
//!    the disk and it is an empty CD-ROM drive (eject, swap).
//! 4. New VM disks, in VM order: disks of new hot-plug volumes that the VMI does not have.
//! 5. Nothing changed → no patch. Reordering the VM's lists alone changes nothing.
//! 6. (virtplug's) A kept disk's `bootOrder` follows the VM's disk of that name: QEMU's
//!    `bootindex` is settable at run time and read at the guest's next reset, so a changed boot
//!    order (a Redfish boot override, or its end) applies to the next reboot inside the guest.
//!
//! # Patch
//! `test` of the VMI's resourceVersion ([`client::patch_if`]), `test` of the old volumes and
//! disks, then `replace` of each (or `add` when the old list was empty), so a VMI changed since
//! the read is re-planned instead of overwritten.

pub mod attachment_pod;
mod plan;
pub mod status;

use kube::api::Api;
use tracing::Instrument;

use api::kubevirt::VirtualMachineInstanceSpec;
use api::{VirtualMachine, VirtualMachineInstance};

pub use plan::plan;
pub use status::{report_claims, report_claims_with};

/// Errors of [`reconcile`].
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("cannot read VM {object}")]
    Read {
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The patch was refused, kept conflicting, or could not be planned.
    #[error("VMI {object}: the declarative hot-plug patch failed")]
    Patch {
        object: String,
        #[source]
        source: client::PatchIfError<serde_json::Error>,
    },
}

/// A hook run before each VMI patch (tests use it to inject a conflict).
pub type BeforePatch = client::BeforeWrite;

/// Patches the VMI `name` of `vmis` to match `template` (the VM's `spec.template.spec`).
/// `seen` is the caller's copy of the VMI (a store's): when the plan on it finds nothing to
/// do, nothing is read or written; otherwise its patch is written at once, behind `seen`'s
/// resourceVersion, and re-planned on a fresh read if the VMI moved on
/// ([`client::patch_if_seen`]). Returns whether a patch was written.
///
/// # Errors
/// `Patch` (e.g. admission refused the output, or the VMI kept changing).
pub async fn reconcile_vmi(
    vmis: &Api<VirtualMachineInstance>,
    template: &VirtualMachineInstanceSpec,
    seen: &VirtualMachineInstance,
    opts: &client::PatchIfOptions,
) -> Result<bool, ReconcileError> {
    let object =
        format!("{}/{}", seen.metadata.namespace.as_deref().unwrap_or_default(), seen.metadata.name.as_deref().unwrap_or_default());
    let span = tracing::info_span!("vmi", vmi = %object);
    let patched = client::patch_if_seen(vmis, seen, opts, |vmi| plan(template, vmi))
        .instrument(span)
        .await
        .map_err(|source| ReconcileError::Patch { object, source })?;
    Ok(patched.wrote)
}

/// Reconciles the VMI of VM `ns/name` once: reads the VM, then plans and patches the VMI on a
/// fresh read. A patch whose `test` fails because the VMI changed since the read is re-planned
/// on a fresh read, up to `attempts` times. Returns whether a patch was written.
///
/// # Errors
/// `Read` for the VM, `Patch` (e.g. admission refused the output, or the VMI kept changing).
pub async fn reconcile(
    client: &kube::Client,
    ns: &str,
    name: &str,
    attempts: u32,
    before_patch: Option<&BeforePatch>,
) -> Result<bool, ReconcileError> {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    let object = format!("{ns}/{name}");
    let vm = vms.get_opt(name).await.map_err(|source| ReconcileError::Read { object: object.clone(), source })?;
    let Some(template) = vm.and_then(|vm| vm.spec.template.spec) else { return Ok(false) };
    let opts = client::PatchIfOptions { attempts, before_write: before_patch.cloned(), ..client::PatchIfOptions::default() };
    let patched = client::patch_if(&vmis, name, &opts, |vmi| plan(&template, vmi))
        .await
        .map_err(|source| ReconcileError::Patch { object, source })?;
    Ok(patched.wrote)
}
