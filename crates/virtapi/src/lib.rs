//! `virtplug subresources-api`: KubeVirt's `subresources.kubevirt.io` served in cluster mode, as
//! KubeVirt's virt-api serves it: an aggregated API server behind kube-apiserver (an
//! `APIService` for `v1.subresources.kubevirt.io`), which does not serve that group itself.
//!
//! - [`authn`]: who asks (kube-aggregator's front-proxy certificate and `X-Remote-*` headers,
//!   or a bearer token reviewed by the API server); [`authz`]: whether they may (a
//!   `SubjectAccessReview` per request, in KubeVirt's RBAC attributes); [`nodebound`]: a node's
//!   tunnel only for a credential bound to that node; [`objects`]: the VMs and VMIs, read and
//!   edited through the API server.
//! - The handlers are the embedded API server's ([`apiserver::subresources`],
//!   [`apiserver::tunnel`]): the same paths, bodies, status codes and wording. Node agents
//!   open their console tunnel here (`subresources.virtplug.io` `nodes/tunnel`,
//!   `nodes/streams`), directly or through kube-apiserver's aggregation.
//!
//! # Routes
//! `/healthz`, `/readyz`, `/livez` (GET, no authentication); discovery (`/apis`,
//! `/apis/subresources.kubevirt.io[/v1]`, `/apis/subresources.virtplug.io[/v1]`); the
//! subresources. Anything else is 404.
//!
//! # Caveats
//! Tunnels are per replica: with several replicas behind one Service, a console request reaches
//! a VMI only through the replica its node's agent is connected to (run one replica, or point
//! each agent at each replica). Only HTTP/1.1 upgrades (see [`apiserver::websocket`]).

pub mod authn;
pub mod authz;
pub mod nodebound;
pub mod objects;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use apiserver::status::ApiError;
use apiserver::subresources;
use apiserver::tunnel::Tunnels;

use authn::{RequestHeader, User};
use objects::KubeObjects;

/// The node agents' group, served beside KubeVirt's.
pub const TUNNEL_GROUP: &str = "subresources.virtplug.io";
/// KubeVirt's group.
pub const KUBEVIRT_GROUP: &str = "subresources.kubevirt.io";
/// Largest request body (KubeVirt's options bodies are small; kube-apiserver's limit).
pub const BODY_LIMIT: usize = 3 * 1024 * 1024;

/// What the server needs.
pub struct Config {
    /// This component's client of the API server (reviews, VM and VMI reads and edits).
    pub client: kube::Client,
    /// The front proxy's settings; `None`: only bearer tokens authenticate.
    pub request_header: Option<RequestHeader>,
    /// The serving certificate chain and key (PEM).
    pub cert_pem: String,
    pub key_pem: String,
    pub connections: tlsserve::Limits,
    /// Whether a node's tunnel needs a credential bound to that node ([`nodebound`]); off only
    /// for clusters whose tokens name no node (before Kubernetes 1.30): then any agent may open any node's tunnel.
    pub node_bound_tunnels: bool,
}

/// The shared state of the routes.
pub struct Server {
    client: kube::Client,
    objects: KubeObjects,
    request_header: Option<RequestHeader>,
    tunnels: Arc<Tunnels>,
    node_bound_tunnels: bool,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the TLS configuration is invalid")]
    Tls(#[source] tlsserve::TlsError),
}

impl Server {
    /// The server; `node_bound_tunnels`: see [`Config::node_bound_tunnels`].
    #[must_use]
    pub fn new(client: kube::Client, request_header: Option<RequestHeader>, node_bound_tunnels: bool) -> Arc<Server> {
        Arc::new(Server { objects: KubeObjects(client.clone()), client, request_header, tunnels: Arc::default(), node_bound_tunnels })
    }

    /// The routes (see the module docs).
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new().fallback(handle).with_state(Arc::clone(self))
    }
}

/// Serves `config` over TLS on `listener` until `shutdown` fires. With a front proxy, clients
/// may present a certificate of its CA (others none).
///
/// # Errors
/// When the TLS configuration cannot be built.
pub async fn serve(config: Config, listener: TcpListener, shutdown: CancellationToken) -> Result<(), ServeError> {
    let tls = match &config.request_header {
        Some(rh) => tlsserve::server_config_with_client_ca(&config.cert_pem, &config.key_pem, &rh.client_ca_pem),
        None => tlsserve::server_config(&config.cert_pem, &config.key_pem),
    }
    .map_err(ServeError::Tls)?;
    let server = Server::new(config.client, config.request_header, config.node_bound_tunnels);
    tlsserve::serve(listener, server.router(), Arc::new(tls), config.connections, shutdown).await;
    Ok(())
}

fn is_health(req: &Request) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD) && matches!(req.uri().path(), "/healthz" | "/readyz" | "/livez")
}

/// Authenticates (see [`authn`]); `None`: 401.
async fn authenticate(st: &Server, parts: &Parts) -> Result<Option<User>, ApiError> {
    if let (Some(rh), Some(peer)) = (&st.request_header, parts.extensions.get::<tlsserve::PeerCertificates>()) {
        if peer.0.first().is_some_and(|leaf| rh.allows(leaf)) {
            if let Some(user) = rh.user(&parts.headers) {
                return Ok(Some(user));
            }
        }
    }
    let bearer = parts.headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match bearer.map(str::trim).filter(|t| !t.is_empty()) {
        Some(token) => authn::review_token(&st.client, token)
            .await
            .map_err(|e| ApiError::unavailable(format!("cannot ask the API server who holds this token (TokenReview): {e}"))),
        None => Ok(None),
    }
}

