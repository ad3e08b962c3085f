//! Server-side apply and field ownership (`metadata.managedFields`), as kube-apiserver's field
//! manager and structured-merge-diff do them.
//!
//! - [`record_update`]: every create, update and patch records what it changed as an `Update`
//!   by its manager, and takes those fields from every other manager.
//! - [`apply`]: an apply (`application/apply-patch+yaml`) merges the applied configuration into
//!   the object, removes what the manager applied before and no longer applies (unless another
//!   manager owns it), and refuses to change a value another manager owns (409 Conflict naming
//!   the fields and managers) unless forced, when it takes them over.
//!
//! [`schema`] says how each list and map merges, [`walk`] walks objects by it, [`fieldset`] holds
//! field paths as `FieldsV1`, [`managed`] reads and writes the entries.
//!
//! # Flow
//! `objects` calls [`record_update`] on the object about to be stored (after the server's own
//! fields are set), and [`apply`] to compute an applied object from the live one (or from none,
//! for an apply that creates); both leave the result's `managedFields` set.
//!
//! # Guarantees
//! - Ownership follows kube-apiserver: an Update owns what it changed and takes it from others;
//!   an Apply owns exactly the fields it applied; a field removed from the object is owned by
//!   no one; two managers applying the same value share it.
//! - Applying the same configuration again changes nothing, not even the entry's time, so the
//!   write is skipped: no new resourceVersion, no watch event.
//! - `managedFields` a client sends are used when valid, cleared by `[]`, ignored (the stored
//!   ones kept) when malformed or sent to the status subresource.
//! - Nothing panics and no walk recurses deeper than [`crate::limits::MAX_OBJECT_DEPTH`].
//!
//! # Caveats (where this differs from kube-apiserver)
//! - New map-list items are appended after the live ones (structured-merge-diff interleaves by
//!   the applied order); a list whose items cannot be keyed is treated as atomic rather than
//!   refused.
//! - Managers are not capped at 10 Update entries (no `ancient-changes` entry).
//! - A core kind's struct fields that Go would default to `{}` count as added on create (`.` in
//!   `fieldsV1`), which kube-apiserver does not record.

pub mod fieldset;
pub mod managed;
pub mod schema;
pub mod walk;

use serde_json::{json, Value};

use self::fieldset::{display_path, FieldSet};
use self::managed::{Entry, Operation, Sent};
use self::walk::{Scope, Walker};
use crate::objects::Part;
use crate::registry::ResourceDef;
use crate::status::ApiError;

/// Longest `fieldManager` (kube-apiserver's `FieldManagerMaxLength`).
pub const MAX_MANAGER_LEN: usize = 128;

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn scope(def: &ResourceDef, part: Part) -> Scope {
    match part {
        Part::Status => Scope::StatusOnly,
        Part::Main if def.status => Scope::NotStatus,
        Part::Main => Scope::All,
    }
}

fn subresource(part: Part) -> &'static str {
    match part {
        Part::Main => "",
        Part::Status => "status",
    }
}

/// The manager of a write without `fieldManager`: the User-Agent up to its first `/`
/// (`kubectl/v1.33.0 (linux/amd64)` is `kubectl`), at most [`MAX_MANAGER_LEN`] characters, as
/// kube-apiserver derives it; `None` for no User-Agent.
#[must_use]
pub fn manager_from_user_agent(ua: &str) -> Option<String> {
    let prefix: String = ua.split('/').next().unwrap_or("").chars().take(MAX_MANAGER_LEN).collect();
    (!prefix.is_empty()).then_some(prefix)
}

/// Checks a `fieldManager` query parameter as kube-apiserver does.
///
/// # Errors
/// 422 Invalid on `options` (`PatchOptions`, ...) for one longer than 128 characters or with a
/// character that is not printable.
pub fn check_manager(manager: &str, options: &str) -> Result<(), ApiError> {
    let cause = if manager.chars().count() > MAX_MANAGER_LEN {
        format!("Too long: may not be more than {MAX_MANAGER_LEN} bytes")
    } else if manager.chars().any(char::is_control) {
        format!("Invalid value: {manager:?}: may not contain non-printable characters")
    } else {
        return Ok(());
    };
    let cause = api::validation::Cause::new(api::validation::CauseType::Invalid, "fieldManager", cause);
    Err(ApiError::invalid("meta.k8s.io", options, "", &[cause]))
}

/// Records a write in `new`'s `managedFields`: the fields that changed from `old` (none for a
/// create) become `manager`'s Update (no entry when `manager` is `None`, the server's own
/// writes) and stop being anyone else's; removed fields stop being anyone's.
///
/// The base entries are the ones `new` carries when valid (`[]` clears them), else `old`'s; a
/// status write always keeps `old`'s, as kube-apiserver ignores them on subresources.
pub fn record_update(def: &ResourceDef, part: Part, old: Option<&Value>, new: &mut Value, manager: Option<&str>) {
    let stored = || old.map(managed::stored).unwrap_or_default();
    let same_as_stored = old.is_some_and(|o| o.pointer("/metadata/managedFields") == new.pointer("/metadata/managedFields"));
    let mut entries = match (part, managed::read(new)) {
        (Part::Status, _) | (_, Sent::Missing | Sent::Malformed) => stored(),
        (_, Sent::Reset) => Vec::new(),
        (_, Sent::Entries(e)) => e,
    };
    let diff = Walker::new(schema::of(def), scope(def, part)).compare(old, new);
    if diff.is_empty() && same_as_stored {
        return;
    }
    let sub = subresource(part);
    let mut taken = diff.changed.clone();
    taken.union(&diff.removed);
    for e in entries.iter_mut().filter(|e| !manager.is_some_and(|m| e.is(m, Operation::Update, sub))) {
        e.fields.difference(&taken);
    }
    if let Some(m) = manager.filter(|_| !diff.is_empty()) {
        let at = entries.iter().position(|e| e.is(m, Operation::Update, sub));
        let entry = match at {
            Some(i) => &mut entries[i],
            None => {
                entries.push(Entry {
                    manager: m.to_owned(),
                    operation: Operation::Update,
                    api_version: def.api_version(),
                    time: None,
                    subresource: sub.to_owned(),
                    fields: FieldSet::default(),
                });
                let last = entries.len() - 1;
                &mut entries[last]
            }
        };
        entry.fields.union(&diff.changed);
        entry.fields.difference(&diff.removed);
        entry.time = Some(now());
        entry.api_version = def.api_version();
    }
    managed::write(new, entries);
}

