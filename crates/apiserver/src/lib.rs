//! An embedded Kubernetes-compatible API server on SQLite.
//!
//! It serves virtplug's resources (kubevirt.io/v1 `VirtualMachine` and `VirtualMachineInstance`,
//! cdi.kubevirt.io/v1beta1 `DataVolume`, core/v1 `PersistentVolumeClaim`, `Event`, `Namespace`, `Node`)
//! with Kubernetes semantics, so `kubectl`, kube-rs and the Python client work unchanged.
//!
//! - [`store`]: SQLite store, global revision, changelog, broadcast.
//! - [`objects`]: the verbs and their metadata rules.
//! - [`routes`], [`watch`], [`table`], [`openapi`]: the HTTP surface.
//! - [`gc`]: owner-reference and namespace garbage collection.
//! - [`pki`]: CA, serving certificate and token, created on first start.

pub mod gc;
pub mod lifecycle;
pub mod metrics;
pub mod objects;
pub mod openapi;
pub mod patch;
pub mod pki;
pub mod registry;
pub mod routes;
pub mod selectors;
pub mod status;
pub mod store;
pub mod table;
pub mod volumes;
pub mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken as CancelToken;

pub use objects::Objects;
pub use store::{Store, StoreConfig};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    #[error("cannot create the data dir {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS configuration is invalid")]
    Tls(#[source] rustls::Error),
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
        }
    }
}

/// The API server: store, HTTP routes, garbage collector.
pub struct Server {
    state: Arc<routes::ApiState>,
    credentials: pki::Credentials,
    data_dir: PathBuf,
}

/// The Kubernetes version this server reports (kubectl's dispatcher picks its binary by it).
pub const GIT_VERSION: &str = "v1.33.0+virtplug";

impl Server {
    /// Opens the store in the data dir, creates credentials on first start, makes sure the
    /// `default` namespace exists and starts the garbage collector.
    ///
    /// # Errors
    /// When the data dir, store or credentials cannot be created or read.
    pub async fn open(config: &Config, listen: Option<SocketAddr>) -> Result<Server, ServerError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServerError::DataDir { path: config.data_dir.clone(), source })?;
        let store = Store::open(&config.data_dir.join("store.db"), &config.store)?;
        let credentials = pki::ensure(&config.data_dir.join("pki"), listen.map(|a| a.ip()))?;
        let objects = Objects { store, enforce_invariants: config.enforce_invariants };
        let nsdef = registry::find("", "v1", "namespaces");
        for (ns, nsdef) in ["default", "kube-system"].into_iter().filter_map(|ns| nsdef.map(|d| (ns, d))) {
            if objects.store.get(&nsdef.key(None, ns)).is_none() {
                let _ = objects.create(nsdef, None, json!({"metadata": {"name": ns}}), false).await;
            }
        }
        tokio::spawn(gc::run(objects.clone()));
        let state = Arc::new(routes::ApiState {
            objects,
            body_limit: config.body_limit,
            git_version: GIT_VERSION.to_owned(),
            metrics: config.metrics.clone(),
        });
        Ok(Server { state, credentials, data_dir: config.data_dir.clone() })
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
        Router::new().fallback(routes::dispatch).with_state(Arc::clone(&self.state))
    }

    /// Routes that require the bearer token, except `/healthz`, `/readyz`, `/livez`, `/version`.
    pub fn router(&self) -> Router {
        let token = Arc::new(format!("Bearer {}", self.credentials.token));
        self.local_router().layer(middleware::from_fn(move |req: Request, next: Next| {
            let token = Arc::clone(&token);
            async move { authenticate(&token, req, next).await }
        }))
    }

    /// Writes `DATA_DIR/kubeconfig` for `server_url` (atomically) and returns its path.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write_kubeconfig(&self, server_url: &str) -> Result<PathBuf, ServerError> {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.credentials.ca_pem.as_bytes());
        let doc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: virtplug\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {ca}\n\
             users:\n- name: virtplug-admin\n  user:\n    token: {}\ncontexts:\n- name: virtplug\n  context:\n    cluster: virtplug\n    user: virtplug-admin\n    namespace: default\n\
             current-context: virtplug\n",
            self.credentials.token
        );
        let path = self.data_dir.join("kubeconfig");
        pki::write_atomic(&path, doc.as_bytes(), 0o600)?;
        Ok(path)
    }

    /// Serves HTTPS on `listener` until `shutdown` fires; open connections are then dropped.
    ///
    /// # Errors
    /// When the TLS configuration cannot be built from the credentials.
    pub async fn serve_tls(&self, listener: TcpListener, shutdown: CancelToken) -> Result<(), ServerError> {
        let tls = self.tls_config()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let app = self.router();
        loop {
            let (tcp, _) = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let app = app.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else { return };
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let builder = auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = conn => {}
                    () = shutdown.cancelled() => {}
                }
            });
        }
    }

    fn tls_config(&self) -> Result<rustls::ServerConfig, ServerError> {
        let certs: Vec<_> = rustls_pemfile::certs(&mut self.credentials.cert_pem.as_bytes()).filter_map(Result::ok).collect();
        let key = rustls_pemfile::private_key(&mut self.credentials.key_pem.as_bytes())
            .ok()
            .flatten()
            .ok_or(ServerError::Tls(rustls::Error::General("the server key in the data dir cannot be read".into())))?;
        let mut cfg = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).map_err(ServerError::Tls)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

async fn authenticate(token: &str, req: Request, next: Next) -> Response {
    let public = matches!(req.uri().path(), "/healthz" | "/readyz" | "/livez" | "/version" | "/version/");
    let ok = req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(token);
    if public || ok {
        next.run(req).await
    } else {
        status::ApiError::unauthorized().into_response()
    }
}
