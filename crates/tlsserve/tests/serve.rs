//! The listener on loopback with a real TLS client: a certificate issued for other names by the
//! API server's CA is trusted through that CA, ALPN picks the protocol, and a connection over
//! the cap gets the service's own refusal, and a connection whose request was answered before
//! its body was read stays usable.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(10);

/// A server for `name` whose certificate `issue_serving_cert` signed with the CA `ensure` made;
/// returns its address, the CA and the shutdown token.
async fn start(
    name: &str,
    limits: tlsserve::Limits,
    refusal: tlsserve::Refusal,
) -> (std::net::SocketAddr, String, CancellationToken, tempfile::TempDir) {
    let t = tempfile::tempdir().unwrap();
    let creds = tlsserve::pki::ensure(&t.path().join("pki"), None).unwrap();
    let (crt, key) = tlsserve::pki::issue_serving_cert(&t.path().join("pki"), &t.path().join("other"), &[name.to_owned()]).unwrap();
    let tls = Arc::new(tlsserve::server_config(&crt, &key).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    // `/refuse` answers a POST without reading its body (as a 401 or 405 does).
    let app = Router::new().route("/", get(|| async { "hello" })).route("/refuse", post(|| async { http::StatusCode::METHOD_NOT_ALLOWED }));
    tokio::spawn(tlsserve::serve_with_refusal(listener, app, tls, limits, shutdown.clone(), refusal));
    (addr, creds.ca_pem, shutdown, t)
}

async fn connect(addr: std::net::SocketAddr, ca_pem: &str, name: &str, alpn: &[&[u8]]) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    tokio::time::timeout(DEADLINE, TlsConnector::from(Arc::new(cfg)).connect(name, tcp)).await.expect("TLS handshake within 10 s")
}

/// GET / over HTTP/1.1 on `s`; the whole response as text.
async fn get_root(mut s: TlsStream<TcpStream>) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    // The server closes after the response (Connection: close); a TLS close without notify is fine.
    let _ = tokio::time::timeout(DEADLINE, s.read_to_end(&mut out)).await.expect("the response within 10 s");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_certificate_for_other_names_is_trusted_through_the_api_servers_ca() {
    let (addr, ca, shutdown, _t) = start("bmc.virtplug.test", tlsserve::Limits::default(), tlsserve::Refusal::default()).await;
    let resp = get_root(connect(addr, &ca, "bmc.virtplug.test", &[b"http/1.1"]).await.unwrap()).await;
    assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("hello"), "{resp}");
    // The certificate names only the names it was issued for.
    let wrong = connect(addr, &ca, "localhost", &[]).await;
    assert!(wrong.is_err(), "a name the certificate does not cover was accepted");
    // ALPN: a client offering h2 gets HTTP/2.
    let h2 = connect(addr, &ca, "bmc.virtplug.test", &[b"h2", b"http/1.1"]).await.unwrap();
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    shutdown.cancel();
}

#[tokio::test]
async fn over_the_cap_a_client_gets_the_services_refusal_with_retry_after() {
    let limits = tlsserve::Limits { max_connections: Some(1), ..tlsserve::Limits::default() };
    let refusal = tlsserve::Refusal::new(|max| (http::StatusCode::SERVICE_UNAVAILABLE, format!("busy: {max} connections")).into_response());
    let (addr, ca, shutdown, _t) = start("bmc.virtplug.test", limits, refusal).await;
    // The one slot: held by a connection that completed its handshake (so it was accepted).
    let held = connect(addr, &ca, "bmc.virtplug.test", &[b"http/1.1"]).await.unwrap();
    let resp = get_root(connect(addr, &ca, "bmc.virtplug.test", &[b"http/1.1"]).await.unwrap()).await;
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(resp.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{resp}");
    assert!(resp.ends_with("busy: 1 connections"), "{resp}");
    // Once the slot is free again, requests are served.
    drop(held);
    let served = async {
        loop {
            let r = get_root(connect(addr, &ca, "bmc.virtplug.test", &[b"http/1.1"]).await.unwrap()).await;
            if r.starts_with("HTTP/1.1 200") {
                return r;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(DEADLINE, served).await.expect("a request served within 10 s of the slot being freed");
    shutdown.cancel();
}

/// Reads from `s` until `text` has arrived; everything read.
async fn read_until(s: &mut TlsStream<TcpStream>, text: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0_u8; 4096];
    let read = async {
        while !String::from_utf8_lossy(&out).contains(text) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed before {text:?}: {}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(DEADLINE, read).await.unwrap_or_else(|_| panic!("{text:?} within 10 s"));
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_request_answered_before_its_body_was_read_leaves_the_connection_usable() {
    let (addr, ca, shutdown, _t) = start("bmc.virtplug.test", tlsserve::Limits::default(), tlsserve::Refusal::default()).await;
    let mut s = connect(addr, &ca, "bmc.virtplug.test", &[b"http/1.1"]).await.unwrap();
    // The head first; the body only once the refusal has come back (a client's body can trail
    // its head): the server must still take it and keep the connection for the next request.
    s.write_all(b"POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n").await.unwrap();
    let refused = read_until(&mut s, "\r\n\r\n").await;
    assert!(refused.starts_with("HTTP/1.1 405"), "{refused}");
    assert!(!refused.to_ascii_lowercase().contains("connection: close"), "{refused}");
    s.write_all(b"{}").await.unwrap();
    let next = get_root(s).await;
    assert!(next.starts_with("HTTP/1.1 200") && next.ends_with("hello"), "the next request on the connection: {next:?}");
    // A body bigger than what is read after a response still ends the connection.
    let mut s = connect(addr, &ca, "bmc.virtplug.test", &[b"http/1.1"]).await.unwrap();
    let big = tlsserve::DRAIN_LIMIT + 1;
    s.write_all(format!("POST /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: {big}\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, s.read_to_end(&mut out)).await.expect("closed within 10 s");
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 405"), "{}", String::from_utf8_lossy(&out));
    shutdown.cancel();
}

#[test]
fn a_user_given_pair_that_does_not_match_is_refused_naming_the_files() {
    let t = tempfile::tempdir().unwrap();
    let (crt_a, _) = tlsserve::pki::issue_serving_cert(&t.path().join("ca"), &t.path().join("a"), &["a.test".to_owned()]).unwrap();
    let (_, key_b) = tlsserve::pki::issue_serving_cert(&t.path().join("ca"), &t.path().join("b"), &["b.test".to_owned()]).unwrap();
    let (crt, key) = (t.path().join("tls.crt"), t.path().join("tls.key"));
    std::fs::write(&crt, &crt_a).unwrap();
    std::fs::write(&key, &key_b).unwrap();
    let e = tlsserve::load_server_config(&crt, &key).unwrap_err();
    assert!(matches!(e, tlsserve::TlsError::Invalid(_)), "{e}");
    std::fs::write(&key, "not a key").unwrap();
    let e = tlsserve::load_server_config(&crt, &key).unwrap_err().to_string();
    assert!(e.contains("tls.key (--tls-key) holds no PEM private key"), "{e}");
    let e = tlsserve::load_server_config(&t.path().join("missing.crt"), &key).unwrap_err().to_string();
    assert!(e.contains("missing.crt"), "{e}");
}
