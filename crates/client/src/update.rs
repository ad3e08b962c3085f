//! The one read-modify-write path. Every change to an existing object goes through [`update`]
//! (or [`update_status`]); [`blind_patch`] is the only exception, for single-key label and
//! annotation writes.
//!
//! # Flow
//! 1. Take the object's lock inside this process (kind, namespace and name), so writers in this
//!    process queue instead of racing.
//! 2. GET a fresh copy.
//! 3. Run the caller's mutation on a copy; it must take every decision from that copy.
//! 4. Nothing changed: no request, return `wrote: false`.
//! 5. Otherwise send a JSON merge patch computed from the copy, carrying the
//!    `metadata.resourceVersion` it was computed from: the server applies it only if the object
//!    is still at that revision.
//! 6. On 409 Conflict (someone else wrote in between), back off with jitter and go to 2, up to
//!    `attempts` times; then return the Conflict. It never overwrites blindly.
//!
//! A write that nothing else would redo once lost (an import's outcome, a finalizer's removal)
//! goes through [`persist`], which runs the whole read-modify-write again, with backoff, until
//! it is written or cannot ever be (the object is gone or refused by the mutation).
//!
//! # Guarantees
//! - A write is always based on the object as it was when the mutation ran: two writers can never
//!   lose each other's changes, even when one of them replaces a whole array (`disks`).
//! - Writers of different objects never wait for each other; lock entries disappear with the last
//!   holder or waiter.
//!
//! # Defaults
//! 5 attempts; backoff before attempt n+1 is uniform in `[50 ms, min(500 ms, 50 ms * 2^n)]`.
//!
//! # Caveats
//! The lock only orders writers within one process; across processes the resourceVersion
//! precondition does that. A merge patch cannot store an explicit `null`: set a field to `null`
//! in the mutation and it is removed.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::backoff::{Backoff, Jitter};
use crate::{locks, metrics};

/// A hook run between the read and the write of every attempt (tests use it to interleave
/// writers at the worst moment).
pub type BeforeWrite = Arc<dyn Fn(u32) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Tunables of [`update`].
#[derive(Clone)]
pub struct UpdateOptions {
    /// Attempts before giving up with the Conflict (at least 1).
    pub attempts: u32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Field manager sent with the patch.
    pub field_manager: String,
    #[doc(hidden)]
    pub before_write: Option<BeforeWrite>,
}

impl Default for UpdateOptions {
    fn default() -> Self {
        UpdateOptions {
            attempts: 5,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(500),
            field_manager: "virtplug".to_owned(),
            before_write: None,
        }
    }
}

impl Debug for UpdateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateOptions")
            .field("attempts", &self.attempts)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .finish_non_exhaustive()
    }
}

/// What [`update`] and [`crate::patch_if`] write: a typed Kubernetes object.
pub trait Object: Resource<DynamicType: Default> + Clone + Serialize + DeserializeOwned + Debug {}

impl<K: Resource<DynamicType: Default> + Clone + Serialize + DeserializeOwned + Debug> Object for K {}

/// What [`update`] did.
#[derive(Debug, Clone)]
pub struct Updated<K> {
    /// The object after the update (or as read, when nothing changed).
    pub object: K,
    /// Whether a write was sent and accepted.
    pub wrote: bool,
    /// Reads it took (1 when the first write went through).
    pub attempts: u32,
}

/// Errors of [`update`].
#[derive(Debug, thiserror::Error)]
pub enum UpdateError<E: std::error::Error + 'static> {
    #[error("{kind} {object} kept changing while an update was being prepared; gave up after {attempts} attempts")]
    Conflict {
        kind: String,
        object: String,
        attempts: u32,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {object}: the mutation refused the change")]
    Mutate {
        kind: String,
        object: String,
        #[source]
        source: E,
    },
    #[error("{kind} {object}: the API request failed")]
    Api {
        kind: String,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {object}: cannot encode or decode the object")]
    Codec {
        kind: String,
        object: String,
        #[source]
        source: serde_json::Error,
    },
}

impl<E: std::error::Error + 'static> UpdateError<E> {
    /// Whether this is a give-up after repeated Conflicts.
    pub fn is_conflict(&self) -> bool {
        matches!(self, UpdateError::Conflict { .. })
    }
    /// Whether the object does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, UpdateError::Api { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}

/// The mutation error of an infallible mutation.
#[derive(Debug, thiserror::Error)]
#[error("unreachable")]
pub enum Never {}

/// Which part of the object a write goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Main,
    Status,
}

