//! The conditional JSON patch, beside [`crate::update`]: for writers whose change is a JSON patch
//! planned from the object (the declarative hot-plug reconcile, the migration).
//!
//! # Flow
//! 1. Take the object's lock inside this process (the same lock as [`crate::update`]).
//! 2. GET a fresh copy (none: return `object: None`, nothing written); [`patch_if_seen`]'s
//!    first attempt plans on the caller's cached copy instead.
//! 3. Run the caller's plan on it; `None` means nothing to do: no write.
//! 4. Send the plan's patch behind a first `test` op of `/metadata/resourceVersion`: the server
//!    applies it only to the revision it was planned from.
//! 5. When the server refuses the patch, tell a conflict from a refusal by re-reading the
//!    resourceVersion: a failed `test` is 422 Invalid on kube-apiserver too (not 409), and a 422
//!    may as well be admission refusing the result. Moved: someone wrote in between, so back
//!    off and go to 2 (re-plan on the fresh copy), up to `attempts` times. Not moved: the
//!    refusal is returned; retrying cannot help.
//!
//! # Guarantees
//! - A patch is applied only to the revision it was planned from; nothing is overwritten
//!   blindly, and a concurrent writer's change is never lost.
//! - What is written is always decided from the object as it is when the write lands: the plan
//!   runs on the copy whose resourceVersion the `test` names.
//!
//! # Test hook
//! [`PatchIfOptions::before_write`] runs between the plan and the write of every attempt (the
//! same hook type as [`crate::UpdateOptions::before_write`]).

use std::fmt::Debug;

use json_patch::{Patch, PatchOperation, TestOperation};
use kube::api::{Api, PatchParams};

use crate::backoff::{Backoff, Jitter};
use crate::update::{BeforeWrite, Object};
use crate::{locks, metrics};

/// Tunables of [`patch_if`].
#[derive(Clone)]
pub struct PatchIfOptions {
    /// Plans and writes before a conflict is given up (at least 1).
    pub attempts: u32,
    pub backoff: Backoff,
    /// Field manager sent with the patch.
    pub field_manager: String,
    #[doc(hidden)]
    pub before_write: Option<BeforeWrite>,
}

impl Default for PatchIfOptions {
    fn default() -> Self {
        PatchIfOptions {
            attempts: 5,
            backoff: Backoff {
                base: std::time::Duration::from_millis(50),
                cap: std::time::Duration::from_millis(500),
                jitter: Jitter::Full,
            },
            field_manager: "virtplug".to_owned(),
            before_write: None,
        }
    }
}

impl Debug for PatchIfOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatchIfOptions").field("attempts", &self.attempts).field("backoff", &self.backoff).finish_non_exhaustive()
    }
}

/// What [`patch_if`] did.
#[derive(Debug, Clone)]
pub struct Patched<K> {
    /// The object after the patch, or as last read when nothing was written; `None` when it
    /// does not exist.
    pub object: Option<K>,
    /// Whether a patch was sent and accepted.
    pub wrote: bool,
    /// Copies it read to plan on (0 when [`patch_if_seen`]'s cached copy decided: nothing to
    /// do, or its patch landed).
    pub attempts: u32,
}

/// Errors of [`patch_if`].
#[derive(Debug, thiserror::Error)]
pub enum PatchIfError<E: std::error::Error + 'static> {
    #[error("{kind} {object}: cannot plan the patch")]
    Plan {
        kind: String,
        object: String,
        #[source]
        source: E,
    },
    #[error("{kind} {object} kept changing while a patch was being prepared; gave up after {attempts} attempts")]
    Conflict {
        kind: String,
        object: String,
        attempts: u32,
        #[source]
        source: kube::Error,
    },
    /// The server refused the patch although the object had not changed since it was read
    /// (admission refused the result, or the patch does not apply).
    #[error("{kind} {object}: the patch was refused")]
    Refused {
        kind: String,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {object}: the API request failed")]
    Api {
        kind: String,
        object: String,
        #[source]
        source: kube::Error,
    },
}

impl<E: std::error::Error + 'static> PatchIfError<E> {
    /// Whether this is a give-up after repeated conflicts.
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, PatchIfError::Conflict { .. })
    }
}

/// Plans and writes a JSON patch of `name` conditionally. See the module docs. `plan` returns
/// the patch (without the resourceVersion test, which this adds), `None` for nothing to do, or
/// an error that stops it (nothing written).
///
/// # Errors
/// `Plan` with the plan's error, `Conflict` after the attempts, `Refused` when the server
/// refuses the patch of an unchanged object, `Api` for a failed read.
pub async fn patch_if<K: Object, E: std::error::Error + 'static>(
    api: &Api<K>,
    name: &str,
    opts: &PatchIfOptions,
    plan: impl FnMut(&K) -> Result<Option<Patch>, E>,
) -> Result<Patched<K>, PatchIfError<E>> {
    attempt_from(api, name, opts, plan, None).await
}

