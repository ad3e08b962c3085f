//! A CRD's `/scale` subresource: the object seen as an `autoscaling/v1` Scale (what
//! `kubectl scale` and the HorizontalPodAutoscaler use), read from and written to the paths the
//! CRD names (`specReplicasPath`, `statusReplicasPath`, `labelSelectorPath`).
//!
//! # Flow
//! GET builds the Scale from the object. PUT and PATCH (merge or JSON patch, applied to the
//! Scale) change only `spec.replicas`, written at `specReplicasPath` by a read-modify-write on
//! the object; a `metadata.resourceVersion` in the Scale is a precondition (409 when stale).
//!
//! # Guarantees
//! Nothing else of the object changes; `spec.replicas` must be a non-negative integer (422
//! naming it); a GET of an object without a value at `specReplicasPath` is 500 naming the path,
//! as kube-apiserver answers.

use axum::http::{header, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use api::validation::{Cause, CauseType};

use super::Scale;
use crate::call::Call;
use crate::objects::{Objects, Part};
use crate::patch::{Patch, PatchKind};
use crate::reply::json_response;
use crate::status::ApiError;
use crate::target::Resource;

/// `.spec.replicas` as a JSON pointer (`/spec/replicas`).
fn pointer(path: &str) -> String {
    path.replace('.', "/")
}

fn scale_of(r: &Resource) -> Result<&'static Scale, ApiError> {
    r.def.crd.and_then(|c| c.scale.as_ref()).ok_or_else(ApiError::no_resource)
}

/// The Scale view of `obj`.
fn view(scale: &Scale, obj: &Value) -> Result<Value, ApiError> {
    let spec = obj.pointer(&pointer(&scale.spec_replicas_path)).cloned().ok_or_else(|| {
        ApiError::internal(format!("the spec replicas field {:?} does not exist in the object", scale.spec_replicas_path))
    })?;
    let status = obj.pointer(&pointer(&scale.status_replicas_path)).cloned().unwrap_or(json!(0));
    let mut st = json!({"replicas": status});
    if let Some(sel) = scale.label_selector_path.as_deref().and_then(|p| obj.pointer(&pointer(p))) {
        st["selector"] = sel.clone();
    }
    let m = &obj["metadata"];
    let meta: serde_json::Map<String, Value> = ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"]
        .iter()
        .filter_map(|k| m.get(*k).map(|v| ((*k).to_owned(), v.clone())))
        .collect();
    Ok(json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": meta, "spec": {"replicas": spec}, "status": st}))
}

/// The object at `ptr` in `v`, made an object (and its parents) where it is missing.
fn object_at<'a>(v: &'a mut Value, ptr: &str) -> Option<&'a mut serde_json::Map<String, Value>> {
    let mut cur = v;
    for seg in ptr.split('/').filter(|s| !s.is_empty()) {
        let child = cur.as_object_mut()?.entry(seg.to_owned()).or_insert_with(|| json!({}));
        if !child.is_object() {
            *child = json!({});
        }
        cur = child;
    }
    cur.as_object_mut()
}

/// `GET .../{name}/scale`.
///
/// # Errors
/// 404 without the object or a scale subresource; 500 when the object has no replicas.
pub async fn get(c: Call<'_>, r: Resource) -> Result<Response, ApiError> {
    let scale = scale_of(&r)?;
    let obj = c.st.objects.get(r.def, r.ns.as_deref(), r.name()?)?.object.value();
    Ok(json_response(StatusCode::OK, &view(scale, &obj)?))
}

/// `PUT .../{name}/scale`.
///
/// # Errors
/// As [`write`].
pub async fn replace(mut c: Call<'_>, r: Resource) -> Result<Response, ApiError> {
    let body = c.body().await?;
    let sent = crate::body::parse_object(c.header(header::CONTENT_TYPE), &body)?;
    write(&c.st.objects, &r, |_| Ok(sent.clone())).await
}

/// `PATCH .../{name}/scale` (merge or JSON patch of the Scale).
///
/// # Errors
/// 415 for other patch types; as [`write`].
pub async fn patch(mut c: Call<'_>, r: Resource) -> Result<Response, ApiError> {
    let ct = c.header(header::CONTENT_TYPE).to_owned();
    let Some(kind @ (PatchKind::Json | PatchKind::Merge)) = PatchKind::from_content_type(&ct) else {
        return Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format ({ct:?}) - accepted media types include: \
             application/json-patch+json, application/merge-patch+json"
        )));
    };
    let body = c.body().await?;
    let parsed = Patch::parse(kind, &body)?;
    write(&c.st.objects, &r, |current| parsed.apply(current)).await
}

/// Writes the `spec.replicas` of the Scale `compute` makes from the current one.
async fn write(objects: &Objects, r: &Resource, compute: impl Fn(&Value) -> Result<Value, ApiError>) -> Result<Response, ApiError> {
    let scale = scale_of(r)?;
    let name = r.name()?;
    let def = r.def;
    let written = objects
        .update_with(def, r.ns.as_deref(), name, Part::Main, r.opts.dry_run, |cur| {
            let current = view(scale, cur)?;
            let wanted = compute(&current)?;
            if let Some(rv) = wanted.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|rv| !rv.is_empty()) {
                if Some(rv) != cur.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
                    return Err(ApiError::conflict(def.group, def.plural, name));
                }
            }
            let replicas = wanted.pointer("/spec/replicas").filter(|v| v.as_i64().is_some_and(|n| n >= 0)).cloned().ok_or_else(|| {
                ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    &[Cause::new(CauseType::Invalid, "spec.replicas", "must be an integer of 0 or more")],
                )
            })?;
            let mut next = cur.clone();
            let ptr = pointer(&scale.spec_replicas_path);
            let (parent, field) = ptr.rsplit_once('/').unwrap_or(("", ptr.as_str()));
            object_at(&mut next, parent)
                .ok_or_else(|| ApiError::internal(format!("{} of the object is not an object", scale.spec_replicas_path)))?
                .insert(field.to_owned(), replicas);
            Ok(next)
        })
        .await?;
    Ok(json_response(StatusCode::OK, &view(scale, &written.value())?))
}
