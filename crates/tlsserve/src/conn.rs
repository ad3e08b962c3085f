//! The HTTPS listener's connections: what a client without credentials can make the server hold.
//!
//! Anyone who reaches the port can open connections, and a connection is anonymous until one of
//! its requests carries credentials. So every stage before that is bounded, in time and in number:
//!
//! | what | bound | default | kube-apiserver |
//! |---|---|---|---|
//! | open connections | [`Limits::max_connections`] | half the open-files limit, 64..=16384 | none |
//! | beyond that | [`REFUSALS`] at a time get an HTTP 503 (with `Retry-After`) within [`REFUSAL_TIMEOUT`]; the rest are closed at once | 64, 2 s | — |
//! | TLS handshake | [`Limits::tls_handshake_timeout`] | 10 s | 32 s (its header timeout) |
//! | HTTP/1 request head (and the wait for the next request on a kept-alive connection) | [`Limits::header_read_timeout`] | 32 s | `ReadHeaderTimeout` 32 s |
//! | no request in flight | [`Limits::idle_timeout`] | 90 s | `IdleTimeout` 90 s |
//! | HTTP/1 buffered head | [`MAX_H1_BUF`] | 64 KiB | 1 MiB |
//! | HTTP/2 header list | hyper's | 16 KiB | 1 MiB |
//! | HTTP/2 dead peer | ping every [`H2_PING_EVERY`], closed without an answer in [`H2_PING_TIMEOUT`] | 30 s, 20 s | — |
//!
//! A connection upgraded by its service (HTTP/1.1 `101 Switching Protocols`) leaves the listener:
//! it is no longer counted, timed out or closed at shutdown here; the service owns it.
//!
//! Request bodies are bounded by the service served (the API server's `Config::body_limit`), and
//! so is authentication: the service should answer a request without credentials before reading
//! its body (the API server's `authenticate` does).
//!
//! A body the service answered without reading to its end (a 401, 404 or 405 sent before it)
//! is read after the response, up to [`DRAIN_LIMIT`] bytes within [`DRAIN_TIMEOUT`], and
//! dropped ([`drain`]): hyper closes an HTTP/1 connection whose request body was left unread, and
//! a keep-alive client that has already sent its next request on it meets a reset instead of an
//! answer (DMTF's protocol validator: the POST after a refused PATCH on the Redfish service
//! root). A bigger or slower body still closes the connection.
//!
//! # Accept errors
//! When the process runs out of file descriptors `accept` fails (EMFILE) while the connection
//! stays queued, so retrying at once spins a core. Failed accepts are retried after a delay that
//! doubles from [`ACCEPT_BACKOFF_MIN`] to [`ACCEPT_BACKOFF_MAX`]; a burst is logged once when it
//! starts and once when accepting works again.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

/// How many refused connections are answered at once; more are closed without a word.
pub const REFUSALS: usize = 64;
/// How long answering a refused connection may take (handshake, request, 503).
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest HTTP/1 read buffer (so the largest request head).
pub const MAX_H1_BUF: usize = 64 * 1024;
/// HTTP/2 keep-alive: ping interval, and how long an answer may take.
pub const H2_PING_EVERY: Duration = Duration::from_secs(30);
/// See [`H2_PING_EVERY`].
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);
/// The most of an unread request body read after its response to keep the connection ([`drain`]).
pub const DRAIN_LIMIT: usize = 64 * 1024;
/// How long that read may take.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Delays between failed accepts.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// See [`ACCEPT_BACKOFF_MIN`].
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one "refusing connections" warning per this period.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Connection limits and timeouts (see the module docs for what each bounds).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most connections served at once; `None`: half the soft open-files limit (after
    /// [`raise_nofile_limit`]), at least 64 and at most 16384.
    pub max_connections: Option<usize>,
    /// How long a client may take to complete the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// How long an HTTP/1 client may take to send a request head (also the longest wait for the
    /// next request on a kept-alive connection).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/2: GOAWAY).
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: None,
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
        }
    }
}

/// Raises the soft open-files limit to the hard limit (each connection costs a descriptor) and
/// returns the soft limit in force (`None`: unlimited).
#[must_use]
pub fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    if let Some(max) = lim.maximum {
        if lim.current.is_some_and(|cur| cur < max) {
            match setrlimit(Resource::Nofile, Rlimit { current: Some(max), maximum: Some(max) }) {
                Ok(()) => return Some(max),
                Err(e) => tracing::warn!("cannot raise the open-files limit from {:?} to {max}: {e}", lim.current),
            }
        }
    }
    lim.current
}

