//! What the `stored_object` fuzz target found in the verbs on stored objects, one test per bug,
//! named after it. Each stores its object straight into a real store (as a store written by an
//! older version, a bug, or by hand could hold it), then runs the verb a client or the garbage
//! collector runs on it.

use serde_json::{json, Value};

use crate::objects::{DeleteOptions, Objects, Part, Propagation};
use crate::patch::PatchKind;
use crate::registry::{self, ResourceDef};
use crate::store::{Op, Store, StoreConfig};

fn def(group: &str, plural: &str) -> &'static ResourceDef {
    let version = if group.is_empty() { "v1" } else { registry::all().into_iter().find(|d| d.group == group).map_or("v1", |d| d.version) };
    registry::find(group, version, plural).unwrap_or_else(|| panic!("{plural} is served"))
}

async fn objects() -> (tempfile::TempDir, Objects) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let store = Store::open(&dir.path().join("store.db"), &StoreConfig { reserve: Some(0), ..StoreConfig::default() })
        .unwrap_or_else(|e| panic!("store: {e}"));
    (dir, Objects { store, enforce_invariants: true })
}

async fn put(o: &Objects, key: String, object: Value) {
    o.store.write(Op::Create { key, object }).await.unwrap_or_else(|e| panic!("stored: {e}"));
}

/// `DELETE` of a namespace whose `status` is not an object (the status subresource accepted
/// one) panicked at `obj["status"]["phase"] = "Terminating"`: the request died and the namespace
/// could never be deleted.
#[tokio::test]
async fn a_namespace_whose_status_is_not_an_object_can_still_be_deleted() {
    let (_dir, o) = objects().await;
    let ns = def("", "namespaces");
    let doomed = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed", "uid": "u1"},
        "spec": {"finalizers": ["kubernetes"]}, "status": "Active"});
    put(&o, ns.key(None, "doomed"), doomed).await;
    let deleting = o.delete(ns, None, "doomed", &DeleteOptions::default()).await.unwrap_or_else(|e| panic!("{}", e.message)).value();
    assert_eq!(deleting["status"], json!({"phase": "Terminating"}));
    assert!(deleting.pointer("/metadata/deletionTimestamp").is_some());
    // The collector finishes it: no content, so the finalizer goes and the namespace with it.
    crate::gc::settle(&o).await;
    assert!(o.store.get(&ns.key(None, "doomed")).is_none(), "the namespace is gone");
}

/// A status write to an object stored as a JSON string panicked at `n["status"] = ...`; a
/// delete with a propagation policy panicked at `obj["metadata"] = {}`.
#[tokio::test]
async fn a_stored_value_that_is_not_an_object_is_refused_for_writes_and_can_be_deleted() {
    let (_dir, o) = objects().await;
    let vms = def("kubevirt.io", "virtualmachines");
    for (name, junk) in [("s", json!("r{[i{ne}iVsion*:")), ("a", json!([1, 2])), ("n", json!(5))] {
        put(&o, vms.key(Some("default"), name), junk).await;
        let body = br#"{"status":{"printableStatus":"Running"}}"#;
        let e = o.patch(vms, Some("default"), name, PatchKind::Merge, body, Part::Status, false).await.unwrap_err();
        assert_eq!(e.code, 500, "{}", e.message);
        assert!(e.message.contains("not an object") && e.message.contains("delete it"), "{}", e.message);
        let e = o.patch(vms, Some("default"), name, PatchKind::Merge, br#"{"metadata":{"labels":{"a":"b"}}}"#, Part::Main, false).await;
        assert_eq!(e.map_err(|e| e.code).err(), Some(500));
        let opts = DeleteOptions { propagation: Some(Propagation::Foreground), ..DeleteOptions::default() };
        o.delete(vms, Some("default"), name, &opts).await.unwrap_or_else(|e| panic!("{}", e.message));
        assert!(o.store.get(&vms.key(Some("default"), name)).is_none(), "{name} is gone");
    }
}

/// A status write whose `status` does not decode as the resource's status type was stored, and
/// then every typed list of the resource failed to decode: the controller, after a restart,
/// saw no VM at all.
#[tokio::test]
async fn a_status_of_the_wrong_shape_is_refused_and_nothing_is_stored() {
    let (_dir, o) = objects().await;
    let vms = def("kubevirt.io", "virtualmachines");
    let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm", "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}});
    put(&o, vms.key(Some("default"), "vm"), vm).await;
    let before = o.store.revision();
    let e = o
        .patch(vms, Some("default"), "vm", PatchKind::Merge, br#"{"status":{"conditions":"oops"}}"#, Part::Status, false)
        .await
        .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
    assert_eq!(e.details.as_ref().and_then(|d| d.pointer("/causes/0/field")).and_then(Value::as_str), Some("status.conditions"));
    assert_eq!(o.store.revision(), before, "nothing was stored");
    let ok =
        o.patch(vms, Some("default"), "vm", PatchKind::Merge, br#"{"status":{"printableStatus":"Stopped"}}"#, Part::Status, false).await;
    assert!(ok.is_ok(), "a status of the right shape is stored");
}