/// Read-modify-write of `name` with an infallible mutation. See the module docs.
///
/// # Errors
/// `Conflict` after the attempt limit, `Api` for any other API error (404 included).
pub async fn update<K: Object>(api: &Api<K>, name: &str, mut mutate: impl FnMut(&mut K)) -> Result<Updated<K>, UpdateError<Never>> {
    try_update(api, name, &UpdateOptions::default(), |k| {
        mutate(k);
        Ok(())
    })
    .await
}

/// Like [`update`], for the `/status` subresource.
///
/// # Errors
/// As [`update`].
pub async fn update_status<K: Object>(api: &Api<K>, name: &str, mut mutate: impl FnMut(&mut K)) -> Result<Updated<K>, UpdateError<Never>> {
    run(api, name, &UpdateOptions::default(), Part::Status, |k| {
        mutate(k);
        Ok(())
    })
    .await
}

/// [`update`] for a caller that holds a cached copy `seen` of the object (a reflector store's):
/// the mutation runs on `seen` first, and when it changes nothing there nothing is read or sent.
/// Otherwise exactly [`update`] (fresh GET, the mutation again on the fresh copy, conditional
/// write).
///
/// # Caveats
/// A stale `seen` that already looks right skips the write; a caller driven by a watch (a
/// kube-runtime controller) is woken again by the newer copy, which corrects that.
///
/// # Errors
/// As [`update`].
pub async fn update_from<K: Object>(api: &Api<K>, seen: &K, mutate: impl FnMut(&mut K)) -> Result<Updated<K>, UpdateError<Never>> {
    run_from(api, seen, Part::Main, mutate).await
}

/// [`update_from`] on the `/status` subresource.
///
/// # Errors
/// As [`update`].
pub async fn update_status_from<K: Object>(api: &Api<K>, seen: &K, mutate: impl FnMut(&mut K)) -> Result<Updated<K>, UpdateError<Never>> {
    run_from(api, seen, Part::Status, mutate).await
}

async fn run_from<K: Object>(api: &Api<K>, seen: &K, part: Part, mut mutate: impl FnMut(&mut K)) -> Result<Updated<K>, UpdateError<Never>> {
    if let Ok(false) = changed_copy(seen, &mut mutate) {
        metrics::get().noop_skips.inc();
        return Ok(Updated { object: seen.clone(), wrote: false, attempts: 0 });
    }
    let name = seen.meta().name.clone().unwrap_or_default();
    run(api, &name, &UpdateOptions::default(), part, |k| {
        mutate(k);
        Ok(())
    })
    .await
}

/// Whether `mutate` changes a copy of `seen` (an encoding error counts as a change: the real
/// update then reports it). Compared as JSON bytes, not `Value` trees: a controller runs this on
/// every event of the objects it reports on, and building two trees was ~5 % of `up`'s CPU while
/// a VM's volumes were plugged and unplugged. A map whose order differs between the two copies
/// reads as a change; that only costs the GET after which [`update`] finds nothing to write.
fn changed_copy<K: Clone + Serialize>(seen: &K, mutate: &mut impl FnMut(&mut K)) -> Result<bool, serde_json::Error> {
    let mut copy = seen.clone();
    mutate(&mut copy);
    Ok(serde_json::to_vec(seen)? != serde_json::to_vec(&copy)?)
}

/// Read-modify-write with a mutation that may refuse (its error is returned, nothing written).
///
/// # Errors
/// As [`update`], plus `Mutate`.
pub async fn try_update<K: Object, E>(
    api: &Api<K>,
    name: &str,
    opts: &UpdateOptions,
    mutate: impl FnMut(&mut K) -> Result<(), E>,
) -> Result<Updated<K>, UpdateError<E>>
where
    E: std::error::Error + 'static,
{
    run(api, name, opts, Part::Main, mutate).await
}

