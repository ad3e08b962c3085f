//! Test support for crates that run this API server in process (feature `testing`): the server
//! opened on a data dir ([`open`]), and a stand-in for an API server that is briefly
//! unavailable, to test that a client's write that must not be lost is sent again.
//!
//! # Guarantees
//! - Every write request (any method but GET, HEAD, OPTIONS) passing through is recorded, with
//!   its path and body, in arrival order.
//! - The first `n` writes that the predicate picks are answered `503 Service Unavailable` (a
//!   `Status` body), and never reach the server; all other requests go through unchanged.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{Method, StatusCode};

/// One write seen by [`refusing`].
#[derive(Clone, Debug)]
pub struct Write {
    pub method: Method,
    pub path: String,
    pub body: String,
    /// Whether it was answered 503.
    pub refused: bool,
}

type Pick = Box<dyn Fn(&Method, &str, &str) -> bool + Send + Sync>;

/// What [`refusing`] refuses, and what it saw.
pub struct Refusals {
    pick: Pick,
    left: AtomicUsize,
    seen: Mutex<Vec<Write>>,
}

impl Refusals {
    /// Refuses the first `n` writes for which `pick(method, path, body)` holds.
    pub fn first(n: usize, pick: impl Fn(&Method, &str, &str) -> bool + Send + Sync + 'static) -> Arc<Refusals> {
        Arc::new(Refusals { pick: Box::new(pick), left: AtomicUsize::new(n), seen: Mutex::new(Vec::new()) })
    }

    /// Every write so far, in arrival order.
    pub fn seen(&self) -> Vec<Write> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn take(&self) -> bool {
        self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

/// The real API server with its data in `dir`, in process, and the router to reach it through
/// (`client::in_process`): behind `refusals` when given, otherwise the server's own.
///
/// # Panics
/// When the server cannot open `dir` (a test set-up failure).
pub async fn open(dir: &Path, refusals: Option<Arc<Refusals>>) -> (crate::Server, Router) {
    let server = match crate::Server::open(&crate::Config::new(dir), None).await {
        Ok(server) => server,
        Err(e) => panic!("the API server cannot open {}: {e}", dir.display()),
    };
    let router = match refusals {
        Some(r) => refusing(server.local_router(), r),
        None => server.local_router(),
    };
    (server, router)
}

/// `router` behind [`Refusals`] (module docs).
pub fn refusing(router: Router, refusals: Arc<Refusals>) -> Router {
    router.layer(middleware::from_fn(move |req: Request, next: Next| {
        let refusals = Arc::clone(&refusals);
        async move {
            if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
                return next.run(req).await;
            }
            let (parts, body) = req.into_parts();
            let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let refused = (refusals.pick)(&parts.method, parts.uri.path(), &text) && refusals.take();
            let write = Write { method: parts.method.clone(), path: parts.uri.path().to_owned(), body: text, refused };
            refusals.seen.lock().unwrap_or_else(PoisonError::into_inner).push(write);
            if refused {
                return unavailable();
            }
            next.run(Request::from_parts(parts, Body::from(bytes))).await
        }
    }))
}

fn unavailable() -> Response {
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "refused by the test's stand-in for an unavailable API server", "reason": "ServiceUnavailable", "code": 503});
    (StatusCode::SERVICE_UNAVAILABLE, [(http::header::CONTENT_TYPE, "application/json")], status.to_string()).into_response()
}
