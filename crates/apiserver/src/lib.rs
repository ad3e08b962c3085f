//! An embedded Kubernetes-compatible API server on SQLite.
//!
//! It serves virtplug's resources (kubevirt.io/v1 `VirtualMachine` and `VirtualMachineInstance`,
//! cdi.kubevirt.io/v1beta1 `DataVolume`, core/v1 `PersistentVolumeClaim`, `Event`, `Namespace`, `Node`)
//! with Kubernetes semantics, so `kubectl`, kube-rs and the Python client work unchanged.
//!
//! - [`store`]: SQLite store, global revision, changelog, broadcast.
//! - [`objects`]: the verbs and their metadata rules; [`apply`]: server-side apply and field
//!   ownership (`managedFields`) on every write.
//! - [`routes`]: the route table, from a request to its handler ([`call`]: what a handler
//!   gets; [`target`]: what a resource path names); the handlers: [`discovery`] (the endpoints
//!   that are not objects, [`openapi`]), [`verbs`] (on resources: [`list`], [`watch`],
//!   [`table`]), [`subresources`] (KubeVirt's `addvolume`, `start`, `console`, ...); [`reply`]: answers;
//!   [`tunnel`]: the node agents' tunnels that console and VNC streams take; [`websocket`]:
//!   upgraded connections.
//! - [`query`], [`body`] ([`protobuf`] for Kubernetes' binary encoding), [`patch`],
//!   [`selectors`], [`labels`]: parsing and checking what a request sends; [`kinds`]: rules of
//!   core kinds beyond the generic verbs (Secret); [`limits`]: every bound on a request and a stored object; [`fuzzing`]: fuzz
//!   entry points.
//! - [`gc`]: owner-reference and namespace garbage collection.
//! - [`pki`]: CA, serving certificate and token, created on first start; [`files`]: the data
//!   dir's ownership and modes; [`conn`]: connection limits and timeouts (all three from
//!   [`tlsserve`], shared with the Redfish service); [`health`]: `/readyz` over the long-lived
//!   tasks; [`audit`]: the audit log, one line per request in RBAC's terms.

pub mod apply;
pub mod audit;
pub mod body;
pub mod call;
pub mod crd;
pub mod discovery;
pub mod fuzzing;
pub mod gc;
pub mod health;
pub mod heap;
pub mod kinds;
pub mod labels;
pub mod limits;
pub mod list;
pub mod metrics;
pub mod negotiate;
pub mod objects;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod query;
pub mod registry;
#[cfg(test)]
mod regressions;
pub mod reply;
pub mod routes;
pub mod selectors;
pub mod shapes;
pub mod status;
pub mod store;
pub mod subresources;
pub mod table;
pub mod target;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokens;
pub mod tunnel;
pub mod verbs;
pub mod watch;
pub mod websocket;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{Method, StatusCode};
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken as CancelToken;
use tracing::Instrument;

