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
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateChangeRequest {
    /// `Start` or `Stop`.
    pub action: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// For `Stop`: the VMI to stop (a newer VMI is left alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// `VirtualMachine.spec.template`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceTemplateSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<VirtualMachineInstanceSpec>,
}

/// `VirtualMachine.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub printable_status: Option<String>,
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
}

/// One entry of `VirtualMachine.status.volumeRequests`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineVolumeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_volume_options: Option<AddVolumeOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_volume_options: Option<RemoveVolumeOptions>,
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
}

/// Body of `PUT .../removevolume`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoveVolumeOptions {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// The sources a hot-plug request may name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<DataVolumeSource>,
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

/// One volume: exactly one source.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<DataVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_no_cloud: Option<CloudInitNoCloud>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_disk: Option<EmptyDisk>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl Volume {
    /// The JSON keys of the sources set on this volume (modelled and unmodelled ones).
    #[must_use]
    pub fn source_keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        if self.persistent_volume_claim.is_some() {
            keys.push("persistentVolumeClaim".to_owned());
        }
        if self.data_volume.is_some() {
            keys.push("dataVolume".to_owned());
        }
        if self.cloud_init_no_cloud.is_some() {
            keys.push("cloudInitNoCloud".to_owned());
        }
        if self.empty_disk.is_some() {
            keys.push("emptyDisk".to_owned());
        }
        keys.extend(self.extra.keys().cloned());
        keys
    }

    /// Whether this is a hot-pluggable DataVolume or PVC volume (KubeVirt's `IsHotplugVolume`).
    #[must_use]
    pub fn is_hotpluggable(&self) -> bool {
        self.persistent_volume_claim.as_ref().is_some_and(|p| p.hotpluggable == Some(true))
            || self.data_volume.as_ref().is_some_and(|d| d.hotpluggable == Some(true))
    }
}

/// `volume.persistentVolumeClaim`: core/v1's source plus KubeVirt's `hotpluggable`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimVolumeSource {
    pub claim_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `volume.dataVolume`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `volume.cloudInitNoCloud`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitNoCloud {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_base64: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `volume.emptyDisk`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDisk {
    pub capacity: Quantity,
}

/// `VirtualMachineInstance.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    /// `Pending`, `Scheduling`, `Scheduled`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_status: Vec<VolumeStatus>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// One entry of `VirtualMachineInstance.status.volumeStatus`, exactly as KubeVirt's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    pub name: String,
    /// Guest device name (`sda`); empty until attached.
    #[serde(default)]
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_info: Option<PersistentVolumeClaimInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplug_volume: Option<HotplugVolumeStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

impl VolumeStatus {
    /// Moves the entry to `phase`/`reason`/`message`, appending the transition to its
    /// `phaseTransitionTimestamps` (virtplug's addition, RFC 3339 with milliseconds, so
    /// per-phase latency can be measured; KubeVirt keeps these per VMI only). No change, no
    /// new timestamp.
    pub fn transition(&mut self, phase: &str, reason: &str, message: &str) {
        if self.phase.as_deref() == Some(phase) && self.reason.as_deref() == Some(reason) && self.message.as_deref() == Some(message) {
            return;
        }
        if self.phase.as_deref() != Some(phase) {
            let stamps = self.extra.entry("phaseTransitionTimestamps".to_owned()).or_insert_with(|| Value::Array(Vec::new()));
            if let Some(a) = stamps.as_array_mut() {
                let at = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
                a.push(serde_json::json!({"phase": phase, "phaseTransitionTimestamp": at}));
            }
        }
        self.phase = Some(phase.to_owned());
        self.reason = Some(reason.to_owned());
        self.message = Some(message.to_owned());
    }

    /// When the entry entered `phase`, from `phaseTransitionTimestamps`.
    #[must_use]
    pub fn entered(&self, phase: &str) -> Option<jiff::Timestamp> {
        self.extra.get("phaseTransitionTimestamps")?.as_array()?.iter().rev().find(|t| t["phase"] == phase)?["phaseTransitionTimestamp"]
            .as_str()?
            .parse()
            .ok()
    }
}

/// `volumeStatus[].hotplugVolume`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "attachPodUID")]
    pub attach_pod_uid: Option<String>,
}

/// `volumeStatus[].persistentVolumeClaimInfo`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem_overhead: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}
