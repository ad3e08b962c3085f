//! Issue 14, class 4: one object's data never stops a long-lived task. Against the real API
//! server and the real controller loop (no QEMU: no node agent runs here).
//!
//! - A client breaks the status of a VM and of a VMI through the status subresource; the
//!   controller, started after (so its first list includes them), still reconciles another VM.
//! - A namespace whose stored status is not an object (a store written before today's checks)
//!   is still deleted, its content with it.
//! - A VM whose reconcile panics (fault injection: a bug meeting its data) leaves the
//!   controller reconciling every other VM.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};

use api::{VirtualMachine, VirtualMachineInstance};

const T: Duration = Duration::from_secs(20);

fn vm(ns: &str, name: &str, strategy: &str) -> VirtualMachine {
    let mut v = common::vm(name);
    v["metadata"]["namespace"] = json!(ns);
    v["spec"]["runStrategy"] = json!(strategy);
    serde_json::from_value(v).unwrap()
}

/// Runs the controller over the server's in-process router until the returned task is aborted.
fn controller(s: &TestServer, root: &tempfile::TempDir) -> tokio::task::JoinHandle<()> {
    let config = controller::run::Config { storage_root: Some(root.path().to_owned()), ..Default::default() };
    tokio::spawn(controller::run::run_with(client::in_process(s.server.local_router()), config))
}

/// Waits for the controller to create the VMI of VM `name` in `default`.
async fn vmi_created(s: &TestServer, name: &str) {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    common::wait_until(T, &format!("the controller to create VM {name}'s VMI"), || {
        let vmis = vmis.clone();
        async move { vmis.get_opt(name).await.ok().flatten() }
    })
    .await;
}

/// Before: the server stored `{"status": {"conditions": "oops"}}`, every typed list of VMs (or
/// VMIs) failed to decode from then on, and a controller that listed again (after a restart)
/// reconciled no VM at all. Now the status write is refused (422, naming the field) and nothing
/// of it is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_or_vmi_whose_status_has_the_wrong_shape_does_not_stop_the_controller() {
    let s = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    vms.create(&PostParams::default(), &vm("default", "broken", "Halted")).await.unwrap();
    let loner = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "loner", "namespace": "default"},
        "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "128Mi"}}}}});
    let (code, _) = s
        .raw("POST", "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances", "application/json", loner.to_string().into())
        .await;
    assert_eq!(code, 201);
    let broken_status = br#"{"status": {"conditions": "oops", "phase": 7}}"#.to_vec();
    let mut answers = Vec::new();
    for path in [
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/broken/status",
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/loner/status",
    ] {
        answers.push(s.raw("PATCH", path, "application/merge-patch+json", broken_status.clone()).await);
    }

    // The controller starts now: its first lists include both objects.
    let ctl = controller(&s, &root);
    vms.create(&PostParams::default(), &vm("default", "good", "Always")).await.unwrap();
    vmi_created(&s, "good").await;
    assert!(!ctl.is_finished(), "the controller is still running");
    ctl.abort();

    for (code, body) in answers {
        assert_eq!(code, 422, "{body}");
        let field = body.pointer("/details/causes/0/field").and_then(Value::as_str).unwrap_or_default();
        assert!(field.starts_with("status."), "the cause names the field: {body}");
    }
}

/// Before: `DELETE` of a namespace whose stored status is not an object panicked in the server
/// (the connection closed, the namespace stayed). Now it is marked, the collector deletes its
/// content, and it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_whose_status_has_the_wrong_shape_is_still_deleted() {
    let s = TestServer::start().await;
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap()).await.unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "doomed");
    vms.create(&PostParams::default(), &vm("doomed", "inside", "Halted")).await.unwrap();
    // As a store written before the status shape was checked holds it.
    let store = &s.server.objects().store;
    let key = "//namespaces/doomed";
    let cur = store.get(key).unwrap();
    let mut bad = cur.object.value();
    bad["status"] = json!("Active");
    store.write(apiserver::store::Op::Update { key: key.to_owned(), expected: cur.rv, object: bad }).await.unwrap();

    namespaces.delete("doomed", &DeleteParams::default()).await.expect("the namespace is marked for deletion");
    common::wait_until(T, "the namespace and its VM to be gone", || {
        let (namespaces, vms) = (namespaces.clone(), vms.clone());
        async move {
            let gone = matches!(namespaces.get_opt("doomed").await, Ok(None)) && matches!(vms.get_opt("inside").await, Ok(None));
            gone.then_some(())
        }
    })
    .await;
}

/// kube-runtime spawns each reconcile and re-raises its panic in the controller's stream:
/// before, one VM whose reconcile panicked ended the controller for every VM (and `up` exited).
/// Now the panic is an error for that VM, counted and requeued, and the others are reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reconcile_of_one_vm_does_not_stop_the_controller() {
    // Names only this test's VM; other tests in this binary use other names.
    std::env::set_var("VIRTPLUG_FAULT", "reconcile:default/panics");
    let errors = || {
        controller::metrics::reconciles()
            .get_or_create(&controller::metrics::Reconcile { controller: "vm".into(), result: "error".into() })
            .get()
    };
    let before = errors();
    let s = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let ctl = controller(&s, &root);
    let vms: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "default");
    vms.create(&PostParams::default(), &vm("default", "panics", "Always")).await.unwrap();
    // Its reconcile fails, is requeued (2 s) and fails again: the controller outlived the panic.
    common::wait_until(T, "the panicking VM's reconcile to fail twice (a requeue after the first)", || async move {
        (errors() >= before + 2).then_some(())
    })
    .await;
    vms.create(&PostParams::default(), &vm("default", "fine", "Always")).await.unwrap();
    vmi_created(&s, "fine").await;
    assert!(!ctl.is_finished(), "the controller is still running");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    assert!(vmis.get_opt("panics").await.unwrap().is_none(), "the panicking VM's reconcile did nothing");
    ctl.abort();
}
