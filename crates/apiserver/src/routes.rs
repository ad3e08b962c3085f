//! HTTP: the route table ([`ROUTES`]), which maps a request's method and path to its handler,
//! and [`dispatch`], the entry point of every request.
//!
//! # Flow
//! The rows are tried in order: the non-resource endpoints, discovery, OpenAPI, KubeVirt's
//! subresources (fixed [`pattern`]s), then the verbs on resource paths. A path that matches no
//! pattern is parsed as a resource path once ([`target::parse`]: 404 when it names no served
//! resource, 400 for a bad query); a resource path with no row for its method is 405.
//!
//! # Guarantees
//! - The request body is read only by the routes that take one (writes, deletes and the
//!   KubeVirt subresources), up to [`ApiState::body_limit`]; `/healthz`, `/readyz`, `/livez`,
//!   `/version`, `/metrics`, discovery and reads never read it ([`Handler::Plain`] handlers get
//!   no way to).
//! - The `method` label of the request counter is one of a fixed set ([`method_label`]), so no
//!   request can add metric series.
//! - Every request runs in a `request` span carrying its method, route template, resource,
//!   namespace and object name (`object`: `name` is the span's own name in JSON logs), so
//!   every log line of a request says which object it is about.

pub mod pattern;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use tracing::field::{display, Empty};
use tracing::{Instrument, Span};

pub use crate::call::ApiState;
use crate::call::Call;
use crate::query;
use crate::status::ApiError;
use crate::target::{self, Resource, Shape};
use crate::{discovery, negotiate, subresources, tokens, tunnel, verbs};

/// What an async handler returns.
pub type Reply<'a> = Pin<Box<dyn Future<Output = Result<Response, ApiError>> + Send + 'a>>;

