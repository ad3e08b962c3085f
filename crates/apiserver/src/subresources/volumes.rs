//! KubeVirt's hot-plug subresources (`subresources.kubevirt.io/v1`), declarative mode:
//!
//! - `PUT .../virtualmachines/NAME/addvolume|removevolume` edit the VM's `spec.template.spec`
//!   (the declarative controller then carries the change to the running VMI);
//! - `PUT .../virtualmachineinstances/NAME/addvolume|removevolume` edit a VMI directly, only
//!   when no VM owns it (otherwise 400, as KubeVirt 1.9 with `HotplugVolumes` off), and only while
//!   it is `Running` (409).
//!
//! As KubeVirt: `disk.name` is forced to the volume name and the source to `hotpluggable: true`;
//! a name or claim already in use is 409; removing an unknown or non-hot-pluggable volume is 409;
//! success is 202. `dryRun: ["All"]` (body or query) validates and writes nothing. Removing a
//! volume removes its disk too, except a CD-ROM drive, which stays as an empty drive (eject).

use axum::response::Response;
use serde_json::{json, Value};

use api::kubevirt::{AddVolumeOptions, Disk, HotplugVolumeSource, VirtualMachineInstanceSpec, Volume};
use api::phases::VmiPhase;
use api::validation::{Cause, CauseType};

use super::access::ObjectAccess;
use super::Put;
use crate::registry;
use crate::status::ApiError;

/// The subresources this module serves, for discovery.
pub const SUBRESOURCES: [&str; 2] = ["addvolume", "removevolume"];

fn bad(causes: &[Cause]) -> ApiError {
    let msg = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect::<Vec<_>>().join("; ");
    let mut e = ApiError::bad_request(msg);
    e.details = Some(json!({"causes": causes}));
    e
}

fn conflict(message: String) -> ApiError {
    ApiError::conflict_message(message)
}

/// Reads `value` as a `T`, or a 400 naming `field`.
fn typed<T: serde::de::DeserializeOwned>(value: Value, field: &str) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| bad(&[Cause::new(CauseType::Invalid, field, e.to_string())]))
}

/// Parses and checks an `AddVolumeOptions` body: returns (disk, volume, dry run).
fn parse_add(body: &[u8]) -> Result<(Disk, Volume, bool), ApiError> {
    let o: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the AddVolumeOptions body is not valid JSON: {e}")))?;
    let mut causes = Vec::new();
    let name = o.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    if name.is_empty() {
        causes.push(Cause::new(CauseType::Required, "name", "AddVolumeOptions requires name: the volume's name"));
    } else {
        causes.extend(api::validation::dns1123_label(&name, "name"));
    }
    let disk = o.get("disk").cloned();
    if !disk.as_ref().is_some_and(Value::is_object) {
        causes.push(Cause::new(CauseType::Required, "disk", "AddVolumeOptions requires disk, e.g. {\"disk\": {\"bus\": \"scsi\"}}"));
    }
    let src = o.get("volumeSource").cloned().unwrap_or(Value::Null);
    let (pvc, dv) = (src.get("persistentVolumeClaim"), src.get("dataVolume"));
    match (pvc, dv) {
        (Some(p), None) if p.get("claimName").and_then(Value::as_str).is_some_and(|c| !c.is_empty()) => {}
        (None, Some(d)) if d.get("name").and_then(Value::as_str).is_some_and(|c| !c.is_empty()) => {}
        (Some(_), None) => {
            causes.push(Cause::new(CauseType::Required, "volumeSource.persistentVolumeClaim.claimName", "the claim's name is required"));
        }
        (None, Some(_)) => {
            causes.push(Cause::new(CauseType::Required, "volumeSource.dataVolume.name", "the DataVolume's name is required"));
        }
        _ => causes.push(Cause::new(
            CauseType::Required,
            "volumeSource",
            "AddVolumeOptions requires volumeSource with exactly one of persistentVolumeClaim {claimName} or dataVolume {name}",
        )),
    }
    if !causes.is_empty() {
        return Err(bad(&causes));
    }
    // As KubeVirt: the disk is named after the volume, the source marked hot-pluggable.
    let opts = AddVolumeOptions {
        disk: Some(typed(disk.unwrap_or_default(), "disk")?),
        volume_source: HotplugVolumeSource {
            persistent_volume_claim: pvc.map(|p| typed(p.clone(), "volumeSource.persistentVolumeClaim")).transpose()?,
            data_volume: dv.map(|d| typed(d.clone(), "volumeSource.dataVolume")).transpose()?,
            ..HotplugVolumeSource::default()
        },
        name,
        ..AddVolumeOptions::default()
    };
    let dry = o.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok((opts.disk(), opts.volume(), dry))
}

