//! Event expiry, as kube-apiserver's `--event-ttl` (default 1 h): an Event not seen again for
//! longer than the TTL is deleted, so Events from guests and retries cannot pile up forever.
//!
//! # Flow
//! The garbage collector calls [`expire`] at start and then every [`period`] (a timer beside its
//! event-driven sweep). Each pass deletes, with a resourceVersion precondition, every Event of
//! every served Event resource (core/v1, and events.k8s.io when served) whose last sighting
//! ([`last_seen`]) is older than the TTL. An Event bumped in the meantime fails the precondition
//! and stays.
//!
//! # Assumptions
//! kube-apiserver expires an Event a TTL after its last write (an etcd lease). This store keeps
//! no write time, so the Event's own times stand in for it: the newest of `lastTimestamp`,
//! `eventTime`, `series.lastObservedTime`, `deprecatedLastTimestamp` and
//! `metadata.creationTimestamp` (set by this server). A time more than [`CLOCK_SKEW`] in the
//! future is ignored, so a wrong clock cannot make an Event live forever.

use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;

use crate::objects::{DeleteOptions, Objects};
use crate::registry;

/// How far in the future an Event's time may be and still count.
pub const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// How often the collector looks for expired Events: a quarter of the TTL, between 100 ms and
/// 1 minute (an Event outlives its TTL by at most that).
#[must_use]
pub fn period(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// When the Event was last seen; `None` when it carries no usable time at all.
#[must_use]
pub fn last_seen(event: &Value, now: Timestamp) -> Option<Timestamp> {
    let latest_allowed = now.checked_add(CLOCK_SKEW).unwrap_or(now);
    ["/lastTimestamp", "/eventTime", "/series/lastObservedTime", "/deprecatedLastTimestamp", "/metadata/creationTimestamp"]
        .iter()
        .filter_map(|p| event.pointer(p).and_then(Value::as_str))
        .filter_map(|s| s.parse::<Timestamp>().ok())
        .filter(|t| *t <= latest_allowed)
        .max()
}

/// Deletes the Events last seen more than `ttl` ago; returns how many.
pub async fn expire(objects: &Objects, ttl: Duration) -> usize {
    let now = Timestamp::now();
    let mut deleted = 0;
    for def in registry::all().into_iter().filter(|d| d.kind == "Event") {
        let (_, items) = objects.store.list(&def.prefix(None), None);
        for (_, stored) in items {
            let event = stored.object.value();
            let Some(seen) = last_seen(&event, now) else { continue };
            let age = now.duration_since(seen);
            if age.is_negative() || age.unsigned_abs() <= ttl {
                continue;
            }
            let ns = event.pointer("/metadata/namespace").and_then(Value::as_str);
            let Some(name) = event.pointer("/metadata/name").and_then(Value::as_str) else { continue };
            // Only the revision judged old: an Event bumped meanwhile fails the precondition.
            let opts = DeleteOptions { resource_version: Some(stored.rv.to_string()), ..DeleteOptions::default() };
            match objects.delete(def, ns, name, &opts).await {
                Ok(_) => deleted += 1,
                Err(e) if e.code == 404 || e.code == 409 => {}
                Err(e) => tracing::warn!("cannot delete the expired Event {}/{name}: {}", ns.unwrap_or_default(), e.message),
            }
        }
    }
    if deleted > 0 {
        tracing::info!("deleted {deleted} Event(s) last seen more than {ttl:?} ago");
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_newest_plausible_time_counts() {
        let now: Timestamp = "2025-01-01T12:00:00Z".parse().unwrap_or_else(|e| panic!("{e}"));
        let ev = json!({
            "metadata": {"creationTimestamp": "2025-01-01T09:00:00Z"},
            "firstTimestamp": "2025-01-01T09:00:00Z",
            "lastTimestamp": "2025-01-01T11:30:00Z",
            "eventTime": "2025-01-01T09:00:00.123456Z",
        });
        assert_eq!(last_seen(&ev, now), "2025-01-01T11:30:00Z".parse().ok());
        // events.k8s.io/v1: series.lastObservedTime.
        let series = json!({"metadata": {"creationTimestamp": "2025-01-01T09:00:00Z"},
            "series": {"count": 3, "lastObservedTime": "2025-01-01T11:59:00.000001Z"}});
        assert_eq!(last_seen(&series, now), "2025-01-01T11:59:00.000001Z".parse().ok());
        // A time far in the future does not keep an Event alive.
        let future = json!({"metadata": {"creationTimestamp": "2025-01-01T09:00:00Z"}, "lastTimestamp": "2999-01-01T00:00:00Z"});
        assert_eq!(last_seen(&future, now), "2025-01-01T09:00:00Z".parse().ok());
        // Garbage is ignored, not a panic.
        assert_eq!(last_seen(&json!({"lastTimestamp": 7, "metadata": "x"}), now), None);
        assert_eq!(last_seen(&json!([]), now), None);
    }

    #[test]
    fn the_sweep_period_follows_the_ttl_within_bounds() {
        assert_eq!(period(Duration::from_secs(3600)), Duration::from_secs(60));
        assert_eq!(period(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(period(Duration::ZERO), Duration::from_millis(100));
    }
}
