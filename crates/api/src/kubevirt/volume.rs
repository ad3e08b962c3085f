//! A VMI's volumes: `spec.volumes[]` and their sources.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Extra;

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

    /// The claim this volume names: a PVC volume's `claimName`, or a DataVolume volume's
    /// name (a DataVolume's claim has the DataVolume's name, as in CDI). `None` for other
    /// sources.
    #[must_use]
    pub fn claim_name(&self) -> Option<&str> {
        match (&self.persistent_volume_claim, &self.data_volume) {
            (Some(p), _) => Some(&p.claim_name),
            (None, Some(d)) => Some(&d.name),
            (None, None) => None,
        }
    }

    /// Whether this is a hot-pluggable DataVolume or PVC volume (KubeVirt's `IsHotplugVolume`,
    /// and its `IsDeclarativeHotplugVolume`: the one test of "hot-pluggable" in virtplug).
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
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}
