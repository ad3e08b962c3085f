//! Kubernetes `Status` errors: every failure the server answers with.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use api::validation::Cause;

/// An error answered as a `Status` object with Kubernetes' reason, code and details.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into(), details: None }
    }

    fn with_details(mut self, name: &str, group: &str, kind: &str) -> Self {
        let mut d = json!({"name": name, "kind": kind});
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        self.details = Some(d);
        self
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 NotFound for an object, with Kubernetes' message.
    #[must_use]
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let qualified = if group.is_empty() { plural.to_owned() } else { format!("{plural}.{group}") };
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found")).with_details(name, group, plural)
    }

    /// 404 NotFound with a message of its own (something that is not an object).
    #[must_use]
    pub fn not_found_message(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    /// 404 for a path that names no resource.
    #[must_use]
    pub fn no_resource() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource")
    }

    /// 409 AlreadyExists.
    #[must_use]
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let qualified = if group.is_empty() { plural.to_owned() } else { format!("{plural}.{group}") };
        Self::new(409, "AlreadyExists", format!("{qualified} \"{name}\" already exists")).with_details(name, group, plural)
    }

    /// 409 Conflict with the message Kubernetes gives for a stale resourceVersion.
    #[must_use]
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let qualified = if group.is_empty() { plural.to_owned() } else { format!("{plural}.{group}") };
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        )
        .with_details(name, group, plural)
    }

    /// 409 Conflict with its own message (a subresource refusing a request, as KubeVirt does).
    pub fn conflict_message(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// The same error with `details.causes` (and no other details), as kube-apiserver's
    /// `NewApplyConflict`.
    #[must_use]
    pub fn with_causes(mut self, causes: &[Value]) -> Self {
        self.details = Some(json!({"causes": causes}));
        self
    }

    /// 409 Conflict for a failed delete precondition.
    #[must_use]
    pub fn precondition(group: &str, plural: &str, name: &str, what: &str) -> Self {
        let qualified = if group.is_empty() { plural.to_owned() } else { format!("{plural}.{group}") };
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {qualified} \"{name}\": {what}"))
            .with_details(name, group, plural)
    }

    /// 422 Invalid with one cause per field.
    #[must_use]
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[Cause]) -> Self {
        let summary: Vec<String> =
            causes.iter().map(|c| if c.field.is_empty() { c.message.clone() } else { format!("{}: {}", c.field, c.message) }).collect();
        // Kubernetes' `GroupKind.String()`: `Kind.group`, or `Kind` for the core group.
        let qualified = if group.is_empty() { kind.to_owned() } else { format!("{kind}.{group}") };
        let mut e =
            Self::new(422, "Invalid", format!("{qualified} \"{name}\" is invalid: {}", summary.join(", "))).with_details(name, group, kind);
        if let Some(d) = e.details.as_mut() {
            d["causes"] = serde_json::to_value(causes).unwrap_or(Value::Null);
        }
        e
    }

    /// 422 for a patch that cannot be applied (failed `test`, bad path).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 406 NotAcceptable.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 413 RequestEntityTooLarge for a request body over the limit.
    #[must_use]
    pub fn too_large(limit: usize) -> Self {
        Self::entity_too_large(format!("the request body is larger than the limit of {limit} bytes; send a smaller object"))
    }

    /// 413 RequestEntityTooLarge with Kubernetes' message prefix.
    pub fn entity_too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("Request entity too large: {}", message.into()))
    }

    /// 504 Timeout for a read from a resourceVersion the store has not reached, exactly as
    /// kube-apiserver's `NewTooLargeResourceVersionError` (client-go's
    /// `isTooLargeResourceVersionError` looks for the cause; clients retry after a second).
    #[must_use]
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(504, "Timeout", format!("Timeout: Too large resource version: {requested}, current: {current}"));
        e.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        e
    }

    /// 429 TooManyRequests, to be retried after `retry_after` seconds.
    pub fn too_many_requests(message: impl Into<String>, retry_after: u32) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        e.details = Some(json!({"retryAfterSeconds": retry_after}));
        e
    }

    /// 410 Expired (watch or list from a compacted revision).
    #[must_use]
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(410, "Expired", format!("too old resource version: {requested} ({oldest})"))
    }

    /// 401 Unauthorized.
    #[must_use]
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized: send the bearer token from the kubeconfig that virtplug wrote")
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 405 MethodNotAllowed.
    #[must_use]
    pub fn method_not_allowed() -> Self {
        Self::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    }

    /// 507 Insufficient Storage: the store refused a write for lack of space (nothing stored).
    /// The reason stays `InternalError`, the closest Kubernetes reason, so client-go's
    /// `IsInternalError` holds.
    pub fn insufficient_storage(message: impl Into<String>) -> Self {
        Self::new(507, "InternalError", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 503 ServiceUnavailable: a part the request needs (a node agent) cannot be reached now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The same error with another message.
    #[must_use]
    pub fn with_message(mut self, m: impl Into<String>) -> Self {
        self.message = m.into();
        self
    }

    /// The `Status` object.
    #[must_use]
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, [(axum::http::header::CONTENT_TYPE, "application/json")], self.to_status().to_string()).into_response();
        // As kube-apiserver: a Status that says when to retry says it in the header too.
        if let Some(secs) = self.details.as_ref().and_then(|d| d.get("retryAfterSeconds")).and_then(Value::as_u64) {
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp
    }
}
