//! The node agents' tunnels ([`api::tunnel`]): the server's side. Each node agent keeps one
//! control connection here; a console or VNC request asks the agent of the VMI's node for a
//! stream over it, and the agent answers with a stream connection of its own.
//!
//! # Flow
//! 1. `GET .../nodes/NODE/tunnel` (`Upgrade: virtplug-tunnel.v1`): the Node must exist; the
//!    connection becomes NODE's link (a newer one replaces an older one: an agent that restarted
//!    does not wait for its dead connection to time out). The server writes keepalives every
//!    [`api::tunnel::KEEPALIVE`].
//! 2. [`Tunnels::open`]: a random stream id is recorded as pending for NODE and an
//!    [`api::tunnel::Open`] line written on NODE's link.
//! 3. `GET .../nodes/NODE/streams/ID` (`Upgrade: virtplug-stream.v1`) from the agent: accepted
//!    only if ID is pending *for NODE*; its upgraded connection completes step 2. Or the agent
//!    writes a [`api::tunnel::Refused`] line, which fails step 2 with its message.
//!
//! # Guarantees
//! - A stream can only be attached by a caller that read the id from NODE's link: ids are 128
//!   random bits, sent on no other connection, used once.
//! - [`Tunnels::open`] ends within its deadline: no link (no agent connected), refused, or
//!   timed out are errors the console handler answers as 503.
//! - In `virtplug subresources-api` (cluster mode), NODE's link and streams are accepted only
//!   from a credential bound to NODE: exactly one `authentication.kubernetes.io/node-name` user
//!   extra, equal to NODE (`virtapi::nodebound`), so an agent on another node cannot take NODE's
//!   consoles even though the agents' shared role grants every node's tunnel.
//!
//! # Assumptions
//! The caller is authenticated and authorized before [`accept_link`] and [`accept_stream`] run:
//! - in the embedded server by the router's token check: one identity, so "the node agent's
//!   credentials" are the kubeconfig's, and any holder of that token (an administrator) can
//!   open any node's tunnel;
//! - in `virtplug subresources-api` by a SubjectAccessReview for `get` on `nodes/tunnel` or
//!   `nodes/streams` named NODE, then the node binding above. That binding holds only where the
//!   API server puts the node in the token's user info: pod-bound ServiceAccount tokens from
//!   Kubernetes 1.30 on (KEP-4193, `ServiceAccountTokenPodNodeInfo`), and tokens bound to a Node
//!   object. On older clusters the check refuses every agent unless it is turned off
//!   (`--insecure-tunnels-from-any-node`), which leaves RBAC alone: any agent, any node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::request::Parts;
use axum::response::Response;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use api::tunnel::{Open, Refused, ServerLine, StreamKind, KEEPALIVE, MAX_LINE, STREAM_UPGRADE, TUNNEL_UPGRADE};

use crate::call::Call;
use crate::registry;
use crate::status::ApiError;
use crate::subresources::access::ObjectAccess;
use crate::websocket::{asks_upgrade, switching, take_upgrade};

/// How long [`Tunnels::open`] waits for the agent's stream.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// A node's stream, once its agent connected it.
pub type NodeStream = TokioIo<Upgraded>;

/// Why no stream was opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the node agent of node {node} is not connected to the API server (is `virtplug node` running there?)")]
    NoAgent { node: String },
    #[error("the node agent of node {node} refused: {message}")]
    Refused { node: String, message: String },
    #[error("the node agent of node {node} did not open the stream within {timeout:?}")]
    Timeout { node: String, timeout: Duration },
}

/// One node's control connection: where [`Open`] lines go.
struct Link {
    serial: u64,
    tx: mpsc::Sender<Open>,
}

/// A stream asked for and not yet connected.
struct Pending {
    node: String,
    tx: oneshot::Sender<Result<NodeStream, String>>,
}

