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

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use crate::objects::Objects;
use crate::registry;
use crate::status::ApiError;

/// `/apis/subresources.kubevirt.io/v1`
#[must_use]
pub fn resource_list() -> Value {
    let mut resources = Vec::new();
    for (plural, kind) in [("virtualmachines", "VirtualMachine"), ("virtualmachineinstances", "VirtualMachineInstance")] {
        for sub in ["addvolume", "removevolume"] {
            resources.push(
                json!({"name": format!("{plural}/{sub}"), "singularName": "", "namespaced": true, "kind": kind, "verbs": ["update"]}),
            );
        }
    }
    for sub in crate::lifecycle::SUBRESOURCES {
        resources.push(json!({"name": format!("virtualmachines/{sub}"), "singularName": "", "namespaced": true, "kind": "VirtualMachine", "verbs": ["update"]}));
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "subresources.kubevirt.io/v1", "resources": resources})
}

fn bad(causes: &[Cause]) -> ApiError {
    let msg = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect::<Vec<_>>().join("; ");
    let mut e = ApiError::bad_request(msg);
    e.details = Some(json!({"causes": causes}));
    e
}

fn conflict(message: String) -> ApiError {
    ApiError::conflict_message(message)
}

/// Parses and checks an `AddVolumeOptions` body: returns (name, disk, volume, dry run).
fn parse_add(body: &[u8]) -> Result<(String, Value, Value, bool), ApiError> {
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
    let mut disk = disk.unwrap_or_default();
    disk["name"] = json!(name);
    let mut volume = json!({"name": name});
    if let Some(p) = pvc {
        let mut p = p.clone();
        p["hotpluggable"] = json!(true);
        volume["persistentVolumeClaim"] = p;
    } else if let Some(d) = dv {
        let mut d = d.clone();
        d["hotpluggable"] = json!(true);
        volume["dataVolume"] = d;
    }
    let dry = o.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok((name, disk, volume, dry))
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

fn owned_by_vm(vmi: &Value) -> bool {
    vmi.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|refs| {
        refs.iter().any(|r| {
            r.get("controller") == Some(&Value::Bool(true))
                && r.get("kind") == Some(&json!("VirtualMachine"))
                && r.get("apiVersion") == Some(&json!("kubevirt.io/v1"))
        })
    })
}

/// Handles `PUT` on `virtualmachines|virtualmachineinstances/NAME/addvolume|removevolume`.
///
/// # Errors
/// 400 for bad bodies (with field causes) and VM-owned VMIs, 404, 409 as KubeVirt, 422 when
/// the resulting spec is invalid.
pub async fn handle(
    objects: &Objects,
    plural: &str,
    ns: &str,
    name: &str,
    sub: &str,
    body: &[u8],
    query_dry_run: bool,
) -> Result<Response, ApiError> {
    let def = registry::find("kubevirt.io", "v1", plural).ok_or_else(ApiError::no_resource)?;
    if body.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{sub} needs a body: {}",
            if sub == "addvolume" { "AddVolumeOptions {name, disk, volumeSource}" } else { "RemoveVolumeOptions {name}" }
        )));
    }
    enum Op {
        Add(String, Value, Value),
        Remove(String),
    }
    let (op, dry) = match sub {
        "addvolume" => {
            let (n, d, v, dry) = parse_add(body)?;
            (Op::Add(n, d, v), dry)
        }
        "removevolume" => {
            let (n, dry) = parse_remove(body)?;
            (Op::Remove(n), dry)
        }
        _ => return Err(ApiError::no_resource()),
    };
    let is_vm = plural == "virtualmachines";
    if !is_vm {
        let vmi = objects.get(def, Some(ns), name)?.object;
        if owned_by_vm(&vmi) {
            return Err(ApiError::bad_request(format!(
                "VMI {ns}/{name} is owned by a VM: use PUT /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/{sub} (or edit the VM's spec)"
            )));
        }
        if vmi.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
            return Err(conflict(format!("VMI {ns}/{name} is not running: hot-plug needs a running VMI")));
        }
    }
    let ptr = if is_vm { "/spec/template/spec" } else { "/spec" };
    objects
        .update_with(def, Some(ns), name, crate::objects::Part::Main, dry || query_dry_run, |cur| {
            let mut obj = cur.clone();
            let Some(spec) = obj.pointer_mut(ptr) else {
                return Err(ApiError::bad_request(format!("{} {ns}/{name} has no {ptr}", def.kind)));
            };
            match &op {
                Op::Add(n, d, v) => api::volume_edit::add(spec, n, d, v).map_err(|e| conflict(e.0))?,
                Op::Remove(n) => api::volume_edit::remove(spec, n).map(|_| ()).map_err(|e| conflict(e.0))?,
            }
            Ok(obj)
        })
        .await?;
    Ok((StatusCode::ACCEPTED, [(axum::http::header::CONTENT_TYPE, "application/json")], "").into_response())
}
