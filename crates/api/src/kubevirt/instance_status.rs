//! `VirtualMachineInstance.status`, with the hot-plug `volumeStatus` entries and their
//! transitions.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Condition, Extra};
use crate::phases::{VmiPhase, VolumePhase, VolumeReason};

/// `VirtualMachineInstance.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    /// `Pending`, `Scheduling`, `Scheduled`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<VmiPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_status: Vec<VolumeStatus>,
    /// The guest's network interfaces, as far as the node agent knows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStatus>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// One entry of `VirtualMachineInstance.status.interfaces`, with KubeVirt's field names. The node
/// agent writes what it knows from the machine it built (`infoSource: domain`): the name, the MAC
/// address, and the address QEMU's user-mode network leases; `interfaceName` (the guest's name
/// for it) would come from a guest agent, which virtplug does not run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info_source: Option<String>,
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
    pub phase: Option<VolumePhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<VolumeReason>,
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

impl VirtualMachineInstanceStatus {
    /// The `volumeStatus` entry of volume `name`.
    #[must_use]
    pub fn volume(&self, name: &str) -> Option<&VolumeStatus> {
        self.volume_status.iter().find(|e| e.name == name)
    }

    /// The `volumeStatus` entry of volume `name`, created (a hot-plug entry, without a phase)
    /// when there is none. Either writer may create it (DESIGN: the node agent can beat the
    /// controller to it), so both go through here.
    pub fn volume_entry(&mut self, name: &str) -> &mut VolumeStatus {
        let idx = match self.volume_status.iter().position(|e| e.name == name) {
            Some(i) => i,
            None => {
                self.volume_status.push(VolumeStatus {
                    name: name.to_owned(),
                    hotplug_volume: Some(HotplugVolumeStatus::default()),
                    ..VolumeStatus::default()
                });
                self.volume_status.len() - 1
            }
        };
        &mut self.volume_status[idx]
    }
}

impl VolumeStatus {
    /// Whether no phase was written yet (absent, or KubeVirt's empty string).
    #[must_use]
    pub fn phase_unset(&self) -> bool {
        self.phase.as_ref().is_none_or(|p| p.as_str().is_empty())
    }

    /// Moves the entry to `phase`/`reason`/`message`, appending the transition to its
    /// `phaseTransitionTimestamps` (virtplug's addition, RFC 3339 with milliseconds, so
    /// per-phase latency can be measured; KubeVirt keeps these per VMI only). No change, no
    /// new timestamp.
    pub fn transition(&mut self, phase: VolumePhase, reason: VolumeReason, message: &str) {
        self.transition_at(phase, reason, message, jiff::Timestamp::now());
    }

    /// [`VolumeStatus::transition`], stamped `at` (when the phase was reached, which a writer
    /// that queues its writes knows better than the moment the write is made) — or at the
    /// entry's last stamp, if that is later: another writer's phase written in between (the
    /// controller's `Bound` landing while the agent's `AttachedToNode` waited in its queue)
    /// keeps the timeline in the order of its phases.
    pub fn transition_at(&mut self, phase: VolumePhase, reason: VolumeReason, message: &str, at: jiff::Timestamp) {
        if self.phase.as_ref() == Some(&phase) && self.reason.as_ref() == Some(&reason) && self.message.as_deref() == Some(message) {
            return;
        }
        if self.phase.as_ref() != Some(&phase) {
            let stamps = self.extra.entry("phaseTransitionTimestamps".to_owned()).or_insert_with(|| Value::Array(Vec::new()));
            if let Some(a) = stamps.as_array_mut() {
                let last = a.last().and_then(|t| t["phaseTransitionTimestamp"].as_str()).and_then(|t| t.parse::<jiff::Timestamp>().ok());
                let at = last.map_or(at, |l| l.max(at)).strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
                a.push(serde_json::json!({"phase": phase.as_str(), "phaseTransitionTimestamp": at}));
            }
        }
        self.phase = Some(phase);
        self.reason = Some(reason);
        self.message = Some(message.to_owned());
    }

    /// When the entry entered `phase`, from `phaseTransitionTimestamps`.
    #[must_use]
    pub fn entered(&self, phase: &VolumePhase) -> Option<jiff::Timestamp> {
        self.extra.get("phaseTransitionTimestamps")?.as_array()?.iter().rev().find(|t| t["phase"] == phase.as_str())?
            ["phaseTransitionTimestamp"]
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
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
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