/// The handler of a [`Route::Path`].
pub enum Handler {
    /// Answers from the path, query and headers alone.
    Plain(fn(&Call<'_>) -> Result<Response, ApiError>),
    /// May read the body.
    Async(for<'a> fn(Call<'a>) -> Reply<'a>),
}

/// One row of the route table.
pub enum Route {
    /// A method and a fixed path [`pattern`].
    Path(Method, &'static str, Handler),
    /// A method and the [`Shape`] of a resource path.
    Verb(Method, Shape, for<'a> fn(Call<'a>, Resource) -> Reply<'a>),
}

const fn get(pattern: &'static str, handler: fn(&Call<'_>) -> Result<Response, ApiError>) -> Route {
    Route::Path(Method::GET, pattern, Handler::Plain(handler))
}

const fn put(pattern: &'static str, handler: for<'a> fn(Call<'a>) -> Reply<'a>) -> Route {
    Route::Path(Method::PUT, pattern, Handler::Async(handler))
}

/// The route table, tried in order (see the module docs).
pub static ROUTES: &[Route] = &[
    // Non-resource endpoints.
    get("/version", discovery::version),
    get("/healthz", discovery::ok),
    get("/readyz", discovery::ok),
    get("/livez", discovery::ok),
    get("/metrics", discovery::metrics),
    // Discovery.
    get("/api", discovery::core_versions),
    get("/apis", discovery::api_groups),
    get("/api/v1", discovery::core_resources),
    get("/apis/subresources.kubevirt.io/v1", discovery::subresource_list),
    get("/apis/{group}", discovery::api_group),
    get("/apis/{group}/{version}", discovery::group_resources),
    // OpenAPI.
    get("/openapi/v2", discovery::openapi_v2),
    get("/openapi/v3", discovery::openapi_v3),
    get("/openapi/v3/{*path}", discovery::openapi_v3_group),
    // KubeVirt's subresources.
    put(
        "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/{plural:virtualmachines|virtualmachineinstances}/{name}/{sub:addvolume|removevolume}",
        |c| Box::pin(subresources::volumes(c)),
    ),
    put(
        "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/{plural:virtualmachines}/{name}/{sub:start|stop|restart}",
        |c| Box::pin(subresources::lifecycle(c)),
    ),
    put(
        "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/{plural:virtualmachineinstances}/{name}/{sub:pause|unpause|softreboot}",
        |c| Box::pin(subresources::vmi_action(c)),
    ),
    Route::Path(
        Method::GET,
        "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/{plural:virtualmachineinstances}/{name}/{sub:console|vnc}",
        Handler::Async(|c| Box::pin(subresources::console::handle(c))),
    ),
    // The node agents' tunnels (the console and VNC streams' way to the nodes).
    Route::Path(Method::GET, "/apis/subresources.virtplug.io/v1/nodes/{node}/tunnel", Handler::Async(|c| Box::pin(tunnel::link(c)))),
    Route::Path(
        Method::GET,
        "/apis/subresources.virtplug.io/v1/nodes/{node}/streams/{id}",
        Handler::Async(|c| Box::pin(async { tunnel::stream(c) })),
    ),
    // core/v1 pods/binding (kube-scheduler's bind).
    Route::Path(Method::POST, "/api/v1/namespaces/{namespace}/pods/{name}/binding", Handler::Async(|c| Box::pin(subresources::binding(c)))),
    // core/v1 serviceaccounts/token (TokenRequest: what the kubelet's projected tokens and
    // `kubectl create token` ask).
    Route::Path(Method::POST, "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", Handler::Async(|c| Box::pin(tokens::request(c)))),
    // The verbs on resources.
    Route::Verb(Method::GET, Shape::Collection, |c, r| Box::pin(verbs::list(c, r))),
    Route::Verb(Method::POST, Shape::Collection, |c, r| Box::pin(verbs::create(c, r))),
    Route::Verb(Method::DELETE, Shape::Collection, |c, r| Box::pin(verbs::delete_collection(c, r))),
    Route::Verb(Method::GET, Shape::Object, |c, r| Box::pin(verbs::get(c, r))),
    Route::Verb(Method::PUT, Shape::Object, |c, r| Box::pin(verbs::replace(c, r))),
    Route::Verb(Method::PATCH, Shape::Object, |c, r| Box::pin(verbs::patch(c, r))),
    Route::Verb(Method::DELETE, Shape::Object, |c, r| Box::pin(verbs::delete(c, r))),
    Route::Verb(Method::GET, Shape::Status, |c, r| Box::pin(verbs::get(c, r))),
    Route::Verb(Method::PUT, Shape::Status, |c, r| Box::pin(verbs::replace(c, r))),
    Route::Verb(Method::PATCH, Shape::Status, |c, r| Box::pin(verbs::patch(c, r))),
    Route::Verb(Method::GET, Shape::Scale, |c, r| Box::pin(crate::crd::scale::get(c, r))),
    Route::Verb(Method::PUT, Shape::Scale, |c, r| Box::pin(crate::crd::scale::replace(c, r))),
    Route::Verb(Method::PATCH, Shape::Scale, |c, r| Box::pin(crate::crd::scale::patch(c, r))),
];

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
    let method = method_label(req.method());
    let span = tracing::info_span!("request", method, route = Empty, resource = Empty, namespace = Empty, object = Empty);
    // Objects and discovery are negotiated; OpenAPI, metrics and health keep their own types.
    let path = req.uri().path();
    let media = if path == "/api" || path.starts_with("/api/") || path == "/apis" || path.starts_with("/apis/") {
        let accept = req.headers().get(http::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
        negotiate::choose(accept)
    } else {
        Ok(negotiate::Media::Json)
    };
    let answered = match media {
        Ok(media) => route(&st, req).instrument(span.clone()).await.map(|r| (r, media)),
        Err(e) => Err(e),
    };
    let resp = match answered {
        Ok((r, negotiate::Media::Json)) => r,
        Ok((r, negotiate::Media::Yaml)) => as_yaml(r).await,
        Err(e) => {
            if e.code >= 500 {
                span.in_scope(|| tracing::warn!(code = e.code, reason = e.reason, "{}", e.message));
            }
            e.into_response()
        }
    };
    span.in_scope(|| tracing::debug!(code = resp.status().as_u16(), "answered"));
    crate::metrics::get()
        .requests
        .get_or_create(&crate::metrics::RequestLabels { method: method.to_owned(), code: resp.status().as_u16().to_string() })
        .inc();
    resp
}

/// A JSON answer rewritten as YAML; a watch stream (or anything not JSON) is left as it is.
async fn as_yaml(resp: Response) -> Response {
    let is_json = resp.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes() == b"application/json");
    let streaming = resp.headers().get(http::header::CACHE_CONTROL).is_some();
    if !is_json || streaming {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let yaml = axum::body::to_bytes(body, usize::MAX).await.ok().and_then(|b| {
        if b.is_empty() {
            Some(String::new())
        } else {
            serde_json::from_slice::<serde_json::Value>(&b).ok().and_then(|v| serde_yaml::to_string(&v).ok())
        }
    });
    match yaml {
        Some(y) => {
            parts.headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/yaml"));
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(y))
        }
        None => ApiError::internal("the answer could not be written as YAML; ask for application/json").into_response(),
    }
}

/// Finds the request's row in [`ROUTES`] and runs its handler.
async fn route(st: &ApiState, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let query = query::params(parts.uri.query());
    if !st.kubevirt_subresources && segs.get(1) == Some(&"subresources.kubevirt.io") && segs.first() == Some(&"apis") {
        return Err(ApiError::no_resource());
    }
    let mut resource: Option<Resource> = None;
    for row in ROUTES {
        match row {
            Route::Path(method, pattern, handler) => {
                if *method != parts.method {
                    continue;
                }
                let Some(captures) = pattern::matches(pattern, &segs) else { continue };
                record_path(pattern, &captures);
                let call = Call::new(st, parts, query, captures, body);
                return match handler {
                    Handler::Plain(h) => h(&call),
                    Handler::Async(h) => h(call).await,
                };
            }
            Route::Verb(method, shape, handler) => {
                let r = match resource.take() {
                    Some(r) => r,
                    None => target::parse(&segs, &query)?,
                };
                if *method != parts.method || *shape != r.shape {
                    resource = Some(r);
                    continue;
                }
                // A review is only created.
                if r.def.review.is_some() && !(parts.method == Method::POST && r.shape == Shape::Collection) {
                    return Err(ApiError::method_not_allowed());
                }
                record_resource(&r);
                return handler(Call::new(st, parts, query, Vec::new(), body), r).await;
            }
        }
    }
    Err(if resource.is_some() { ApiError::method_not_allowed() } else { ApiError::no_resource() })
}

/// Puts a path route's template and object into the request's span.
fn record_path(pattern: &'static str, captures: &[(&'static str, String)]) {
    let span = Span::current();
    span.record("route", pattern);
    let get = |name| captures.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
    if let Some(plural) = get("plural") {
        match get("sub") {
            Some(sub) => span.record("resource", display(format_args!("{plural}/{sub}"))),
            None => span.record("resource", plural),
        };
    }
    if let Some(ns) = get("namespace") {
        span.record("namespace", ns);
    }
    if let Some(name) = get("name") {
        span.record("object", name);
    }
}