/// [`try_update`] on the `/status` subresource.
///
/// # Errors
/// As [`try_update`].
pub async fn try_update_status<K: Object, E>(
    api: &Api<K>,
    name: &str,
    opts: &UpdateOptions,
    mutate: impl FnMut(&mut K) -> Result<(), E>,
) -> Result<Updated<K>, UpdateError<E>>
where
    E: std::error::Error + 'static,
{
    run(api, name, opts, Part::Status, mutate).await
}

async fn run<K: Object, E>(
    api: &Api<K>,
    name: &str,
    opts: &UpdateOptions,
    part: Part,
    mut mutate: impl FnMut(&mut K) -> Result<(), E>,
) -> Result<Updated<K>, UpdateError<E>>
where
    E: std::error::Error + 'static,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let object = match api.namespace() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    };
    let api_err = |source| UpdateError::Api { kind: kind.clone(), object: object.clone(), source };
    let codec = |source| UpdateError::Codec { kind: kind.clone(), object: object.clone(), source };
    let _lock = locks::lock(&format!("{}/{name}", api.resource_url())).await;
    let attempts = opts.attempts.max(1);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = api.get(name).await.map_err(api_err)?;
        let mut changed = current.clone();
        mutate(&mut changed).map_err(|source| UpdateError::Mutate { kind: kind.clone(), object: object.clone(), source })?;
        let before = serde_json::to_value(&current).map_err(codec)?;
        let after = serde_json::to_value(&changed).map_err(codec)?;
        let mut patch = merge_diff(&before, &after);
        if patch.as_object().is_none_or(Map::is_empty) {
            metrics::get().noop_skips.inc();
            return Ok(Updated { object: current, wrote: false, attempts: attempt });
        }
        // The precondition: the revision this patch was computed from.
        let rv = current.meta().resource_version.clone().unwrap_or_default();
        patch["metadata"]["resourceVersion"] = Value::String(rv);
        if let Some(hook) = &opts.before_write {
            hook(attempt).await;
        }
        let pp = PatchParams { field_manager: Some(opts.field_manager.clone()), ..PatchParams::default() };
        let sent = match part {
            Part::Main => api.patch(name, &pp, &Patch::Merge(&patch)).await,
            Part::Status => api.patch_status(name, &pp, &Patch::Merge(&patch)).await,
        };
        match sent {
            Ok(object) => {
                metrics::get().updates.inc();
                return Ok(Updated { object, wrote: true, attempts: attempt });
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < attempts => {
                metrics::get().conflicts_retried.inc();
                tracing::info!(
                    "{kind} {object} changed while an update was being prepared, retrying on a fresh copy (attempt {attempt}/{attempts})"
                );
                tokio::time::sleep(opts.backoff().delay(attempt + 1)).await;
            }
            Err(source @ kube::Error::Api(_)) if is_conflict(&source) => {
                metrics::get().giveups.inc();
                tracing::warn!("{kind} {object} kept changing; giving up after {attempt} attempts");
                return Err(UpdateError::Conflict { kind, object, attempts: attempt, source });
            }
            Err(source) => return Err(api_err(source)),
        }
    }
}

/// The backoff of [`persist`]: 100 ms, doubling to 5 s, ±20 %.
pub const PERSIST_BACKOFF: Backoff =
    Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(5), jitter: Jitter::Proportional(0.2) };

