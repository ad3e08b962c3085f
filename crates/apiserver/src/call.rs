//! What a route's handler gets ([`Call`]): the server's shared state ([`ApiState`]) and one
//! request, parsed as far as its route needs - the path's named segments and the query - with
//! the body still unread: only the handlers that take a body read it ([`Call::body`]).

use std::collections::HashMap;

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::HeaderName;

use crate::objects::Objects;
use crate::status::ApiError;
use crate::watch::WatchSlots;

/// Shared state of the HTTP layer.
pub struct ApiState {
    pub objects: Objects,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// The `gitVersion` reported by `/version`.
    pub git_version: String,
    /// What `/metrics` serves.
    pub metrics: Option<crate::metrics::SharedRegistry>,
    /// The open watches, at most [`crate::limits::MAX_WATCHES`].
    pub watches: WatchSlots,
    /// Whether `subresources.kubevirt.io` is served ([`crate::Config::kubevirt_subresources`]).
    pub kubevirt_subresources: bool,
    /// The node agents' tunnels (console and VNC).
    pub tunnels: std::sync::Arc<crate::tunnel::Tunnels>,
    /// The bearer token a `TokenReview` authenticates (the kubeconfig's); `None`: none.
    pub token: Option<String>,
    /// The ServiceAccount tokens minted by `serviceaccounts/token` ([`crate::tokens`]).
    pub tokens: crate::tokens::Tokens,
}

/// One request on its way to its handler.
pub struct Call<'a> {
    pub st: &'a ApiState,
    pub parts: Parts,
    /// The query parameters (the last value of a repeated one).
    pub query: HashMap<String, String>,
    /// The path's named segments (`{namespace}` -> `("namespace", "default")`), as the route's
    /// pattern names them.
    pub captures: Vec<(&'static str, String)>,
    body: Body,
}

impl<'a> Call<'a> {
    #[must_use]
    pub fn new(st: &'a ApiState, parts: Parts, query: HashMap<String, String>, captures: Vec<(&'static str, String)>, body: Body) -> Self {
        Call { st, parts, query, captures, body }
    }

    /// The path segment the pattern names `name`; empty when it names none.
    #[must_use]
    pub fn capture(&self, name: &str) -> &str {
        self.captures.iter().find(|(n, _)| *n == name).map_or("", |(_, v)| v.as_str())
    }

    /// A request header as text; empty when missing or not text.
    #[must_use]
    pub fn header(&self, name: HeaderName) -> &str {
        self.parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// `?dryRun=All`.
    #[must_use]
    pub fn dry_run_query(&self) -> bool {
        self.query.get("dryRun").is_some_and(|v| v == "All")
    }

    /// Reads the request body, refusing more than [`ApiState::body_limit`] bytes (413). A
    /// second call gets an empty body.
    ///
    /// # Errors
    /// 413 when the body is larger than the limit (or cannot be read).
    pub async fn body(&mut self) -> Result<Bytes, ApiError> {
        let limit = self.st.body_limit;
        axum::body::to_bytes(std::mem::take(&mut self.body), limit).await.map_err(|_| ApiError::too_large(limit))
    }
}
