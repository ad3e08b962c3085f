//! cdi.kubevirt.io/v1beta1 `DataVolume`: a PVC plus how to fill it (`http` import, `blank`, `pvc`
//! clone), with CDI's status phases and progress.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kubevirt::{Condition, Extra};
use crate::phases::DataVolumePhase;

/// `DataVolume.spec`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataVolume",
    plural = "datavolumes",
    namespaced,
    status = "DataVolumeStatus",
    shortname = "dv",
    shortname = "dvs",
    category = "all",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Restarts","type":"integer","jsonPath":".status.restartCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<DataVolumeSource>,
    /// CDI's preferred storage spec (defaults filled in by the provisioner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// The older form: a full PVC spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PersistentVolumeClaimSpec>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `DataVolume.spec.source`: exactly one of `http`, `blank`, `pvc`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blank: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcSource>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// What virtplug fills a DataVolume from, for messages.
pub const SUPPORTED_SOURCES: &str = "spec.source.http {url}, spec.source.blank {} or spec.source.pvc {namespace, name}";

/// The one source of a DataVolume that virtplug can fill it from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SourceKind<'a> {
    Http(&'a HttpSource),
    Blank,
    Pvc(&'a PvcSource),
}

impl DataVolumeSpec {
    /// The DataVolume's source, or the field that is wrong and why: no source, more than one,
    /// `spec.sourceRef` (a DataSource) or a CDI source virtplug does not import from
    /// (`registry`, `s3`, `gcs`, `upload`, `imageio`, `vddk`, `snapshot`, ...). The one place
    /// both admission and the importer ask.
    ///
    /// # Errors
    /// `(field, message)`: the message names what is supported.
    pub fn source_kind(&self) -> Result<SourceKind<'_>, (String, String)> {
        if self.extra.contains_key("sourceRef") {
            return Err((
                "spec.sourceRef".into(),
                format!("DataSource references (spec.sourceRef) are not supported; use {SUPPORTED_SOURCES}"),
            ));
        }
        let Some(src) = &self.source else {
            return Err(("spec.source".into(), format!("a DataVolume needs a source: {SUPPORTED_SOURCES}")));
        };
        if let Some(other) = src.extra.keys().next() {
            return Err((format!("spec.source.{other}"), format!("importing from {other:?} is not supported; use {SUPPORTED_SOURCES}")));
        }
        match (&src.http, &src.blank, &src.pvc) {
            (Some(h), None, None) => Ok(SourceKind::Http(h)),
            (None, Some(_), None) => Ok(SourceKind::Blank),
            (None, None, Some(p)) => Ok(SourceKind::Pvc(p)),
            (None, None, None) => Err(("spec.source".into(), format!("a DataVolume needs a source: {SUPPORTED_SOURCES}"))),
            _ => Err(("spec.source".into(), "exactly one source must be set; keep one of http, blank, pvc".into())),
        }
    }
}

/// `source.http`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpSource {
    pub url: String,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `source.pvc`: clone another claim.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcSource {
    pub namespace: String,
    pub name: String,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `DataVolume.spec.storage`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<StorageResources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `storage.resources`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageResources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}

/// `DataVolume.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeStatus {
    /// `Pending`, `ImportScheduled`, `ImportInProgress`, `Succeeded`, `Failed`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DataVolumePhase>,
    /// e.g. `"42.0%"`, or `"N/A"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(flatten)]
    #[schemars(skip)]
    pub extra: Extra,
}
