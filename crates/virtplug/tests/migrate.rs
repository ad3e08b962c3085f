//! `virtplug migrate hotplug-to-declarative` against the real embedded API server, with VMI
//! status set through `/status` as KubeVirt's node agent would. Fixtures follow the upstream
//! migration's (tenant-a … tenant-h). Cases our admission refuses to store (a VMI volume without
//! a disk, a VM disk without volume) are covered by the planner's unit tests.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::TestServer;
use controller::migrate::{self, Action, Options};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

async fn ns(s: &TestServer, name: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(s.client.clone());
    api.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()).await.unwrap();
}

async fn vm(s: &TestServer, ns_: &str, name: &str, disks: Value, volumes: Value) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), ns_, &common::kubevirt_resource("VirtualMachine"));
    let mut spec = json!({"domain": {"devices": {}}});
    if !disks.is_null() {
        spec["domain"]["devices"]["disks"] = disks;
    }
    if !volumes.is_null() {
        spec["volumes"] = volumes;
    }
    let obj = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name}, "spec": {"runStrategy": "Always", "template": {"spec": spec}}});
    serde_json::to_value(api.create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await.unwrap()).unwrap()
}

async fn vmi(s: &TestServer, ns_: &str, name: &str, owner: Option<Value>, phase: Option<&str>, disks: Value, volumes: Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), ns_, &common::kubevirt_resource("VirtualMachineInstance"));
    let mut meta = json!({"name": name});
    if let Some(o) = owner {
        meta["ownerReferences"] = json!([o]);
    }
    let obj = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
        "spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}});
    api.create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await.unwrap();
    if let Some(p) = phase {
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": p}}))).await.unwrap();
    }
}

fn owner(vm: &Value, controller: bool) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": vm["metadata"]["name"], "uid": vm["metadata"]["uid"], "controller": controller})
}

async fn get_vm(s: &TestServer, ns_: &str, name: &str) -> Value {
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), ns_, &common::kubevirt_resource("VirtualMachine"));
    serde_json::to_value(api.get(name).await.unwrap()).unwrap()
}

fn dv(name: &str, hp: bool) -> Value {
    if hp {
        json!({"name": name, "dataVolume": {"name": name, "hotpluggable": true}})
    } else {
        json!({"name": name, "dataVolume": {"name": format!("{name}-dv")}})
    }
}

fn scsi(name: &str) -> Value {
    json!({"name": name, "disk": {"bus": "scsi"}, "serial": name})
}

