//! VM lifecycle against the real embedded API server and the real controller loop: every
//! runStrategy, the start/stop/restart subresources, scheduling, printableStatus, volume
//! readiness, legacy volume requests and self-heal. The node agent's part (Scheduled → Running,
//! finalizer removal) is played by the named FAKE in `common::fakenode`; no QEMU runs here.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use api::phases::{DataVolumePhase, PrintableStatus, VolumePhase, VolumeReason};
use api::{VirtualMachine, VirtualMachineInstance};

const T: Duration = Duration::from_secs(20);

struct Env {
    s: TestServer,
    vms: Api<VirtualMachine>,
    vmis: Api<VirtualMachineInstance>,
    ctl: tokio::task::JoinHandle<()>,
    _root: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.ctl.abort();
    }
}

async fn env_with(tune: impl FnOnce(&mut apiserver::Config), legacy_volume_requests: bool) -> Env {
    let s = TestServer::start_with(tune).await;
    let root = tempfile::tempdir().unwrap();
    let config = controller::run::Config { legacy_volume_requests, storage_root: Some(root.path().to_owned()), ..Default::default() };
    let ctl = tokio::spawn(controller::run::run_with(client::in_process(s.server.local_router()), config));
    let vms = Api::namespaced(s.client.clone(), "default");
    let vmis = Api::namespaced(s.client.clone(), "default");
    Env { s, vms, vmis, ctl, _root: root }
}

async fn env() -> Env {
    env_with(|_| {}, false).await
}

fn vm(name: &str, strategy: &str) -> VirtualMachine {
    let mut v = common::vm(name);
    v["spec"]["runStrategy"] = json!(strategy);
    serde_json::from_value(v).unwrap()
}

impl Env {
    async fn create(&self, vm: VirtualMachine) {
        self.vms.create(&PostParams::default(), &vm).await.unwrap();
    }

    /// PUT to a subresource; returns (code, message).
    async fn sub(&self, name: &str, sub: &str, body: Value) -> (u16, String) {
        let path = format!("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/{name}/{sub}");
        let (code, body) = self.s.raw("PUT", &path, "application/json", serde_json::to_vec(&body).unwrap()).await;
        (code, body["message"].as_str().unwrap_or_default().to_owned())
    }

    async fn printable(&self, name: &str, want: &str) -> VirtualMachine {
        let vms = self.vms.clone();
        common::wait_until(T, &format!("VM {name} to be {want}"), || {
            let vms = vms.clone();
            async move {
                vms.get(name)
                    .await
                    .ok()
                    .filter(|v| v.status.as_ref().and_then(|s| s.printable_status.as_ref()).map(PrintableStatus::as_str) == Some(want))
            }
        })
        .await
    }

    async fn running_vmi(&self, name: &str) -> VirtualMachineInstance {
        let vmis = self.vmis.clone();
        common::wait_until(T, &format!("VMI {name} to run"), || {
            let vmis = vmis.clone();
            async move { vmis.get_opt(name).await.ok().flatten().filter(|v| v.is_running() && v.metadata.deletion_timestamp.is_none()) }
        })
        .await
    }

    async fn vmi_gone(&self, name: &str) {
        let vmis = self.vmis.clone();
        common::wait_until(T, &format!("VMI {name} to be gone"), || {
            let vmis = vmis.clone();
            async move { matches!(vmis.get_opt(name).await, Ok(None)).then_some(()) }
        })
        .await;
    }

