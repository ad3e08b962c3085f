//! core/v1 Events, as `kubectl describe` and `kubectl get events` show them, aggregated the way
//! client-go's event recorder does, so a guest that reboots all day leaves one Event, not
//! thousands.
//!
//! # Flow
//! [`publish`] keys the Event by source component, involved object (by uid), type, reason and
//! message (client-go's `getEventKey`) and:
//! 1. aggregates: once [`cache::AGGREGATE_MAX_MESSAGES`] distinct messages for the same object
//!    and reason arrive within 10 minutes, they all go to one Event whose message says
//!    "(combined from similar events): ..." (client-go's `EventAggregator`);
//! 2. takes a per-key lock in this process, so concurrent repeats queue instead of racing;
//! 3. on a key it wrote before (a bounded LRU of [`cache::MAX_ENTRIES`] keys, no list per call)
//!    bumps `count` and `lastTimestamp` (and the message) with a merge patch that carries the
//!    Event's last known `resourceVersion`: the server applies it only to that revision. On 409
//!    it re-reads and retries through [`crate::try_update`]; if the Event is gone (expired by the
//!    server's TTL, deleted) or keeps changing, it creates a new one;
//! 4. otherwise creates a new Event (named `OBJECT.<nanoseconds hex>`, like the kubelet's) with
//!    `count: 1` and remembers it.
//!
//! # Guarantees
//! Best effort: a failure is logged, never returned, and the whole call is bounded by
//! [`PUBLISH_DEADLINE`], so an Event can never stop or stall the reconcile that raised it.
//!
//! # Caveats
//! The cache lives in this process: after a restart the first repeat creates a new Event, as
//! the kubelet's does. client-go's spam filter (a token bucket per object that drops Events) is
//! not mirrored: aggregation already bounds what is stored, and every occurrence is counted.

mod cache;

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use cache::{Correlator, Key, Observed};
pub use cache::{AGGREGATE_MAX_MESSAGES, COMBINED, MAX_ENTRIES};

/// The most one [`publish`] may take, waits for the per-key lock included.
pub const PUBLISH_DEADLINE: Duration = Duration::from_secs(10);

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

fn correlator() -> MutexGuard<'static, Correlator> {
    static CACHE: OnceLock<Mutex<Correlator>> = OnceLock::new();
    // Every operation on the caches is a single lookup or insert: consistent after any panic.
    CACHE.get_or_init(|| Mutex::new(Correlator::default())).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Publishes an Event about `obj` from `component` (e.g. `virtplug-controller`), or counts
/// one more occurrence on the Event already published for it. See the module docs.
pub async fn publish<K>(client: &kube::Client, component: &str, obj: &K, type_: EventType, reason: &str, message: &str)
where
    K: Resource<DynamicType = ()>,
{
    let ns = obj.namespace().unwrap_or_else(|| "default".to_owned());
    let involved = ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: Some(obj.name_any()),
        namespace: obj.namespace(),
        uid: obj.uid(),
        resource_version: obj.resource_version(),
        ..ObjectReference::default()
    };
    let key = Key {
        component: component.to_owned(),
        namespace: ns.clone(),
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: obj.name_any(),
        uid: obj.uid().unwrap_or_default(),
        type_: type_.as_str().to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
    };
    let (key, message) = correlator().aggregate(key, Instant::now());
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    let new = NewEvent { namespace: &ns, component, involved, type_, reason, message: &message };
    match tokio::time::timeout(PUBLISH_DEADLINE, record(&api, &key, &new)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("cannot publish the Event {reason} about {ns}/{}: {e}", key.name),
        Err(_) => tracing::warn!("cannot publish the Event {reason} about {ns}/{}: no answer within {PUBLISH_DEADLINE:?}", key.name),
    }
}

/// What a new Event is made of.
struct NewEvent<'a> {
    namespace: &'a str,
    component: &'a str,
    involved: ObjectReference,
    type_: EventType,
    reason: &'a str,
    message: &'a str,
}

/// Bumps the Event remembered for `key`, or creates one.
async fn record(api: &Api<Event>, key: &Key, new: &NewEvent<'_>) -> Result<(), kube::Error> {
    let _lock = crate::locks::lock(&key.lock_name()).await;
    let seen = correlator().observed.get_mut(key).cloned();
    if let Some(seen) = seen {
        match bump(api, &seen, new.message).await {
            Ok(Some(event)) => {
                remember(key, &event);
                return Ok(());
            }
            // Gone or unresolvable: a new Event below, as client-go does on NotFound.
            Ok(None) => correlator().observed.remove(key),
            Err(e) => return Err(e),
        }
    }
    let event = api.create(&PostParams::default(), &build(new)).await?;
    remember(key, &event);
    Ok(())
}

fn remember(key: &Key, event: &Event) {
    if let (Some(name), Some(rv)) = (event.metadata.name.clone(), event.metadata.resource_version.clone()) {
        let observed = Observed { name, resource_version: rv, count: event.count.unwrap_or(1) };
        correlator().observed.insert(key.clone(), observed);
    }
}

/// One more occurrence on the Event `seen`: a merge patch conditional on its last known
/// revision; on 409 a fresh read and [`crate::try_update`]. `None`: the Event is gone or kept
/// changing (the caller creates a new one).
async fn bump(api: &Api<Event>, seen: &Observed, message: &str) -> Result<Option<Event>, kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = json!({
        "metadata": {"resourceVersion": seen.resource_version},
        "count": seen.count.saturating_add(1),
        "lastTimestamp": Time(now),
        "message": message,
    });
    match api.patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(event) => return Ok(Some(event)),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    // Someone else wrote the Event since: count on the current copy.
    let r = crate::update(api, &seen.name, |e: &mut Event| {
        e.count = Some(e.count.unwrap_or(1).saturating_add(1));
        e.last_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        e.message = Some(message.to_owned());
    })
    .await;
    match r {
        Ok(u) => Ok(Some(u.object)),
        Err(e) if e.is_not_found() || e.is_conflict() => Ok(None),
        Err(crate::UpdateError::Api { source, .. }) => Err(source),
        Err(e) => {
            tracing::warn!("cannot count one more occurrence on the Event {}: {e}", seen.name);
            Ok(None)
        }
    }
}

fn build(new: &NewEvent<'_>) -> Event {
    let now = k8s_openapi::jiff::Timestamp::now();
    let name = format!("{}.{:x}", new.involved.name.as_deref().unwrap_or_default(), now.as_nanosecond());
    let time = Time(now);
    Event {
        metadata: ObjectMeta { name: Some(name), namespace: Some(new.namespace.to_owned()), ..ObjectMeta::default() },
        involved_object: new.involved.clone(),
        type_: Some(new.type_.as_str().to_owned()),
        reason: Some(new.reason.to_owned()),
        message: Some(new.message.to_owned()),
        source: Some(EventSource { component: Some(new.component.to_owned()), host: None }),
        reporting_component: Some(new.component.to_owned()),
        first_timestamp: Some(time.clone()),
        last_timestamp: Some(time),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        ..Event::default()
    }
}

/// The Events about the object named `name` in `ns` with `reason`, oldest first.
///
/// # Errors
/// When the list request fails.
pub async fn list(client: &kube::Client, ns: &str, name: &str, reason: &str) -> Result<Vec<Event>, kube::Error> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let mut events: Vec<Event> = api
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason))
        .collect();
    events.sort_by_key(|e| e.metadata.name.clone());
    Ok(events)
}