pub use health::{GARBAGE_COLLECTOR, STORE_WRITER};
pub use objects::Objects;
pub use store::{Store, StoreConfig};
pub use tlsserve::{conn, files, pki};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    #[error(transparent)]
    Files(#[from] files::FileError),
    #[error(transparent)]
    Write(#[from] durable::WriteError),
    #[error("opening the data dir did not finish (its blocking task panicked or was cancelled)")]
    Open(#[source] tokio::task::JoinError),
    #[error("the TLS configuration is invalid")]
    Tls(#[source] tlsserve::TlsError),
    #[error(transparent)]
    Audit(#[from] audit::OpenError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Server settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub store: StoreConfig,
    /// Largest request body (Kubernetes' default is 3 MiB).
    pub body_limit: usize,
    /// The registry `/metrics` serves (with every component's metrics); `None`: 404.
    pub metrics: Option<metrics::SharedRegistry>,
    /// VM admission enforces [`api::invariants`] (default). Turned off only to model a cluster
    /// without virtplug's admission, where broken specs exist and self-heal must find them.
    pub enforce_invariants: bool,
    /// Connection limits and timeouts of [`Server::serve_tls`].
    pub connections: conn::Limits,
    /// Events last seen longer ago are deleted by the garbage collector (kube-apiserver's
    /// `--event-ttl`, default 1 h); `None` keeps them forever.
    pub event_ttl: Option<std::time::Duration>,
    /// Serve KubeVirt's `subresources.kubevirt.io` API (default). Turned off only to model a
    /// cluster with KubeVirt's CRDs but no virt-api, where clients must edit the VM instead.
    pub kubevirt_subresources: bool,
    /// Log every request served over the network ([`Server::router`]) here; `None`: no log.
    pub audit: Option<audit::AuditConfig>,
}

impl Config {
    /// Defaults for `data_dir`.
    #[must_use]
    pub fn new(data_dir: &Path) -> Self {
        Config {
            data_dir: data_dir.to_owned(),
            store: StoreConfig::default(),
            body_limit: 3 * 1024 * 1024,
            metrics: None,
            enforce_invariants: true,
            connections: conn::Limits::default(),
            event_ttl: Some(std::time::Duration::from_secs(3600)),
            kubevirt_subresources: true,
            audit: None,
        }
    }
}

/// The API server: store, HTTP routes, garbage collector.
pub struct Server {
    state: Arc<call::ApiState>,
    credentials: pki::Credentials,
    data_dir: PathBuf,
    health: health::Health,
    connections: conn::Limits,
    audit: Option<Arc<audit::AuditLog>>,
}

/// Namespaces created at start when missing: Kubernetes' `default` and `kube-system`, and
/// `virtplug-system`, where virtplug's own components keep their objects (the Redfish
/// service's accounts, as Secrets).
pub const BUILTIN_NAMESPACES: [&str; 3] = ["default", "kube-system", "virtplug-system"];

/// The Kubernetes version this server reports (kubectl's dispatcher picks its binary by it).
pub const GIT_VERSION: &str = "v1.33.0+virtplug";

impl Server {
    /// Opens the store in the data dir, creates credentials on first start, makes sure the
    /// [`BUILTIN_NAMESPACES`] exist and starts the garbage collector.
    ///
    /// The data dir must belong to this user; it and `pki/` are made 0700, the store's files
    /// 0600 (see [`files`]). The garbage collector and the store's writer thread are watched by
    /// [`Server::health`].
    ///
    /// # Errors
    /// When the data dir, store or credentials cannot be created or read, or the data dir
    /// belongs to another user.
    pub async fn open(config: &Config, listen: Option<SocketAddr>) -> Result<Server, ServerError> {
        // Files, SQLite and key generation block: off the reactor.
        let (data_dir, store_config) = (config.data_dir.clone(), config.store.clone());
        let audit = config.audit.as_ref().map(audit::AuditLog::open).transpose()?.map(Arc::new);
        let (store, credentials) =
            tokio::task::spawn_blocking(move || open_data_dir(&data_dir, &store_config, listen)).await.map_err(ServerError::Open)??;
        // The OpenAPI documents take a moment to build: start now, not at kubectl's first request.
        openapi::warm();
        let health = health::Health::new();
        health.register(STORE_WRITER);
        {
            let (store, health) = (store.clone(), health.clone());
            tokio::spawn(async move {
                let reason = store.writer_stopped().await;
                health.fail(STORE_WRITER, reason);
            });
        }
        let objects = Objects { store, enforce_invariants: config.enforce_invariants };
        let nsdef = registry::find("", "v1", "namespaces");
        for (ns, nsdef) in BUILTIN_NAMESPACES.into_iter().filter_map(|ns| nsdef.map(|d| (ns, d))) {
            if objects.store.get(&nsdef.key(None, ns)).is_none() {
                let _ = objects.create(nsdef, None, json!({"metadata": {"name": ns}}), false).await;
            }
        }
        // Namespaces made before ServiceAccounts were served get their `default` one now.
        if let Some(nsdef) = nsdef {
            for (_, ns) in objects.list(nsdef, None, None).1 {
                if let Some(name) = ns.value().pointer("/metadata/name").and_then(serde_json::Value::as_str) {
                    objects.ensure_default_service_account(name).await;
                }
            }
        }
        crd::ensure_builtin(&objects).await;
        crd::reconcile_all(&objects).await;
        if let Some(scdef) = registry::find("storage.k8s.io", "v1", "storageclasses") {
            if objects.store.get(&scdef.key(None, kinds::storageclass::LOCAL)).is_none() {
                if let Err(e) = objects.create(scdef, None, kinds::storageclass::local(), false).await {
                    tracing::warn!("creating the default StorageClass failed: {}", e.message);
                }
            }
        }
        {
            let crd_objects = objects.clone();
            health.register(health::CRD_ESTABLISHER);
            health.spawn(health::CRD_ESTABLISHER, async move {
                crd::run(crd_objects).instrument(tracing::info_span!("crd_establisher")).await;
                Ok::<(), std::convert::Infallible>(())
            });
        }
        tokio::spawn(heap::run(objects.store.clone()));
        let gc_objects = objects.clone();
        let event_ttl = config.event_ttl;
        health.spawn(GARBAGE_COLLECTOR, async move {
            // Its log lines carry the span, not a hand-written prefix.
            gc::run(gc_objects, event_ttl).instrument(tracing::info_span!("garbage_collector")).await;
            Ok::<(), std::convert::Infallible>(())
        });
        let state = Arc::new(call::ApiState {
            objects,
            body_limit: config.body_limit,
            git_version: GIT_VERSION.to_owned(),
            metrics: config.metrics.clone(),
            watches: watch::WatchSlots::default(),
            kubevirt_subresources: config.kubevirt_subresources,
            tunnels: Arc::default(),
            token: Some(credentials.token.clone()),
            tokens: tokens::Tokens::default(),
        });
        Ok(Server { state, credentials, data_dir: config.data_dir.clone(), health, connections: config.connections.clone(), audit })
    }

    /// The liveness of the server's long-lived tasks; `/readyz` answers from it, and an embedder
    /// (`virtplug up`) starts its own components with [`health::Health::spawn`] to be covered too.
    #[must_use]
    pub fn health(&self) -> &health::Health {
        &self.health
    }

    /// The object verbs, for in-process use.
    #[must_use]
    pub fn objects(&self) -> &Objects {
        &self.state.objects
    }

    /// The bearer token clients must send.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.credentials.token
    }

    /// The CA certificate (PEM) that signed the serving certificate.
    #[must_use]
    pub fn ca_pem(&self) -> &str {
        &self.credentials.ca_pem
    }

    /// Routes without authentication: for an in-process `kube::Client`, never for a socket.
    pub fn local_router(&self) -> Router {
        let health = self.health.clone();
        Router::new().fallback(routes::dispatch).with_state(Arc::clone(&self.state)).layer(middleware::from_fn(
            move |req: Request, next: Next| {
                let health = health.clone();
                async move { readyz(&health, req, next).await }
            },
        ))
    }

    /// Routes that require the bearer token, except GET of `/healthz`, `/readyz`, `/livez`,
    /// `/version`; with [`Config::audit`], every request (refused ones too) is logged.
    pub fn router(&self) -> Router {
        let token: Arc<[u8]> = format!("Bearer {}", self.credentials.token).into_bytes().into();
        let router = self.local_router().layer(middleware::from_fn(move |req: Request, next: Next| {
            let token = Arc::clone(&token);
            async move { authenticate(&token, req, next).await }
        }));
        self.audited(router)
    }

    /// [`Self::local_router`], its requests in the audit log when [`Config::audit`] asks for one:
    /// `up`'s in-process controller and node agent, whose requests belong in the log too.
    pub fn audited_local_router(&self) -> Router {
        self.audited(self.local_router())
    }

    /// `router` wrapped in the audit log's layer, if there is a log.
    fn audited(&self, router: Router) -> Router {
        match &self.audit {
            Some(log) => {
                let log = Arc::clone(log);
                router.layer(middleware::from_fn(move |req: Request, next: Next| audit::layer(Arc::clone(&log), req, next)))
            }
            None => router,
        }
    }

    /// Writes `DATA_DIR/kubeconfig` for `server_url` (atomically) and returns its path.
    ///
    /// It blocks for two fsyncs: a one-off at start; anything later calls it from
    /// `spawn_blocking`.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write_kubeconfig(&self, server_url: &str) -> Result<PathBuf, ServerError> {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.credentials.ca_pem.as_bytes());
        let doc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: virtplug\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {ca}\n\
             users:\n- name: {user}\n  user:\n    token: {}\ncontexts:\n- name: virtplug\n  context:\n    cluster: virtplug\n    user: {user}\n    namespace: default\n\
             current-context: virtplug\n",
            self.credentials.token,
            user = kinds::review::ADMIN_USER,
        );
        let path = self.data_dir.join("kubeconfig");
        durable::write_atomic(&path, doc.as_bytes(), 0o600)?;
        Ok(path)
    }

    /// Serves HTTPS on `listener` until `shutdown` fires; open connections are then dropped.
    /// Connections are limited and timed out as [`conn`] describes ([`Config::connections`]);
    /// the process's soft open-files limit is raised to its hard limit.
    ///
    /// # Errors
    /// When the TLS configuration cannot be built from the credentials.
    pub async fn serve_tls(&self, listener: TcpListener, shutdown: CancelToken) -> Result<(), ServerError> {
        let tls = tlsserve::server_config(&self.credentials.cert_pem, &self.credentials.key_pem).map_err(ServerError::Tls)?;
        conn::serve_with_refusal(listener, self.router(), Arc::new(tls), self.connections.clone(), shutdown, refusal()).await;
        Ok(())
    }
}

/// Beyond the connection cap: a Kubernetes `Status` 503 (the listener adds `Retry-After`).
fn refusal() -> conn::Refusal {
    conn::Refusal::new(|max| {
        status::ApiError::unavailable(format!(
            "the API server is serving its maximum of {max} connections (--max-connections); retry later"
        ))
        .into_response()
    })
}

/// Makes the data dir and its files private, opens the store and loads (or creates) the
/// credentials. Blocking.
fn open_data_dir(data_dir: &Path, store: &StoreConfig, listen: Option<SocketAddr>) -> Result<(Store, pki::Credentials), ServerError> {
    files::private_dir(data_dir)?;
    let db = data_dir.join("store.db");
    // SQLite gives the -wal and -shm files the mode of the database file.
    files::private_file(&db)?;
    for side in ["store.db-wal", "store.db-shm"] {
        files::tighten_existing(&data_dir.join(side), 0o600)?;
    }
    let store = Store::open(&db, store)?;
    let credentials = pki::ensure(&data_dir.join("pki"), listen.map(|a| a.ip()))?;
    Ok((store, credentials))
}

/// Marks a request served without credentials (public endpoints).
#[derive(Clone, Copy)]
struct Anonymous;

fn is_public(req: &Request) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && matches!(req.uri().path(), "/healthz" | "/readyz" | "/livez" | "/version" | "/healthz/" | "/readyz/" | "/livez/" | "/version/")
}

