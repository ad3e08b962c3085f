//! KubeVirt's subresources on the embedded API server: hot-plug (declarative mode) and the VMI
//! actions (`pause`, `unpause`, `softreboot`: what they record on the VMI, and their refusals).

#![allow(clippy::unwrap_used)]

mod common;

use common::{vm, TestServer};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default";

async fn put(s: &TestServer, path: &str, body: &Value) -> (u16, Value) {
    s.raw("PUT", &format!("{SUB}/{path}"), "application/json", body.to_string().into_bytes()).await
}

async fn vm_spec(s: &TestServer, name: &str) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "default", &ApiResource::erase::<api::VirtualMachine>(&()));
    serde_json::to_value(api.get(name).await.unwrap()).unwrap()["spec"]["template"]["spec"].clone()
}

fn names(spec: &Value, ptr: &str) -> Vec<String> {
    spec.pointer(ptr).and_then(Value::as_array).unwrap().iter().map(|v| v["name"].as_str().unwrap().to_owned()).collect()
}

fn add(name: &str) -> Value {
    json!({"name": name, "disk": {"disk": {"bus": "scsi"}, "serial": name}, "volumeSource": {"persistentVolumeClaim": {"claimName": format!("{name}-pvc")}}})
}

#[tokio::test]
async fn addvolume_and_removevolume_edit_the_vm_spec() {
    let s = TestServer::start().await;
    let vms: Api<api::VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(vm("v")).unwrap()).await.unwrap();

    let rev = s.revision();
    let mut dry = add("data");
    dry["dryRun"] = json!(["All"]);
    assert_eq!(put(&s, "virtualmachines/v/addvolume", &dry).await.0, 202);
    assert_eq!(s.revision(), rev, "dryRun writes nothing");

    assert_eq!(put(&s, "virtualmachines/v/addvolume", &add("data")).await.0, 202);
    let spec = vm_spec(&s, "v").await;
    assert_eq!(names(&spec, "/volumes"), ["root", "data"]);
    assert_eq!(names(&spec, "/domain/devices/disks"), ["root", "cdrom0", "data"]);
    assert_eq!(spec["volumes"][1]["persistentVolumeClaim"], json!({"claimName": "data-pvc", "hotpluggable": true}), "forced hot-pluggable");
    assert_eq!(spec["domain"]["devices"]["disks"][2]["name"], "data", "disk.name forced to the volume name");

    // A medium into the empty CD-ROM drive: only the volume is added.
    let cd = json!({"name": "cdrom0", "disk": {"cdrom": {"bus": "sata"}}, "volumeSource": {"dataVolume": {"name": "iso"}}});
    assert_eq!(put(&s, "virtualmachines/v/addvolume", &cd).await.0, 202);
    assert_eq!(names(&vm_spec(&s, "v").await, "/domain/devices/disks"), ["root", "cdrom0", "data"]);

    let (code, st) = put(&s, "virtualmachines/v/addvolume", &add("data")).await;
    assert_eq!((code, st["reason"].as_str()), (409, Some("Conflict")), "{st}");
    assert!(st["message"].as_str().unwrap().contains("volume with that name already exists"));

    assert_eq!(put(&s, "virtualmachines/v/removevolume", &json!({"name": "data"})).await.0, 202);
    assert_eq!(put(&s, "virtualmachines/v/removevolume", &json!({"name": "cdrom0"})).await.0, 202);
    let spec = vm_spec(&s, "v").await;
    assert_eq!(names(&spec, "/volumes"), ["root"]);
    assert_eq!(names(&spec, "/domain/devices/disks"), ["root", "cdrom0"], "eject keeps the drive");
    let (code, st) = put(&s, "virtualmachines/v/removevolume", &json!({"name": "root"})).await;
    assert_eq!(code, 409);
    assert!(st["message"].as_str().unwrap().contains("not hotpluggable"), "{st}");
    let (code, _) = put(&s, "virtualmachines/missing/addvolume", &add("x")).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn bad_bodies_get_field_errors_and_store_nothing() {
    let s = TestServer::start().await;
    let vms: Api<api::VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(vm("v")).unwrap()).await.unwrap();
    let rev = s.revision();
    for (body, field) in [
        (json!({"disk": {}, "volumeSource": {"dataVolume": {"name": "d"}}}), "name"),
        (json!({"name": "Bad_Name", "disk": {}, "volumeSource": {"dataVolume": {"name": "d"}}}), "name"),
        (json!({"name": "x", "volumeSource": {"dataVolume": {"name": "d"}}}), "disk"),
        (json!({"name": "x", "disk": {}}), "volumeSource"),
        (json!({"name": "x", "disk": {}, "volumeSource": {"persistentVolumeClaim": {}}}), "volumeSource.persistentVolumeClaim.claimName"),
    ] {
        let (code, st) = put(&s, "virtualmachines/v/addvolume", &body).await;
        assert_eq!(code, 400, "{body}: {st}");
        assert!(st["details"]["causes"].as_array().unwrap().iter().any(|c| c["field"] == field), "{body}: {st}");
    }
    // A bus that hot-plug does not allow: the resulting spec fails admission.
    let lun_virtio =
        json!({"name": "l", "disk": {"lun": {"bus": "virtio"}}, "volumeSource": {"persistentVolumeClaim": {"claimName": "l"}}});
    let (code, st) = put(&s, "virtualmachines/v/addvolume", &lun_virtio).await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(s.revision(), rev, "nothing stored");
}

