//! The node agent's side of the tunnel ([`api::tunnel`]): it keeps a control connection to the
//! API server and, for each [`Open`] the server sends, connects the VMI's console or VNC socket
//! to a stream connection of its own. The API server never dials the node.
//!
//! # Flow
//! 1. `GET .../nodes/NODE/tunnel` (upgrade) with the agent's client; on failure, retried with
//!    the agent's capped exponential backoff (one warning per outage).
//! 2. Each line is an [`Open`] or a keepalive; no line within
//!    [`api::tunnel::KEEPALIVE_TIMEOUT`] means the connection is dead: reconnect.
//! 3. For an [`Open`]: [`socket_for`] finds the socket (only for a VMI this agent runs, by the
//!    record in its run dir), connects to it, then opens the stream connection and copies bytes
//!    both ways until either end closes. Anything that fails before the stream exists is written
//!    back as a [`Refused`] line, which the API server turns into a 503 with its message.
//!
//! # Guarantees
//! A request can reach only `serial.sock` or `vnc.sock` in the run dir of a VMI this agent runs
//! under exactly that namespace, name and UID: the UID is checked to be one path component
//! before it touches a path.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use api::tunnel::{Open, Refused, ServerLine, KEEPALIVE_TIMEOUT, MAX_LINE, STREAM_UPGRADE, TUNNEL_UPGRADE};

use client::backoff::{Backoff, Jitter};

/// Reconnect delays: from 200 ms, doubling, capped at 10 s (±20 %).
const RECONNECT: Backoff = Backoff { base: Duration::from_millis(200), cap: Duration::from_secs(10), jitter: Jitter::Proportional(0.2) };

/// Where this agent's tunnel connects and what it serves.
#[derive(Clone)]
pub struct Tunnel {
    /// A client that can upgrade (from a kubeconfig or in-cluster config, not in-process). For
    /// `virtplug subresources-api` its credential must be bound to `node` (in a cluster: the
    /// pod's projected ServiceAccount token, the in-cluster config's token file).
    pub client: kube::Client,
    pub node: String,
    /// The agent's run dirs (`STATE_DIR/vmis`).
    pub vmis_dir: PathBuf,
}

/// Why a stream was not opened; its text is what the client of the console sees.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("the VMI's UID {0:?} cannot name a run dir")]
    BadUid(String),
    #[error("node {node} does not run VMI {namespace}/{name} (UID {uid})")]
    NotHere { node: String, namespace: String, name: String, uid: String },
    #[error("cannot connect to {path} (is QEMU still starting?)")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The socket an [`Open`] asks for, if this agent runs that VMI.
///
/// # Errors
/// [`SocketError::BadUid`] for a UID that is not a single safe path component,
/// [`SocketError::NotHere`] when no run dir holds this VMI.
pub fn socket_for(vmis_dir: &Path, node: &str, open: &Open) -> Result<PathBuf, SocketError> {
    let uid = &open.uid;
    let safe = !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') && !uid.starts_with('-');
    if !safe {
        return Err(SocketError::BadUid(uid.clone()));
    }
    let run_dir = vmis_dir.join(uid);
    match crate::checkpoint::read_record(&run_dir) {
        Some(r) if r.namespace == open.namespace && r.name == open.name && r.uid == *uid => Ok(run_dir.join(open.kind.socket_name())),
        _ => Err(SocketError::NotHere {
            node: node.to_owned(),
            namespace: open.namespace.clone(),
            name: open.name.clone(),
            uid: uid.clone(),
        }),
    }
}

/// Keeps the tunnel connected until the process stops (dropping the future stops it).
pub async fn run(t: Tunnel) {
    let path = api::tunnel::tunnel_path(&t.node);
    let mut failures: u32 = 0;
    loop {
        match client::upgrade::raw(&t.client, &path, TUNNEL_UPGRADE).await {
            Ok(io) => {
                if failures > 0 {
                    tracing::info!(node = t.node, "the console tunnel is connected again");
                }
                failures = 0;
                let why = serve(&t, io).await;
                tracing::info!(node = t.node, "the console tunnel closed ({why}); reconnecting");
            }
            Err(e) => {
                if failures == 0 {
                    tracing::warn!(
                        node = t.node,
                        "cannot open the console tunnel to the API server: {}; retrying with backoff (consoles of this node's VMs are unreachable meanwhile)",
                        client::error_chain(&e)
                    );
                }
                failures = failures.saturating_add(1);
            }
        }
        tokio::time::sleep(RECONNECT.delay(failures)).await;
    }
}

