//! kubevirt.io/v1 `VirtualMachine` and `VirtualMachineInstance`: the subset that hot-plug,
//! lifecycle and Redfish need, with KubeVirt's JSON field names.
//!
//! Every struct keeps the fields it does not model in `extra`, so a client that reads an object,
//! changes one field and writes it back does not drop what KubeVirt (or a newer virtplug) put
//! there. Lists default to empty and are left out when empty, as KubeVirt's `omitempty` does.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::phases::{PrintableStatus, StateChangeAction, VmiPhase};

mod instance_status;
#[cfg(test)]
mod round_trip;
mod volume;

pub use instance_status::{HotplugVolumeStatus, InterfaceStatus, PersistentVolumeClaimInfo, VirtualMachineInstanceStatus, VolumeStatus};
pub use volume::{
    CloudInitKind, CloudInitSource, DataVolumeSource, EmptyDisk, LocalObjectReference, PersistentVolumeClaimVolumeSource, Volume,
};

/// Fields a struct does not model, kept verbatim through a read-modify-write.
pub type Extra = BTreeMap<String, Value>;

/// `VirtualMachine.spec`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachine",
    plural = "virtualmachines",
    namespaced,
    status = "VirtualMachineStatus",
    shortname = "vm",
    shortname = "vms",
    category = "all",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.printableStatus"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Deprecated boolean form of `runStrategy` (`true` = `Always`, `false` = `Halted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
    /// `Always`, `Halted`, `Manual`, `RerunOnFailure`, `Once` (or `WaitAsReceiver`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<String>,
    pub template: VirtualMachineInstanceTemplateSpec,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// How a VM's VMI is kept running (`spec.runStrategy`, or the legacy `spec.running`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStrategy {
    /// A VMI always exists; a finished one is replaced.
    Always,
    /// No VMI.
    Halted,
    /// Only the start, stop and restart subresources create or delete the VMI.
    Manual,
    /// Like `Always`, but a VMI that succeeded (the guest shut down) is left stopped.
    RerunOnFailure,
    /// Run once; when the VMI finishes the VM becomes `Halted`.
    Once,
    /// The target of a migration between clusters (not supported here; treated as `Halted`).
    WaitAsReceiver,
}

impl RunStrategy {
    /// The strategies, as written in `spec.runStrategy`.
    pub const ALL: [RunStrategy; 6] = [
        RunStrategy::Always,
        RunStrategy::Halted,
        RunStrategy::Manual,
        RunStrategy::RerunOnFailure,
        RunStrategy::Once,
        RunStrategy::WaitAsReceiver,
    ];

    /// The value in `spec.runStrategy`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            RunStrategy::Always => "Always",
            RunStrategy::Halted => "Halted",
            RunStrategy::Manual => "Manual",
            RunStrategy::RerunOnFailure => "RerunOnFailure",
            RunStrategy::Once => "Once",
            RunStrategy::WaitAsReceiver => "WaitAsReceiver",
        }
    }

    /// Parses a `spec.runStrategy` value.
    #[must_use]
    pub fn parse(s: &str) -> Option<RunStrategy> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl VirtualMachineSpec {
    /// The effective strategy: `runStrategy`, else `running` (`true` = `Always`, `false` =
    /// `Halted`), else `Halted` (KubeVirt's default). An unknown value counts as `Halted`
    /// (admission refuses it).
    #[must_use]
    pub fn effective_run_strategy(&self) -> RunStrategy {
        match (&self.run_strategy, self.running) {
            (Some(s), _) => RunStrategy::parse(s).unwrap_or(RunStrategy::Halted),
            (None, Some(true)) => RunStrategy::Always,
            _ => RunStrategy::Halted,
        }
    }
}

