//! The console and VNC subresources' path without QEMU: a real API server on loopback, the real
//! node agent tunnel (`node::tunnel`) with a node-local unix socket standing in for QEMU's
//! serial port, and the websocket client `virtplug vm console` uses (tokio-tungstenite through
//! the kubeconfig's client). What only a guest can show is in `e2e.rs`.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(30);

fn path(name: &str, sub: &str) -> String {
    format!("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}/{sub}")
}

/// A VMI as the controller and agent leave it: `Running` on `node`; its UID.
async fn running_vmi(s: &TestServer, name: &str, node: &str) -> String {
    let api: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), "default", &ApiResource::erase::<api::VirtualMachineInstance>(&()));
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": name},
        "spec": {"domain": {"devices": {}}}});
    let made = api.create(&PostParams::default(), &serde_json::from_value(vmi).unwrap()).await.unwrap();
    let status = json!({"status": {"phase": "Running", "nodeName": node}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    made.metadata.uid.unwrap()
}

/// A client as `virtplug vm console` and the node agent use for upgrades: no retries.
async fn streams_client(s: &TestServer) -> kube::Client {
    client::connect_with(Some(&s.kubeconfig), "test", client::Retries::None).await.unwrap()
}

async fn refusal(s: &TestServer, name: &str, sub: &str) -> (u16, String) {
    let (streams, path) = (streams_client(s).await, path(name, sub));
    let asked = client::upgrade::websocket(&streams, &path, api::tunnel::PLAIN_SUBPROTOCOL);
    // Regression: with kube-client's default retries a 503 came back only after ~5 minutes.
    match tokio::time::timeout(T, asked).await.expect("a refusal within the deadline, not retried") {
        Ok(_) => panic!("{sub} of {name} was upgraded"),
        Err(client::upgrade::UpgradeError::Refused { code, message, .. }) => (code, message),
        Err(e) => panic!("{sub} of {name}: {e}"),
    }
}

/// Stands in for QEMU's serial socket: greets each client, then echoes what it reads.
fn fake_serial(socket: &std::path::Path) {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                conn.write_all(b"hello from the serial port\n").await.unwrap();
                let mut buf = [0u8; 256];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// The next message, which must be binary, within [`T`].
async fn next_binary<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(ws: &mut tokio_tungstenite::WebSocketStream<S>) -> Vec<u8> {
    match tokio::time::timeout(T, ws.next()).await.expect("a message within the deadline") {
        Some(Ok(Message::Binary(b))) => b.to_vec(),
        other => panic!("not a binary message: {other:?}"),
    }
}

/// Without its node's agent a console is 503 naming the node; once the agent's tunnel is up,
/// bytes cross both ways unchanged through the API server; a VMI the agent does not run, or a
/// socket that is not there, is 503 with the agent's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_crosses_the_node_agents_tunnel_both_ways() {
    let s = TestServer::start().await;
    let nodes: Api<Node> = Api::all(s.client.clone());
    nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap()).await.unwrap();
    let uid = running_vmi(&s, "v1", "n1").await;
    let (code, message) = refusal(&s, "v1", "console").await;
    assert_eq!(code, 503, "{message}");
    assert!(message.contains("the node agent of node n1 is not connected"), "{message}");

    let vmis = tempfile::tempdir().unwrap();
    let run_dir = vmis.path().join(&uid);
    node::checkpoint::write_record(
        &run_dir,
        &node::checkpoint::VmiRecord { namespace: "default".into(), name: "v1".into(), uid: uid.clone(), cgroup: None },
    )
    .unwrap();
    fake_serial(&run_dir.join("serial.sock"));
    let agent = tokio::spawn(node::tunnel::run(node::tunnel::Tunnel {
        client: streams_client(&s).await,
        node: "n1".into(),
        vmis_dir: vmis.path().to_owned(),
    }));

    let streams = streams_client(&s).await;
    let mut ws = common::wait_until(T, "the agent's tunnel to carry the console", || async {
        client::upgrade::websocket(&streams, &path("v1", "console"), api::tunnel::PLAIN_SUBPROTOCOL).await.ok()
    })
    .await;
    assert_eq!(next_binary(&mut ws).await, b"hello from the serial port\n");
    ws.send(Message::binary(b"\x00typed\xff".to_vec())).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"\x00typed\xff");

    // VNC: this stand-in has no vnc.sock.
    let (code, message) = refusal(&s, "v1", "vnc").await;
    assert_eq!(code, 503, "{message}");
    assert!(message.contains("vnc.sock"), "{message}");
    // A VMI on n1 that this agent does not run.
    running_vmi(&s, "v2", "n1").await;
    let (code, message) = refusal(&s, "v2", "console").await;
    assert_eq!(code, 503, "{message}");
    assert!(message.contains("node n1 does not run VMI default/v2"), "{message}");
    agent.abort();
}

/// The tunnel's own endpoints: a tunnel for a node that is not registered is 404, a stream
/// nobody asked for is 404, and neither is served without its upgrade.
#[tokio::test]
async fn tunnel_endpoints_refuse_unknown_nodes_and_unasked_streams() {
    let s = TestServer::start().await;
    let e =
        client::upgrade::raw(&streams_client(&s).await, &api::tunnel::tunnel_path("ghost"), api::tunnel::TUNNEL_UPGRADE).await.unwrap_err();
    assert_eq!(e.code(), Some(404), "{e}");
    let nodes: Api<Node> = Api::all(s.client.clone());
    nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap()).await.unwrap();
    let e = client::upgrade::raw(&streams_client(&s).await, &api::tunnel::stream_path("n1", &"0".repeat(32)), api::tunnel::STREAM_UPGRADE)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(404), "{e}");
    let (code, _) = s.raw("GET", &api::tunnel::tunnel_path("n1"), "application/json", Vec::new()).await;
    assert_eq!(code, 400, "a plain GET is not a tunnel");
    let (code, body) = s.raw("GET", &path("v1", "console"), "application/json", Vec::new()).await;
    assert_eq!(code, 400, "a plain GET is not a websocket: {body}");
}
