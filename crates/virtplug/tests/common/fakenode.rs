//! FAKE node agent, for controller tests that run no QEMU: it registers a Ready Node and plays
//! the node agent's part of the VMI lifecycle — `Scheduled` → `Running`, and on deletion the
//! removal of the VMI finalizer — without starting anything. Tests that need a guest use the
//! real node agent.

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

/// Registers node `name` (Ready) and starts its stand-in agent.
pub async fn start(client: &kube::Client, name: &str) -> FakeNode {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "FakeNodeReady"}]}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(ready)).await.unwrap();
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
