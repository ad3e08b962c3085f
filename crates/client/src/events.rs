//! core/v1 Events, as `kubectl describe` and `kubectl get events` show them.
//!
//! Each call creates one Event (named `OBJECT.<nanoseconds hex>`, like the kubelet's); no
//! aggregation. Publishing is best effort: a failure is logged, never returned, so an Event can
//! never stop the reconcile that raised it.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// Publishes an Event about `obj` from `component` (e.g. `virtplug-controller`).
pub async fn publish<K>(client: &kube::Client, component: &str, obj: &K, type_: EventType, reason: &str, message: &str)
where
    K: Resource<DynamicType = ()>,
{
    let ns = obj.namespace().unwrap_or_else(|| "default".to_owned());
    let now = k8s_openapi::jiff::Timestamp::now();
    let name = format!("{}.{:x}", obj.name_any(), now.as_nanosecond());
    let involved = ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: Some(obj.name_any()),
        namespace: obj.namespace(),
        uid: obj.uid(),
        resource_version: obj.resource_version(),
        ..ObjectReference::default()
    };
    let time = Time(now);
    let event = Event {
        metadata: ObjectMeta { name: Some(name), namespace: Some(ns.clone()), ..ObjectMeta::default() },
        involved_object: involved,
        type_: Some(match type_ {
            EventType::Normal => "Normal".to_owned(),
            EventType::Warning => "Warning".to_owned(),
        }),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        source: Some(EventSource { component: Some(component.to_owned()), host: None }),
        reporting_component: Some(component.to_owned()),
        first_timestamp: Some(time.clone()),
        last_timestamp: Some(time),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        ..Event::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::warn!("cannot publish the Event {reason} about {}/{}: {e}", ns, obj.name_any());
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