    async fn set_phase(&self, name: &str, phase: &str) {
        self.vmis.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": phase}}))).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_starts_a_scheduled_owned_vmi_and_stop_start_restart_work() {
    let e = env().await;
    let _node = common::fakenode::start(&e.s.client, "node-a").await;
    e.create(vm("a", "Always")).await;
    let vmi = e.running_vmi("a").await;
    let vm = e.printable("a", "Running").await;
    let owner = &vmi.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("VirtualMachine", vm.uid().unwrap().as_str(), Some(true)));
    assert_eq!(vmi.labels().get("kubevirt.io/nodeName").map(String::as_str), Some("node-a"));
    assert_eq!(vmi.labels().get("vm.kubevirt.io/name").map(String::as_str), Some("a"));
    assert_eq!(vmi.status.as_ref().unwrap().node_name.as_deref(), Some("node-a"));
    assert_eq!(vmi.spec, vm.spec.template.spec.clone().unwrap(), "the VMI runs the template");
    let st = vm.status.unwrap();
    assert_eq!((st.ready, st.created), (Some(true), Some(true)));
    assert!(st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"));

    // start on a running VM: KubeVirt's refusal.
    assert_eq!(e.sub("a", "start", json!({})).await, (409, "VM is already running".to_owned()));
    // stop: Always becomes Halted, the VMI goes.
    assert_eq!(e.sub("a", "stop", json!({})).await.0, 202);
    assert_eq!(e.vms.get("a").await.unwrap().spec.run_strategy.as_deref(), Some("Halted"));
    e.vmi_gone("a").await;
    let stopped = e.printable("a", "Stopped").await;
    assert_eq!(stopped.status.unwrap().ready, Some(false));
    assert_eq!(e.sub("a", "stop", json!({})).await, (409, "VM is not running".to_owned()));
    assert_eq!(e.sub("a", "restart", json!({})).await, (409, "Halted does not support manual restart requests".to_owned()));
    // start: Halted becomes Always, a new VMI runs.
    assert_eq!(e.sub("a", "start", json!({})).await.0, 202);
    let second = e.running_vmi("a").await;
    assert_ne!(second.uid(), vmi.uid());
    // restart: the VMI is replaced by a new one; the requests are consumed.
    assert_eq!(e.sub("a", "restart", json!({})).await.0, 202);
    let third = e.running_vmi("a").await;
    let third = if third.uid() == second.uid() {
        common::wait_until(T, "a restarted VMI", || {
            let vmis = e.vmis.clone();
            let old = second.uid();
            async move {
                vmis.get_opt("a")
                    .await
                    .ok()
                    .flatten()
                    .filter(|v| v.uid() != old && v.is_running() && v.metadata.deletion_timestamp.is_none())
            }
        })
        .await
    } else {
        third
    };
    assert_ne!(third.uid(), second.uid());
    common::wait_until(T, "the state change requests to be consumed", || {
        let vms = e.vms.clone();
        async move { vms.get("a").await.ok().filter(|v| v.status.as_ref().is_some_and(|s| s.state_change_requests.is_empty())) }
    })
    .await;
    // dryRun changes nothing: the spec (runStrategy) and the state change requests stay. (Not
    // the revision or the VM's resourceVersion: the controller may still be writing the VM's
    // status and Events as the restart settles.)
    let before = e.vms.get("a").await.unwrap();
    assert_eq!(e.sub("a", "stop", json!({"dryRun": ["All"]})).await.0, 202);
    let after = e.vms.get("a").await.unwrap();
    assert_eq!(serde_json::to_value(&after.spec).unwrap(), serde_json::to_value(&before.spec).unwrap(), "a dry-run stop changed the spec");
    assert!(after.status.as_ref().is_some_and(|s| s.state_change_requests.is_empty()), "a dry-run stop queued a request");
    // Deleting the VM garbage-collects its VMI (through the finalizer the node removes).
    e.vms.delete("a", &DeleteParams::default()).await.unwrap();
    e.vmi_gone("a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_rerun_once_and_the_legacy_running_field() {
    let e = env().await;
    let _node = common::fakenode::start(&e.s.client, "node-a").await;

    // Manual: nothing on its own; start and stop through the subresources.
    e.create(vm("m", "Manual")).await;
    e.printable("m", "Stopped").await;
    assert!(e.vmis.get_opt("m").await.unwrap().is_none());
    assert_eq!(e.sub("m", "stop", json!({})).await, (409, "VM is not running".to_owned()));
    assert_eq!(e.sub("m", "start", json!({})).await.0, 202);
    let first = e.running_vmi("m").await;
    assert_eq!(e.sub("m", "stop", json!({"gracePeriod": 0})).await.0, 202);
    e.vmi_gone("m").await;
    e.printable("m", "Stopped").await;
    assert_eq!(e.vms.get("m").await.unwrap().spec.run_strategy.as_deref(), Some("Manual"), "Manual stays Manual");
    assert_eq!(e.sub("m", "start", json!({})).await.0, 202);
    assert_ne!(e.running_vmi("m").await.uid(), first.uid());

    // RerunOnFailure: a failed VMI is replaced, a succeeded one stays stopped.
    e.create(vm("r", "RerunOnFailure")).await;
    let r1 = e.running_vmi("r").await;
    e.set_phase("r", "Failed").await;
    let r2 = common::wait_until(T, "the failed VMI to be replaced", || {
        let vmis = e.vmis.clone();
        let old = r1.uid();
        async move { vmis.get_opt("r").await.ok().flatten().filter(|v| v.uid() != old && v.is_running()) }
    })
    .await;
    e.set_phase("r", "Succeeded").await;
    e.printable("r", "Stopped").await;
    assert_eq!(e.vmis.get("r").await.unwrap().uid(), r2.uid(), "a VMI that succeeded is not re-run");
    // start replaces the finished VMI.
    assert_eq!(e.sub("r", "start", json!({})).await.0, 202);
    common::wait_until(T, "a re-run VMI", || {
        let vmis = e.vmis.clone();
        let old = r2.uid();
        async move { vmis.get_opt("r").await.ok().flatten().filter(|v| v.uid() != old && v.is_running()) }
    })
    .await;

    // Once: runs, and when the run is over the VM is Halted.
    e.create(vm("o", "Once")).await;
    e.running_vmi("o").await;
    assert_eq!(e.sub("o", "restart", json!({})).await, (409, "Once does not support manual restart requests".to_owned()));
    e.set_phase("o", "Succeeded").await;
    e.vmi_gone("o").await;
    assert_eq!(e.vms.get("o").await.unwrap().spec.run_strategy.as_deref(), Some("Halted"));

    // The legacy `running` field: start and stop flip it, never add runStrategy.
    let mut legacy = common::vm("l");
    legacy["spec"].as_object_mut().unwrap().remove("runStrategy");
    legacy["spec"]["running"] = json!(false);
    e.create(serde_json::from_value(legacy).unwrap()).await;
    assert_eq!(e.sub("l", "start", json!({})).await.0, 202);
    e.running_vmi("l").await;
    let v = e.vms.get("l").await.unwrap();
    assert_eq!((v.spec.running, v.spec.run_strategy.as_deref()), (Some(true), None));
    assert_eq!(e.sub("l", "stop", json!({})).await.0, 202);
    e.vmi_gone("l").await;
    assert_eq!(e.vms.get("l").await.unwrap().spec.running, Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_node_means_unschedulable_and_a_node_arriving_schedules_it() {
    let e = env().await;
    e.create(vm("u", "Always")).await;
    let vm = e.printable("u", "ErrorUnschedulable").await;
    assert_eq!(vm.status.unwrap().created, Some(true));
    let vmi = e.vmis.get("u").await.unwrap();
    let cond = vmi.status.unwrap().conditions.into_iter().find(|c| c.type_ == "PodScheduled").unwrap();
    assert!(cond.message.unwrap().contains("virtplug node"), "the condition says how to get a node");
    // Stopping an unscheduled VM needs no node agent: the controller releases the finalizer.
    assert_eq!(e.sub("u", "stop", json!({})).await.0, 202);
    e.vmi_gone("u").await;
    let _node = common::fakenode::start(&e.s.client, "node-b").await;
    assert_eq!(e.sub("u", "start", json!({})).await.0, 202);
    assert_eq!(e.running_vmi("u").await.status.unwrap().node_name.as_deref(), Some("node-b"));
}

/// kube-scheduler's filters on the VMI: a tainted node is skipped (the message says why, in
/// kube-scheduler's words), a node arriving later schedules the waiting VMI with no other nudge,
/// a cordoned node is skipped, and a toleration or node selector is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduling_honours_taints_cordons_selectors_and_wakes_on_a_new_node() {
    let e = env().await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(e.s.client.clone());
    let _tainted = common::fakenode::start(&e.s.client, "tainted").await;
    let taint = json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}});
    nodes.patch("tainted", &PatchParams::default(), &Patch::Merge(&taint)).await.unwrap();
    e.create(vm("t", "Always")).await;
    e.printable("t", "ErrorUnschedulable").await;
    let vmis = e.vmis.clone();
    let msg = common::wait_until(T, "the VMI's PodScheduled message to name the taint", || {
        let vmis = vmis.clone();
        async move {
            let v = vmis.get_opt("t").await.ok().flatten()?;
            let c = v.status?.conditions.into_iter().find(|c| c.type_ == "PodScheduled")?;
            c.message.filter(|m| m.contains("untolerated taint {dedicated: db}"))
        }
    })
    .await;
    assert!(msg.starts_with("0/1 nodes are available"), "{msg}");

