//! The answers a handler builds: a JSON object, a watch stream, KubeVirt's empty 202. (Errors
//! are [`crate::status::ApiError`]s.)

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// `v` as `application/json` with `code`.
pub(crate) fn json_response(code: StatusCode, v: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// A stored object as `application/json` with `code`: its bytes as the store keeps them, not
/// encoded again.
pub(crate) fn doc_response(code: StatusCode, doc: &crate::store::Doc) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], doc.bytes().clone()).into_response()
}

/// A watch stream body.
pub(crate) fn stream_response(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache, private")], body).into_response()
}

/// 202 Accepted with an empty body: what KubeVirt's subresources answer on success.
pub(crate) fn accepted() -> Response {
    (StatusCode::ACCEPTED, [(header::CONTENT_TYPE, "application/json")], "").into_response()
}