fn parse_remove(body: &[u8]) -> Result<(String, bool), ApiError> {
    let o: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the RemoveVolumeOptions body is not valid JSON: {e}")))?;
    let name = o.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    if name.is_empty() {
        return Err(bad(&[Cause::new(CauseType::Required, "name", "RemoveVolumeOptions requires name: the volume to remove")]));
    }
    let dry = o.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok((name, dry))
}

fn owned_by_vm(vmi: &api::VirtualMachineInstance) -> bool {
    vmi.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.kind == "VirtualMachine" && r.api_version == "kubevirt.io/v1")
}

/// Handles `PUT` on `virtualmachines|virtualmachineinstances/NAME/addvolume|removevolume`.
///
/// # Errors
/// 400 for bad bodies (with field causes) and VM-owned VMIs, 404, 409 as KubeVirt, 422 when
/// the resulting spec is invalid.
pub async fn handle<O: ObjectAccess>(objects: &O, put: &Put<'_>) -> Result<Response, ApiError> {
    let Put { plural, ns, name, sub, body, query_dry_run } = *put;
    let def = registry::find("kubevirt.io", "v1", plural).ok_or_else(ApiError::no_resource)?;
    if body.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{sub} needs a body: {}",
            if sub == "addvolume" { "AddVolumeOptions {name, disk, volumeSource}" } else { "RemoveVolumeOptions {name}" }
        )));
    }
    enum Op {
        Add(Box<(Disk, Volume)>),
        Remove(String),
    }
    let (op, dry) = match sub {
        "addvolume" => {
            let (d, v, dry) = parse_add(body)?;
            (Op::Add(Box::new((d, v))), dry)
        }
        "removevolume" => {
            let (n, dry) = parse_remove(body)?;
            (Op::Remove(n), dry)
        }
        _ => return Err(ApiError::no_resource()),
    };
    let is_vm = plural == "virtualmachines";
    if !is_vm {
        let vmi: api::VirtualMachineInstance = serde_json::from_value(objects.get(def, Some(ns), name).await?)
            .map_err(|e| ApiError::internal(format!("VMI {ns}/{name} cannot be read: {e}")))?;
        if owned_by_vm(&vmi) {
            return Err(ApiError::bad_request(format!(
                "VMI {ns}/{name} is owned by a VM: use PUT /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/{sub} (or edit the VM's spec)"
            )));
        }
        if vmi.phase() != Some(&VmiPhase::Running) {
            return Err(conflict(format!("VMI {ns}/{name} is not running: hot-plug needs a running VMI")));
        }
    }
    let ptr = if is_vm { "/spec/template/spec" } else { "/spec" };
    objects
        .update_with(def, Some(ns), name, crate::objects::Part::Main, dry || query_dry_run, |cur| {
            let mut obj = cur.clone();
            let Some(raw) = obj.pointer_mut(ptr).filter(|v| !v.is_null()) else {
                return Err(ApiError::bad_request(format!("{} {ns}/{name} has no {ptr}", def.kind)));
            };
            let mut spec: VirtualMachineInstanceSpec = serde_json::from_value(raw.clone())
                .map_err(|e| ApiError::internal(format!("{} {ns}/{name}: {ptr} cannot be read: {e}", def.kind)))?;
            match &op {
                Op::Add(dv) => api::volume_edit::add(&mut spec, dv.0.clone(), dv.1.clone()).map_err(|e| conflict(e.0))?,
                Op::Remove(n) => api::volume_edit::remove(&mut spec, n).map(|_| ()).map_err(|e| conflict(e.0))?,
            }
            *raw = serde_json::to_value(&spec)
                .map_err(|e| ApiError::internal(format!("{} {ns}/{name}: cannot encode {ptr}: {e}", def.kind)))?;
            Ok(obj)
        })
        .await?;
    Ok(crate::reply::accepted())
}
