//! How every virtplug component reaches the API: a `kube::Client` from a kubeconfig, from the
//! in-cluster config, or in-process over the embedded server's router (no socket); the one
//! read-modify-write path, [`update`], and its JSON-patch sibling, [`patch_if`]; the one retry
//! [`backoff`]; [`upgrade`]: upgraded connections (the node tunnel, console and VNC websockets).

pub mod backoff;
pub mod events;
pub mod locks;
pub mod metrics;
pub mod panics;
mod patch_if;
mod update;
pub mod upgrade;

pub use patch_if::{patch_if, patch_if_seen, PatchIfError, PatchIfOptions, Patched};
pub use update::{
    blind_patch, blind_patch_keys, merge_diff, persist, try_update, try_update_status, update, update_from, update_status,
    update_status_from, BeforeWrite, MetaKey, Never, Object, Transient, UpdateError, UpdateOptions, Updated, PERSIST_BACKOFF,
};

use std::path::{Path, PathBuf};

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot read the kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no kubeconfig given and none found (tried $KUBECONFIG, ~/.kube/config and the in-cluster config)")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("cannot build a client")]
    Client(#[source] kube::Error),
    #[error("the user agent {0:?} is not a valid header value")]
    UserAgent(String),
}

/// The `User-Agent` of a virtplug component (`virtplug-controller/0.1.0`): what the API
/// server's audit log tells components apart by, and the default field manager of its writes
/// (the part before `/`, as kube-apiserver takes it).
#[must_use]
pub fn user_agent(component: &str) -> String {
    format!("virtplug-{component}/{}", env!("CARGO_PKG_VERSION"))
}

/// A client from the kubeconfig at `path`, or, without one, from `$KUBECONFIG`,
/// `~/.kube/config` or the in-cluster service account.
///
/// # Errors
/// When the kubeconfig cannot be read or names no usable cluster.
pub async fn connect(path: Option<&Path>) -> Result<kube::Client, ConnectError> {
    kube::Client::try_from(config(path).await?).map_err(ConnectError::Client)
}

/// [`connect`], sending `user_agent` (see [`user_agent`]) with every request.
///
/// # Errors
/// As [`connect`]; and when `user_agent` is not a valid header value.
pub async fn connect_as(path: Option<&Path>, user_agent: &str) -> Result<kube::Client, ConnectError> {
    connect_with(path, user_agent, Retries::Default).await
}

/// Whether a client retries answers that say "later" (429, 503, 504).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retries {
    /// kube-client's default: up to 15 retries with growing delays (minutes in all).
    Default,
    /// None: the answer is the caller's at once. For upgraded connections ([`upgrade`]): a
    /// console whose node is unreachable (503) is reported, not retried for minutes.
    None,
}

/// [`connect_as`] with the given [`Retries`].
///
/// # Errors
/// As [`connect_as`].
pub async fn connect_with(path: Option<&Path>, user_agent: &str, retries: Retries) -> Result<kube::Client, ConnectError> {
    build(config(path).await?, user_agent, retries)
}

/// Where and as whom [`connect_to`] connects instead of the kubeconfig's server and user.
#[derive(Clone, Debug, Default)]
pub struct Elsewhere {
    /// Another server (the kubeconfig's CA still applies unless `roots` is given).
    pub server: Option<http::Uri>,
    /// DER certificates to trust instead of the kubeconfig's CA.
    pub roots: Option<Vec<Vec<u8>>>,
    /// A file holding the bearer token to present instead of the kubeconfig's credentials
    /// (re-read as it changes, as kube-client reads token files).
    pub token_file: Option<PathBuf>,
}

/// [`connect_with`], but to another server or as another bearer token ([`Elsewhere`]): the node
/// agent's tunnel to `virtplug subresources-api` where kube-apiserver does not proxy it, or with
/// a token bound to its node.
///
/// # Errors
/// As [`connect_with`].
pub async fn connect_to(path: Option<&Path>, user_agent: &str, retries: Retries, to: Elsewhere) -> Result<kube::Client, ConnectError> {
    let mut config = config(path).await?;
    if let Some(server) = to.server {
        config.cluster_url = server;
    }
    if to.roots.is_some() {
        config.root_cert = to.roots;
    }
    if let Some(file) = to.token_file {
        // The token alone: no client certificate, basic auth or exec plugin of the kubeconfig.
        config.auth_info = kube::config::AuthInfo { token_file: Some(file.to_string_lossy().into_owned()), ..Default::default() };
    }
    build(config, user_agent, retries)
}

fn build(mut config: kube::Config, user_agent: &str, retries: Retries) -> Result<kube::Client, ConnectError> {
    config.default_retry = retries == Retries::Default;
    let value = http::HeaderValue::from_str(user_agent).map_err(|_| ConnectError::UserAgent(user_agent.to_owned()))?;
    config.headers.push((http::header::USER_AGENT, value));
    kube::Client::try_from(config).map_err(ConnectError::Client)
}

/// The client configuration of [`connect`].
async fn config(path: Option<&Path>) -> Result<kube::Config, ConnectError> {
    let config = match path {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|source| ConnectError::Kubeconfig { path: path.to_owned(), source })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| ConnectError::Kubeconfig { path: path.to_owned(), source })?
        }
        None => kube::Config::infer().await.map_err(ConnectError::Infer)?,
    };
    Ok(config)
}

/// A client that calls `service` (the embedded server's router) directly, in the same process.
pub fn in_process<S, B>(service: S) -> kube::Client
where
    S: tower_service::Service<http::Request<kube::client::Body>, Response = http::Response<B>> + Send + Clone + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    kube::Client::new(service, "default")
}

pub use api::diag::error_chain;
