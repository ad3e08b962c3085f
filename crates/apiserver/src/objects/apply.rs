//! The apply verb (PATCH with `application/apply-patch+yaml`): parses the applied
//! configuration, then applies it to the live object with [`crate::apply::apply`], or creates the
//! object from it when there is none (as kube-apiserver does, dry runs included).
//!
//! # Errors
//! 400 for a body that is not a YAML or JSON object, that lacks `apiVersion` or `kind`, names
//! another object than the URL, or carries `managedFields`; 422 without a field manager; 409
//! for conflicts (or a stale `resourceVersion` in the configuration); 404 for the status of a
//! missing object; then what create and update answer.

use serde_json::Value;

use super::metadata::check_type;
use super::{meta_str, Objects, Part, Track, Write, INTERNAL_RETRIES};
use crate::limits::MAX_YAML_EXPANSION_BYTES;
use crate::registry::ResourceDef;
use crate::status::ApiError;
use crate::store::Doc;

impl Objects {
    /// Applies `body` for `write.manager`; returns the object and whether the apply created it.
    ///
    /// # Errors
    /// See the module docs.
    pub async fn apply(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        body: &[u8],
        part: Part,
        write: &Write,
    ) -> Result<(Doc, bool), ApiError> {
        let manager = write.manager.as_deref().filter(|m| !m.is_empty()).ok_or_else(|| {
            let cause = api::validation::Cause::new(
                api::validation::CauseType::Required,
                "fieldManager",
                "Required value: is required for apply patch",
            );
            ApiError::invalid("meta.k8s.io", "PatchOptions", "", &[cause])
        })?;
        let config = parse_config(def, name, body)?;
        let want_rv = meta_str(&config, "resourceVersion").filter(|rv| !rv.is_empty()).map(str::to_owned);
        for _ in 0..INTERNAL_RETRIES {
            if part == Part::Main && self.store.get(&def.key(ns, name)).is_none() {
                if want_rv.is_some() {
                    return Err(ApiError::not_found(def.group, def.plural, name));
                }
                let obj = crate::apply::apply(def, part, None, &config, manager, write.force)?;
                match self.create_tracked(def, ns, obj, write.dry_run, Track::Applied).await {
                    // Created meanwhile by someone else: apply to theirs.
                    Err(e) if e.code == 409 && e.reason == "AlreadyExists" => continue,
                    created => return created.map(|c| (c, true)),
                }
            }
            let updated = self
                .guaranteed_update(
                    def,
                    ns,
                    name,
                    want_rv.is_some(),
                    write.dry_run,
                    Track::Applied,
                    |cur| {
                        if want_rv.as_ref().is_some_and(|rv| *rv != cur.rv.to_string()) {
                            return Err(ApiError::conflict(def.group, def.plural, name));
                        }
                        crate::apply::apply(def, part, Some(&cur.object), &config, manager, write.force)
                    },
                    part,
                )
                .await;
            match updated {
                // Deleted meanwhile: create it on the next round.
                Err(e) if e.code == 404 && part == Part::Main && self.store.get(&def.key(ns, name)).is_none() => continue,
                other => return other.map(|u| (u, false)),
            }
        }
        Err(ApiError::conflict(def.group, def.plural, name))
    }
}

/// Reads an applied configuration: a YAML (or JSON) object of `def`'s kind, named `name`.
fn parse_config(def: &ResourceDef, name: &str, body: &[u8]) -> Result<Value, ApiError> {
    let mut config = crate::body::parse_yaml(body, MAX_YAML_EXPANSION_BYTES)?;
    if !config.is_object() {
        return Err(ApiError::bad_request(format!("the apply patch must be a YAML or JSON object of kind {}", def.kind)));
    }
    for field in ["apiVersion", "kind"] {
        if config.get(field).and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(ApiError::bad_request(format!(
                "the apply patch has no {field}: an applied configuration names its type (apiVersion: {}, kind: {})",
                def.api_version(),
                def.kind
            )));
        }
    }
    check_type(def, &mut config)?;
    match meta_str(&config, "name") {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!("the name of the object ({n}) does not match the name on the URL ({name})")));
        }
        Some(_) => {}
        None => {
            if let Some(m) = config.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("name".into(), Value::String(name.to_owned()));
            } else {
                config["metadata"] = serde_json::json!({"name": name});
            }
        }
    }
    if config.pointer("/metadata/managedFields").is_some_and(|f| !f.is_null()) {
        return Err(ApiError::bad_request("metadata.managedFields must be nil in an apply patch: the server keeps them"));
    }
    Ok(config)
}