    let _plain = common::fakenode::start(&e.s.client, "plain").await;
    assert_eq!(e.running_vmi("t").await.status.unwrap().node_name.as_deref(), Some("plain"), "the new node woke the waiting VMI");

    // Cordon "plain": a new VM goes nowhere; a toleration sends it to "tainted".
    nodes.patch("plain", &PatchParams::default(), &Patch::Merge(json!({"spec": {"unschedulable": true}}))).await.unwrap();
    let mut tolerant = vm("tol", "Always");
    tolerant.spec.template.spec.as_mut().unwrap().extra.insert("tolerations".into(), json!([{"key": "dedicated", "operator": "Exists"}]));
    e.create(tolerant).await;
    assert_eq!(e.running_vmi("tol").await.status.unwrap().node_name.as_deref(), Some("tainted"));
    let mut selected = vm("sel", "Always");
    selected.spec.template.spec.as_mut().unwrap().extra.insert("nodeSelector".into(), json!({"kubernetes.io/hostname": "plain"}));
    e.create(selected).await;
    e.printable("sel", "ErrorUnschedulable").await;
    nodes
        .patch(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/hostname": "plain"}}, "spec": {"unschedulable": null}})),
        )
        .await
        .unwrap();
    assert_eq!(e.running_vmi("sel").await.status.unwrap().node_name.as_deref(), Some("plain"), "uncordoned and labelled: scheduled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_waits_for_its_volumes_and_restart_keeps_a_pending_hotplug() {
    let e = env().await;
    let _node = common::fakenode::start(&e.s.client, "node-a").await;
    let mut v = common::vm("w");
    v["spec"]["runStrategy"] = json!("Always");
    v["spec"]["template"]["spec"]["domain"]["devices"]["disks"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "data", "disk": {"bus": "virtio"}}));
    v["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}));
    e.create(serde_json::from_value(v).unwrap()).await;
    let vm = e.printable("w", "ErrorPvcNotFound").await;
    assert!(vm
        .status
        .unwrap()
        .conditions
        .iter()
        .any(|c| c.type_ == "DataVolumesReady" && c.message.as_deref().unwrap_or("").contains("claim data")));
    // A claim of a class nobody serves stays Pending: the VM waits for binding.
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(e.s.client.clone(), "default");
    let claim = |class: Option<&str>| {
        let mut c = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
                           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}});
        if let Some(class) = class {
            c["spec"]["storageClassName"] = json!(class);
        }
        serde_json::from_value(c).unwrap()
    };
    pvcs.create(&PostParams::default(), &claim(Some("elsewhere"))).await.unwrap();
    e.printable("w", "WaitingForVolumeBinding").await;
    assert!(e.vmis.get_opt("w").await.unwrap().is_none(), "no VMI before the volume is there");
    // Replace it with one the local provisioner serves: the VM starts.
    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    common::wait_until(T, "the claim to go", || {
        let pvcs = pvcs.clone();
        async move { matches!(pvcs.get_opt("data").await, Ok(None)).then_some(()) }
    })
    .await;
    pvcs.create(&PostParams::default(), &claim(None)).await.unwrap();
    e.running_vmi("w").await;
    e.printable("w", "Running").await;

    // A hot-plug whose claim does not exist yet is pending; a restart keeps it in the new VMI.
    let add = json!([
        {"op": "add", "path": "/spec/template/spec/domain/devices/disks/-", "value": {"name": "hp", "disk": {"bus": "scsi"}}},
        {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "hp", "persistentVolumeClaim": {"claimName": "later", "hotpluggable": true}}}
    ]);
    e.vms.patch("w", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(add).unwrap())).await.unwrap();
    let pending = common::wait_until(T, "the hot-plug volume to be Pending", || {
        let vmis = e.vmis.clone();
        async move {
            let v = vmis.get("w").await.ok()?;
            let st = v.status.as_ref()?.volume_status.iter().find(|s| s.name == "hp")?.clone();
            (st.phase == Some(VolumePhase::Pending)).then_some((v, st))
        }
    })
    .await;
    assert_eq!(pending.1.reason, Some(VolumeReason::PvcNotReady));
    assert!(pending.1.extra.contains_key("phaseTransitionTimestamps"));
    assert_eq!(e.sub("w", "restart", json!({})).await.0, 202);
    let restarted = common::wait_until(T, "the restarted VMI", || {
        let vmis = e.vmis.clone();
        let old = pending.0.uid();
        async move { vmis.get_opt("w").await.ok().flatten().filter(|v| v.uid() != old && v.is_running()) }
    })
    .await;
    assert!(restarted.spec.volumes.iter().any(|v| v.name == "hp"), "the pending hot-plug is in the new VMI");
    // The claim appears: the volume becomes Bound.
    let mut later = claim(None);
    later.metadata.name = Some("later".into());
    pvcs.create(&PostParams::default(), &later).await.unwrap();
    common::wait_until(T, "the hot-plug volume to be Bound", || {
        let vmis = e.vmis.clone();
        async move {
            let v = vmis.get("w").await.ok()?;
            let st = v.status?.volume_status.into_iter().find(|s| s.name == "hp")?;
            (st.phase == Some(VolumePhase::Bound) && st.persistent_volume_claim_info.is_some()).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_volume_requests_are_reported_or_applied_with_the_legacy_gate() {
    // Declarative (default): reported with the way out.
    let e = env().await;
    e.create(vm("q", "Halted")).await;
    let reqs = json!({"status": {"volumeRequests": [{"addVolumeOptions": {"name": "x", "disk": {"name": "x", "disk": {"bus": "scsi"}},
                        "volumeSource": {"persistentVolumeClaim": {"claimName": "x"}}}}]}});
    e.vms.patch_status("q", &PatchParams::default(), &Patch::Merge(reqs.clone())).await.unwrap();
    let got = common::wait_until(T, "the VolumeRequestsPending condition", || {
        let vms = e.vms.clone();
        async move {
            vms.get("q")
                .await
                .ok()
                .filter(|v| v.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "VolumeRequestsPending")))
        }
    })
    .await;
    let c = got.status.unwrap().conditions.into_iter().find(|c| c.type_ == "VolumeRequestsPending").unwrap();
    assert!(c.message.as_deref().unwrap().contains("virtplug migrate hotplug-to-declarative"));
    assert!(got.spec.template.spec.unwrap().volumes.iter().all(|v| v.name != "x"), "not applied");
    // Cleared by the user: the condition goes.
    e.vms
        .patch_status(
            "q",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([{"op": "remove", "path": "/status/volumeRequests"}])).unwrap()),
        )
        .await
        .unwrap();
    common::wait_until(T, "the condition to go", || {
        let vms = e.vms.clone();
        async move {
            vms.get("q")
                .await
                .ok()
                .filter(|v| v.status.as_ref().is_some_and(|s| s.conditions.iter().all(|c| c.type_ != "VolumeRequestsPending")))
        }
    })
    .await;
    drop(e);

    // Legacy gate on: applied to the template, then cleared.
    let e = env_with(|_| {}, true).await;
    e.create(vm("q", "Halted")).await;
    e.vms.patch_status("q", &PatchParams::default(), &Patch::Merge(reqs)).await.unwrap();
    let got = common::wait_until(T, "the request to be applied", || {
        let vms = e.vms.clone();
        async move { vms.get("q").await.ok().filter(|v| v.status.as_ref().is_some_and(|s| s.volume_requests.is_empty())) }
    })
    .await;
    let spec = serde_json::to_value(got.spec.template.spec.unwrap()).unwrap();
    assert!(spec["volumes"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "x", "persistentVolumeClaim": {"claimName": "x", "hotpluggable": true}})));
    assert!(spec["domain"]["devices"]["disks"].as_array().unwrap().contains(&json!({"name": "x", "disk": {"bus": "scsi"}})));
}

