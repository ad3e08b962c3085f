//! STAND-IN for the kubelet's node registration, for deployments without a kubelet: `virtplug
//! up` (its one node) and `virtplug node --register-node`. On a real cluster the kubelet creates
//! the Node and keeps its conditions; the node agent never writes either ([`node::agent`]).
//!
//! This is the one piece of the embedded deployment that does what a cluster's own component
//! does: create the Node (labels `kubernetes.io/hostname`, `kubernetes.io/os`,
//! `kubernetes.io/arch`) if it is missing, and set its `Ready=True` condition at start.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Registers node `name` as a kubelet would at its start.
///
/// # Errors
/// When the API refuses.
pub async fn register(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(name).await?.is_none() {
        let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": std::env::consts::ARCH}}}))
        .map_err(kube::Error::SerdeError)?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "virtplug's stand-in for the kubelet registered this node",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": format!("virtplug-{}", env!("CARGO_PKG_VERSION")), "architecture": std::env::consts::ARCH, "operatingSystem": "linux"}}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await?;
    Ok(())
}