/// The upstream fixture set; returns the VMs that must be patched.
async fn fixtures(s: &TestServer) {
    for n in ["tenant-a", "tenant-b", "tenant-c", "tenant-d", "tenant-e", "tenant-f", "tenant-g", "tenant-h"] {
        ns(s, n).await;
    }
    let root = json!({"name": "root", "disk": {"bus": "virtio"}});
    // a: VMI-only DV and PVC hot-plugs, plus a non-hot-pluggable VMI-only cloud-init volume.
    let a = vm(s, "tenant-a", "worker-old", json!([root, scsi("pvc-in-spec")]), json!([dv("root", false), dv("pvc-in-spec", true)])).await;
    vmi(
        s,
        "tenant-a",
        "worker-old",
        Some(owner(&a, true)),
        Some("Running"),
        json!([root, scsi("pvc-in-spec"), scsi("pvc-vmi-only"), scsi("pvc-claim-only"), {"name": "cloudinit", "disk": {"bus": "virtio"}}]),
        json!([dv("root", false), dv("pvc-in-spec", true), dv("pvc-vmi-only", true),
               {"name": "pvc-claim-only", "persistentVolumeClaim": {"claimName": "pvc-claim-only", "hotpluggable": true}},
               {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}}]),
    )
    .await;
    // b: already in sync.
    let b = vm(s, "tenant-b", "worker-new", json!([root, scsi("pvc-b")]), json!([dv("root", false), dv("pvc-b", true)])).await;
    vmi(
        s,
        "tenant-b",
        "worker-new",
        Some(owner(&b, true)),
        Some("Running"),
        json!([root, scsi("pvc-b")]),
        json!([dv("root", false), dv("pvc-b", true)]),
    )
    .await;
    // c: standalone VMI.
    vmi(s, "tenant-c", "orphan", None, Some("Running"), json!([scsi("pvc-c")]), json!([dv("pvc-c", true)])).await;
    // d: the VM already has the drive (an empty CD-ROM drive here); only the volume is copied.
    let cd = json!({"name": "cd", "cdrom": {"bus": "sata"}});
    let d = vm(s, "tenant-d", "worker-disk", json!([root, cd]), json!([dv("root", false)])).await;
    vmi(
        s,
        "tenant-d",
        "worker-disk",
        Some(owner(&d, true)),
        Some("Running"),
        json!([root, cd]),
        json!([dv("root", false), dv("cd", true)]),
    )
    .await;
    // e: owner reference that is not the controller.
    let e = vm(s, "tenant-e", "worker-ref", Value::Null, Value::Null).await;
    vmi(s, "tenant-e", "worker-ref", Some(owner(&e, false)), Some("Running"), json!([scsi("pvc-e")]), json!([dv("pvc-e", true)])).await;
    // f: the controlling VM is gone.
    vmi(
        s,
        "tenant-f",
        "worker-gone",
        Some(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "worker-gone", "uid": "gone", "controller": true})),
        Some("Running"),
        json!([scsi("pvc-f")]),
        json!([dv("pvc-f", true)]),
    )
    .await;
    // g: VMI Failed; h: VMI with no phase.
    let g = vm(s, "tenant-g", "worker-failed", json!([root]), json!([dv("root", false)])).await;
    vmi(
        s,
        "tenant-g",
        "worker-failed",
        Some(owner(&g, true)),
        Some("Failed"),
        json!([root, scsi("pvc-g")]),
        json!([dv("root", false), dv("pvc-g", true)]),
    )
    .await;
    let h = vm(s, "tenant-h", "worker-pending", Value::Null, Value::Null).await;
    vmi(s, "tenant-h", "worker-pending", Some(owner(&h, true)), None, json!([scsi("pvc-h")]), json!([dv("pvc-h", true)])).await;
}

#[tokio::test]
async fn upstream_fixtures_copy_exactly_what_is_needed_and_a_second_run_writes_nothing() {
    let s = TestServer::start().await;
    fixtures(&s).await;
    let untouched: Vec<(&str, &str)> =
        vec![("tenant-b", "worker-new"), ("tenant-e", "worker-ref"), ("tenant-g", "worker-failed"), ("tenant-h", "worker-pending")];
    let mut before = Vec::new();
    for (n, v) in &untouched {
        before.push(get_vm(&s, n, v).await);
    }

    let report = migrate::run(&s.client, &Options::default()).await.unwrap();
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.patched, 2);
    let copied: Vec<(String, String)> = report
        .findings
        .iter()
        .filter(|f| f.action == Action::Copied)
        .map(|f| (format!("{}/{}", f.namespace, f.vm), f.volume.clone()))
        .collect();
    assert_eq!(
        copied,
        [
            ("tenant-a/worker-old".to_owned(), "pvc-vmi-only".to_owned()),
            ("tenant-a/worker-old".to_owned(), "pvc-claim-only".to_owned()),
            ("tenant-d/worker-disk".to_owned(), "cd".to_owned()),
        ]
    );

    let a = get_vm(&s, "tenant-a", "worker-old").await;
    assert_eq!(
        a["spec"]["template"]["spec"]["volumes"],
        json!([dv("root", false), dv("pvc-in-spec", true), dv("pvc-vmi-only", true),
        {"name": "pvc-claim-only", "persistentVolumeClaim": {"claimName": "pvc-claim-only", "hotpluggable": true}}])
    );
    assert_eq!(
        a["spec"]["template"]["spec"]["domain"]["devices"]["disks"],
        json!([{"name": "root", "disk": {"bus": "virtio"}}, scsi("pvc-in-spec"), scsi("pvc-vmi-only"), scsi("pvc-claim-only")])
    );
    let d = get_vm(&s, "tenant-d", "worker-disk").await;
    assert_eq!(d["spec"]["template"]["spec"]["volumes"], json!([dv("root", false), dv("cd", true)]));
    assert_eq!(
        d["spec"]["template"]["spec"]["domain"]["devices"]["disks"],
        json!([{"name": "root", "disk": {"bus": "virtio"}}, {"name": "cd", "cdrom": {"bus": "sata"}}]),
        "no duplicate disk"
    );
    for ((n, v), b) in untouched.iter().zip(&before) {
        assert_eq!(&get_vm(&s, n, v).await, b, "{n}/{v} untouched");
    }

    let rev = s.revision();
    let again = migrate::run(&s.client, &Options::default()).await.unwrap();
    assert!(again.findings.is_empty() && again.patched == 0, "{again:?}");
    assert_eq!(s.revision(), rev, "the second run wrote nothing");
}

