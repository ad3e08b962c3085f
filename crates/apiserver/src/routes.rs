//! HTTP: parses Kubernetes REST paths and query parameters into calls on [`Objects`], and
//! serves discovery, OpenAPI, lists, tables and watch streams.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

use crate::objects::{DeleteOptions, Objects, Part, Propagation};
use crate::patch::PatchKind;
use crate::registry::{self, ResourceDef};
use crate::selectors::Selector;
use crate::status::ApiError;
use crate::{openapi, table, watch};

/// Shared state of the HTTP layer.
pub struct ApiState {
    pub objects: Objects,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// The `gitVersion` reported by `/version`.
    pub git_version: String,
    /// What `/metrics` serves.
    pub metrics: Option<crate::metrics::SharedRegistry>,
}

/// What a REST path names.
struct Target {
    def: &'static ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Entry point for every request.
pub async fn dispatch(State(st): State<Arc<ApiState>>, req: Request) -> Response {
    let method = req.method().as_str().to_owned();
    let resp = match handle(&st, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    crate::metrics::get().requests.get_or_create(&crate::metrics::RequestLabels { method, code: resp.status().as_u16().to_string() }).inc();
    resp
}

async fn handle(st: &ApiState, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().trim_end_matches('/').to_owned();
    let query: HashMap<String, String> =
        parts.uri.query().map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default();
    let body = axum::body::to_bytes(body, st.body_limit).await.map_err(|_| ApiError::too_large(st.body_limit))?;
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();

    // Discovery and non-resource endpoints.
    match (parts.method.clone(), segs.as_slice()) {
        (Method::GET, ["version"]) => {
            return Ok(json_response(
                StatusCode::OK,
                &json!({
                    "major": "1", "minor": "33", "gitVersion": st.git_version, "gitCommit": "virtplug",
                    "gitTreeState": "clean", "buildDate": "2026-11-29T00:00:00Z", "goVersion": "rust",
                    "compiler": "rustc", "platform": "linux/amd64"
                }),
            ));
        }
        (Method::GET, ["healthz" | "readyz" | "livez"]) => return Ok((StatusCode::OK, "ok").into_response()),
        (Method::GET, ["metrics"]) => {
            let Some(registry) = &st.metrics else { return Err(ApiError::no_resource()) };
            let text = crate::metrics::render(registry);
            return Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response());
        }
        (Method::GET, ["api"]) => return Ok(json_response(StatusCode::OK, &registry::core_versions())),
        (Method::GET, ["apis"]) => return Ok(json_response(StatusCode::OK, &registry::api_group_list())),
        (Method::GET, ["api", "v1"]) => {
            return registry::resource_list("", "v1").map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource);
        }
        (Method::GET, ["apis", "subresources.kubevirt.io", "v1"]) => {
            return Ok(json_response(StatusCode::OK, &crate::volumes::resource_list()))
        }
        (
            Method::PUT,
            ["apis", "subresources.kubevirt.io", "v1", "namespaces", ns, plural @ ("virtualmachines" | "virtualmachineinstances"), name, sub @ ("addvolume" | "removevolume")],
        ) => {
            let dry = query.get("dryRun").is_some_and(|v| v == "All");
            return crate::volumes::handle(&st.objects, plural, ns, name, sub, &body, dry).await;
        }
        (
            Method::PUT,
            ["apis", "subresources.kubevirt.io", "v1", "namespaces", ns, "virtualmachines", name, sub @ ("start" | "stop" | "restart")],
        ) => {
            let dry = query.get("dryRun").is_some_and(|v| v == "All");
            return crate::lifecycle::handle(&st.objects, ns, name, sub, &body, dry).await;
        }
        (Method::GET, ["apis", g]) => {
            return registry::api_group(g).map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource)
        }
        (Method::GET, ["apis", g, v]) => {
            return registry::resource_list(g, v).map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource);
        }
        (Method::GET, ["openapi", "v2"]) => {
            let accept = parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
            if accept.contains("protobuf") {
                return Ok((
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")],
                    openapi::v2_protobuf(),
                )
                    .into_response());
            }
            return Ok(json_response(StatusCode::OK, &openapi::v2()));
        }
        (Method::GET, ["openapi", "v3"]) => return Ok(json_response(StatusCode::OK, &openapi::v3_index())),
        (Method::GET, ["openapi", "v3", rest @ ..]) => {
            return openapi::v3_group(&rest.join("/")).map(|v| json_response(StatusCode::OK, &v)).ok_or_else(ApiError::no_resource);
        }
        _ => {}
    }
    let target = parse_target(&segs)?;
    let accept = parts.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
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
            if query.get("watch").is_some_and(|w| w == "1" || w == "true") {
                return watch::serve(objects, def, ns, None, &query, &accept);
            }
            list(objects, def, ns, &query, &accept)
        }
        (Method::GET, Some(name)) => {
            if query.get("watch").is_some_and(|w| w == "1" || w == "true") {
                return watch::serve(objects, def, ns, Some(name), &query, &accept);
            }
            let obj = objects.get(def, ns, name)?.object;
            if table::wants_table(&accept) {
                let t = table::table(
                    def,
                    &[&obj],
                    &json!({"resourceVersion": obj.pointer("/metadata/resourceVersion")}),
                    query.get("includeObject").map_or("Metadata", String::as_str),
                );
                return Ok(json_response(StatusCode::OK, &t));
            }
            Ok(json_response(StatusCode::OK, &obj))
        }
        (Method::POST, None) => {
            if part != Part::Main {
                return Err(ApiError::method_not_allowed());
            }
            let obj = parse_body(&parts.headers, &body)?;
            let created = objects.create(def, ns, obj, dry_run).await?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Method::PUT, Some(name)) => {
            let obj = parse_body(&parts.headers, &body)?;
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
            let out = objects.patch(def, ns, name, kind, &body, part, dry_run).await?;
            Ok(json_response(StatusCode::OK, &out))
        }
        (Method::DELETE, Some(name)) => {
            if part != Part::Main {
                return Err(ApiError::method_not_allowed());
            }
            let opts = delete_options(&query, &body, dry_run)?;
            let out = objects.delete(def, ns, name, &opts).await?;
            Ok(json_response(StatusCode::OK, &out))
        }
        (Method::DELETE, None) => {
            let opts = delete_options(&query, &body, dry_run)?;
            let labels = Selector::labels(query.get("labelSelector").map_or("", String::as_str))?;
            let fields = Selector::fields(query.get("fieldSelector").map_or("", String::as_str))?;
            let (rv, items) = objects.list(def, ns, None);
            let mut deleted = Vec::new();
            for (_, obj) in items.iter().filter(|(_, o)| labels.matches_labels(o) && fields.matches_fields(o)) {
                let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                let ons = obj.pointer("/metadata/namespace").and_then(Value::as_str);
                match objects.delete(def, ons, name, &opts).await {
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

/// Parses a JSON or YAML body into an object.
fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty; send the object as JSON or YAML"));
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    let v: Value = if ct.contains("yaml") {
        serde_yaml::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}")))?
    } else {
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be an object with apiVersion, kind and metadata"));
    }
    Ok(v)
}

fn delete_options(query: &HashMap<String, String>, body: &Bytes, dry_run: bool) -> Result<DeleteOptions, ApiError> {
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

#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    rv: u64,
    start: String,
}

fn list(
    objects: &Objects,
    def: &ResourceDef,
    ns: Option<&str>,
    query: &HashMap<String, String>,
    accept: &str,
) -> Result<Response, ApiError> {
    let labels = Selector::labels(query.get("labelSelector").map_or("", String::as_str))?;
    let fields = Selector::fields(query.get("fieldSelector").map_or("", String::as_str))?;
    let limit: usize = match query.get("limit") {
        Some(l) => l.parse().map_err(|_| ApiError::bad_request(format!("limit {l:?} is not a number")))?,
        None => 0,
    };
    let cont: Option<Continue> = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .ok_or_else(|| ApiError::bad_request("the continue token is not valid: start the list again without it"))?,
        ),
        None => None,
    };
    if let Some(c) = &cont {
        let oldest = objects.store.oldest();
        if c.rv < oldest {
            return Err(ApiError::expired(c.rv, oldest)
                .with_message("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."));
        }
    }
    let (current_rv, items) = objects.list(def, ns, cont.as_ref().map(|c| c.start.as_str()));
    if let (Some(rv), Some("Exact")) = (query.get("resourceVersion"), query.get("resourceVersionMatch").map(String::as_str)) {
        let rv: u64 = rv.parse().map_err(|_| ApiError::bad_request(format!("resourceVersion {rv:?} is not a number")))?;
        if rv != current_rv {
            return Err(ApiError::expired(rv, current_rv));
        }
    }
    let list_rv = cont.as_ref().map_or(current_rv, |c| c.rv);
    let mut selected: Vec<(&String, &Arc<Value>)> = Vec::new();
    let mut next = None;
    for (key, obj) in &items {
        if !(labels.matches_labels(obj) && fields.matches_fields(obj)) {
            continue;
        }
        if limit > 0 && selected.len() == limit {
            next = selected.last().map(|(k, _)| (*k).clone());
            break;
        }
        selected.push((key, obj));
    }
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let Some(start) = next {
        let token = serde_json::to_vec(&Continue { rv: list_rv, start }).unwrap_or_default();
        meta["continue"] = json!(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token));
    }
    if table::wants_table(accept) {
        let objs: Vec<&Value> = selected.iter().map(|(_, o)| o.as_ref()).collect();
        return Ok(json_response(
            StatusCode::OK,
            &table::table(def, &objs, &meta, query.get("includeObject").map_or("Metadata", String::as_str)),
        ));
    }
    let items: Vec<&Value> = selected.iter().map(|(_, o)| o.as_ref()).collect();
    let body = json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(), "metadata": meta, "items": items});
    Ok(json_response(StatusCode::OK, &body))
}

impl ApiError {
    fn with_message(mut self, m: &str) -> Self {
        self.message = m.to_owned();
        self
    }
}

/// A watch stream body.
pub(crate) fn stream_response(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache, private")], body).into_response()
}

/// How long a watch without `timeoutSeconds` stays open (the apiserver's default is 30–60 min).
pub(crate) const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
