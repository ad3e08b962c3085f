//! HTTP: parses Kubernetes REST paths and query parameters into calls on [`Objects`], and
//! serves discovery, OpenAPI, lists, tables and watch streams.
//!
//! # Guarantees
//! - The request body is read only by the routes that take one (writes, deletes and the
//!   KubeVirt subresources), up to [`ApiState::body_limit`]; `/healthz`, `/readyz`, `/livez`,
//!   `/version`, `/metrics`, discovery and reads never read it.
//! - The `method` label of the request counter is one of a fixed set ([`method_label`]), so no
//!   request can add metric series.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, request::Parts, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::limits::FRESHNESS_WAIT;
use crate::objects::{DeleteOptions, Objects, Part, Propagation};
use crate::patch::PatchKind;
use crate::query::{self, ListOptions};
use crate::registry::{self, ResourceDef};
use crate::status::ApiError;
use crate::{list, openapi, table, watch};

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
    pub watches: watch::WatchSlots,
}

/// What a REST path names.
struct Target {
    def: &'static ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

pub(crate) fn json_response(code: StatusCode, v: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// The `method` label of a request: the standard methods by name, anything else `other`.
#[must_use]
pub fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Entry point for every request.
pub async fn dispatch(State(st): State<Arc<ApiState>>, req: Request) -> Response {
    let method = method_label(req.method()).to_owned();
    let resp = match handle(&st, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    crate::metrics::get().requests.get_or_create(&crate::metrics::RequestLabels { method, code: resp.status().as_u16().to_string() }).inc();
    resp
}

/// Reads a request body, refusing more than `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| ApiError::too_large(limit))
}

async fn handle(st: &ApiState, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().trim_end_matches('/').to_owned();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let Some(r) = non_resource(st, &parts, &segs) {
        return r;
    }
    let query = query::params(parts.uri.query());
    if let Some(sub) = kubevirt_subresource(&parts.method, &segs) {
        let dry = query.get("dryRun").is_some_and(|v| v == "All");
        let body = read_body(body, st.body_limit).await?;
        return match sub {
            Subresource::Volume { plural, ns, name, sub } => crate::volumes::handle(&st.objects, plural, ns, name, sub, &body, dry).await,
            Subresource::Lifecycle { ns, name, sub } => crate::lifecycle::handle(&st.objects, ns, name, sub, &body, dry).await,
        };
    }
    let target = parse_target(&segs)?;
    resource(st, parts, target, &query, body).await
}

/// Discovery and the other endpoints that are not objects; none of them reads the body.
fn non_resource(st: &ApiState, parts: &Parts, segs: &[&str]) -> Option<Result<Response, ApiError>> {
    Some(match (&parts.method, segs) {
        (&Method::GET, ["version"]) => Ok(json_response(
            StatusCode::OK,
            &json!({
                "major": "1", "minor": "33", "gitVersion": st.git_version, "gitCommit": "virtplug",
                "gitTreeState": "clean", "buildDate": "2026-11-29T00:00:00Z", "goVersion": "rust",
                "compiler": "rustc", "platform": "linux/amd64"
            }),
        )),
        (&Method::GET, ["healthz" | "readyz" | "livez"]) => Ok((StatusCode::OK, "ok").into_response()),
        (&Method::GET, ["metrics"]) => match &st.metrics {
            None => Err(ApiError::no_resource()),
            Some(registry) => {
                let text = crate::metrics::render(registry);
                Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
            }
        },
        (&Method::GET, ["api"]) => Ok(json_response(StatusCode::OK, &registry::core_versions())),
        (&Method::GET, ["apis"]) => Ok(json_response(StatusCode::OK, &registry::api_group_list())),
        (&Method::GET, ["api", "v1"]) => {
            registry::resource_list("", "v1").map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource)
        }
        (&Method::GET, ["apis", "subresources.kubevirt.io", "v1"]) => Ok(json_response(StatusCode::OK, &crate::volumes::resource_list())),
        (&Method::GET, ["apis", g]) => registry::api_group(g).map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource),
        (&Method::GET, ["apis", g, v]) => {
            registry::resource_list(g, v).map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource)
        }
        (&Method::GET, ["openapi", "v2"]) => {
            let accept = parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
            if accept.contains("protobuf") {
                Ok((
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")],
                    openapi::v2_protobuf(),
                )
                    .into_response())
            } else {
                Ok(json_response(StatusCode::OK, &openapi::v2()))
            }
        }
        (&Method::GET, ["openapi", "v3"]) => Ok(json_response(StatusCode::OK, &openapi::v3_index())),
        (&Method::GET, ["openapi", "v3", rest @ ..]) => {
            openapi::v3_group(&rest.join("/")).map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource)
        }
        _ => return None,
    })
}