#[tokio::test]
async fn uid_mismatch_differing_source_and_pending_requests_are_refused() {
    let s = TestServer::start().await;
    ns(&s, "t").await;
    // UID mismatch: the VM was re-created after the VMI started.
    let _ = vm(&s, "t", "recreated", Value::Null, Value::Null).await;
    vmi(
        &s,
        "t",
        "recreated",
        Some(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "recreated", "uid": "old-uid", "controller": true})),
        Some("Running"),
        json!([scsi("x")]),
        json!([dv("x", true)]),
    )
    .await;
    // Differing source under the same name.
    let differ =
        vm(&s, "t", "differ", json!([scsi("data")]), json!([{"name": "data", "dataVolume": {"name": "new-dv", "hotpluggable": true}}]))
            .await;
    vmi(
        &s,
        "t",
        "differ",
        Some(owner(&differ, true)),
        Some("Running"),
        json!([scsi("data")]),
        json!([{"name": "data", "dataVolume": {"name": "old-dv", "hotpluggable": true}}]),
    )
    .await;
    // Pending legacy volume requests.
    let pending = vm(&s, "t", "pending", Value::Null, Value::Null).await;
    let vms: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "t", &common::kubevirt_resource("VirtualMachine"));
    vms.patch_status(
        "pending",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"volumeRequests": [{"removeVolumeOptions": {"name": "y"}}]}})),
    )
    .await
    .unwrap();
    vmi(&s, "t", "pending", Some(owner(&pending, true)), Some("Running"), json!([scsi("y")]), json!([dv("y", true)])).await;

    let rev = s.revision();
    let report = migrate::run(&s.client, &Options { namespace: Some("t".into()), ..Options::default() }).await.unwrap();
    assert!(report.failed());
    assert_eq!(report.patched, 0);
    assert_eq!(s.revision(), rev, "nothing copied");
    let reason = |vm: &str| report.findings.iter().find(|f| f.vm == vm).map(|f| (f.action, f.reason.clone())).unwrap();
    let (a, r) = reason("recreated");
    assert!(a == Action::Refused && r.contains("UID old-uid"), "{r}");
    let (a, r) = reason("differ");
    assert!(a == Action::Refused && r.contains("different source"), "{r}");
    let (a, r) = reason("pending");
    assert!(a == Action::Refused && r.contains("pending status.volumeRequests") && r.contains("--subresource=status"), "{r}");
}

