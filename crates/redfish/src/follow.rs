//! Following an action's effect through the caches, for resets and virtual media alike: a
//! probe judges the System from the caches each time they change (no polling), until the goal
//! is reached, fails, or the time is up; an action that outlasts its request answers 202 with
//! its Task ([`accepted`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{header, HeaderValue, StatusCode};
use serde_json::json;

use crate::auth::Caller;
use crate::cache::Cache;
use crate::error::Message;
use crate::protocol;
use crate::registry::MessageId;
use crate::resources::{self, Ctx};
use crate::service::Service;
use crate::tasks::{TaskState, Tasks};
use crate::uri::Uri;

/// Where the System is on the way to a goal.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    Reached,
    /// Percent done.
    Moving(u8),
    /// Why the goal cannot be reached.
    Failed(String),
}

/// Calls `probe` now and after every change of the caches until it says `Reached` or
/// `Failed`, or `within` passed (then its last answer); `on_progress` hears every `Moving`.
pub async fn until(cache: &Cache, within: Duration, mut probe: impl FnMut() -> Progress, mut on_progress: impl FnMut(u8)) -> Progress {
    let mut changed = cache.changed();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        changed.borrow_and_update();
        match probe() {
            Progress::Moving(p) => on_progress(p),
            done => return done,
        }
        match tokio::time::timeout_at(deadline, changed.changed()).await {
            Ok(Ok(())) => {}
            // The deadline, or the caches stopped (the service is stopping).
            Ok(Err(_)) | Err(_) => return probe(),
        }
    }
}

/// 202 Accepted for the Task `id`: its representation, `Location` and `Retry-After`.
pub fn accepted(svc: &Arc<Service>, caller: &Caller, id: String) -> http::Response<Body> {
    let uri = Uri::Task(id);
    let body = resources::get(&Ctx { svc, caller: Some(caller) }, &uri).unwrap_or_else(|_| json!({}));
    let mut r = protocol::json(StatusCode::ACCEPTED, &body);
    if let Ok(v) = HeaderValue::from_str(&uri.path()) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Ends Task `id` with what following its goal came to: `Completed`, or `Exception` with the
/// reason, or with `late` (what did not happen within the deadline) when time ran out.
pub fn end_task(tasks: &Tasks, id: &str, outcome: &Progress, late: &str) {
    match outcome {
        Progress::Reached => tasks.finish(id, TaskState::Completed, Message::new(MessageId::Success, &[])),
        Progress::Failed(why) => tasks.finish(id, TaskState::Exception, Message::new(MessageId::GeneralError, &[]).explained(why)),
        Progress::Moving(_) => tasks.finish(id, TaskState::Exception, Message::new(MessageId::OperationTimeout, &[]).explained(late)),
    }
}