/// The default connection cap for a soft open-files limit: half of it, leaving the other half to
/// the store, QEMU's sockets and the node agent's volumes.
#[must_use]
pub fn default_max_connections(nofile: Option<u64>) -> usize {
    nofile.map_or(16_384, |n| usize::try_from(n / 2).unwrap_or(16_384).clamp(64, 16_384))
}

/// What a connection beyond [`Limits::max_connections`] is answered: a response for the cap in
/// force (the listener adds `Retry-After: 1`). The default is a plain-text 503; a service with
/// its own error format (Kubernetes `Status`, Redfish error) gives its own.
#[derive(Clone)]
pub struct Refusal(Arc<dyn Fn(usize) -> Response + Send + Sync>);

impl Refusal {
    /// A refusal answered by `answer(max_connections)`.
    pub fn new(answer: impl Fn(usize) -> Response + Send + Sync + 'static) -> Self {
        Refusal(Arc::new(answer))
    }

    fn answer(&self, max: usize) -> Response {
        let mut resp = (self.0)(max);
        resp.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
        resp
    }
}

impl Default for Refusal {
    fn default() -> Self {
        Refusal::new(|max| {
            let message = format!("the server is serving its maximum of {max} connections (--max-connections); retry later\n");
            (http::StatusCode::SERVICE_UNAVAILABLE, [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response()
        })
    }
}

impl fmt::Debug for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Refusal")
    }
}

/// The client certificate chain of the connection a request came on (leaf first), verified
/// against the client CA of [`crate::server_config_with_client_ca`]; absent when the client
/// presented none.
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<Vec<rustls::pki_types::CertificateDer<'static>>>);

/// Serves `service` (an [`axum::Router`], or any tower service of the same shape) over TLS on
/// `listener` until `shutdown` fires, within `limits`; connections over the cap get the default
/// [`Refusal`]. See [`serve_with_refusal`].
pub fn serve<S>(
    listener: TcpListener,
    service: S,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send
where
    S: Service<http::Request<Body>, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    serve_with_refusal(listener, service, tls, limits, shutdown, Refusal::default())
}

/// Serves `service` over TLS on `listener` until `shutdown` fires, within `limits` (see the
/// module docs); connections over the cap are answered by `refusal`.
///
/// # Guarantees
/// The process's soft open-files limit is raised to its hard limit first ([`raise_nofile_limit`]).
/// The protocol is the one the client chose by ALPN (`tls` should offer `h2` and `http/1.1`, as
/// [`crate::server_config`] does), else whatever the client speaks. When `shutdown` fires the
/// future returns and open connections are dropped. Failed accepts are retried with backoff
/// (see the module docs); a failed connection is dropped without affecting the others.
pub async fn serve_with_refusal<S>(
    listener: TcpListener,
    service: S,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    shutdown: CancellationToken,
    refusal: Refusal,
) where
    S: Service<http::Request<Body>, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    let acceptor = TlsAcceptor::from(tls);
    let nofile = raise_nofile_limit();
    let max = limits.max_connections.unwrap_or_else(|| default_max_connections(nofile));
    if nofile.is_some_and(|n| u64::try_from(max).unwrap_or(u64::MAX) >= n) {
        tracing::warn!(
            "--max-connections {max} is not below the open-files limit {nofile:?}: accepts will fail (and back off) before the cap refuses"
        );
    }
    tracing::info!(
        "serving at most {max} connections (TLS handshake within {:?}, request head within {:?}, idle for {:?})",
        limits.tls_handshake_timeout,
        limits.header_read_timeout,
        limits.idle_timeout
    );
    let slots = Arc::new(Semaphore::new(max));
    let refusals = Arc::new(Semaphore::new(REFUSALS));
    let limits = Arc::new(limits);
    let mut backoff = AcceptBackoff::default();
    let mut refused = RefusalLog::default();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => {
                backoff.succeeded();
                tcp
            }
            Err(e) => {
                let delay = backoff.failed(&e);
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let _ = tcp.set_nodelay(true);
        if let Ok(permit) = Arc::clone(&slots).try_acquire_owned() {
            tokio::spawn(serve_one(tcp, acceptor.clone(), service.clone(), Arc::clone(&limits), shutdown.clone(), permit));
            continue;
        }
        refused.note(max);
        if let Ok(permit) = Arc::clone(&refusals).try_acquire_owned() {
            tokio::spawn(refuse(tcp, acceptor.clone(), refusal.clone(), max, permit));
        }
        // Else `tcp` is dropped here: closed at once.
    }
}