/// `VirtualMachine.status.stateChangeRequests[]`: a start or stop asked through the
/// subresources, carried out by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateChangeRequest {
    /// `Start` or `Stop`.
    pub action: StateChangeAction,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// For `Stop`: the VMI to stop (a newer VMI is left alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `VirtualMachine.spec.template`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceTemplateSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<VirtualMachineInstanceSpec>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `VirtualMachine.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printable_status: Option<PrintableStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Legacy imperative hot-plug requests (KubeVirt's `HotplugVolumes` gate).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_requests: Vec<VirtualMachineVolumeRequest>,
    /// Pending start/stop requests from the subresources, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_change_requests: Vec<StateChangeRequest>,
    /// VMIs that failed before they ran, in a row (KubeVirt's crash-loop backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<StartFailure>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `VirtualMachine.status.startFailure` (KubeVirt's `VirtualMachineStartFailure`): the VM's VMIs
/// failed this many times in a row before reaching `Running`; the next is started no earlier
/// than `retryAfterTimestamp`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartFailure {
    #[serde(default)]
    pub consecutive_fail_count: u32,
    #[serde(default, rename = "lastFailedVMIUID", skip_serializing_if = "Option::is_none")]
    pub last_failed_vmi_uid: Option<String>,
    /// RFC 3339, whole seconds (as `metav1.Time`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_timestamp: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// A condition as KubeVirt writes it (`VirtualMachineCondition`, `VirtualMachineInstanceCondition`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339; KubeVirt writes `null` here, so it stays optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// One entry of `VirtualMachine.status.volumeRequests`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineVolumeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_volume_options: Option<AddVolumeOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_volume_options: Option<RemoveVolumeOptions>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// Body of `PUT .../addvolume` (and a legacy volume request).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddVolumeOptions {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Disk>,
    pub volume_source: HotplugVolumeSource,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl AddVolumeOptions {
    /// The volume this request adds: its claim or DataVolume source marked `hotpluggable`, as
    /// KubeVirt's virt-api does.
    #[must_use]
    pub fn volume(&self) -> Volume {
        let hot = Some(true);
        Volume {
            name: self.name.clone(),
            persistent_volume_claim: self
                .volume_source
                .persistent_volume_claim
                .clone()
                .map(|p| PersistentVolumeClaimVolumeSource { hotpluggable: hot, ..p }),
            data_volume: self.volume_source.data_volume.clone().map(|d| DataVolumeSource { hotpluggable: hot, ..d }),
            ..Volume::default()
        }
    }

    /// The disk this request adds, named after the volume: the request's, else KubeVirt's
    /// default for a hot-plugged disk (`disk: {bus: scsi}`).
    #[must_use]
    pub fn disk(&self) -> Disk {
        let disk = self.disk.clone().unwrap_or_else(|| Disk {
            disk: Some(DiskTarget { bus: Some("scsi".to_owned()), ..DiskTarget::default() }),
            ..Disk::default()
        });
        Disk { name: self.name.clone(), ..disk }
    }
}

/// Body of `PUT .../removevolume`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoveVolumeOptions {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// The sources a hot-plug request may name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<DataVolumeSource>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `VirtualMachineInstance.spec`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstance",
    plural = "virtualmachineinstances",
    namespaced,
    status = "VirtualMachineInstanceStatus",
    shortname = "vmi",
    shortname = "vmis",
    category = "all",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.interfaces[0].ipAddress"}"#,
    printcolumn = r#"{"name":"NodeName","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceSpec {
    pub domain: DomainSpec,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl VirtualMachineInstance {
    /// The VMI's phase (`None` until someone wrote one).
    #[must_use]
    pub fn phase(&self) -> Option<&VmiPhase> {
        self.status.as_ref().and_then(|s| s.phase.as_ref())
    }

    /// Whether the VMI is in phase `Running`.
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.phase() == Some(&VmiPhase::Running)
    }
}