/// Serves one control connection until it ends; returns why.
async fn serve<IO: AsyncRead + AsyncWrite + Send + 'static>(t: &Tunnel, io: IO) -> String {
    let (rd, mut wr) = tokio::io::split(io);
    let (refused_tx, mut refused_rx) = mpsc::channel::<Refused>(64);
    let writer = async move {
        while let Some(r) = refused_rx.recv().await {
            let Ok(mut line) = serde_json::to_vec(&r) else { continue };
            line.truncate(MAX_LINE - 1);
            line.push(b'\n');
            if wr.write_all(&line).await.is_err() || wr.flush().await.is_err() {
                return "writing to it failed".to_owned();
            }
        }
        "the agent stopped".to_owned()
    };
    let reader = async {
        let mut rd = BufReader::new(rd);
        let mut line = Vec::new();
        loop {
            line.clear();
            let mut limited = (&mut rd).take(MAX_LINE as u64 + 1);
            match tokio::time::timeout(KEEPALIVE_TIMEOUT, limited.read_until(b'\n', &mut line)).await {
                Err(_) => return format!("no keepalive within {KEEPALIVE_TIMEOUT:?}"),
                Ok(Ok(0)) => return "the API server closed it".to_owned(),
                Ok(Err(e)) => return format!("reading failed: {e}"),
                Ok(Ok(n)) if n > MAX_LINE => return format!("the API server wrote a line over {MAX_LINE} bytes"),
                Ok(Ok(_)) => {}
            }
            match serde_json::from_slice::<ServerLine>(&line) {
                Ok(ServerLine::Keepalive {}) => {}
                Ok(ServerLine::Open(open)) => {
                    tokio::spawn(stream(t.clone(), open, refused_tx.clone()));
                }
                Err(e) => tracing::warn!(node = t.node, "ignoring an unreadable line on the console tunnel: {e}"),
            }
        }
    };
    tokio::select! {
        why = writer => why,
        why = reader => why,
    }
}

/// One stream: the VMI's socket, then the stream connection, then bytes both ways.
async fn stream(t: Tunnel, open: Open, refused: mpsc::Sender<Refused>) {
    let refuse = |message: String| {
        let refused = refused.clone();
        let stream = open.stream.clone();
        async move {
            let _ = refused.send(Refused { stream, message }).await;
        }
    };
    let socket = match socket_for(&t.vmis_dir, &t.node, &open) {
        Ok(s) => s,
        Err(e) => return refuse(e.to_string()).await,
    };
    let local = match UnixStream::connect(&socket).await {
        Ok(s) => s,
        Err(source) => return refuse(SocketError::Connect { path: socket, source }.to_string()).await,
    };
    if !api::tunnel::valid_stream_id(&open.stream) {
        return refuse("the stream id is not 32 hex digits".to_owned()).await;
    }
    let path = api::tunnel::stream_path(&t.node, &open.stream);
    let remote = match client::upgrade::raw(&t.client, &path, STREAM_UPGRADE).await {
        Ok(io) => io,
        Err(e) => return refuse(format!("cannot open the stream connection: {}", client::error_chain(&e))).await,
    };
    tracing::debug!(namespace = open.namespace, object = open.name, "{} stream open", open.kind.as_str());
    relay(local, remote).await;
    tracing::debug!(namespace = open.namespace, object = open.name, "{} stream closed", open.kind.as_str());
}

/// Copies both ways until either direction ends, then drops both (QEMU's chardev then sees its
/// client leave and accepts the next one).
async fn relay<A, B>(a: A, b: B)
where
    A: AsyncRead + AsyncWrite,
    B: AsyncRead + AsyncWrite,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    tokio::select! {
        _ = tokio::io::copy(&mut ar, &mut bw) => {}
        _ = tokio::io::copy(&mut br, &mut aw) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{write_record, VmiRecord};
    use api::tunnel::StreamKind;

    fn open(uid: &str, name: &str, kind: StreamKind) -> Open {
        Open { stream: "0".repeat(32), namespace: "ns".into(), name: name.into(), uid: uid.into(), kind }
    }

    /// Only the run dir whose record names the same VMI, and only its two sockets.
    #[test]
    fn a_stream_reaches_only_the_sockets_of_a_vmi_this_agent_runs() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("u-1");
        write_record(&run, &VmiRecord { namespace: "ns".into(), name: "vm".into(), uid: "u-1".into(), cgroup: None }).unwrap();
        assert_eq!(socket_for(d.path(), "n1", &open("u-1", "vm", StreamKind::Console)).unwrap(), run.join("serial.sock"));
        assert_eq!(socket_for(d.path(), "n1", &open("u-1", "vm", StreamKind::Vnc)).unwrap(), run.join("vnc.sock"));
        let e = socket_for(d.path(), "n1", &open("u-1", "other", StreamKind::Console)).unwrap_err();
        assert!(e.to_string().contains("node n1 does not run VMI ns/other"), "{e}");
        for bad in ["", "..", "../u-1", "u-1/../u-1", "-rf", &"a".repeat(65)] {
            assert!(matches!(socket_for(d.path(), "n1", &open(bad, "vm", StreamKind::Console)), Err(SocketError::BadUid(_))), "{bad:?}");
        }
    }
}
