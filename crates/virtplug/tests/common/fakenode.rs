//! FAKE node agent, for controller tests that run no QEMU: it registers a Ready Node (the
//! kubelet's part), heartbeats once (the agent's label and annotation) and plays the node
//! agent's part of the VMI lifecycle — `Scheduled` → `Running`, and on deletion the removal of
//! the VMI finalizer — without starting anything. Tests that need a guest use the real node
//! agent, after [`kubelet`] registered its Node.

use api::phases::VmiPhase;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

use api::VirtualMachineInstance;

pub struct FakeNode {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// STAND-IN for the kubelet: registers node `name` with `Ready=True` (the real node agent only
/// heartbeats on a Node someone else registered). Idempotent.
pub async fn kubelet(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})).unwrap();
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {} // registered by an earlier start
        Err(e) => panic!("the stand-in kubelet cannot register node {name}: {e}"),
    }
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(ready)).await.unwrap();
}

/// Registers node `name` (Ready), heartbeats on it once as an agent would, and starts its
/// stand-in agent.
pub async fn start(client: &kube::Client, name: &str) -> FakeNode {
    kubelet(client, name).await;
    node::agent::heartbeat(client, name).await.unwrap();
    let (client, name) = (client.clone(), name.to_owned());
    let task = tokio::spawn(async move {
        let vmis: Api<VirtualMachineInstance> = Api::all(client.clone());
        let cfg = watcher::Config::default().labels(&format!("kubevirt.io/nodeName={name}"));
        let mut stream = watcher(vmis, cfg).default_backoff().applied_objects().boxed();
        while let Some(Ok(vmi)) = stream.next().await {
            let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
            if vmi.metadata.deletion_timestamp.is_some() {
                let _ = client::update(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
                    if let Some(f) = v.metadata.finalizers.as_mut() {
                        f.retain(|x| x != "kubevirt.io/foregroundDeleteVirtualMachine");
                    }
                })
                .await;
            } else if vmi.phase() == Some(&VmiPhase::Scheduled) {
                let _ = client::update_status(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
                    v.status.get_or_insert_with(Default::default).phase = Some(VmiPhase::Running);
                })
                .await;
            }
        }
    });
    FakeNode { task }
}
