//! Watch streams: `ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK` lines from a resourceVersion, the
//! initial events of a streaming list, and an `ERROR` 410 `Expired` when the start revision was
//! compacted or the watcher fell too far behind (the client then lists again, as kube-runtime's
//! watcher and client-go's reflector do).
//!
//! # Limits
//! - At most [`MAX_WATCHES`] watches per server at once ([`WatchSlots`]); more are 429 with
//!   `Retry-After`.
//! - `timeoutSeconds` is capped at [`MAX_WATCH_TIMEOUT`] (see `query`), and the deadline is
//!   computed with checked arithmetic.
//!
//! # A resourceVersion newer than the store
//! The stream waits up to [`FRESHNESS_WAIT`] for the store to reach it, then serves normally;
//! if it does not, the stream carries one `ERROR` event with kube-apiserver's 504 "Too large
//! resource version" Status and ends. (kube-apiserver's watch cache answers so for a streaming
//! list, and keeps a plain watch open; here the store is the source of truth, so a revision it
//! has not reached can only come from another store - e.g. one that was reset - and waiting for
//! it would silently skip every event up to it.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use serde_json::json;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use crate::limits::{FRESHNESS_WAIT, MAX_WATCHES, MAX_WATCH_TIMEOUT};
use crate::objects::Objects;
use crate::query::ListOptions;
use crate::registry::ResourceDef;
use crate::reply::stream_response;
use crate::selectors::{Selection, Selector};
use crate::status::ApiError;
use crate::store::{Doc, Event, EventType, Store, StoreError};
use crate::table;

/// How long a watch without `timeoutSeconds` stays open (the apiserver's default is 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// How often an idle watch with `allowWatchBookmarks` gets a BOOKMARK.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);

/// Counts the open watches of one server.
#[derive(Clone, Debug)]
pub struct WatchSlots {
    open: Arc<AtomicUsize>,
    max: usize,
}

impl Default for WatchSlots {
    fn default() -> Self {
        WatchSlots::new(MAX_WATCHES)
    }
}