async fn handle(State(st): State<Arc<Server>>, req: Request) -> Response {
    if is_health(&req) {
        return (StatusCode::OK, [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], "ok").into_response();
    }
    let (mut parts, body) = req.into_parts();
    let user = match authenticate(&st, &parts).await {
        Ok(Some(u)) => u,
        // kube-apiserver's 401 says no more than this.
        Ok(None) => return ApiError::unauthorized().with_message("Unauthorized").into_response(),
        Err(e) => return e.into_response(),
    };
    let path = parts.uri.path().to_owned();
    let attrs = authz::Attributes::of(&parts.method, &path);
    if let Err(e) = authz::check(&st.client, &user, &attrs).await {
        return e.into_response();
    }
    if st.node_bound_tunnels {
        if let Err(e) = nodebound::check(&user, &attrs) {
            tracing::warn!(user = user.name, path, "refused a node tunnel to a credential not bound to that node: {}", e.message);
            return e.into_response();
        }
    }
    tracing::debug!(user = user.name, method = %parts.method, path, "allowed");
    match route(&st, &mut parts, body, &path).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn json_ok(v: &Value) -> Response {
    (StatusCode::OK, [(http::header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn group(name: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": [gv], "preferredVersion": gv})
}

/// `subresources.virtplug.io/v1`'s resources.
fn tunnel_resources() -> Value {
    let resources: Vec<Value> = ["nodes/tunnel", "nodes/streams"]
        .iter()
        .map(|n| json!({"name": n, "singularName": "", "namespaced": false, "kind": "Node", "verbs": ["get"]}))
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{TUNNEL_GROUP}/v1"), "resources": resources})
}

/// Refuses a namespace, object or node name that is not one Kubernetes allows, before it reaches
/// a request this component makes with its own credentials: the path's segments are not
/// percent-decoded here, and a name like `a%2F..%2Fb` must not become a different path at the API
/// server.
fn valid_names(ns: Option<&str>, name: &str) -> Result<(), ApiError> {
    let mut causes = ns.map(|ns| api::validation::dns1123_label(ns, "namespace")).unwrap_or_default();
    causes.extend(api::validation::dns1123_subdomain(name, "name"));
    match causes.first() {
        None => Ok(()),
        Some(c) => Err(ApiError::bad_request(format!("{}: {}", c.field, c.message))),
    }
}

fn dry_run(parts: &Parts) -> bool {
    form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()).any(|(k, v)| k == "dryRun" && v == "All")
}

async fn route(st: &Server, parts: &mut Parts, body: Body, path: &str) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let get = parts.method == Method::GET;
    let put = parts.method == Method::PUT;
    match segs.as_slice() {
        ["apis"] if get => {
            Ok(json_ok(&json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group(KUBEVIRT_GROUP), group(TUNNEL_GROUP)]})))
        }
        ["apis", g] if get && (*g == KUBEVIRT_GROUP || *g == TUNNEL_GROUP) => Ok(json_ok(&group(g))),
        ["apis", KUBEVIRT_GROUP, "v1"] if get => Ok(json_ok(&subresources::resource_list())),
        ["apis", TUNNEL_GROUP, "v1"] if get => Ok(json_ok(&tunnel_resources())),
        ["apis", KUBEVIRT_GROUP, "v1", "namespaces", ns, plural, name, sub] => {
            valid_names(Some(ns), name)?;
            let (ns, plural, name, sub) = ((*ns).to_owned(), (*plural).to_owned(), (*name).to_owned(), (*sub).to_owned());
            let vmi = plural == "virtualmachineinstances";
            if get && vmi && subresources::console::SUBRESOURCES.contains(&sub.as_str()) {
                return subresources::console::open(&st.objects, &st.tunnels, parts, &ns, &name, &sub).await;
            }
            if !put {
                return Err(ApiError::method_not_allowed());
            }
            let body = axum::body::to_bytes(body, BODY_LIMIT).await.map_err(|_| ApiError::too_large(BODY_LIMIT))?;
            let put = subresources::Put { plural: &plural, ns: &ns, name: &name, sub: &sub, body: &body, query_dry_run: dry_run(parts) };
            subresources::put(&st.objects, &put).await
        }
        ["apis", TUNNEL_GROUP, "v1", "nodes", node, "tunnel"] if get => {
            valid_names(None, node)?;
            let node = (*node).to_owned();
            apiserver::tunnel::accept_link(&st.objects, &st.tunnels, parts, &node).await
        }
        ["apis", TUNNEL_GROUP, "v1", "nodes", node, "streams", id] if get => {
            valid_names(None, node)?;
            let (node, id) = ((*node).to_owned(), (*id).to_owned());
            apiserver::tunnel::accept_stream(&st.tunnels, parts, &node, &id)
        }
        _ => Err(ApiError::no_resource()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that would read as another path once the API server decodes it is refused here,
    /// before this component's credentials carry it anywhere.
    #[test]
    fn names_that_are_not_kubernetes_names_are_refused() {
        assert!(valid_names(Some("default"), "vm-1.a").is_ok());
        for (ns, name) in
            [(Some("default"), "x%2F..%2F..%2Fnamespaces%2Fother"), (Some("a%2Fb"), "vm"), (Some("default"), ".."), (None, "Node_1")]
        {
            let e = valid_names(ns, name).unwrap_err();
            assert_eq!(e.code, 400, "{ns:?} {name}");
        }
    }
}