#[tokio::test]
async fn vmi_level_hotplug_only_for_standalone_running_vmis() {
    let s = TestServer::start().await;
    let vmis: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), "default", &ApiResource::erase::<api::VirtualMachineInstance>(&()));
    let mut spec = vm("x")["spec"]["template"]["spec"].clone();
    spec["domain"]["devices"]["disks"] = json!([{"name": "root", "disk": {"bus": "virtio"}}]);
    for (name, owned) in [("owned", true), ("alone", false)] {
        let mut meta = json!({"name": name});
        if owned {
            meta["ownerReferences"] =
                json!([{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name, "uid": "u", "controller": true}]);
        }
        let obj = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta, "spec": spec});
        vmis.create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await.unwrap();
    }
    let (code, st) = put(&s, "virtualmachineinstances/owned/addvolume", &add("d")).await;
    assert_eq!(code, 400);
    assert!(st["message"].as_str().unwrap().contains("VMI default/owned is owned by a VM: use PUT"), "{st}");
    let (code, st) = put(&s, "virtualmachineinstances/alone/addvolume", &add("d")).await;
    assert_eq!(code, 409, "not running yet: {st}");
    vmis.patch_status("alone", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running"}}))).await.unwrap();
    assert_eq!(put(&s, "virtualmachineinstances/alone/addvolume", &add("d")).await.0, 202);
    let got = serde_json::to_value(vmis.get("alone").await.unwrap()).unwrap();
    assert_eq!(names(&got["spec"], "/volumes"), ["root", "d"]);
    assert_eq!(put(&s, "virtualmachineinstances/alone/removevolume", &json!({"name": "d"})).await.0, 202);
    let got = serde_json::to_value(vmis.get("alone").await.unwrap()).unwrap();
    assert_eq!(names(&got["spec"], "/volumes"), ["root"]);
}

/// The VMI actions record the request on the VMI for its node agent, checked against the VMI
/// as stored (KubeVirt's 409 refusals, 404 for no VMI), listed in discovery; `dryRun` writes
/// nothing. (What the agent does with them: `vm_actions.rs`, with a real guest.)
#[tokio::test]
async fn vmi_actions_record_the_request_and_refuse_as_kubevirt_does() {
    let s = TestServer::start().await;
    let vmis: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), "default", &ApiResource::erase::<api::VirtualMachineInstance>(&()));
    let obj = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "i"},
        "spec": vm("i")["spec"]["template"]["spec"].clone()});
    vmis.create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await.unwrap();
    let annotations = || async { serde_json::to_value(vmis.get("i").await.unwrap()).unwrap()["metadata"]["annotations"].clone() };
    let message = |r: (u16, Value)| (r.0, r.1["message"].as_str().unwrap_or_default().to_owned());

    assert_eq!(message(put(&s, "virtualmachineinstances/i/pause", &json!({})).await), (409, "VM is not running".to_owned()));
    assert_eq!(message(put(&s, "virtualmachineinstances/i/unpause", &json!({})).await), (409, "VMI is not running".to_owned()));
    assert_eq!(message(put(&s, "virtualmachineinstances/i/softreboot", &json!({})).await), (409, "VM is not running".to_owned()));
    assert_eq!(put(&s, "virtualmachineinstances/nope/pause", &json!({})).await.0, 404);
    vmis.patch_status("i", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running"}}))).await.unwrap();

    let rev = s.revision();
    assert_eq!(put(&s, "virtualmachineinstances/i/pause", &json!({"dryRun": ["All"]})).await.0, 202);
    assert_eq!(s.revision(), rev, "dryRun writes nothing");
    assert_eq!(put(&s, "virtualmachineinstances/i/pause", &json!({})).await.0, 202);
    assert_eq!(annotations().await["virtplug.io/pause-requested"], "true");
    assert_eq!(message(put(&s, "virtualmachineinstances/i/pause", &json!({})).await), (409, "VMI is already paused".to_owned()));
    assert_eq!(message(put(&s, "virtualmachineinstances/i/softreboot", &json!({})).await), (409, "VMI is paused".to_owned()));
    assert_eq!(put(&s, "virtualmachineinstances/i/unpause", &json!({})).await.0, 202);
    assert_eq!(annotations().await.get("virtplug.io/pause-requested"), None);
    assert_eq!(message(put(&s, "virtualmachineinstances/i/unpause", &json!({})).await), (409, "VMI is not paused".to_owned()));

    // Each soft reboot is a new request (the agent carries out each ID once); virtctl sends no
    // body.
    let path = format!("{SUB}/virtualmachineinstances/i/softreboot");
    assert_eq!(s.raw("PUT", &path, "application/json", Vec::new()).await.0, 202);
    let first = annotations().await["virtplug.io/softreboot-requested"].clone();
    assert_eq!(put(&s, "virtualmachineinstances/i/softreboot", &json!({})).await.0, 202);
    let second = annotations().await["virtplug.io/softreboot-requested"].clone();
    assert!(first.is_string() && second.is_string() && first != second, "{first} {second}");

    // Served on VMIs only, as in KubeVirt (virtctl pause vm goes to the VM's VMI).
    assert_eq!(put(&s, "virtualmachines/i/pause", &json!({})).await.0, 404);
    let (_, list) = s.raw("GET", "/apis/subresources.kubevirt.io/v1", "application/json", Vec::new()).await;
    let listed: Vec<&str> = list["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    for sub in ["virtualmachineinstances/pause", "virtualmachineinstances/unpause", "virtualmachineinstances/softreboot"] {
        assert!(listed.contains(&sub), "{sub} in {listed:?}");
    }
}