/// One open watch; its slot is freed when it is dropped.
pub struct WatchSlot(Arc<AtomicUsize>);

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl WatchSlots {
    /// At most `max` watches at once.
    #[must_use]
    pub fn new(max: usize) -> Self {
        WatchSlots { open: Arc::new(AtomicUsize::new(0)), max }
    }

    /// Takes a slot, or `None` when all are taken.
    #[must_use]
    pub fn try_acquire(&self) -> Option<WatchSlot> {
        self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1)).ok()?;
        Some(WatchSlot(Arc::clone(&self.open)))
    }

    /// How many watches are open.
    #[must_use]
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// Waits until the store has reached revision `rv`, for at most `within`.
///
/// # Errors
/// 504 "Too large resource version" (kube-apiserver's Status) when it has not by then.
pub async fn wait_for_revision(store: &Store, rv: u64, within: Duration) -> Result<(), ApiError> {
    if store.revision() >= rv {
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + within.min(MAX_WATCH_TIMEOUT);
    // Subscribe first, then look: a write between the two is seen by one or the other.
    let mut live = match store.watch(u64::MAX) {
        Ok((_, live)) => live,
        Err(e) => return Err(ApiError::internal(e.to_string())),
    };
    loop {
        let current = store.revision();
        if current >= rv {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => return Err(ApiError::too_large_resource_version(rv, store.revision())),
            got = live.recv() => match got {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return Err(ApiError::too_large_resource_version(rv, current)),
            }
        }
    }
}

/// A watch's objects: those under `prefix` that `selection` picks.
struct Filter {
    prefix: String,
    selection: Selection,
}

impl Filter {
    fn new(prefix: String, name: Option<&str>, labels: &Selector, fields: &Selector) -> Filter {
        Filter { prefix, selection: Selection::new(name, labels, fields) }
    }

    fn matches(&self, key: &str, obj: &Doc) -> bool {
        key.starts_with(&self.prefix) && self.selection.matches(key, obj)
    }
}

/// Where a stream starts.
struct Start {
    rv: u64,
    /// Synthetic ADDED events for "from now, with the state".
    initial: Vec<Event>,
    backlog: Vec<Event>,
    live: broadcast::Receiver<Event>,
}

/// Opens a stream: waits for a revision the store has not reached yet (504 when it does not
/// come), lists the initial state when asked for, and subscribes (410 for a compacted start).
async fn open(store: &Store, filter: &Filter, requested: Option<u64>, initial_events: bool) -> Result<Start, ApiError> {
    if let Some(rv) = requested.filter(|rv| *rv > 0) {
        wait_for_revision(store, rv, FRESHNESS_WAIT).await?;
    }
    let (rv, initial): (u64, Vec<Event>) = match requested {
        Some(rv) if rv > 0 && !initial_events => (rv, Vec::new()),
        _ => {
            let (rv, items) = store.list(&filter.prefix, None);
            let initial = items
                .into_iter()
                .filter(|(k, s)| filter.matches(k, &s.object))
                .map(|(key, s)| Event { rv: s.rv, key, kind: EventType::Added, object: s.object })
                .collect();
            (rv, initial)
        }
    };
    let (backlog, live) = store.watch(rv).map_err(|e| match e {
        StoreError::Compacted { requested, oldest } => ApiError::expired(requested, oldest),
        e => ApiError::internal(e.to_string()),
    })?;
    Ok(Start { rv, initial, backlog, live })
}

/// Starts a watch.
///
/// # Errors
/// 429 when [`MAX_WATCHES`] are open. A compacted or too new start revision is reported in the
/// stream.
pub fn serve(
    objects: &Objects,
    slots: &WatchSlots,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: Option<&str>,
    opts: &ListOptions,
    accept: &str,
) -> Result<Response, ApiError> {
    let slot = slots.try_acquire().ok_or_else(|| {
        ApiError::too_many_requests(format!("too many watches are open on this server (at most {}); retry later", slots.max), 1)
    })?;
    let filter = Filter::new(def.prefix(ns), name, &opts.labels, &opts.fields);
    let timeout = opts.timeout.unwrap_or(DEFAULT_WATCH_TIMEOUT).min(MAX_WATCH_TIMEOUT);
    let bookmarks = opts.bookmarks;
    let initial_events = opts.send_initial_events;
    let requested = opts.resource_version;
    let as_table = table::wants_table(accept);
    let store = objects.store.clone();
    let (tx, rx) = mpsc::channel::<Result<Vec<u8>, std::io::Error>>(64);
    let stream = async move {
        let _slot = slot;
        let mut enc = Encoder { def, as_table, header_sent: false };
        let send = |line: Vec<u8>| {
            let tx = tx.clone();
            async move { tx.send(Ok(line)).await.is_ok() }
        };
        let Start { rv: start, initial, backlog, mut live } = match open(&store, &filter, requested, initial_events).await {
            Ok(s) => s,
            Err(e) => {
                let _ = send(error_line(&e)).await;
                return;
            }
        };
        for e in &initial {
            if !send(enc.line_or_error(e)).await {
                return;
            }
        }
        if initial_events {
            let mark = json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(),
                "metadata": {"resourceVersion": start.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}});
            if !send(format!("{mark}\n").into_bytes()).await {
                return;
            }
        }
        let mut last = start;
        for e in backlog {
            if e.rv > last && filter.matches(&e.key, &e.object) && !send(enc.line_or_error(&e)).await {
                return;
            }
            last = last.max(e.rv);
        }
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or(now + MAX_WATCH_TIMEOUT);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                () = tx.closed() => return,
                _ = tick.tick(), if bookmarks => {
                    let mark = json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(),
                        "metadata": {"resourceVersion": last.max(store.revision()).to_string()}}});
                    if !send(format!("{mark}\n").into_bytes()).await { return; }
                }
                got = live.recv() => match got {
                    Ok(e) => {
                        if e.rv <= last { continue; }
                        last = e.rv;
                        if filter.matches(&e.key, &e.object) && !send(enc.line_or_error(&e)).await { return; }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = send(error_line(&ApiError::expired(last, store.oldest()))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    };
    // The stream runs in the request's span: its log lines name the watch's resource.
    tokio::spawn(stream.instrument(tracing::Span::current()));
    Ok(stream_response(Body::from_stream(ReceiverStream::new(rx))))
}

fn error_line(e: &ApiError) -> Vec<u8> {
    format!("{}\n", json!({"type": "ERROR", "object": e.to_status()})).into_bytes()
}

struct Encoder {
    def: &'static ResourceDef,
    as_table: bool,
    header_sent: bool,
}

impl Encoder {
    /// The line of `e`; if encoding it panics (a bug meeting a stored object of an unexpected
    /// shape), an `ERROR` line naming the object instead (the client ends the watch and lists
    /// again) and the panic is logged: one object never silently kills the stream, nor is its
    /// event silently skipped.
    fn line_or_error(&mut self, e: &Event) -> Vec<u8> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.line(e))) {
            Ok(line) => line,
            Err(panic) => {
                let message = crate::health::panic_message(panic.as_ref());
                tracing::error!("watch: encoding {} at revision {} panicked ({message})", e.key, e.rv);
                error_line(&ApiError::internal(format!("the server cannot encode {} at revision {}: {message}", e.key, e.rv)))
            }
        }
    }

    /// The event's line: the stored object spliced in as it is (a Table is built from it).
    fn line(&mut self, e: &Event) -> Vec<u8> {
        if self.as_table {
            let mut t = table::table(self.def, &[&e.object.value()], &json!({"resourceVersion": e.rv.to_string()}), "Metadata");
            if self.header_sent {
                t["columnDefinitions"] = json!([]);
            }
            self.header_sent = true;
            return format!("{}\n", json!({"type": e.kind.as_str(), "object": t})).into_bytes();
        }
        let object = e.object.bytes();
        let mut line = Vec::with_capacity(object.len() + 32);
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(e.kind.as_str().as_bytes());
        line.extend_from_slice(b"\",\"object\":");
        line.extend_from_slice(object);
        line.extend_from_slice(b"}\n");
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_slots_refuse_past_the_limit_and_free_on_drop() {
        let slots = WatchSlots::new(2);
        let a = slots.try_acquire().unwrap();
        let _b = slots.try_acquire().unwrap();
        assert!(slots.try_acquire().is_none());
        drop(a);
        assert_eq!(slots.open(), 1);
        assert!(slots.try_acquire().is_some());
    }

    /// A `metadata.name=` field selector is checked on the key, and matches exactly what it
    /// matched on the object: with the URL's name, with another name (nothing), beside the
    /// other selectors, and `!=` still on the object.
    #[test]
    fn a_name_field_selector_matches_on_the_key_as_on_the_object() {
        let prefix = "/kubevirt.io/virtualmachines/";
        let doc = |ns: &str, name: &str, app: &str| {
            Doc::new(&serde_json::json!({"metadata": {"name": name, "namespace": ns, "labels": {"app": app}}, "status": {"ready": true}}))
        };
        let objects = [("default", "a", "web"), ("default", "b", "web"), ("other", "a", "db"), ("other", "ab", "web")];
        // (watched namespace, URL name, label selector, field selector, which objects match)
        type Case<'a> = (Option<&'a str>, Option<&'a str>, &'a str, &'a str, &'a [usize]);
        let cases: [Case; 8] = [
            (None, None, "", "metadata.name=a", &[0, 2]),
            (None, None, "", "metadata.name==a", &[0, 2]),
            (None, Some("a"), "", "metadata.name=a", &[0, 2]),
            (None, Some("a"), "", "metadata.name=b", &[]),
            (None, None, "", "metadata.name=a,metadata.name=b", &[]),
            (None, None, "app=web", "metadata.name=a", &[0]),
            (None, None, "", "metadata.name!=a", &[1, 3]),
            (Some("other"), None, "", "metadata.name=a,status.ready=true", &[2]),
        ];
        for (ns, name, labels, fields, want) in cases {
            let prefix = ns.map_or(prefix.to_owned(), |ns| format!("{prefix}{ns}/"));
            let filter = Filter::new(prefix, name, &Selector::labels(labels).unwrap(), &Selector::fields(fields).unwrap());
            let got: Vec<usize> = objects
                .iter()
                .enumerate()
                .filter(|(_, (o_ns, o_name, app))| {
                    filter.matches(&format!("/kubevirt.io/virtualmachines/{o_ns}/{o_name}"), &doc(o_ns, o_name, app))
                })
                .map(|(i, _)| i)
                .collect();
            assert_eq!(got, want, "namespace {ns:?}, name {name:?}, labels {labels:?}, fields {fields:?}");
        }
    }

    #[tokio::test]
    async fn waiting_for_a_revision_ends_when_it_arrives_or_with_504() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db"), &crate::StoreConfig::default()).unwrap();
        let e = wait_for_revision(&store, store.revision() + 5, Duration::from_millis(50)).await.unwrap_err();
        assert_eq!((e.code, e.reason), (504, "Timeout"));
        let target = store.revision() + 1;
        let writer = store.clone();
        let w = tokio::spawn(async move {
            tokio::task::yield_now().await;
            writer.write(crate::store::Op::Create { key: "/x".into(), object: serde_json::json!({"metadata": {}}) }).await
        });
        wait_for_revision(&store, target, Duration::from_secs(10)).await.unwrap();
        w.await.unwrap().unwrap();
    }
}
