//! The endpoints that are not objects: `/version`, the health checks, `/metrics`, API
//! discovery (`/api`, `/apis`, the group and resource lists) and the OpenAPI documents. They
//! answer from the path and headers alone and never read the request body.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::call::Call;
use crate::reply::json_response;
use crate::status::ApiError;
use crate::{openapi, registry, subresources};

type Answer = Result<Response, ApiError>;

/// `GET /version`.
pub fn version(c: &Call<'_>) -> Answer {
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "major": "1", "minor": "33", "gitVersion": c.st.git_version, "gitCommit": "virtplug",
            "gitTreeState": "clean", "buildDate": "2026-11-29T00:00:00Z", "goVersion": "rust",
            "compiler": "rustc", "platform": "linux/amd64"
        }),
    ))
}

/// `GET /healthz`, `/livez` (and `/readyz` when the readiness layer is not in front).
pub fn ok(_: &Call<'_>) -> Answer {
    Ok((StatusCode::OK, "ok").into_response())
}

/// `GET /metrics`: 404 when the server has no registry.
pub fn metrics(c: &Call<'_>) -> Answer {
    let registry = c.st.metrics.as_ref().ok_or_else(ApiError::no_resource)?;
    let text = crate::metrics::render(registry);
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// `GET /api`.
pub fn core_versions(_: &Call<'_>) -> Answer {
    Ok(json_response(StatusCode::OK, &registry::core_versions()))
}

/// `GET /apis`.
pub fn api_groups(c: &Call<'_>) -> Answer {
    let mut list = registry::api_group_list();
    if !c.st.kubevirt_subresources {
        if let Some(groups) = list.get_mut("groups").and_then(serde_json::Value::as_array_mut) {
            groups.retain(|g| g.get("name").and_then(serde_json::Value::as_str) != Some("subresources.kubevirt.io"));
        }
    }
    Ok(json_response(StatusCode::OK, &list))
}

/// `GET /api/v1`.
pub fn core_resources(_: &Call<'_>) -> Answer {
    registry::resource_list("", "v1").map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource)
}

/// `GET /apis/subresources.kubevirt.io/v1`.
pub fn subresource_list(_: &Call<'_>) -> Answer {
    Ok(json_response(StatusCode::OK, &subresources::resource_list()))
}

/// `GET /apis/{group}`.
pub fn api_group(c: &Call<'_>) -> Answer {
    registry::api_group(c.capture("group")).map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource)
}

/// `GET /apis/{group}/{version}`.
pub fn group_resources(c: &Call<'_>) -> Answer {
    registry::resource_list(c.capture("group"), c.capture("version"))
        .map(|v| json_response(StatusCode::OK, &v))
        .ok_or_else(ApiError::no_resource)
}

/// The media type of the gnostic protobuf form of `/openapi/v2`, as kube-openapi answers it:
/// client-go asks for `...spec.v2@v1.0+protobuf`, but Go's `mime.ParseMediaType` refuses the `@`
/// in a response's `Content-Type` (kubectl fails with "mime: unexpected content after media
/// subtype").
pub const OPENAPI_V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// A cached document, or 304 when the client has it (`If-None-Match`).
fn served(c: &Call<'_>, doc: &openapi::Served, content_type: &'static str, cache_control: &'static str) -> Response {
    let etag = doc.etag.as_str();
    let matches = c.header(header::IF_NONE_MATCH).split(',').any(|t| t.trim() == etag || t.trim() == "*");
    let headers = [(header::ETAG, etag.to_owned()), (header::CACHE_CONTROL, cache_control.to_owned()), (header::VARY, "Accept".to_owned())];
    if matches {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type.to_owned())], headers, doc.body.clone()).into_response()
}

/// `GET /openapi/v2`: gnostic protobuf when the client accepts protobuf (kubectl, through
/// client-go, asks for nothing else), JSON otherwise.
pub fn openapi_v2(c: &Call<'_>) -> Answer {
    let docs = openapi::documents();
    if c.header(header::ACCEPT).contains("protobuf") {
        return Ok(served(c, &docs.v2_protobuf, OPENAPI_V2_PROTOBUF, "no-cache, private"));
    }
    Ok(served(c, &docs.v2_json, "application/json", "no-cache, private"))
}

/// `GET /openapi/v3`.
pub fn openapi_v3(c: &Call<'_>) -> Answer {
    Ok(served(c, &openapi::documents().v3_index, "application/json", "no-cache, private"))
}

/// `GET /openapi/v3/{group-version path}`: with the `?hash=` the index gives, the document
/// never changes under that URL (`immutable`), as kube-apiserver answers.
pub fn openapi_v3_group(c: &Call<'_>) -> Answer {
    let docs = openapi::documents();
    let doc = docs.v3.get(c.capture("path")).ok_or_else(ApiError::no_resource)?;
    let current = c.query.get("hash").is_some_and(|h| doc.etag.trim_matches('"') == h);
    Ok(served(c, doc, "application/json", if current { "public, immutable" } else { "no-cache, private" }))
}
