//! Declarative hot-plug's VMI patch against the real embedded API server: the plan computed from
//! the VM template lands on the VMI, and a conflict injected between read and patch is retried
//! on a fresh read.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::TestServer;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

#[tokio::test]
async fn vm_template_changes_reach_the_vmi_and_a_conflict_is_retried() {
    let s = TestServer::start().await;
    let vms: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "default", &common::kubevirt_resource("VirtualMachine"));
    let vmis: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "default", &common::kubevirt_resource("VirtualMachineInstance"));
    let base = json!({"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}, {"name": "cd", "cdrom": {"bus": "sata"}}]}},
                      "volumes": [{"name": "root", "emptyDisk": {"capacity": "1Gi"}}]});
    let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "d"}, "spec": {"runStrategy": "Always", "template": {"spec": base}}});
    vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "d"}, "spec": base});
    vmis.create(&PostParams::default(), &serde_json::from_value(vmi).unwrap()).await.unwrap();
    vmis.patch_status("d", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running"}}))).await.unwrap();

    // The user adds a hot-plug disk and inserts a CD-ROM medium, in the VM spec.
    let p = json!([
        {"op": "add", "path": "/spec/template/spec/domain/devices/disks/-", "value": {"name": "data", "disk": {"bus": "scsi"}, "serial": "data"}},
        {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "data", "persistentVolumeClaim": {"claimName": "data", "hotpluggable": true}}},
        {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "cd", "dataVolume": {"name": "iso", "hotpluggable": true}}}
    ]);
    vms.patch("d", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(p).unwrap())).await.unwrap();

    // Another writer changes the VMI between the reconcile's read and its patch, once.
    let racer = vmis.clone();
    let hook: controller::hotplug::BeforePatch = Arc::new(move |attempt| {
        let racer = racer.clone();
        Box::pin(async move {
            if attempt == 1 {
                let p = json!([{"op": "add", "path": "/spec/volumes/-", "value": {"name": "late", "persistentVolumeClaim": {"claimName": "late"}}},
                               {"op": "add", "path": "/spec/domain/devices/disks/-", "value": {"name": "late", "disk": {"bus": "virtio"}}}]);
                racer.patch("d", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(p).unwrap())).await.unwrap();
            }
        })
    });
    assert!(controller::hotplug::reconcile(&s.client, "default", "d", 5, Some(&hook)).await.unwrap());
    let got = serde_json::to_value(vmis.get("d").await.unwrap()).unwrap();
    let names = |ptr: &str| {
        got.pointer(ptr).and_then(Value::as_array).unwrap().iter().map(|v| v["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(names("/spec/volumes"), ["root", "late", "data", "cd"], "the concurrent change kept, hot-plugs added in VM order");
    assert_eq!(
        names("/spec/domain/devices/disks"),
        ["root", "cd", "late", "data"],
        "the CD-ROM drive was already there: only its medium was added"
    );
    // Converged: another pass writes nothing.
    let rev = s.revision();
    assert!(!controller::hotplug::reconcile(&s.client, "default", "d", 5, None).await.unwrap());
    assert_eq!(s.revision(), rev);
}

/// The controller loop (as `virtplug up` runs it, in-process) carries a VM spec edit to the
/// running VMI without being asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_loop_plugs_and_unplugs_from_vm_spec_edits() {
    let s = TestServer::start().await;
    let ctl = tokio::spawn(controller::run::run(client::in_process(s.server.local_router())));
    let _node = common::fakenode::start(&s.client, "node-a").await;
    let vms: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "default", &common::kubevirt_resource("VirtualMachine"));
    let vmis: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "default", &common::kubevirt_resource("VirtualMachineInstance"));
    let base = json!({"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}}, "volumes": [{"name": "root", "emptyDisk": {"capacity": "1Gi"}}]});
    let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "live"}, "spec": {"runStrategy": "Always", "template": {"spec": base}}});
    vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    // The controller starts the VMI; the stand-in node agent reports it Running.
    common::wait_until(std::time::Duration::from_secs(20), "the VMI to run", || {
        let vmis = vmis.clone();
        async move { (vmis.get("live").await.ok()?.data.pointer("/status/phase")? == "Running").then_some(()) }
    })
    .await;

    let volumes = |v: Value| {
        v.pointer("/spec/volumes")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|x| x["name"].as_str().unwrap_or("").to_owned()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let add = json!([
        {"op": "add", "path": "/spec/template/spec/domain/devices/disks/-", "value": {"name": "data", "disk": {"bus": "scsi"}}},
        {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "data", "dataVolume": {"name": "data", "hotpluggable": true}}}
    ]);
    vms.patch("live", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(add).unwrap())).await.unwrap();
    common::wait_until(std::time::Duration::from_secs(20), "the VMI to gain the volume", || {
        let vmis = vmis.clone();
        async move { (volumes(serde_json::to_value(vmis.get("live").await.ok()?).ok()?) == ["root", "data"]).then_some(()) }
    })
    .await;
    let remove = json!([{"op": "remove", "path": "/spec/template/spec/volumes/1"}, {"op": "remove", "path": "/spec/template/spec/domain/devices/disks/1"}]);
    vms.patch("live", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(remove).unwrap())).await.unwrap();
    common::wait_until(std::time::Duration::from_secs(20), "the VMI to lose the volume", || {
        let vmis = vmis.clone();
        async move { (volumes(serde_json::to_value(vmis.get("live").await.ok()?).ok()?) == ["root"]).then_some(()) }
    })
    .await;
    ctl.abort();
}