/// [`patch_if`]'s loop; the first attempt sends `first` (a cached copy and the patch planned on
/// it) instead of reading and planning, and a conflict there is retried on a fresh read at once
/// (a cache a write behind is not contention: no backoff for it).
async fn attempt_from<K: Object, E: std::error::Error + 'static>(
    api: &Api<K>,
    name: &str,
    opts: &PatchIfOptions,
    mut plan: impl FnMut(&K) -> Result<Option<Patch>, E>,
    mut first: Option<(K, Patch)>,
) -> Result<Patched<K>, PatchIfError<E>> {
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let object = match api.namespace() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    };
    let api_err = |source| PatchIfError::Api { kind: kind.clone(), object: object.clone(), source };
    let _lock = locks::lock(&format!("{}/{name}", api.resource_url())).await;
    let attempts = opts.attempts.max(1);
    let (mut attempt, mut reads) = (0, 0);
    loop {
        attempt += 1;
        let cached = first.is_some();
        let (current, patch) = match first.take() {
            Some(planned) => planned,
            None => {
                reads += 1;
                let Some(current) = api.get_opt(name).await.map_err(api_err)? else {
                    return Ok(Patched { object: None, wrote: false, attempts: reads });
                };
                let planned = plan(&current).map_err(|source| PatchIfError::Plan { kind: kind.clone(), object: object.clone(), source })?;
                let Some(patch) = planned else {
                    metrics::get().noop_skips.inc();
                    return Ok(Patched { object: Some(current), wrote: false, attempts: reads });
                };
                (current, patch)
            }
        };
        let read_rv = current.meta().resource_version.clone();
        if let Some(hook) = &opts.before_write {
            hook(attempt).await;
        }
        let pp = PatchParams { field_manager: Some(opts.field_manager.clone()), ..PatchParams::default() };
        match api.patch(name, &pp, &kube::api::Patch::Json::<()>(guarded(read_rv.as_deref(), patch))).await {
            Ok(written) => {
                metrics::get().updates.inc();
                return Ok(Patched { object: Some(written), wrote: true, attempts: reads });
            }
            Err(source @ kube::Error::Api(_)) => {
                let now_rv = api.get_opt(name).await.map_err(api_err)?.and_then(|o| o.meta().resource_version.clone());
                if now_rv == read_rv {
                    return Err(PatchIfError::Refused { kind, object, source });
                }
                if attempt >= attempts {
                    metrics::get().giveups.inc();
                    tracing::warn!("{kind} {object} kept changing; giving up after {attempt} attempts");
                    return Err(PatchIfError::Conflict { kind, object, attempts: attempt, source });
                }
                metrics::get().conflicts_retried.inc();
                tracing::info!(
                    "{kind} {object} changed while its patch was prepared, re-planning on a fresh copy (attempt {attempt}/{attempts})"
                );
                if !cached {
                    tokio::time::sleep(opts.backoff.delay(attempt)).await;
                }
            }
            Err(source) => return Err(api_err(source)),
        }
    }
}

/// [`patch_if`] for a caller that holds a cached copy `seen` (a reflector store's): the plan
/// runs on `seen`; when it plans nothing there nothing is read or sent, otherwise its patch is
/// sent at once behind the `test` of `seen`'s resourceVersion — no GET before it. A `seen` a
/// write behind fails that test and costs what a conflict costs in [`patch_if`] (the re-read,
/// then a plan on the fresh copy, without the backoff): the common case, a current cache, is one
/// request instead of two, and the write is still applied only to the revision it was planned
/// from. (Without the GET, a declarative hot-plug's spec edit → `device_add` chain is one round
/// trip shorter.) A plan that fails on `seen` is not final either: the fresh copy decides.
///
/// # Errors
/// As [`patch_if`].
pub async fn patch_if_seen<K: Object, E: std::error::Error + 'static>(
    api: &Api<K>,
    seen: &K,
    opts: &PatchIfOptions,
    mut plan: impl FnMut(&K) -> Result<Option<Patch>, E>,
) -> Result<Patched<K>, PatchIfError<E>> {
    let first = match plan(seen) {
        Ok(None) => {
            metrics::get().noop_skips.inc();
            return Ok(Patched { object: Some(seen.clone()), wrote: false, attempts: 0 });
        }
        Ok(Some(patch)) => Some((seen.clone(), patch)),
        // A plan error on the cached copy is not final: the fresh copy decides.
        Err(_) => None,
    };
    let name = seen.meta().name.clone().unwrap_or_default();
    attempt_from(api, &name, opts, plan, first).await
}

/// `patch` behind a `test` of the resourceVersion it was planned from (unless the plan put that
/// very test first itself).
fn guarded(rv: Option<&str>, patch: Patch) -> Patch {
    // Why `test` first: the object must still be the revision the plan was computed from.
    let test = PatchOperation::Test(TestOperation {
        path: json_patch::jsonptr::PointerBuf::from_tokens(["metadata", "resourceVersion"]),
        value: rv.map_or(serde_json::Value::Null, |v| serde_json::Value::String(v.to_owned())),
    });
    if patch.0.first() == Some(&test) {
        return patch;
    }
    let mut ops = Vec::with_capacity(patch.0.len() + 1);
    ops.push(test);
    ops.extend(patch.0);
    Patch(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_patch_is_applied_only_to_the_revision_it_was_planned_from() {
        let plan: Patch = serde_json::from_value(json!([{"op": "add", "path": "/spec/x", "value": 1}])).unwrap();
        let p = guarded(Some("7"), plan);
        assert_eq!(serde_json::to_value(&p).unwrap()[0], json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"}));
        let mut same = json!({"metadata": {"resourceVersion": "7"}, "spec": {}});
        json_patch::patch(&mut same, &p).unwrap();
        assert_eq!(same["spec"]["x"], 1);
        let mut moved = json!({"metadata": {"resourceVersion": "8"}, "spec": {}});
        assert!(json_patch::patch(&mut moved, &p).is_err(), "a newer revision fails the test");
        assert_eq!(moved["spec"], json!({}), "and is left as it was");
        assert_eq!(guarded(Some("7"), p.clone()), p, "a plan that tests the revision itself is not tested twice");
    }
}