/// The connected node agents and the streams asked of them.
#[derive(Default)]
pub struct Tunnels {
    links: Mutex<HashMap<String, Link>>,
    pending: Mutex<HashMap<String, Pending>>,
    serials: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves maps that are still consistent (single inserts and
    // removes): keep serving.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Tunnels {
    /// Whether `node`'s agent holds a control connection.
    #[must_use]
    pub fn connected(&self, node: &str) -> bool {
        lock(&self.links).contains_key(node)
    }

    /// Asks `node`'s agent for a stream to `kind` of the VMI `ns/name` (UID `uid`) and waits up
    /// to `timeout` for it.
    ///
    /// # Errors
    /// See [`OpenError`].
    pub async fn open(
        &self,
        node: &str,
        ns: &str,
        name: &str,
        uid: &str,
        kind: StreamKind,
        timeout: Duration,
    ) -> Result<NodeStream, OpenError> {
        let Some(link) = lock(&self.links).get(node).map(|l| l.tx.clone()) else {
            return Err(OpenError::NoAgent { node: node.to_owned() });
        };
        let id = format!("{:032x}", rand::random::<u128>());
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id.clone(), Pending { node: node.to_owned(), tx });
        let open = Open { stream: id.clone(), namespace: ns.to_owned(), name: name.to_owned(), uid: uid.to_owned(), kind };
        let answer = if link.send(open).await.is_err() {
            Err(OpenError::NoAgent { node: node.to_owned() })
        } else {
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(Ok(stream))) => Ok(stream),
                Ok(Ok(Err(message))) => Err(OpenError::Refused { node: node.to_owned(), message }),
                // The pending entry was dropped: its link went away.
                Ok(Err(_)) => Err(OpenError::NoAgent { node: node.to_owned() }),
                Err(_) => Err(OpenError::Timeout { node: node.to_owned(), timeout }),
            }
        };
        lock(&self.pending).remove(&id);
        answer
    }

    /// Takes the pending stream `id` if it was asked of `node`.
    fn claim(&self, node: &str, id: &str) -> Option<oneshot::Sender<Result<NodeStream, String>>> {
        let mut pending = lock(&self.pending);
        if pending.get(id).is_some_and(|p| p.node == node) {
            pending.remove(id).map(|p| p.tx)
        } else {
            None
        }
    }

    /// Serves `node`'s control connection until it ends or a newer one replaces it.
    async fn serve_link(self: Arc<Self>, node: String, io: NodeStream) {
        let serial = self.serials.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::channel::<Open>(64);
        if lock(&self.links).insert(node.clone(), Link { serial, tx }).is_some() {
            tracing::info!(node, "a new tunnel from the node agent replaces its previous one");
        } else {
            tracing::info!(node, "the node agent's tunnel is connected");
        }
        let (rd, mut wr) = tokio::io::split(io);
        let writer = async {
            let mut keepalive = tokio::time::interval(KEEPALIVE);
            loop {
                let line = tokio::select! {
                    open = rx.recv() => match open {
                        Some(o) => ServerLine::Open(o),
                        // Replaced by a newer link.
                        None => return,
                    },
                    _ = keepalive.tick() => ServerLine::Keepalive {},
                };
                let Ok(mut text) = serde_json::to_vec(&line) else { return };
                text.push(b'\n');
                if wr.write_all(&text).await.is_err() || wr.flush().await.is_err() {
                    return;
                }
            }
        };
        let reader = async {
            let mut rd = BufReader::new(rd);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut rd).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) if n > MAX_LINE => {
                        tracing::warn!(node, "the node agent wrote a line over {MAX_LINE} bytes on its tunnel; closing it");
                        return;
                    }
                    Ok(_) => {}
                }
                match serde_json::from_slice::<Refused>(&line) {
                    Ok(r) => {
                        if let Some(tx) = self.claim(&node, &r.stream) {
                            let _ = tx.send(Err(r.message));
                        }
                    }
                    Err(e) => tracing::warn!(node, "ignoring an unreadable line from the node agent's tunnel: {e}"),
                }
            }
        };
        tokio::select! {
            () = writer => {}
            () = reader => {}
        }
        let mut links = lock(&self.links);
        if links.get(&node).is_some_and(|l| l.serial == serial) {
            links.remove(&node);
            tracing::info!(node, "the node agent's tunnel is closed");
        }
    }
}

/// `GET /apis/subresources.virtplug.io/v1/nodes/{node}/tunnel`: a node agent's control
/// connection.
///
/// # Errors
/// See [`accept_link`].
pub async fn link(mut c: Call<'_>) -> Result<Response, ApiError> {
    let node = c.capture("node").to_owned();
    accept_link(&c.st.objects, &c.st.tunnels, &mut c.parts, &node).await
}