/// KubeVirt's `subresources.kubevirt.io` PUTs.
enum Subresource<'a> {
    /// `addvolume` / `removevolume` on a VM or VMI.
    Volume { plural: &'a str, ns: &'a str, name: &'a str, sub: &'a str },
    /// `start` / `stop` / `restart` on a VM.
    Lifecycle { ns: &'a str, name: &'a str, sub: &'a str },
}

fn kubevirt_subresource<'a>(method: &Method, segs: &[&'a str]) -> Option<Subresource<'a>> {
    if method != Method::PUT {
        return None;
    }
    match *segs {
        ["apis", "subresources.kubevirt.io", "v1", "namespaces", ns, plural @ ("virtualmachines" | "virtualmachineinstances"), name, sub @ ("addvolume" | "removevolume")] => {
            Some(Subresource::Volume { plural, ns, name, sub })
        }
        ["apis", "subresources.kubevirt.io", "v1", "namespaces", ns, "virtualmachines", name, sub @ ("start" | "stop" | "restart")] => {
            Some(Subresource::Lifecycle { ns, name, sub })
        }
        _ => None,
    }
}

/// The verbs on a resource path.
async fn resource(st: &ApiState, parts: Parts, target: Target, query: &HashMap<String, String>, body: Body) -> Result<Response, ApiError> {
    let accept = parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let opts = ListOptions::parse(query)?;
    let dry_run = opts.dry_run;
    let ns = target.ns.as_deref();
    let def = target.def;
    let objects = &st.objects;
    let part = match target.sub.as_deref() {
        None => Part::Main,
        Some("status") if def.status => Part::Status,
        Some(_) => return Err(ApiError::no_resource()),
    };

    match (parts.method, target.name.as_deref()) {
        (Method::GET, None) => {
            if opts.watch {
                return watch::serve(objects, &st.watches, def, ns, None, &opts, &accept);
            }
            list::serve(objects, def, ns, &opts, &accept).await
        }
        (Method::GET, Some(name)) => {
            if opts.watch {
                return watch::serve(objects, &st.watches, def, ns, Some(name), &opts, &accept);
            }
            if let Some(rv) = opts.resource_version.filter(|rv| *rv > 0) {
                watch::wait_for_revision(&objects.store, rv, FRESHNESS_WAIT).await?;
            }
            let obj = objects.get(def, ns, name)?.object;
            if table::wants_table(&accept) {
                let t =
                    table::table(def, &[&obj], &json!({"resourceVersion": obj.pointer("/metadata/resourceVersion")}), &opts.include_object);
                return Ok(json_response(StatusCode::OK, &t));
            }
            Ok(json_response(StatusCode::OK, &obj))
        }
        (Method::POST, None) => {
            if part != Part::Main {
                return Err(ApiError::method_not_allowed());
            }
            let obj = parse_body(&parts.headers, &read_body(body, st.body_limit).await?)?;
            let created = objects.create(def, ns, obj, dry_run).await?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Method::PUT, Some(name)) => {
            let obj = parse_body(&parts.headers, &read_body(body, st.body_limit).await?)?;
            let out = objects.replace(def, ns, name, obj, part, dry_run).await?;
            Ok(json_response(StatusCode::OK, &out))
        }
        (Method::PATCH, Some(name)) => {
            let ct = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            let kind = PatchKind::from_content_type(ct).ok_or_else(|| {
                ApiError::unsupported_media(format!(
                    "the body of the request was in an unknown format ({ct:?}) - accepted media types include: \
                     application/json-patch+json, application/merge-patch+json"
                ))
            })?;
            let body = read_body(body, st.body_limit).await?;
            let out = objects.patch(def, ns, name, kind, &body, part, dry_run).await?;
            Ok(json_response(StatusCode::OK, &out))
        }
        (Method::DELETE, Some(name)) => {
            if part != Part::Main {
                return Err(ApiError::method_not_allowed());
            }
            let opts = delete_options(query, &read_body(body, st.body_limit).await?, dry_run)?;
            let out = objects.delete(def, ns, name, &opts).await?;
            Ok(json_response(StatusCode::OK, &out))
        }
        (Method::DELETE, None) => {
            let del = delete_options(query, &read_body(body, st.body_limit).await?, dry_run)?;
            let (rv, items) = objects.list(def, ns, None);
            let mut deleted = Vec::new();
            for (_, obj) in items.iter().filter(|(_, o)| opts.labels.matches_labels(o) && opts.fields.matches_fields(o)) {
                let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                let ons = obj.pointer("/metadata/namespace").and_then(Value::as_str);
                match objects.delete(def, ons, name, &del).await {
                    Ok(v) => deleted.push(v),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(),
                "metadata": {"resourceVersion": rv.to_string()}, "items": deleted}),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn parse_target(segs: &[&str]) -> Result<Target, ApiError> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_resource()),
    };
    let find = |plural: &str| registry::find(group, version, plural).ok_or_else(ApiError::no_resource);
    let own = |s: &&str| (*s).to_owned();
    match rest {
        ["namespaces", ns, plural, tail @ ..] if !group.is_empty() || !matches!(*plural, "status" | "finalize") => {
            let def = find(plural)?;
            if !def.namespaced {
                return Err(ApiError::no_resource());
            }
            let (name, sub) = match tail {
                [] => (None, None),
                [n] => (Some(own(n)), None),
                [n, s] => (Some(own(n)), Some(own(s))),
                _ => return Err(ApiError::no_resource()),
            };
            Ok(Target { def, ns: Some((*ns).to_owned()), name, sub })
        }
        [plural, tail @ ..] => {
            let def = find(plural)?;
            let (name, sub) = match tail {
                [] => (None, None),
                [n] if !def.namespaced => (Some(own(n)), None),
                [n, s] if !def.namespaced => (Some(own(n)), Some(own(s))),
                _ => return Err(ApiError::no_resource()),
            };
            Ok(Target { def, ns: None, name, sub })
        }
        _ => Err(ApiError::no_resource()),
    }
}