/// Applies `config` for `manager` to `live` (or to nothing, for an apply that creates) and
/// returns the object to store, its `managedFields` set.
///
/// # Errors
/// 400 when `config` or `live` is not an object (the verbs never pass one); 409 Conflict when
/// the apply changes a value another manager owns and `force` is false, worded
/// and detailed as kube-apiserver's (see [`conflict_error`]).
pub fn apply(def: &ResourceDef, part: Part, live: Option<&Value>, config: &Value, manager: &str, force: bool) -> Result<Value, ApiError> {
    if !config.is_object() || live.is_some_and(|l| !l.is_object()) {
        return Err(ApiError::bad_request(format!("an apply patch and the {} it applies to must both be objects", def.kind)));
    }
    let schema = schema::of(def);
    let scope = scope(def, part);
    let sub = subresource(part);
    let mut walker = Walker::new(schema, scope);
    let mut entries = live.map(managed::stored).unwrap_or_default();
    let applied = walker.fields(config);
    let mut merged = live.cloned().unwrap_or_else(|| identity_of(config));
    walker.merge(&mut merged, config);

    // What the manager applied last time and no longer applies goes, unless someone else owns
    // it (or something under it).
    let mine = entries.iter().position(|e| e.is(manager, Operation::Apply, sub));
    if let Some(i) = mine {
        let mut dropped = entries[i].fields.clone();
        dropped.difference(&applied);
        let mut others = FieldSet::default();
        for e in entries.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, e)| e) {
            others.union(&e.fields);
        }
        others.union(&applied);
        for path in dropped.paths() {
            if others.get(&path).is_none() {
                walker.remove(&mut merged, &path);
            }
        }
    }

    let diff = walker.compare(live, &merged);
    let mut conflicts: Vec<(String, String)> = Vec::new();
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) == mine {
            continue;
        }
        let clash = e.fields.intersection(&diff.changed);
        if clash.is_empty() {
            continue;
        }
        if force {
            e.fields.difference(&clash);
        } else {
            conflicts.extend(clash.paths().iter().map(|p| (e.describe(), display_path(p))));
        }
    }
    if !conflicts.is_empty() {
        return Err(conflict_error(conflicts));
    }
    for e in &mut entries {
        e.fields.difference(&diff.removed);
    }
    let unchanged = mine.is_some_and(|i| entries[i].fields == applied) && diff.is_empty();
    if !unchanged {
        let entry = Entry {
            manager: manager.to_owned(),
            operation: Operation::Apply,
            api_version: def.api_version(),
            time: Some(now()),
            subresource: sub.to_owned(),
            fields: applied,
        };
        match mine {
            Some(i) => entries[i] = entry,
            None => entries.push(entry),
        }
    }
    if !merged.get("metadata").is_some_and(Value::is_object) {
        merged["metadata"] = json!({});
    }
    managed::write(&mut merged, entries);
    Ok(merged)
}

/// What an object created by an apply starts from: the configuration's type and name (which
/// the walks skip, as no manager owns them).
fn identity_of(config: &Value) -> Value {
    let mut base = json!({"metadata": {}});
    for k in ["apiVersion", "kind"] {
        if let Some(v) = config.get(k) {
            base[k] = v.clone();
        }
    }
    for k in ["name", "namespace"] {
        if let Some(v) = config.pointer(&format!("/metadata/{k}")) {
            base["metadata"][k] = v.clone();
        }
    }
    base
}

/// 409 Conflict for an apply that would change fields other managers own (`(manager, path)`
/// pairs), worded as kube-apiserver's: `Apply failed with 1 conflict: conflict with "m" using v1:
/// .spec.x`, or `Apply failed with N conflicts: conflicts with "m":` then `- .path` per line,
/// managers sorted; one `FieldManagerConflict` cause per field.
#[must_use]
pub fn conflict_error(mut conflicts: Vec<(String, String)>) -> ApiError {
    conflicts.sort();
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m}"), "field": p}))
        .collect();
    let message = match conflicts.as_slice() {
        [(m, p)] => format!("Apply failed with 1 conflict: conflict with {m}: {p}"),
        _ => {
            let mut lines = Vec::new();
            let mut last: Option<&str> = None;
            for (m, p) in &conflicts {
                if last != Some(m.as_str()) {
                    lines.push(format!("conflicts with {m}:"));
                    last = Some(m);
                }
                lines.push(format!("- {p}"));
            }
            format!("Apply failed with {} conflicts: {}", conflicts.len(), lines.join("\n"))
        }
    };
    ApiError::conflict_message(message).with_causes(&causes)
}

#[cfg(test)]
mod tests;