/// Puts a resource route's template and object into the request's span.
fn record_resource(r: &Resource) {
    let span = Span::current();
    span.record("route", display(r.template()));
    match r.shape {
        Shape::Status => span.record("resource", display(format_args!("{}/status", r.def.plural))),
        Shape::Scale => span.record("resource", display(format_args!("{}/scale", r.def.plural))),
        Shape::Collection | Shape::Object => span.record("resource", r.def.plural),
    };
    if let Some(ns) = &r.ns {
        span.record("namespace", ns.as_str());
    }
    if let Some(name) = &r.name {
        span.record("object", name.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    use axum::body::{Body, Bytes};
    use axum::http::StatusCode;

    use crate::objects::Objects;
    use crate::watch;

    fn state(dir: &std::path::Path) -> Arc<ApiState> {
        let store = crate::Store::open(&dir.join("store.db"), &crate::StoreConfig::default()).unwrap();
        Arc::new(ApiState {
            objects: Objects { store, enforce_invariants: true },
            body_limit: 1024,
            git_version: "test".to_owned(),
            metrics: None,
            watches: watch::WatchSlots::default(),
            kubevirt_subresources: true,
            tunnels: Arc::default(),
            token: None,
            tokens: crate::tokens::Tokens::default(),
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

    #[test]
    fn the_table_is_well_formed_and_tries_resource_paths_last() {
        let first_verb = ROUTES.iter().position(|r| matches!(r, Route::Verb(..))).unwrap();
        assert!(ROUTES[first_verb..].iter().all(|r| matches!(r, Route::Verb(..))), "a path row after the verbs is never reached");
        for row in ROUTES {
            if let Route::Path(_, pattern, _) = row {
                assert_eq!(pattern::check(pattern), None);
            }
        }
    }

    #[tokio::test]
    async fn unknown_paths_are_404_and_unknown_verbs_405() {
        let dir = tempfile::tempdir().unwrap();
        let st = state(dir.path());
        let vm = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1";
        let subresource = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/vm1/addvolume";
        for (method, path, code) in [
            ("POST", "/version", 404),
            ("GET", "/apis/nothing.example.com/v1/things", 404),
            ("GET", &format!("{vm}/console") as &str, 404),
            ("GET", subresource, 404),
            ("PUT", subresource, 400),
            ("PUT", "/apis/kubevirt.io/v1/namespaces/default/virtualmachines", 405),
            ("POST", vm, 405),
            ("DELETE", &format!("{vm}/status"), 405),
            ("GET", vm, 404),
            ("GET", "/api/v1/namespaces", 200),
            ("PATCH", "/api/v1/namespaces", 405),
        ] {
            let req = Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
            assert_eq!(dispatch(State(Arc::clone(&st)), req).await.status().as_u16(), code, "{method} {path}");
        }
    }

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    async fn logged(json: bool, st: &Arc<ApiState>, method: &str, path: &str) -> String {
        let lines = Lines::default();
        let writer = {
            let lines = lines.clone();
            move || lines.clone()
        };
        let builder = tracing_subscriber::fmt().with_writer(writer).with_ansi(false).with_max_level(tracing::Level::DEBUG);
        let _default = if json {
            tracing::subscriber::set_default(builder.json().finish())
        } else {
            tracing::subscriber::set_default(builder.finish())
        };
        let req = Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
        dispatch(State(Arc::clone(st)), req).await;
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[tokio::test]
    async fn a_requests_log_lines_carry_its_object_in_text_and_json() {
        let dir = tempfile::tempdir().unwrap();
        let st = state(dir.path());
        let path = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/vm1/status";
        let json = logged(true, &st, "GET", path).await;
        // The request's own line (another test's work on this thread may log first).
        let line: serde_json::Value = json
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["span"]["name"] == "request")
            .unwrap_or_else(|| panic!("no request line in {json}"));
        assert_eq!(
            line["span"],
            serde_json::json!({"name": "request", "method": "GET", "route": "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status",
                "resource": "virtualmachines/status", "namespace": "default", "object": "vm1"}),
            "{json}"
        );
        let text = logged(false, &st, "PUT", "/apis/subresources.kubevirt.io/v1/namespaces/ns2/virtualmachines/vm2/start").await;
        assert!(
            text.contains("resource=virtualmachines/start") && text.contains("namespace=\"ns2\"") && text.contains("object=\"vm2\""),
            "{text}"
        );
    }
}