/// Parses a JSON or YAML body into an object (see [`crate::body`]).
fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    crate::body::parse_object(ct, body)
}

fn delete_options(query: &HashMap<String, String>, body: &Bytes, dry_run: bool) -> Result<DeleteOptions, ApiError> {
    // Objects go at once (deletionGracePeriodSeconds 0), but a bad grace period is still refused.
    query::grace_period(query)?;
    let mut opts = DeleteOptions { dry_run, ..DeleteOptions::default() };
    let mut policy = query.get("propagationPolicy").cloned();
    if !body.is_empty() {
        let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("DeleteOptions is not valid JSON: {e}")))?;
        opts.uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_owned);
        opts.resource_version = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(str::to_owned);
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            policy = Some(p.to_owned());
        }
        if v.get("orphanDependents") == Some(&json!(true)) {
            policy = Some("Orphan".to_owned());
        }
        if v.get("dryRun").and_then(Value::as_array).is_some_and(|a| a.iter().any(|x| x == "All")) {
            opts.dry_run = true;
        }
    }
    opts.propagation = match policy.as_deref() {
        None => None,
        Some("Background") => Some(Propagation::Background),
        Some("Foreground") => Some(Propagation::Foreground),
        Some("Orphan") => Some(Propagation::Orphan),
        Some(other) => {
            return Err(ApiError::bad_request(format!("unknown propagationPolicy {other:?}: use Background, Foreground or Orphan")));
        }
    };
    Ok(opts)
}

/// A watch stream body.
pub(crate) fn stream_response(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache, private")], body).into_response()
}

/// How long a watch without `timeoutSeconds` stays open (the apiserver's default is 30–60 min).
pub(crate) const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

#[cfg(test)]
mod tests {
    use super::*;

    fn state(dir: &std::path::Path) -> Arc<ApiState> {
        let store = crate::Store::open(&dir.join("store.db"), &crate::StoreConfig::default()).unwrap();
        Arc::new(ApiState {
            objects: Objects { store, enforce_invariants: true },
            body_limit: 1024,
            git_version: "test".to_owned(),
            metrics: None,
            watches: watch::WatchSlots::default(),
        })
    }

    /// A body that never ends: reading it would wait forever.
    fn endless() -> Body {
        Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
    }

    #[tokio::test]
    async fn public_endpoints_answer_without_reading_the_body() {
        let dir = tempfile::tempdir().unwrap();
        let st = state(dir.path());
        for path in ["/healthz", "/readyz", "/livez", "/version", "/api", "/apis/kubevirt.io/v1"] {
            let req = Request::builder().uri(path).body(endless()).unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(5), dispatch(State(Arc::clone(&st)), req))
                .await
                .unwrap_or_else(|_| panic!("{path} waited for the request body"));
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
        }
    }

    #[tokio::test]
    async fn a_write_still_reads_its_body_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let st = state(dir.path());
        let req = Request::builder().method("POST").uri("/api/v1/namespaces").body(Body::from(vec![b' '; 2048])).unwrap();
        assert_eq!(dispatch(State(st), req).await.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn junk_methods_share_one_label() {
        for m in ["FOO", "JUNK1", "get", "PROPFIND"] {
            assert_eq!(method_label(&Method::from_bytes(m.as_bytes()).unwrap()), "other", "{m}");
        }
        assert_eq!(method_label(&Method::PATCH), "PATCH");
    }
}