#[tokio::test]
async fn a_conflict_is_retried_on_a_fresh_read_and_a_failed_vm_is_completed_by_a_rerun() {
    let s = TestServer::start().await;
    ns(&s, "t").await;
    for name in ["first", "second"] {
        let v = vm(&s, "t", name, json!([{"name": "root", "disk": {"bus": "virtio"}}]), json!([dv("root", false)])).await;
        vmi(
            &s,
            "t",
            name,
            Some(owner(&v, true)),
            Some("Running"),
            json!([{"name": "root", "disk": {"bus": "virtio"}}, scsi(&format!("{name}-hp"))]),
            json!([dv("root", false), dv(&format!("{name}-hp"), true)]),
        )
        .await;
    }
    let vms: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "t", &common::kubevirt_resource("VirtualMachine"));
    // first: one concurrent write between read and patch; second: a writer that always wins.
    let racer = vms.clone();
    let opts = Options {
        before_patch: Some(Arc::new(move |_, vm, attempt| {
            let racer = racer.clone();
            let vm = vm.to_owned();
            Box::pin(async move {
                if vm == "second" || attempt == 1 {
                    client::blind_patch(&racer, &vm, client::MetaKey::Annotation, "example.com/racer", Some(&attempt.to_string()))
                        .await
                        .unwrap();
                }
            })
        })),
        ..Options::default()
    };
    let report = migrate::run(&s.client, &opts).await.unwrap();
    assert!(report.failed(), "the second VM failed: the run fails closed");
    assert_eq!(report.patched, 1);
    let first = get_vm(&s, "t", "first").await;
    assert_eq!(first["spec"]["template"]["spec"]["volumes"][1]["name"], "first-hp", "retried on a fresh read and copied");
    assert_eq!(first["metadata"]["annotations"]["example.com/racer"], "1", "the concurrent write survived");
    let failed: Vec<_> = report.findings.iter().filter(|f| f.action == Action::Failed).collect();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].vm == "second" && failed[0].reason.contains("kept changing"), "{failed:?}");

    let first_rv = first["metadata"]["resourceVersion"].clone();
    let rerun = migrate::run(&s.client, &Options::default()).await.unwrap();
    assert!(!rerun.failed(), "{rerun:?}");
    assert_eq!(rerun.patched, 1);
    assert_eq!(get_vm(&s, "t", "first").await["metadata"]["resourceVersion"], first_rv, "the first VM is not touched again");
    assert_eq!(get_vm(&s, "t", "second").await["spec"]["template"]["spec"]["volumes"][1]["name"], "second-hp");
}

#[tokio::test]
async fn a_vm_without_volumes_or_disks_keys_is_patched() {
    let s = TestServer::start().await;
    ns(&s, "t").await;
    let bare = vm(&s, "t", "bare", Value::Null, Value::Null).await;
    assert!(bare["spec"]["template"]["spec"].get("volumes").is_none());
    assert!(bare["spec"]["template"]["spec"]["domain"]["devices"].get("disks").is_none());
    vmi(&s, "t", "bare", Some(owner(&bare, true)), Some("Running"), json!([scsi("hp")]), json!([dv("hp", true)])).await;
    let report = migrate::run(&s.client, &Options::default()).await.unwrap();
    assert!(!report.failed(), "{report:?}");
    let after = get_vm(&s, "t", "bare").await;
    assert_eq!(after["spec"]["template"]["spec"]["volumes"], json!([dv("hp", true)]));
    assert_eq!(after["spec"]["template"]["spec"]["domain"]["devices"]["disks"], json!([scsi("hp")]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_a_dry_run_writes_nothing_and_fails_closed() {
    let s = TestServer::start().await;
    fixtures(&s).await;
    let bin = env!("CARGO_BIN_EXE_virtplug");
    let kc = s.kubeconfig.clone();
    let rev = s.revision();
    let run = move |args: Vec<&'static str>| {
        let kc = kc.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin)
                .args(["migrate", "hotplug-to-declarative", "--kubeconfig"])
                .arg(&kc)
                .args(args)
                .output()
                .unwrap()
        })
    };
    let out = run(vec!["--dry-run"]).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAMESPACE/VM", "VOLUME", "ACTION", "REASON"]);
    assert!(
        table.lines().any(|l| l.starts_with("tenant-a/worker-old") && l.contains(" pvc-claim-only ") && l.contains(" copy ")),
        "{table}"
    );
    assert_eq!(s.revision(), rev, "a dry run writes nothing");

    let out = run(vec!["--dry-run", "-o", "json"]).await.unwrap();
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["findings"].as_array().unwrap().len(), 3);

    // A refused VM makes the real run exit non-zero.
    ns(&s, "bad").await;
    let _ = vm(&s, "bad", "recreated", Value::Null, Value::Null).await;
    vmi(
        &s,
        "bad",
        "recreated",
        Some(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "recreated", "uid": "old", "controller": true})),
        Some("Running"),
        json!([scsi("x")]),
        json!([dv("x", true)]),
    )
    .await;
    let out = run(vec![]).await.unwrap();
    assert_eq!(out.status.code(), Some(1), "fails closed: {}", String::from_utf8_lossy(&out.stdout));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("summary: 2 VM(s) patched, 3 volume(s) copied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