/// One connection: handshake, then HTTP until it closes, idles out or the server stops.
async fn serve_one<S>(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    service: S,
    limits: Arc<Limits>,
    shutdown: CancellationToken,
    _slot: OwnedSemaphorePermit,
) where
    S: Service<http::Request<Body>, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    // Not TLS, a failed handshake, or too slow: nothing was served, nothing to report.
    let Ok(Ok(stream)) = tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(tcp)).await else { return };
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    // Only a configuration with a client verifier (`crate::server_config_with_client_ca`) lets
    // a client present certificates; they were verified during the handshake.
    let peer = stream
        .get_ref()
        .1
        .peer_certificates()
        .filter(|c| !c.is_empty())
        .map(|c| PeerCertificates(Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())));
    let activity = Arc::new(Activity::default());
    let svc = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let guard = activity.begin();
            let service = service.clone();
            let (parts, incoming) = req.into_parts();
            let held = Arc::new(Mutex::new(incoming));
            let mut req = http::Request::from_parts(parts, Body::new(Held(Arc::clone(&held))));
            if let Some(p) = &peer {
                req.extensions_mut().insert(p.clone());
            }
            async move {
                let resp = service.oneshot(req).await?;
                drain(held);
                // The request counts as in flight until its response body is done (a watch).
                Ok::<_, Infallible>(resp.map(|b| {
                    Body::new(b.map_frame(move |f| {
                        let _ = &guard;
                        f
                    }))
                }))
            }
        })
    };
    let builder = builder(&limits, alpn.as_deref());
    // With upgrades: an HTTP/1.1 request answered 101 (a websocket, the node tunnel) takes the
    // connection over; the upgraded connection then lives in the service's task, outside these
    // limits (the service bounds its own streams), and no longer holds a connection slot.
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = shutdown.cancelled() => return,
        () = activity.idle_for(limits.idle_timeout) => {}
    }
    // Idle: say goodbye (HTTP/2 GOAWAY; HTTP/1 closes), but do not wait on the peer for long.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
}

/// A request's body as the service reads it, while the connection keeps a hold on it: what the
/// service leaves unread is [`drain`]ed.
struct Held(Arc<Mutex<Incoming>>);

impl Held {
    fn body(&self) -> std::sync::MutexGuard<'_, Incoming> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl hyper::body::Body for Held {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut *self.body()).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body().is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body().size_hint()
    }
}

/// After the response: reads what the service left of the request's body, if anything and if the
/// service let go of it, in a task of its own (the response is not held back), at most
/// [`DRAIN_LIMIT`] bytes within [`DRAIN_TIMEOUT`]; past either it is dropped and hyper closes
/// the connection. Nothing to do (no spawn) for a body read to its end or none, every request
/// but an early refusal of a write.
fn drain(held: Arc<Mutex<Incoming>>) {
    let Ok(body) = Arc::try_unwrap(held).map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner)) else {
        return; // the service still reads it (a response streaming from its request)
    };
    if body.is_end_stream() || body.size_hint().lower() > DRAIN_LIMIT as u64 {
        return;
    }
    tokio::spawn(async move {
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, http_body_util::Limited::new(body, DRAIN_LIMIT).collect()).await;
    });
}

/// HTTP/1 and HTTP/2 settings; the protocol the client chose by ALPN, else either.
fn builder(limits: &Limits, alpn: Option<&[u8]>) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_buf_size(MAX_H1_BUF);
    b.http2().timer(TokioTimer::new()).keep_alive_interval(H2_PING_EVERY).keep_alive_timeout(H2_PING_TIMEOUT);
    match alpn {
        Some(b"h2") => b.http2_only(),
        Some(b"http/1.1") => b.http1_only(),
        _ => b,
    }
}

/// A connection over the cap: the refusal (a 503 with `Retry-After`), within [`REFUSAL_TIMEOUT`].
async fn refuse(tcp: TcpStream, acceptor: TlsAcceptor, refusal: Refusal, max: usize, _permit: OwnedSemaphorePermit) {
    let answer = async {
        let Ok(stream) = acceptor.accept(tcp).await else { return };
        let svc = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
            let resp = refusal.answer(max);
            async move { Ok::<_, Infallible>(resp) }
        });
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1().keep_alive(false);
        let _ = b.serve_connection(TokioIo::new(stream), svc).await;
    };
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, answer).await;
}

