//! The node tunnel: how the API server reaches a VMI's console and VNC on the node that runs it,
//! without the node being reachable from the API server.
//!
//! KubeVirt's virt-api dials virt-handler on the node (a fixed port on the pod network). Here the
//! node agent dials instead: it holds one upgraded connection to the API server, the *control*
//! connection (`GET` [`tunnel_path`], `Upgrade:` [`TUNNEL_UPGRADE`]), on which the server sends
//! one [`Open`] per console or VNC request, one JSON object a line. The agent answers each by
//! opening a *stream* connection (`GET` [`stream_path`], `Upgrade:` [`STREAM_UPGRADE`]) that then
//! carries the socket's raw bytes both ways, or by writing a [`Refused`] line on the control
//! connection. Both connections are ordinary authenticated API requests: the agent uses its own
//! kubeconfig credentials, and a stream is only accepted from the connection of the node the
//! server asked (its id is 128 random bits, sent only there).
//!
//! # Guarantees
//! Lines are at most [`MAX_LINE`] bytes. The server writes an empty object (`{}`) every
//! [`KEEPALIVE`], so a dead control connection is noticed by the agent within
//! [`KEEPALIVE_TIMEOUT`] (and by the server at its next write).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// KubeVirt's websocket subprotocol for console and VNC: binary frames carry raw bytes.
pub const PLAIN_SUBPROTOCOL: &str = "plain.kubevirt.io";
/// The `Upgrade` token of the control connection.
pub const TUNNEL_UPGRADE: &str = "virtplug-tunnel.v1";
/// The `Upgrade` token of a stream connection.
pub const STREAM_UPGRADE: &str = "virtplug-stream.v1";
/// Longest line either side writes on the control connection.
pub const MAX_LINE: usize = 4096;
/// How often the server writes a keepalive line.
pub const KEEPALIVE: Duration = Duration::from_secs(20);
/// How long the agent waits for a line before it takes the connection for dead and reconnects.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// The path of `node`'s control connection.
#[must_use]
pub fn tunnel_path(node: &str) -> String {
    format!("/apis/subresources.virtplug.io/v1/nodes/{node}/tunnel")
}

/// The path of stream `id` of `node`.
#[must_use]
pub fn stream_path(node: &str, id: &str) -> String {
    format!("/apis/subresources.virtplug.io/v1/nodes/{node}/streams/{id}")
}

/// Which of a VMI's sockets a stream reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// The serial console (QEMU's `serial.sock`).
    Console,
    /// The VNC server (QEMU's `vnc.sock`).
    Vnc,
}

impl StreamKind {
    /// The socket's file name in the VMI's run dir.
    #[must_use]
    pub fn socket_name(self) -> &'static str {
        match self {
            StreamKind::Console => "serial.sock",
            StreamKind::Vnc => "vnc.sock",
        }
    }

    /// The subresource's name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Console => "console",
            StreamKind::Vnc => "vnc",
        }
    }
}

/// Server to agent: open a stream to this VMI's socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Open {
    /// The stream's id (32 hex digits), for [`stream_path`].
    pub stream: String,
    pub namespace: String,
    pub name: String,
    /// The VMI's UID: the agent serves the stream only if the VMI it runs under this UID is
    /// this namespace and name.
    pub uid: String,
    pub kind: StreamKind,
}

/// Agent to server: the stream will not be opened, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refused {
    pub stream: String,
    pub message: String,
}

/// A line from the server: an [`Open`] or a keepalive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServerLine {
    Open(Open),
    Keepalive {},
}

/// Whether `id` is a stream id as the server makes them (32 lowercase hex digits).
#[must_use]
pub fn valid_stream_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_keepalive_is_an_empty_object() {
        let open = Open { stream: "0".repeat(32), namespace: "ns".into(), name: "vm".into(), uid: "u".into(), kind: StreamKind::Vnc };
        let text = serde_json::to_string(&ServerLine::Open(open.clone())).unwrap();
        assert_eq!(serde_json::from_str::<ServerLine>(&text).unwrap(), ServerLine::Open(open));
        assert_eq!(serde_json::from_str::<ServerLine>("{}").unwrap(), ServerLine::Keepalive {});
        assert!(text.contains(r#""kind":"vnc""#), "{text}");
    }

    #[test]
    fn stream_ids_are_exactly_32_lowercase_hex_digits() {
        assert!(valid_stream_id(&"a1".repeat(16)));
        for bad in ["", "../../x", &"A".repeat(32), &"0".repeat(31), &"0".repeat(33)] {
            assert!(!valid_stream_id(bad), "{bad}");
        }
    }
}
