//! The controller reads from its reflector stores and reaches the API only to write: one
//! declarative hot-plug (an `addvolume` on a running VM, through to the volume's `Bound` status)
//! costs a handful of requests, counted at the controller's own client.
//!
//! Method: the controller (with the local provisioner) runs in-process over the server's router
//! wrapped in a layer that records every request it sends; the test's own client (and the fake
//! node) go over TLS and are not counted. The count starts once the controller has been idle
//! for a while after the VM is running and its claim bound, and ends once it is idle again after
//! the volume's status is `Bound`. Watches are long-running requests started before the window.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::TestServer;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, PostParams};
use serde_json::json;

use api::phases::{ClaimPhase, VolumePhase};
use api::{VirtualMachine, VirtualMachineInstance};

const T: Duration = Duration::from_secs(20);
/// How long without a request counts as idle.
const IDLE: Duration = Duration::from_millis(1500);

fn requests(log: &common::Requests) -> Vec<String> {
    log.lock().unwrap().clone()
}

/// Waits until the controller has sent no request for [`IDLE`] (deadline [`T`]).
async fn idle(log: &common::Requests) {
    let end = Instant::now() + T;
    let (mut seen, mut since) = (requests(log).len(), Instant::now());
    while since.elapsed() < IDLE {
        assert!(Instant::now() < end, "the controller did not go idle within {T:?}: {:#?}", requests(log));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = requests(log).len();
        if now != seen {
            (seen, since) = (now, Instant::now());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hotplug_costs_the_controller_only_its_writes() {
    let s = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let (counted, log) = common::counted(s.server.local_router());
    let config = controller::run::Config { storage_root: Some(root.path().to_owned()), ..Default::default() };
    let ctl = tokio::spawn(controller::run::run_with(client::in_process(counted), config));
    let _node = common::fakenode::start(&s.client, "node-a").await;

    let vms: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(s.client.clone(), "default");
    let mut vm = common::vm("m");
    vm["spec"]["runStrategy"] = json!("Always");
    vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    let claim =
        json!({"metadata": {"name": "hp"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}});
    pvcs.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
    common::wait_until(T, "the VMI to run and the claim to be bound", || {
        let (vmis, pvcs) = (vmis.clone(), pvcs.clone());
        async move {
            let running = vmis.get_opt("m").await.ok()??.is_running();
            (running && ClaimPhase::is_bound(&pvcs.get("hp").await.ok()?)).then_some(())
        }
    })
    .await;
    idle(&log).await;

    let before = requests(&log).len();
    let body = json!({"name": "hp", "disk": {"disk": {"bus": "scsi"}}, "volumeSource": {"persistentVolumeClaim": {"claimName": "hp"}}});
    let (code, _) = s
        .raw(
            "PUT",
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/m/addvolume",
            "application/json",
            body.to_string().into_bytes(),
        )
        .await;
    assert_eq!(code, 202);
    common::wait_until(T, "volume hp to be Bound on the VMI", || {
        let vmis = vmis.clone();
        async move {
            let v = vmis.get("m").await.ok()?;
            (v.status?.volume("hp")?.phase == Some(VolumePhase::Bound)).then_some(())
        }
    })
    .await;
    idle(&log).await;
    let sent = requests(&log)[before..].to_vec();
    ctl.abort();

    eprintln!("the controller's requests for one hot-plug ({}):\n  {}", sent.len(), sent.join("\n  "));
    let gets = sent.iter().filter(|r| r.starts_with("GET ")).count();
    let writes = sent.len() - gets;
    // Two conditional writes (the VMI's spec, its volumeStatus), each one fresh GET and one
    // PATCH; the VM's status may get one more. Before the stores it was ~8 GETs per pass.
    assert!(writes >= 2, "the VMI's spec and status were written: {sent:#?}");
    assert!(gets <= writes, "every GET comes right before a write: {sent:#?}");
}
