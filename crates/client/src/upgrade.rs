//! Upgraded connections through the API server: a raw one (`Upgrade: TOKEN`, the node agent's
//! tunnel, [`api::tunnel`]) and a websocket (`virtplug vm console|vnc`, KubeVirt's
//! `plain.kubevirt.io`).
//!
//! Both go through the `kube::Client` of a kubeconfig, with its TLS and credentials, so they work
//! wherever the kubeconfig does. HTTP/1.1 only (kube-client's connector offers nothing else).
//! Use a client without retries ([`crate::Retries::None`]): kube-client's default retries a 503
//! (a node that cannot be reached) for minutes before the caller hears of it.
//! An in-process client (`client::in_process`) cannot upgrade: there is no connection to hand
//! over.
//!
//! # Errors
//! A refusal carries the API's status code and message (a `Status` body, as KubeVirt's virt-api
//! answers before it upgrades: 404 for no VMI, 400 when it is not running, 503 when its node
//! cannot be reached).

use http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION, UPGRADE};
use http::{HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

/// The longest error body read from a refused upgrade.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Why an upgrade did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The API answered with an error instead of upgrading.
    #[error("{path}: {message} ({code})")]
    Refused { path: String, code: u16, message: String },
    /// The request did not reach the API.
    #[error("{path}: the request failed")]
    Transport {
        path: String,
        #[source]
        source: kube::Error,
    },
    /// The API answered 101 but not as the protocol requires.
    #[error("{path}: {what}")]
    Protocol { path: String, what: String },
    /// The connection was not handed over (an in-process client, or a connection that closed).
    #[error("{path}: the connection could not be upgraded (an in-process client cannot upgrade)")]
    Handover {
        path: String,
        #[source]
        source: hyper::Error,
    },
}

impl UpgradeError {
    /// The API's status code for a refusal.
    #[must_use]
    pub fn code(&self) -> Option<u16> {
        match self {
            UpgradeError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// `GET path` with `Upgrade: token`; the upgraded connection on 101.
///
/// # Errors
/// See [`UpgradeError`].
pub async fn raw(client: &kube::Client, path: &str, token: &'static str) -> Result<TokioIo<Upgraded>, UpgradeError> {
    let req = Request::get(path)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, HeaderValue::from_static(token))
        .body(kube::client::Body::empty())
        .map_err(|e| UpgradeError::Protocol { path: path.to_owned(), what: format!("cannot build the request: {e}") })?;
    let res = switch(client, path, req).await?;
    hand_over(path, res).await
}

/// `GET path` as a websocket handshake offering `subprotocol`; the client's end of the websocket.
///
/// # Errors
/// See [`UpgradeError`]; also when the server's `Sec-WebSocket-Accept` is wrong or it chose
/// another subprotocol.
pub async fn websocket(
    client: &kube::Client,
    path: &str,
    subprotocol: &'static str,
) -> Result<WebSocketStream<TokioIo<Upgraded>>, UpgradeError> {
    let key = generate_key();
    let req = Request::get(path)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, "websocket")
        .header(SEC_WEBSOCKET_VERSION, "13")
        .header(SEC_WEBSOCKET_KEY, &key)
        .header(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(subprotocol))
        .body(kube::client::Body::empty())
        .map_err(|e| UpgradeError::Protocol { path: path.to_owned(), what: format!("cannot build the request: {e}") })?;
    let res = switch(client, path, req).await?;
    let header = |name| res.headers().get(name).map(HeaderValue::as_bytes);
    let protocol_error = |what: String| UpgradeError::Protocol { path: path.to_owned(), what };
    if header(SEC_WEBSOCKET_ACCEPT) != Some(derive_accept_key(key.as_bytes()).as_bytes()) {
        return Err(protocol_error("the server's Sec-WebSocket-Accept does not answer our key".to_owned()));
    }
    if header(SEC_WEBSOCKET_PROTOCOL) != Some(subprotocol.as_bytes()) {
        return Err(protocol_error(format!("the server did not choose the subprotocol {subprotocol}")));
    }
    let io = hand_over(path, res).await?;
    Ok(WebSocketStream::from_raw_socket(io, Role::Client, None).await)
}

/// Sends the request; the response if it is 101, the API's refusal otherwise.
async fn switch(
    client: &kube::Client,
    path: &str,
    req: Request<kube::client::Body>,
) -> Result<http::Response<kube::client::Body>, UpgradeError> {
    let res = client.send(req).await.map_err(|source| UpgradeError::Transport { path: path.to_owned(), source })?;
    if res.status() == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(res);
    }
    let code = res.status().as_u16();
    let body = http_body_util::Limited::new(res.into_body(), MAX_ERROR_BODY)
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|s| s.get("message").and_then(serde_json::Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_owned());
    let message = if message.is_empty() { format!("the server answered {code} instead of upgrading") } else { message };
    Err(UpgradeError::Refused { path: path.to_owned(), code, message })
}

async fn hand_over(path: &str, res: http::Response<kube::client::Body>) -> Result<TokioIo<Upgraded>, UpgradeError> {
    hyper::upgrade::on(res).await.map(TokioIo::new).map_err(|source| UpgradeError::Handover { path: path.to_owned(), source })
}