/// The lost-update corruption (a CD-ROM volume whose disk a merge patch dropped), on a server
/// without virtplug's admission (as a cluster with bare CRDs): reported, then repaired once
/// the volume is marked as virtual media.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdrom_volume_without_its_disk_is_reported_and_repaired_when_marked() {
    let e = env_with(|c| c.enforce_invariants = false, false).await;
    let mut v = common::vm("h");
    // The drive `cdrom0` is gone from the disks; its volume is still there.
    v["spec"]["template"]["spec"]["domain"]["devices"]["disks"] = json!([{"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}}]);
    v["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "cdrom0", "dataVolume": {"name": "iso", "hotpluggable": true}}));
    e.create(serde_json::from_value(v).unwrap()).await;
    let vm =
        common::wait_until(T, "the SpecValid condition", || {
            let vms = e.vms.clone();
            async move {
                vms.get("h").await.ok().filter(|v| v.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "SpecValid")))
            }
        })
        .await;
    let c = vm.status.unwrap().conditions.into_iter().find(|c| c.type_ == "SpecValid").unwrap();
    assert_eq!(c.status, "False");
    assert!(
        c.message.as_deref().unwrap().contains("spec.template.spec.volumes[1].name") && c.message.as_deref().unwrap().contains("cdrom0")
    );
    let events = client::events::list(&e.s.client, "default", "h", "InvariantViolated").await.unwrap();
    assert_eq!(events.len(), 1, "one Event per distinct violation");
    assert!(events[0].message.as_deref().unwrap().contains("cdrom0"));

    // Marked as virtual media (what the Redfish service does): the drive is re-added.
    client::blind_patch(&e.vms, "h", client::MetaKey::Annotation, controller::selfheal::VIRTUAL_MEDIA, Some("cdrom0")).await.unwrap();
    let vm = common::wait_until(T, "the drive to be back and the condition gone", || {
        let vms = e.vms.clone();
        async move {
            vms.get("h").await.ok().filter(|v| {
                v.spec.template.spec.as_ref().is_some_and(|s| s.domain.devices.disks.iter().any(|d| d.name == "cdrom0"))
                    && v.status.as_ref().is_some_and(|s| s.conditions.iter().all(|c| c.type_ != "SpecValid"))
            })
        }
    })
    .await;
    let disk = vm.spec.template.spec.unwrap().domain.devices.disks.into_iter().find(|d| d.name == "cdrom0").unwrap();
    assert_eq!(disk.kind(), api::kubevirt::DiskKind::Cdrom);
    assert!(api::invariants::check(&e.vms.get("h").await.unwrap().spec.template.spec.unwrap(), "spec").is_empty());
    assert_eq!(client::events::list(&e.s.client, "default", "h", "VirtualMediaDriveRestored").await.unwrap().len(), 1);
}

/// A VM whose root is a DataVolume from `dataVolumeTemplates`: the DataVolume is created (owned
/// by the VM) and the VM starts only once it has succeeded (`Provisioning` before: unit-tested).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_volume_templates_are_provisioned_before_the_vm_starts() {
    let e = env().await;
    let mut v = common::vm("p");
    v["spec"]["runStrategy"] = json!("Always");
    v["spec"]["template"]["spec"]["volumes"] = json!([{"name": "root", "dataVolume": {"name": "p-root"}}]);
    v["spec"]["template"]["spec"]["domain"]["devices"]["disks"] = json!([{"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}}]);
    v["spec"]["dataVolumeTemplates"] = json!([{"metadata": {"name": "p-root"}, "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "8Mi"}}}}}]);
    e.create(serde_json::from_value(v).unwrap()).await;
    // No node yet: the blank DataVolume completes, then the VMI waits to be scheduled.
    let dvs: Api<api::DataVolume> = Api::namespaced(e.s.client.clone(), "default");
    let dv = common::wait_until(T, "the DataVolume to succeed", || {
        let dvs = dvs.clone();
        async move {
            dvs.get_opt("p-root")
                .await
                .ok()
                .flatten()
                .filter(|d| d.status.as_ref().and_then(|s| s.phase.as_ref()) == Some(&DataVolumePhase::Succeeded))
        }
    })
    .await;
    assert_eq!(dv.owner_references()[0].kind, "VirtualMachine");
    assert_eq!(dv.status.unwrap().progress.as_deref(), Some("100.0%"));
    e.printable("p", "ErrorUnschedulable").await;
    let _node = common::fakenode::start(&e.s.client, "node-a").await;
    assert_eq!(e.sub("p", "restart", json!({})).await.0, 202);
    e.printable("p", "Running").await;
    // Deleting the VM takes the DataVolume and its claim with it.
    e.vms.delete("p", &DeleteParams::default()).await.unwrap();
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(e.s.client.clone(), "default");
    common::wait_until(T, "the DataVolume's claim to be collected", || {
        let pvcs = pvcs.clone();
        async move { matches!(pvcs.get_opt("p-root").await, Ok(None)).then_some(()) }
    })
    .await;
}

/// Regression (found by the P3 benchmark: 88 CPU seconds in 60 s for 256 waiting volumes): the
/// controller rewrote the message the node agent had written on a `Pending` volume, each write
/// woke the other, forever. The controller now leaves an entry alone unless it moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_does_not_rewrite_the_agents_message_on_a_pending_volume() {
    let s = TestServer::start().await;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "pp"},
        "spec": {"domain": {"devices": {"disks": [{"name": "w", "disk": {"bus": "scsi"}}]}},
                 "volumes": [{"name": "w", "persistentVolumeClaim": {"claimName": "never", "hotpluggable": true}}]}});
    vmis.create(&PostParams::default(), &serde_json::from_value(vmi).unwrap()).await.unwrap();
    let status = json!({"status": {"phase": "Running", "volumeStatus": [{"name": "w", "target": "", "phase": "Pending", "reason": "PVCNotReady",
        "message": "claim never does not exist", "hotplugVolume": {}}]}});
    vmis.patch_status("pp", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
    let vmi = vmis.get("pp").await.unwrap();
    let rev = s.revision();
    controller::hotplug::report_claims(&s.client, &vmi).await.unwrap();
    assert_eq!(s.revision(), rev, "no write");
    let st = vmis.get("pp").await.unwrap().status.unwrap().volume_status.remove(0);
    assert_eq!(st.message.as_deref(), Some("claim never does not exist"));
}

/// Regression (a flaky `addvolume --wait` timeline without `Bound`): the node agent can react to
/// the VMI spec before the controller's status write and create the entry itself, past `Bound`.
/// The controller then leaves phase, reason and message to the agent but still fills in the
/// claim info it owns, once: a second pass writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_the_agent_created_first_gets_its_claim_info_and_keeps_the_agents_phase() {
    let s = TestServer::start().await;
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(s.client.clone(), "default");
    let c = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "quick"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Mi"}}}});
    pvcs.create(&PostParams::default(), &serde_json::from_value(c).unwrap()).await.unwrap();
    let bound = json!({"status": {"phase": "Bound", "capacity": {"storage": "8Mi"}}});
    pvcs.patch_status("quick", &PatchParams::default(), &Patch::Merge(bound)).await.unwrap();
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "qq"},
        "spec": {"domain": {"devices": {"disks": [{"name": "q", "disk": {"bus": "scsi"}}]}},
                 "volumes": [{"name": "q", "persistentVolumeClaim": {"claimName": "quick", "hotpluggable": true}}]}});
    vmis.create(&PostParams::default(), &serde_json::from_value(vmi).unwrap()).await.unwrap();
    let status = json!({"status": {"phase": "Running", "volumeStatus": [{"name": "q", "target": "", "phase": "AttachedToNode",
        "reason": "SuccessfulCreate", "message": "opened /x/disk.img", "hotplugVolume": {}}]}});
    vmis.patch_status("qq", &PatchParams::default(), &Patch::Merge(status)).await.unwrap();

    controller::hotplug::report_claims(&s.client, &vmis.get("qq").await.unwrap()).await.unwrap();
    let st = vmis.get("qq").await.unwrap().status.unwrap().volume_status.remove(0);
    assert_eq!((st.phase, st.message.as_deref()), (Some(VolumePhase::AttachedToNode), Some("opened /x/disk.img")), "the agent's");
    let info = st.persistent_volume_claim_info.expect("the claim info is filled in");
    assert_eq!(info.claim_name.as_deref(), Some("quick"));
    let rev = s.revision();
    controller::hotplug::report_claims(&s.client, &vmis.get("qq").await.unwrap()).await.unwrap();
    assert_eq!(s.revision(), rev, "nothing more to write");
}