/// Runs `write` (an [`update`]-style read-modify-write, or a [`blind_patch`]) again, with
/// [`PERSIST_BACKOFF`], until it is written or cannot ever be: for a write nothing else would
/// redo once it is lost (a final outcome, a finalizer's removal, an answer to a request), whose
/// loss would leave the object stuck until a restart.
///
/// Retried: repeated Conflicts, 429 and 5xx answers, and failures without an answer (the
/// connection). Returned: success, and every error that another try cannot change (404: the
/// object is gone; the mutation's refusal, e.g. because the object is now another one of the
/// same name; any other 4xx; an encoding or decoding error). `what` names the write in the
/// log. It never gives up on a transient error by itself: the caller bounds it (drops it when
/// its task ends).
///
/// # Errors
/// The last error, when it is one of those that end the retries.
pub async fn persist<T, E, F>(what: &str, mut write: impl FnMut() -> F) -> Result<T, E>
where
    E: Transient + std::error::Error + 'static,
    F: Future<Output = Result<T, E>>,
{
    let mut retry = 0u32;
    loop {
        match write().await {
            Err(e) if e.transient() => {
                retry = retry.saturating_add(1);
                let delay = PERSIST_BACKOFF.delay(retry);
                tracing::warn!("cannot {what} (trying again in {delay:.1?}): {}", crate::error_chain(&e));
                tokio::time::sleep(delay).await;
            }
            done => return done,
        }
    }
}

/// Whether another try of a write may succeed where this one failed ([`persist`]).
pub trait Transient {
    fn transient(&self) -> bool;
}

impl Transient for kube::Error {
    /// 429 and 5xx answers, and no answer at all (the connection, the transport, credentials
    /// that could not be loaded this time); not a request that cannot be built or an answer
    /// that cannot be read, which fail the same way every time.
    fn transient(&self) -> bool {
        match self {
            kube::Error::Api(s) => s.code == 429 || s.code >= 500,
            e => matches!(e, kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) | kube::Error::Auth(_)),
        }
    }
}

impl<E: std::error::Error + 'static> Transient for UpdateError<E> {
    fn transient(&self) -> bool {
        match self {
            UpdateError::Conflict { .. } => true,
            UpdateError::Api { source, .. } => source.transient(),
            UpdateError::Mutate { .. } | UpdateError::Codec { .. } => false,
        }
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl UpdateOptions {
    /// The backoff between attempts: before attempt n+1, uniform in
    /// `[backoff_min, min(backoff_max, backoff_min × 2^n)]` (its retry n+1).
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        Backoff { base: self.backoff_min, cap: self.backoff_max, jitter: Jitter::Full }
    }
}

/// The RFC 7396 merge patch that turns `before` into `after`: objects recurse, arrays and
/// scalars are replaced whole, removed keys become `null`.
#[must_use]
pub fn merge_diff(before: &Value, after: &Value) -> Value {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut out = Map::new();
            for (k, bv) in b {
                match a.get(k) {
                    None => {
                        out.insert(k.clone(), Value::Null);
                    }
                    Some(av) if av != bv => {
                        let d = merge_diff(bv, av);
                        out.insert(k.clone(), d);
                    }
                    Some(_) => {}
                }
            }
            for (k, av) in a {
                if !b.contains_key(k) {
                    out.insert(k.clone(), av.clone());
                }
            }
            Value::Object(out)
        }
        _ => after.clone(),
    }
}

/// What [`blind_patch`] may write.
#[derive(Clone, Copy, Debug)]
pub enum MetaKey {
    Label,
    Annotation,
}

/// The only write outside [`update`]: sets (or, with `None`, removes) one label or annotation
/// with a merge patch that carries no resourceVersion. Safe without a precondition because it
/// touches one map key and no array, so it cannot undo anyone else's change.
///
/// # Errors
/// The API error.
pub async fn blind_patch<K>(api: &Api<K>, name: &str, which: MetaKey, key: &str, value: Option<&str>) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    blind_patch_keys(api, name, &[(which, key, value)]).await
}

