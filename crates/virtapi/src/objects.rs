//! [`ObjectAccess`] through a kube-apiserver: what the shared subresource handlers
//! ([`apiserver::subresources`]) read and edit, with this component's own credentials.
//!
//! # Guarantees
//! An edit is a `PUT` of the object as read (its `resourceVersion` with it), so the API server
//! refuses it with 409 if anyone wrote in between; then it is recomputed on a fresh read, up to
//! [`ATTEMPTS`] times. The API server's errors are answered as it gave them (code, reason,
//! message): a missing VM is its 404, admission's refusal its 422.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::Value;

use apiserver::objects::Part;
use apiserver::registry::ResourceDef;
use apiserver::status::ApiError;
use apiserver::subresources::access::ObjectAccess;

/// Attempts of one edit against concurrent writers.
pub const ATTEMPTS: usize = 10;

/// The field manager of this component's writes.
pub const FIELD_MANAGER: &str = "virtplug-subresources-api";

/// Objects through a kube client.
#[derive(Clone)]
pub struct KubeObjects(pub kube::Client);

fn api(client: &kube::Client, def: &ResourceDef, ns: Option<&str>) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(def.group, def.version, def.kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, def.plural);
    match ns {
        Some(ns) if def.namespaced => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    }
}

/// The reasons Kubernetes' `Status` uses, as the `&'static str` [`ApiError`] holds.
fn reason(r: &str) -> &'static str {
    const KNOWN: [&str; 14] = [
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Invalid",
        "BadRequest",
        "Forbidden",
        "Unauthorized",
        "Gone",
        "Expired",
        "MethodNotAllowed",
        "RequestEntityTooLarge",
        "TooManyRequests",
        "ServiceUnavailable",
        "Timeout",
    ];
    KNOWN.into_iter().find(|k| *k == r).unwrap_or("InternalError")
}

/// The API server's error as this server's answer.
fn answer(e: kube::Error) -> ApiError {
    match e {
        kube::Error::Api(s) => {
            let mut out = ApiError::internal(s.message.clone());
            out.code = if s.code == 0 { 500 } else { s.code };
            out.reason = reason(&s.reason);
            out.details = s.details.as_ref().and_then(|d| serde_json::to_value(d).ok());
            out
        }
        other => ApiError::unavailable(format!("cannot reach the API server: {other}")),
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl ObjectAccess for KubeObjects {
    async fn get(&self, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        let obj = api(&self.0, def, ns).get(name).await.map_err(answer)?;
        serde_json::to_value(obj).map_err(|e| ApiError::internal(format!("{} {name} cannot be read: {e}", def.kind)))
    }

    async fn update_with<F>(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        part: Part,
        dry_run: bool,
        compute: F,
    ) -> Result<(), ApiError>
    where
        F: Fn(&Value) -> Result<Value, ApiError> + Send + Sync,
    {
        let api = api(&self.0, def, ns);
        let pp = PostParams { dry_run, field_manager: Some(FIELD_MANAGER.to_owned()) };
        for _ in 0..ATTEMPTS {
            let current = self.get(def, ns, name).await?;
            // The result carries the resourceVersion read: the PUT is conditional on it.
            let new = compute(&current)?;
            let obj: DynamicObject = serde_json::from_value(new)
                .map_err(|e| ApiError::internal(format!("{} {name}: the edited object cannot be written: {e}", def.kind)))?;
            let written = match part {
                Part::Main => api.replace(name, &pp, &obj).await.map(drop),
                Part::Status => api.replace_status(name, &pp, &obj).await.map(drop),
            };
            match written {
                Ok(()) => return Ok(()),
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(answer(e)),
            }
        }
        Err(ApiError::conflict_message(format!(
            "{} {name} kept changing under this edit ({ATTEMPTS} attempts lost a race with other writers): try again",
            def.kind
        )))
    }
}