/// The tunnel handler's work wherever the Node is read from: checks the upgrade in `parts` and
/// that Node `node` exists in `objects`, then answers 101, after which a task serves the link.
///
/// # Errors
/// 400 without `Upgrade: virtplug-tunnel.v1` (or over HTTP/2), 404 when the Node does not exist.
pub async fn accept_link<O: ObjectAccess>(
    objects: &O,
    tunnels: &Arc<Tunnels>,
    parts: &mut Parts,
    node: &str,
) -> Result<Response, ApiError> {
    if !asks_upgrade(&parts.headers, TUNNEL_UPGRADE) {
        return Err(ApiError::bad_request(format!(
            "a node tunnel is an upgrade: send `Connection: Upgrade` and `Upgrade: {TUNNEL_UPGRADE}`"
        )));
    }
    let def = registry::find("", "v1", "nodes").ok_or_else(ApiError::no_resource)?;
    objects.get(def, None, node).await?;
    let upgrade = take_upgrade(parts)?;
    let (tunnels, node) = (Arc::clone(tunnels), node.to_owned());
    tokio::spawn(async move {
        match upgrade.await {
            Ok(up) => tunnels.serve_link(node, TokioIo::new(up)).await,
            Err(e) => tracing::debug!(node, "the node agent's tunnel was not handed over: {e}"),
        }
    });
    Ok(switching(TUNNEL_UPGRADE))
}

/// `GET /apis/subresources.virtplug.io/v1/nodes/{node}/streams/{id}`: a node agent connecting
/// the stream `id` it was asked for.
///
/// # Errors
/// See [`accept_stream`].
pub fn stream(mut c: Call<'_>) -> Result<Response, ApiError> {
    let (node, id) = (c.capture("node").to_owned(), c.capture("id").to_owned());
    accept_stream(&c.st.tunnels, &mut c.parts, &node, &id)
}

/// The stream handler's work: hands the upgraded connection to whoever waits for stream `id`
/// of `node`.
///
/// # Errors
/// 400 without `Upgrade: virtplug-stream.v1`, 404 when no stream `id` is waiting for this node.
pub fn accept_stream(tunnels: &Tunnels, parts: &mut Parts, node: &str, id: &str) -> Result<Response, ApiError> {
    if !asks_upgrade(&parts.headers, STREAM_UPGRADE) {
        return Err(ApiError::bad_request(format!(
            "a node stream is an upgrade: send `Connection: Upgrade` and `Upgrade: {STREAM_UPGRADE}`"
        )));
    }
    let upgrade = take_upgrade(parts)?;
    let Some(tx) = tunnels.claim(node, id) else {
        return Err(ApiError::not_found_message(format!(
            "no stream {id} is waiting for node {node} (it timed out, or was asked of another node)"
        )));
    };
    tokio::spawn(async move {
        let stream = upgrade.await.map(TokioIo::new).map_err(|e| format!("the stream connection was not handed over: {e}"));
        let _ = tx.send(stream);
    });
    Ok(switching(STREAM_UPGRADE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_an_agent_open_fails_at_once_naming_the_node() {
        let t = Tunnels::default();
        let e = t.open("n1", "ns", "vm", "u", StreamKind::Console, OPEN_TIMEOUT).await.unwrap_err();
        assert!(matches!(e, OpenError::NoAgent { .. }));
        assert!(e.to_string().contains("node n1"), "{e}");
    }

    /// An agent that never answers costs the caller its deadline, and the stream can no longer
    /// be claimed afterwards.
    #[tokio::test]
    async fn a_silent_agent_times_out_and_its_stream_id_is_forgotten() {
        let t = Arc::new(Tunnels::default());
        let (tx, mut rx) = mpsc::channel(1);
        lock(&t.links).insert("n1".into(), Link { serial: 0, tx });
        let opening = {
            let t = Arc::clone(&t);
            tokio::spawn(async move { t.open("n1", "ns", "vm", "u", StreamKind::Vnc, Duration::from_millis(200)).await })
        };
        let asked = rx.recv().await.unwrap();
        assert_eq!((asked.kind, asked.name.as_str()), (StreamKind::Vnc, "vm"));
        assert!(t.claim("n2", &asked.stream).is_none(), "another node cannot take the stream");
        let e = opening.await.unwrap().unwrap_err();
        assert!(matches!(e, OpenError::Timeout { .. }), "{e}");
        assert!(t.claim("n1", &asked.stream).is_none(), "a timed-out stream is gone");
    }
}