/// `spec.domain`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    #[serde(default)]
    pub devices: Devices,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl DomainSpec {
    /// cores × sockets × threads (each at least 1), saturating: three `u32`s can overflow a
    /// `u64`, and any count past [`crate::validation::MAX_VCPUS`] is refused anyway.
    #[must_use]
    pub fn vcpus(&self) -> u64 {
        let Some(c) = &self.cpu else { return 1 };
        [c.cores, c.sockets, c.threads].iter().fold(1u64, |n, v| n.saturating_mul(u64::from(v.unwrap_or(1).max(1))))
    }
}

/// `spec.domain.resources` (KubeVirt's own `ResourceRequirements`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.domain.memory`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<Quantity>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.domain.cpu`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.domain.firmware`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Bootloader>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.domain.firmware.bootloader`: which firmware boots the guest, BIOS (SeaBIOS, KubeVirt's
/// default) or UEFI (OVMF). Admission refuses both at once.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootloader {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<BiosBootloader>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efi: Option<EfiBootloader>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `bootloader.bios`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BiosBootloader {
    /// KubeVirt: SeaBIOS also prints to the serial console. Accepted and ignored here: the
    /// serial console is always there, and the test media print their own lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_serial: Option<bool>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `bootloader.efi`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EfiBootloader {
    /// KubeVirt's default is `true`; virtplug has no secure-boot OVMF, so admission refuses
    /// `true` and a missing value means `false` here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<bool>,
    /// KubeVirt: keep the NVRAM (EFI variables) across VMI restarts. virtplug keeps them per
    /// run directory either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent: Option<bool>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.domain.firmware.kernelBoot`: boot a kernel and initrd directly.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBoot {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_args: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<KernelBootContainer>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// Where the kernel and initrd come from (`kernelBoot.container`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootContainer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `spec.domain.devices`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// One disk: exactly one of `disk`, `lun`, `cdrom` (none means `disk` with default bus).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Required in a spec (admission checks it); may be left out of `AddVolumeOptions.disk`,
    /// where the volume's name is used.
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lun: Option<DiskTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdrom: Option<CdromTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// The kind of device a disk is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskKind {
    Disk,
    Lun,
    Cdrom,
}

impl DiskKind {
    /// The JSON key of this kind (`disk`, `lun`, `cdrom`).
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            DiskKind::Disk => "disk",
            DiskKind::Lun => "lun",
            DiskKind::Cdrom => "cdrom",
        }
    }
}

impl Disk {
    /// The device kinds set on this disk (KubeVirt requires at most one).
    #[must_use]
    pub fn kinds(&self) -> Vec<DiskKind> {
        let mut kinds = Vec::new();
        if self.disk.is_some() {
            kinds.push(DiskKind::Disk);
        }
        if self.lun.is_some() {
            kinds.push(DiskKind::Lun);
        }
        if self.cdrom.is_some() {
            kinds.push(DiskKind::Cdrom);
        }
        kinds
    }

    /// The device kind, `Disk` when none is set (KubeVirt's default).
    #[must_use]
    pub fn kind(&self) -> DiskKind {
        self.kinds().first().copied().unwrap_or(DiskKind::Disk)
    }

    /// The bus named by the disk's device, if any.
    #[must_use]
    pub fn bus(&self) -> Option<&str> {
        self.disk
            .as_ref()
            .and_then(|d| d.bus.as_deref())
            .or_else(|| self.lun.as_ref().and_then(|d| d.bus.as_deref()))
            .or_else(|| self.cdrom.as_ref().and_then(|d| d.bus.as_deref()))
    }

    /// Whether the guest sees the device read-only (a CD-ROM is read-only unless it says otherwise).
    #[must_use]
    pub fn readonly(&self) -> bool {
        match self.kind() {
            DiskKind::Disk => self.disk.as_ref().and_then(|d| d.readonly).unwrap_or(false),
            DiskKind::Lun => self.lun.as_ref().and_then(|d| d.readonly).unwrap_or(false),
            DiskKind::Cdrom => self.cdrom.as_ref().and_then(|d| d.readonly).unwrap_or(true),
        }
    }
}

/// `disk.disk` and `disk.lun`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `disk.cdrom`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdromTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tray: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}
