//! Issue 14, class 1: nothing from a spec reaches QEMU's command line as an option, and QEMU
//! (root) is never handed a host file a spec names outside the allowed directories.
//!
//! Against the real API server (admission) and, for the boot files, the real controller and
//! node agent: a VMI naming `/etc/shadow` as its initrd fails to start, and no QEMU runs.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{vm, TestServer};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::{json, Value};

use api::VirtualMachineInstance;

const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default";

/// The review's injection: a serial that, pasted into `-device ...,serial=S`, would have set the
/// disk's drive and boot index. Refused at admission with KubeVirt's rule, by field, whichever
/// way it arrives; nothing is stored.
#[tokio::test]
async fn an_injected_serial_is_refused_by_field_on_create_patch_and_addvolume() {
    let s = TestServer::start().await;
    let injected = "data,drive=root-disk,bootindex=0";
    let mut bad = vm("inj");
    bad["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]["serial"] = json!(injected);
    let (code, st) =
        s.raw("POST", "/apis/kubevirt.io/v1/namespaces/default/virtualmachines", "application/json", bad.to_string().into()).await;
    assert_eq!(code, 422, "{st}");
    let causes = st["details"]["causes"].as_array().unwrap();
    assert_eq!(causes[0]["field"], "spec.template.spec.domain.devices.disks[0].serial", "{st}");
    assert!(causes[0]["message"].as_str().unwrap().contains("[A-Za-z0-9_.+-]"), "{st}");

    let vms: Api<api::VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(vm("v")).unwrap()).await.unwrap();
    let rev = s.revision();
    let patch = json!([{"op": "add", "path": "/spec/template/spec/domain/devices/disks/0/serial", "value": injected}]);
    let (code, st) = s
        .raw("PATCH", "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/v", "application/json-patch+json", patch.to_string().into())
        .await;
    assert_eq!(code, 422, "{st}");
    let body = json!({"name": "data", "disk": {"disk": {"bus": "scsi"}, "serial": injected},
                      "volumeSource": {"persistentVolumeClaim": {"claimName": "data-pvc"}}});
    let (code, st) = s.raw("PUT", &format!("{SUB}/virtualmachines/v/addvolume"), "application/json", body.to_string().into()).await;
    assert_eq!(code, 422, "{st}");
    assert!(st.to_string().contains("serial"), "{st}");
    let long = json!({"name": "data", "disk": {"disk": {"bus": "scsi"}, "serial": "s".repeat(257)},
                      "volumeSource": {"persistentVolumeClaim": {"claimName": "data-pvc"}}});
    let (code, _) = s.raw("PUT", &format!("{SUB}/virtualmachines/v/addvolume"), "application/json", long.to_string().into()).await;
    assert_eq!(code, 422, "a serial longer than KubeVirt's 256 characters");
    assert_eq!(s.revision(), rev, "nothing was stored");
}

/// Kernel boot paths with relative components or commas are refused at admission, by field.
#[tokio::test]
async fn kernel_paths_with_relative_components_or_commas_are_refused_at_admission() {
    let s = TestServer::start().await;
    for (path, what) in
        [("/var/lib/../../etc/shadow", "relative components"), ("/boot/vmlinuz,/etc/shadow", "comma"), ("vmlinuz", "relative")]
    {
        let mut bad = vm("k");
        bad["spec"]["template"]["spec"]["domain"]["firmware"] =
            json!({"kernelBoot": {"container": {"kernelPath": "/boot/vmlinuz", "initrdPath": path}}});
        let (code, st) =
            s.raw("POST", "/apis/kubevirt.io/v1/namespaces/default/virtualmachines", "application/json", bad.to_string().into()).await;
        assert_eq!(code, 422, "{path}: {st}");
        let cause = &st["details"]["causes"][0];
        assert_eq!(cause["field"], "spec.template.spec.domain.firmware.kernelBoot.container.initrdPath", "{what}: {st}");
    }
}

/// A clean absolute path is admitted (admission cannot know the node's directories), but the
/// node agent refuses to hand a file outside its allowed directories to QEMU: the VMI fails
/// with the field and the flag in its message, and no QEMU was started.
#[tokio::test]
async fn a_host_file_outside_the_allowed_dirs_never_reaches_qemu() {
    let s = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("storage")).unwrap();
    let ctl_config = controller::run::Config { storage_root: Some(dir.path().join("storage")), ..Default::default() };
    let ctl = tokio::spawn(controller::run::run_with(client::in_process(s.server.local_router()), ctl_config));
    let mut config = node::agent::Config::new("node-t", dir.path());
    config.accel = qemu::accel::Accel::Tcg;
    let agent_client = client::in_process(s.server.local_router());
    common::fakenode::kubelet(&agent_client, "node-t").await;
    let agent = tokio::spawn(async move { node::agent::run(agent_client, config).await });
    let _guard = Abort(vec![ctl.abort_handle(), agent.abort_handle()]);

    let g = common::guest::guest_dir();
    // runStrategy Once: the failed VMI stays, nothing restarts it.
    let vm: api::VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "shadow", "namespace": "default"},
        "spec": {"runStrategy": "Once", "template": {"spec": {
            "domain": {"resources": {"requests": {"memory": "128Mi"}}, "devices": {"disks": []},
                       "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0",
                           "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": "/etc/shadow"}}}},
            "volumes": []}}}}))
    .unwrap();
    // Watched, not polled: with runStrategy Once the controller halts the VM as soon as its VMI
    // has failed, and the failed VMI is gone a few milliseconds later.
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    let from = vmis.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut events = vmis.watch(&WatchParams::default().timeout(120), &from).await.unwrap().boxed();
    Api::<api::VirtualMachine>::namespaced(s.client.clone(), "default").create(&PostParams::default(), &vm).await.unwrap();
    let failed = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = events.try_next().await.unwrap() {
            if let WatchEvent::Added(v) | WatchEvent::Modified(v) = event {
                if v.phase() == Some(&api::phases::VmiPhase::Failed) {
                    return v;
                }
            }
        }
        panic!("the VMI watch ended before the VMI failed to launch");
    })
    .await
    .expect("timed out after 60s waiting for the VMI to fail to launch");
    let status = serde_json::to_value(&failed.status).unwrap();
    let message = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap()["message"].clone();
    let message = message.as_str().unwrap();
    assert!(message.contains("kernelBoot.container.initrdPath") && message.contains("--boot-file-dir"), "{message}");
    assert_eq!(status["reason"], Value::from("LaunchFailed"), "{status}");
    // No QEMU ran for it: its run dir has no pidfile, and no process names /etc/shadow.
    let uid = failed.metadata.uid.unwrap();
    assert!(!dir.path().join("node/vmis").join(&uid).join("qemu.pid").exists(), "QEMU was started");
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&cmdline).contains("/etc/shadow"), "a process was given /etc/shadow: {}", p.path().display());
    }
}

struct Abort(Vec<tokio::task::AbortHandle>);

impl Drop for Abort {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