/// [`blind_patch`] of several label and annotation keys in one request (a node agent's
/// heartbeat: its schedulable label and its heartbeat annotation together). The same reasoning
/// holds: map keys only, no array.
///
/// # Errors
/// The API error.
pub async fn blind_patch_keys<K>(api: &Api<K>, name: &str, keys: &[(MetaKey, &str, Option<&str>)]) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut meta = Map::new();
    for (which, key, value) in keys {
        let field = match which {
            MetaKey::Label => "labels",
            MetaKey::Annotation => "annotations",
        };
        let map = meta.entry(field.to_owned()).or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(map) = map {
            map.insert((*key).to_owned(), value.map_or(Value::Null, |v| Value::String(v.to_owned())));
        }
    }
    let mut body = Map::new();
    body.insert("metadata".to_owned(), Value::Object(meta));
    api.patch(name, &PatchParams::default(), &Patch::Merge(Value::Object(body))).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// [`persist`] sends again what the server may take later (a Conflict give-up, 429, 5xx, no
    /// answer) and stops on what no retry changes (gone, refused by the mutation, other 4xx, an
    /// answer that cannot be read).
    #[test]
    fn persist_retries_what_may_pass_later_and_stops_on_what_cannot() {
        let api = |code: u16| UpdateError::<std::fmt::Error>::Api {
            kind: "K".into(),
            object: "o".into(),
            source: kube::Error::Api(kube::core::Status::failure("m", "r").with_code(code).boxed()),
        };
        let conflict = UpdateError::<std::fmt::Error>::Conflict {
            kind: "K".into(),
            object: "o".into(),
            attempts: 5,
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        };
        let mutate = UpdateError::Mutate { kind: "K".into(), object: "o".into(), source: std::fmt::Error };
        let other = |source| UpdateError::<std::fmt::Error>::Api { kind: "K".into(), object: "o".into(), source };
        let unanswered = other(kube::Error::Service("connection refused".into()));
        let unreadable = other(kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err()));
        let got: Vec<bool> = [api(503), api(500), api(429), conflict, unanswered, api(404), api(403), api(422), mutate, unreadable]
            .iter()
            .map(Transient::transient)
            .collect();
        assert_eq!(got, [true, true, true, true, true, false, false, false, false, false]);
    }

    #[test]
    fn a_mutation_that_sets_what_is_there_changes_nothing_and_any_other_does() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let seen: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c", "resourceVersion": "7",
            "labels": {"b": "2", "a": "1"}}, "data": {"k": "v", "j": "w"}}))
        .unwrap();
        let same = changed_copy(&seen, &mut |c: &mut ConfigMap| {
            c.data.get_or_insert_with(Default::default).insert("k".into(), "v".into());
        });
        assert!(!same.unwrap(), "the same value written again");
        let removed_and_back = changed_copy(&seen, &mut |c: &mut ConfigMap| {
            let labels = c.metadata.labels.get_or_insert_with(Default::default);
            let a = labels.remove("a").unwrap();
            labels.insert("a".into(), a);
        });
        assert!(!removed_and_back.unwrap(), "a sorted map reads the same after a remove and insert");
        let changed = changed_copy(&seen, &mut |c: &mut ConfigMap| {
            c.data.get_or_insert_with(Default::default).insert("k".into(), "x".into());
        });
        assert!(changed.unwrap(), "a new value");
        let status: serde_json::Value = json!({"status": {"phase": "Running", "volumeStatus": [{"name": "v"}]}});
        assert!(!changed_copy(&status, &mut |s: &mut serde_json::Value| s["status"]["phase"] = json!("Running")).unwrap());
        assert!(changed_copy(&status, &mut |s: &mut serde_json::Value| s["status"]["volumeStatus"] = json!([])).unwrap());
    }

    #[test]
    fn merge_diff_round_trips_through_merge() {
        let before = json!({"a": 1, "b": {"c": [1, 2], "d": "x"}, "gone": true});
        let after = json!({"a": 1, "b": {"c": [2], "e": 3}, "new": {"k": "v"}});
        let patch = merge_diff(&before, &after);
        assert_eq!(patch, json!({"b": {"c": [2], "d": null, "e": 3}, "gone": null, "new": {"k": "v"}}));
        let mut doc = before.clone();
        json_patch::merge(&mut doc, &patch);
        assert_eq!(doc, after);
        assert_eq!(merge_diff(&after, &after), json!({}));
    }

    #[test]
    fn backoff_stays_within_bounds() {
        let o = UpdateOptions::default();
        for attempt in 1..10 {
            let b = o.backoff().delay(attempt + 1);
            assert!(b >= o.backoff_min && b <= o.backoff_max, "{b:?}");
        }
    }
}
