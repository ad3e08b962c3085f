//! KubeVirt's streaming subresources: `GET .../virtualmachineinstances/NAME/console|vnc`, a
//! websocket (subprotocol `plain.kubevirt.io`, binary messages carrying raw bytes) to the VMI's
//! serial console or VNC server, proxied through the tunnel of the node agent that runs it
//! ([`crate::tunnel`]).
//!
//! # Flow
//! As virt-api's streamer: check the handshake, fetch and check the VMI, open the stream to the
//! node *before* answering, then answer 101 and carry bytes until either end closes. So every
//! refusal is an HTTP status with a `Status` body, never a websocket that closes at once.
//!
//! # Errors (KubeVirt's codes and wording)
//! - 400: not a websocket handshake; the VMI is not running ("VMI is not running", with its
//!   phase); `vnc` on a VMI with `autoattachGraphicsDevice: false` ("No graphics devices are
//!   present.").
//! - 404: no such VMI.
//! - 409: the VMI failed ("VMI is in failed status").
//! - 503: its node's agent is not connected, refused (e.g. the socket is not there yet), or did
//!   not answer within [`crate::tunnel::OPEN_TIMEOUT`].

use axum::http::request::Parts;
use axum::response::Response;
use serde_json::Value;

use api::tunnel::{StreamKind, PLAIN_SUBPROTOCOL};

use super::access::ObjectAccess;
use crate::call::Call;
use crate::registry;
use crate::status::ApiError;
use crate::tunnel::{Tunnels, OPEN_TIMEOUT};
use crate::websocket::{self, Handshake, PING_EVERY};

/// The subresources this module serves, for discovery.
pub const SUBRESOURCES: [&str; 2] = ["console", "vnc"];

/// Whether the VMI can be reached now, as virt-api's validators decide; its node otherwise the
/// refusal.
fn node_of(kind: StreamKind, vmi: &Value) -> Result<&str, ApiError> {
    let graphics = vmi.pointer("/spec/domain/devices/autoattachGraphicsDevice").and_then(Value::as_bool);
    if kind == StreamKind::Vnc && graphics == Some(false) {
        return Err(ApiError::bad_request("No graphics devices are present."));
    }
    let phase = vmi.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
    if kind == StreamKind::Console && phase == "Failed" {
        return Err(ApiError::conflict_message("VMI is in failed status"));
    }
    let node = vmi.pointer("/status/nodeName").and_then(Value::as_str).unwrap_or("");
    if phase != "Running" || node.is_empty() {
        let phase = if phase.is_empty() { "Pending" } else { phase };
        return Err(ApiError::bad_request(format!("VMI is not running (its phase is {phase}): start it and connect again")));
    }
    Ok(node)
}

/// `GET .../virtualmachineinstances/{name}/console|vnc`.
///
/// # Errors
/// See the module docs.
pub async fn handle(mut c: Call<'_>) -> Result<Response, ApiError> {
    let (ns, name, sub) = (c.capture("namespace").to_owned(), c.capture("name").to_owned(), c.capture("sub").to_owned());
    open(&c.st.objects, &c.st.tunnels, &mut c.parts, &ns, &name, &sub).await
}

/// The handler's work wherever the VMI is read from: checks the handshake in `parts`, reads the
/// VMI `ns/name` from `objects`, asks its node's agent for the `sub` stream over `tunnels`, and
/// answers 101, after which a task carries the bytes.
///
/// # Errors
/// See the module docs.
pub async fn open<O: ObjectAccess>(
    objects: &O,
    tunnels: &Tunnels,
    parts: &mut Parts,
    ns: &str,
    name: &str,
    sub: &str,
) -> Result<Response, ApiError> {
    let kind = match sub {
        "console" => StreamKind::Console,
        "vnc" => StreamKind::Vnc,
        _ => return Err(ApiError::no_resource()),
    };
    let handshake = Handshake::check(&parts.headers, kind.as_str(), PLAIN_SUBPROTOCOL)?;
    let def = registry::find("kubevirt.io", "v1", "virtualmachineinstances").ok_or_else(ApiError::no_resource)?;
    let vmi = objects.get(def, Some(ns), name).await?;
    let node = node_of(kind, &vmi)?.to_owned();
    let uid = vmi.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("").to_owned();
    let upgrade = websocket::take_upgrade(parts)?;
    let agent = tunnels
        .open(&node, ns, name, &uid, kind, OPEN_TIMEOUT)
        .await
        .map_err(|e| ApiError::unavailable(format!("cannot reach the {} of VMI {ns}/{name}: {e}", kind.as_str())))?;
    let (ns, name) = (ns.to_owned(), name.to_owned());
    tokio::spawn(async move {
        match upgrade.await {
            Ok(up) => {
                let ws = websocket::server_end(up).await;
                match websocket::pump(ws, agent, Some(PING_EVERY)).await {
                    Ok(()) => tracing::debug!(namespace = ns, object = name, "the {} stream ended", kind.as_str()),
                    Err(e) => tracing::debug!(namespace = ns, object = name, "the {} stream ended: {e}", kind.as_str()),
                }
            }
            Err(e) => tracing::debug!(namespace = ns, object = name, "the client's connection was not handed over: {e}"),
        }
    });
    Ok(handshake.response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_running_vmi_with_a_node_is_reachable_with_kubevirts_codes() {
        let running = json!({"status": {"phase": "Running", "nodeName": "n1"}});
        assert_eq!(node_of(StreamKind::Console, &running).unwrap(), "n1");
        for (kind, vmi, code, words) in [
            (StreamKind::Console, json!({"status": {"phase": "Scheduling"}}), 400, "VMI is not running (its phase is Scheduling)"),
            (StreamKind::Vnc, json!({}), 400, "VMI is not running (its phase is Pending)"),
            (StreamKind::Console, json!({"status": {"phase": "Failed", "nodeName": "n1"}}), 409, "VMI is in failed status"),
            (StreamKind::Vnc, json!({"status": {"phase": "Succeeded", "nodeName": "n1"}}), 400, "VMI is not running"),
            (
                StreamKind::Vnc,
                json!({"spec": {"domain": {"devices": {"autoattachGraphicsDevice": false}}}, "status": {"phase": "Running", "nodeName": "n1"}}),
                400,
                "No graphics devices are present.",
            ),
        ] {
            let e = node_of(kind, &vmi).unwrap_err();
            assert_eq!(e.code, code, "{vmi}");
            assert!(e.message.contains(words), "{}", e.message);
        }
    }
}
