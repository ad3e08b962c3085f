//! Upgraded connections on the server side: the websocket handshake of KubeVirt's console and
//! VNC subresources (RFC 6455, subprotocol [`api::tunnel::PLAIN_SUBPROTOCOL`]), raw upgrades
//! (the node tunnel), and [`pump`], which carries bytes between a websocket and a byte stream.
//!
//! # Caveats
//! Only HTTP/1.1 upgrades (`Connection: Upgrade`): an HTTP/2 request has no connection to hand
//! over and is refused with 400. Every client KubeVirt users use (virtctl, websocket-client,
//! browsers for noVNC) speaks HTTP/1.1 for websockets.

use std::time::Duration;

use axum::body::Body;
use axum::http::request::Parts;
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION, UPGRADE};
use http::{HeaderMap, HeaderValue, StatusCode};
use hyper::upgrade::OnUpgrade;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::status::ApiError;

/// How often [`pump`] pings the websocket's peer (keeps proxies and client read timeouts from
/// closing an idle console; KubeVirt's virt-api pings too).
pub const PING_EVERY: Duration = Duration::from_secs(20);

/// Largest websocket message accepted from a client.
const MAX_MESSAGE: usize = 1 << 20;

/// Whether the request asks to upgrade to `token` (`Connection: upgrade` among its tokens,
/// `Upgrade: token`, both case-insensitive).
#[must_use]
pub fn asks_upgrade(headers: &HeaderMap, token: &str) -> bool {
    let has = |name, want: &str| {
        headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|t| t.trim().eq_ignore_ascii_case(want))
    };
    has(CONNECTION, "upgrade") && has(UPGRADE, token)
}

/// A checked websocket handshake request: what the 101 answer needs.
#[derive(Debug)]
pub struct Handshake {
    accept: String,
    protocol: Option<&'static str>,
}

impl Handshake {
    /// Checks a websocket handshake. `protocol` is chosen when the client offers it; a client
    /// that offers none gets none (gorilla's `Upgrader`, which virt-api uses, does the same).
    ///
    /// # Errors
    /// 400 naming what is missing.
    pub fn check(headers: &HeaderMap, what: &str, protocol: &'static str) -> Result<Handshake, ApiError> {
        if !asks_upgrade(headers, "websocket") {
            return Err(ApiError::bad_request(format!(
                "{what} is a websocket: send the request with `Connection: Upgrade` and `Upgrade: websocket` (e.g. `virtplug vm console`, `virtctl console`)"
            )));
        }
        if headers.get(SEC_WEBSOCKET_VERSION).map(HeaderValue::as_bytes) != Some(b"13") {
            return Err(ApiError::bad_request("websocket: Sec-WebSocket-Version must be 13"));
        }
        let Some(key) = headers.get(SEC_WEBSOCKET_KEY) else {
            return Err(ApiError::bad_request("websocket: the Sec-WebSocket-Key header is missing"));
        };
        let offered = headers.get_all(SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(','));
        let chosen = offered.map(str::trim).any(|p| p == protocol).then_some(protocol);
        Ok(Handshake { accept: derive_accept_key(key.as_bytes()), protocol: chosen })
    }

    /// The 101 answer.
    #[must_use]
    pub fn response(&self) -> Response {
        let mut r = switching("websocket");
        if let Ok(v) = HeaderValue::from_str(&self.accept) {
            r.headers_mut().insert(SEC_WEBSOCKET_ACCEPT, v);
        }
        if let Some(p) = self.protocol {
            r.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
        }
        r
    }
}

/// A 101 Switching Protocols answer to `Upgrade: token`.
#[must_use]
pub fn switching(token: &'static str) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    r.headers_mut().insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    r.headers_mut().insert(UPGRADE, HeaderValue::from_static(token));
    r
}

/// The request's pending upgrade: hyper hands the connection over once the 101 answer is sent.
///
/// # Errors
/// 400 when the request came without a connection to take over (HTTP/2, or an in-process call).
pub fn take_upgrade(parts: &mut Parts) -> Result<OnUpgrade, ApiError> {
    parts.extensions.remove::<OnUpgrade>().ok_or_else(|| {
        ApiError::bad_request(
            "this request cannot be upgraded: connect over HTTP/1.1 (websocket and tunnel requests need their own connection)",
        )
    })
}

/// The server's end of a websocket over a connection hyper handed over.
pub async fn server_end(up: hyper::upgrade::Upgraded) -> WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>> {
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default().max_message_size(Some(MAX_MESSAGE));
    WebSocketStream::from_raw_socket(hyper_util::rt::TokioIo::new(up), tokio_tungstenite::tungstenite::protocol::Role::Server, Some(config))
        .await
}

