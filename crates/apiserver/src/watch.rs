//! Watch streams: `ADDED`/`MODIFIED`/`DELETED`/`BOOKMARK` lines from a resourceVersion, the
//! initial events of a streaming list, and an `ERROR` 410 `Expired` when the start revision was
//! compacted or the watcher fell too far behind (the client then lists again, as kube-runtime's
//! watcher and client-go's reflector do).

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::objects::Objects;
use crate::registry::ResourceDef;
use crate::routes::{stream_response, DEFAULT_WATCH_TIMEOUT};
use crate::selectors::Selector;
use crate::status::ApiError;
use crate::store::{Event, EventType, StoreError};
use crate::table;

/// How often an idle watch with `allowWatchBookmarks` gets a BOOKMARK.
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);

struct Filter {
    prefix: String,
    name: Option<String>,
    labels: Selector,
    fields: Selector,
}

impl Filter {
    fn matches(&self, key: &str, obj: &Value) -> bool {
        key.starts_with(&self.prefix)
            && self.name.as_deref().is_none_or(|n| obj.pointer("/metadata/name").and_then(Value::as_str) == Some(n))
            && self.labels.matches_labels(obj)
            && self.fields.matches_fields(obj)
    }
}

/// Starts a watch.
///
/// # Errors
/// 400 for bad selectors or parameters. A compacted start revision is reported in the stream.
pub fn serve(
    objects: &Objects,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: Option<&str>,
    query: &HashMap<String, String>,
    accept: &str,
) -> Result<Response, ApiError> {
    let filter = Filter {
        prefix: def.prefix(ns),
        name: name.map(str::to_owned),
        labels: Selector::labels(query.get("labelSelector").map_or("", String::as_str))?,
        fields: Selector::fields(query.get("fieldSelector").map_or("", String::as_str))?,
    };
    let timeout = match query.get("timeoutSeconds") {
        Some(t) => Duration::from_secs(t.parse().map_err(|_| ApiError::bad_request(format!("timeoutSeconds {t:?} is not a number")))?),
        None => DEFAULT_WATCH_TIMEOUT,
    };
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|v| v == "true" || v == "1");
    let initial_events = query.get("sendInitialEvents").is_some_and(|v| v == "true");
    let rv_param = query.get("resourceVersion").map(String::as_str).unwrap_or("");
    let as_table = table::wants_table(accept);
    let store = objects.store.clone();

    // Where the stream starts, and the synthetic ADDED events for "from now, with the state".
    let (start, initial): (u64, Vec<Event>) = if rv_param.is_empty() || rv_param == "0" || initial_events {
        let (rv, items) = store.list(&filter.prefix, None);
        let initial = items
            .into_iter()
            .filter(|(k, s)| filter.matches(k, &s.object))
            .map(|(key, s)| Event { rv: s.rv, key, kind: EventType::Added, object: s.object })
            .collect();
        (rv, initial)
    } else {
        (rv_param.parse().map_err(|_| ApiError::bad_request(format!("resourceVersion {rv_param:?} is not a number")))?, Vec::new())
    };
    let (tx, rx) = mpsc::channel::<Result<String, std::io::Error>>(64);
    let watched = store.watch(start);
    tokio::spawn(async move {
        let mut enc = Encoder { def, as_table, header_sent: false };
        let send = |line: String| {
            let tx = tx.clone();
            async move { tx.send(Ok(line)).await.is_ok() }
        };
        let (backlog, mut live) = match watched {
            Ok(w) => w,
            Err(StoreError::Compacted { requested, oldest }) => {
                let _ = send(error_line(&ApiError::expired(requested, oldest))).await;
                return;
            }
            Err(e) => {
                let _ = send(error_line(&ApiError::internal(e.to_string()))).await;
                return;
            }
        };
        for e in &initial {
            if !send(enc.line(e)).await {
                return;
            }
        }
        if initial_events {
            let mark = json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(),
                "metadata": {"resourceVersion": start.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}});
            if !send(format!("{mark}\n")).await {
                return;
            }
        }
        let mut last = start;
        for e in backlog {
            if e.rv > last && filter.matches(&e.key, &e.object) && !send(enc.line(&e)).await {
                return;
            }
            last = last.max(e.rv);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                () = tx.closed() => return,
                _ = tick.tick(), if bookmarks => {
                    let mark = json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(),
                        "metadata": {"resourceVersion": last.max(store.revision()).to_string()}}});
                    if !send(format!("{mark}\n")).await { return; }
                }
                got = live.recv() => match got {
                    Ok(e) => {
                        if e.rv <= last { continue; }
                        last = e.rv;
                        if filter.matches(&e.key, &e.object) && !send(enc.line(&e)).await { return; }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = send(error_line(&ApiError::expired(last, store.oldest()))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    Ok(stream_response(Body::from_stream(ReceiverStream::new(rx))))
}

fn error_line(e: &ApiError) -> String {
    format!("{}\n", json!({"type": "ERROR", "object": e.to_status()}))
}

struct Encoder {
    def: &'static ResourceDef,
    as_table: bool,
    header_sent: bool,
}

impl Encoder {
    fn line(&mut self, e: &Event) -> String {
        let object = if self.as_table {
            let mut t = table::table(self.def, &[&e.object], &json!({"resourceVersion": e.rv.to_string()}), "Metadata");
            if self.header_sent {
                t["columnDefinitions"] = json!([]);
            }
            self.header_sent = true;
            t
        } else {
            (*e.object).clone()
        };
        format!("{}\n", json!({"type": e.kind.as_str(), "object": object}))
    }
}