/// Requests in flight on one connection.
#[derive(Default)]
struct Activity {
    in_flight: watch::Sender<usize>,
}

/// One request in flight; dropping it ends it.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Activity {
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.send_modify(|n| *n += 1);
        InFlight(Arc::clone(self))
    }

    /// Resolves once no request has been in flight for `idle`.
    async fn idle_for(&self, idle: Duration) {
        let mut rx = self.in_flight.subscribe();
        loop {
            // The sender lives in `self`: neither wait can fail while we hold it.
            if rx.wait_for(|n| *n == 0).await.is_err() {
                return;
            }
            if tokio::time::timeout(idle, rx.changed()).await.is_err() {
                return;
            }
        }
    }
}

/// Capped exponential backoff between failed accepts, logged once per burst.
#[derive(Default)]
struct AcceptBackoff {
    failures: u64,
    delay: Duration,
    since: Option<Instant>,
}

impl AcceptBackoff {
    fn failed(&mut self, e: &std::io::Error) -> Duration {
        if self.failures == 0 {
            let hint = match e.raw_os_error() {
                Some(code) if code == rustix::io::Errno::MFILE.raw_os_error() || code == rustix::io::Errno::NFILE.raw_os_error() => {
                    " (out of file descriptors: raise the open-files limit, e.g. LimitNOFILE= or ulimit -n, or lower --max-connections)"
                }
                _ => "",
            };
            tracing::warn!("accepting a connection failed: {e}{hint}; retrying with backoff up to {ACCEPT_BACKOFF_MAX:?}");
            self.since = Some(Instant::now());
            self.delay = ACCEPT_BACKOFF_MIN;
        }
        self.failures += 1;
        let d = self.delay;
        self.delay = (self.delay * 2).min(ACCEPT_BACKOFF_MAX);
        d
    }

    fn succeeded(&mut self) {
        if self.failures > 0 {
            let took = self.since.map(|s| s.elapsed()).unwrap_or_default();
            tracing::info!("accepting connections again after {} failed accepts over {took:?}", self.failures);
        }
        *self = AcceptBackoff::default();
    }
}

/// Counts refused connections; warns at most every [`REFUSAL_LOG_EVERY`].
#[derive(Default)]
struct RefusalLog {
    count: u64,
    last: Option<Instant>,
}

impl RefusalLog {
    fn note(&mut self, max: usize) {
        self.count += 1;
        if self.last.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
            tracing::warn!(
                "refused {} connection(s): {max} are open, the maximum (--max-connections; idle ones close after the timeouts)",
                self.count
            );
            self.count = 0;
            self.last = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_is_half_the_descriptors_within_bounds() {
        assert_eq!(default_max_connections(Some(20_000)), 10_000);
        assert_eq!(default_max_connections(Some(100)), 64);
        assert_eq!(default_max_connections(Some(1 << 20)), 16_384);
        assert_eq!(default_max_connections(None), 16_384);
    }

    #[test]
    fn accept_backoff_doubles_to_its_cap_and_resets() {
        let mut b = AcceptBackoff::default();
        let e = std::io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        let delays: Vec<Duration> = (0..10).map(|_| b.failed(&e)).collect();
        assert_eq!(delays[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(delays[1], ACCEPT_BACKOFF_MIN * 2);
        assert_eq!(delays[9], ACCEPT_BACKOFF_MAX);
        b.succeeded();
        assert_eq!(b.failed(&e), ACCEPT_BACKOFF_MIN);
    }

    #[tokio::test]
    async fn a_connection_is_idle_only_without_requests_in_flight() {
        let a = Arc::new(Activity::default());
        let idle = Duration::from_millis(50);
        let guard = a.begin();
        let waiter = {
            let a = Arc::clone(&a);
            tokio::spawn(async move { a.idle_for(idle).await })
        };
        // A request in flight (a long watch) for several idle periods keeps the connection.
        tokio::time::sleep(idle * 4).await;
        assert!(!waiter.is_finished(), "idle while a request was in flight");
        let released = Instant::now();
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("idle within 5 s of the last request").ok();
        assert!(released.elapsed() >= idle, "idle only a full period after the last request");
    }
}