/// Why [`pump`] ended.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("the websocket failed")]
    Websocket(#[source] tokio_tungstenite::tungstenite::Error),
    #[error("the byte stream failed")]
    Io(#[source] std::io::Error),
}

/// Carries bytes between a websocket and a byte stream until either side ends: each binary (or
/// text) message's payload is written to `io`, and what `io` gives is sent as binary messages
/// (KubeVirt's `plain.kubevirt.io`). With `ping_every`, the websocket's peer is pinged that often.
///
/// When one side ends (close message, EOF, error) the other is dropped: a console has no
/// half-closed state worth keeping. A websocket close is sent when `io` ends first.
///
/// # Errors
/// The side that failed; a clean end (close or EOF) is `Ok`.
pub async fn pump<S, IO>(ws: WebSocketStream<S>, io: IO, ping_every: Option<Duration>) -> Result<(), PumpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    IO: AsyncRead + AsyncWrite,
{
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(io);
    let inbound = async {
        while let Some(m) = stream.next().await {
            match m.map_err(PumpError::Websocket)? {
                Message::Binary(b) => wr.write_all(&b).await.map_err(PumpError::Io)?,
                Message::Text(t) => wr.write_all(t.as_bytes()).await.map_err(PumpError::Io)?,
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
        Ok(())
    };
    let outbound = async {
        let mut buf = vec![0u8; 32 * 1024];
        // Without `ping_every` the ticker exists but is never polled (the branch is disabled).
        let mut ping = tokio::time::interval(ping_every.unwrap_or(PING_EVERY));
        ping.reset();
        loop {
            tokio::select! {
                n = rd.read(&mut buf) => {
                    let n = n.map_err(PumpError::Io)?;
                    if n == 0 {
                        // Best effort: the peer may be gone already.
                        let _ = sink.send(Message::Close(None)).await;
                        return Ok(());
                    }
                    sink.send(Message::binary(buf[..n].to_vec())).await.map_err(PumpError::Websocket)?;
                }
                _ = ping.tick(), if ping_every.is_some() => {
                    sink.send(Message::Ping(Vec::new().into())).await.map_err(PumpError::Websocket)?;
                }
            }
        }
    };
    tokio::select! {
        r = inbound => r,
        r = outbound => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// RFC 6455 section 1.3's example key and answer; the subprotocol is chosen only if offered.
    #[test]
    fn the_handshake_answers_the_rfc_example_and_picks_the_offered_subprotocol() {
        let base = [
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "WebSocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ];
        let h = Handshake::check(&headers(&base), "console", "plain.kubevirt.io").unwrap();
        let r = h.response();
        assert_eq!(r.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(r.headers()[SEC_WEBSOCKET_ACCEPT], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert!(r.headers().get(SEC_WEBSOCKET_PROTOCOL).is_none(), "nothing offered, nothing chosen");
        let mut offered = base.to_vec();
        offered.push(("sec-websocket-protocol", "other, plain.kubevirt.io"));
        let r = Handshake::check(&headers(&offered), "console", "plain.kubevirt.io").unwrap().response();
        assert_eq!(r.headers()[SEC_WEBSOCKET_PROTOCOL], "plain.kubevirt.io");
    }

    #[test]
    fn a_request_that_is_not_a_websocket_handshake_is_400_saying_what_is_missing() {
        for (h, want) in [
            (headers(&[]), "Upgrade: websocket"),
            (headers(&[("connection", "upgrade"), ("upgrade", "websocket")]), "Sec-WebSocket-Version"),
            (headers(&[("connection", "upgrade"), ("upgrade", "websocket"), ("sec-websocket-version", "13")]), "Sec-WebSocket-Key"),
        ] {
            let e = Handshake::check(&h, "console", "plain.kubevirt.io").unwrap_err();
            assert_eq!(e.code, 400);
            assert!(e.message.contains(want), "{}", e.message);
        }
    }

    /// Bytes cross both ways unchanged, and the websocket closes when the byte stream ends.
    #[tokio::test]
    async fn pump_carries_bytes_both_ways_and_closes_at_eof() {
        let (ws_client_io, ws_server_io) = tokio::io::duplex(1024);
        let (io_here, mut io_there) = tokio::io::duplex(1024);
        let server = WebSocketStream::from_raw_socket(ws_server_io, tokio_tungstenite::tungstenite::protocol::Role::Server, None).await;
        let mut client = WebSocketStream::from_raw_socket(ws_client_io, tokio_tungstenite::tungstenite::protocol::Role::Client, None).await;
        let pumping = tokio::spawn(pump(server, io_here, Some(Duration::from_secs(60))));
        client.send(Message::binary(b"in\x00\xff".to_vec())).await.unwrap();
        let mut got = [0u8; 4];
        io_there.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"in\x00\xff");
        io_there.write_all(b"out").await.unwrap();
        assert_eq!(client.next().await.unwrap().unwrap(), Message::binary(b"out".to_vec()));
        drop(io_there);
        assert!(matches!(client.next().await.unwrap().unwrap(), Message::Close(_)));
        pumping.await.unwrap().unwrap();
    }
}