/// Lets a request through if it carries the token (compared in constant time) or is a GET of a
/// public endpoint; answers 401 otherwise. Either way the body of a request without the token
/// is never read: a rejected request is answered before its body is polled (HTTP/1 then closes
/// the connection instead of draining it; HTTP/2 resets the stream), and a public one has its
/// body replaced by an empty one. Public endpoints are GET-only, so junk methods from
/// anonymous clients never reach the handlers (or their per-method metrics).
async fn authenticate(token: &[u8], req: Request, next: Next) -> Response {
    let given = req.headers().get(http::header::AUTHORIZATION).map(http::HeaderValue::as_bytes);
    // `ct_eq` on slices of different lengths is false at once: the length of "Bearer " plus
    // 64 hex digits is no secret; for equal lengths the time does not depend on the bytes.
    if given.is_some_and(|g| bool::from(g.ct_eq(token))) {
        return next.run(req).await;
    }
    if is_public(&req) {
        let (parts, _unread) = req.into_parts();
        let mut req = Request::from_parts(parts, Body::empty());
        req.extensions_mut().insert(Anonymous);
        return next.run(req).await;
    }
    status::ApiError::unauthorized().into_response()
}

/// `/readyz`: 503 naming every dead component (with the reason for authenticated callers,
/// "reason withheld" for anonymous ones, as kube-apiserver), 200 `ok` otherwise;
/// `?verbose` lists every component.
async fn readyz(health: &health::Health, req: Request, next: Next) -> Response {
    if !(req.method() == Method::GET && matches!(req.uri().path(), "/readyz" | "/readyz/")) {
        return next.run(req).await;
    }
    let detailed = req.extensions().get::<Anonymous>().is_none();
    let verbose = req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "verbose" || p.starts_with("verbose=")));
    let (ok, body) = health::readyz_body(health, detailed, verbose);
    let code = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}
