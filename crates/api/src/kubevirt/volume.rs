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
    pub cloud_init_no_cloud: Option<CloudInitSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_config_drive: Option<CloudInitSource>,
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
        if self.cloud_init_config_drive.is_some() {
            keys.push("cloudInitConfigDrive".to_owned());
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

    /// The cloud-init source of this volume and its JSON key (`cloudInitNoCloud` or
    /// `cloudInitConfigDrive`; the first when, against admission, both are set).
    #[must_use]
    pub fn cloud_init(&self) -> Option<(CloudInitKind, &CloudInitSource)> {
        match (&self.cloud_init_no_cloud, &self.cloud_init_config_drive) {
            (Some(s), _) => Some((CloudInitKind::NoCloud, s)),
            (None, Some(s)) => Some((CloudInitKind::ConfigDrive, s)),
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

/// KubeVirt's two cloud-init data sources: the seed image the node agent builds differs (label,
/// file names, meta-data), their fields do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloudInitKind {
    /// `cloudInitNoCloud`: volume label `cidata`, files `meta-data`, `user-data`,
    /// `network-config`.
    NoCloud,
    /// `cloudInitConfigDrive`: volume label `config-2`, files under `openstack/latest/`.
    ConfigDrive,
}

impl CloudInitKind {
    /// The volume source's JSON key.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            CloudInitKind::NoCloud => "cloudInitNoCloud",
            CloudInitKind::ConfigDrive => "cloudInitConfigDrive",
        }
    }
}

/// `volume.cloudInitNoCloud` and `volume.cloudInitConfigDrive` (KubeVirt's
/// `CloudInitNoCloudSource` and `CloudInitConfigDriveSource`, which have the same fields): user
/// data and network data, each inline, base64 or from a Secret of the VMI's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_base64: Option<String>,
    /// A Secret with key `userdata` (or `userData`). KubeVirt's JSON name is `secretRef`.
    #[serde(default, rename = "secretRef", skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data_base64: Option<String>,
    /// A Secret with key `networkdata` (or `networkData`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data_secret_ref: Option<LocalObjectReference>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// core/v1 `LocalObjectReference`: an object of the same namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    #[serde(default)]
    pub name: String,
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
