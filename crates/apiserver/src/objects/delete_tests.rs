//! Graceful deletion of Pods ([`super::pod_grace`]): what a kubelet and `kubectl delete pod`
//! rely on, on a real store.

use serde_json::{json, Value};

use crate::objects::{DeleteOptions, Objects};
use crate::registry::{self, ResourceDef};
use crate::store::{Op, Store, StoreConfig};

fn pods() -> &'static ResourceDef {
    registry::find("", "v1", "pods").unwrap_or_else(|| panic!("pods are served"))
}

async fn objects() -> (tempfile::TempDir, Objects) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let store = Store::open(&dir.path().join("store.db"), &StoreConfig { reserve: Some(0), ..StoreConfig::default() })
        .unwrap_or_else(|e| panic!("store: {e}"));
    (dir, Objects { store, enforce_invariants: true })
}

/// Stores pod `name` with `spec` and `status` as a kubelet would have them.
async fn pod(o: &Objects, name: &str, spec: Value, status: Value) {
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "d", "uid": format!("uid-{name}")},
        "spec": spec, "status": status});
    o.store.write(Op::Create { key: pods().key(Some("d"), name), object: p }).await.unwrap_or_else(|e| panic!("stored: {e}"));
}

fn grace(g: Option<u64>) -> DeleteOptions {
    DeleteOptions { grace_period: g, ..DeleteOptions::default() }
}

async fn delete(o: &Objects, name: &str, g: Option<u64>) -> Value {
    o.delete(pods(), Some("d"), name, &grace(g)).await.unwrap_or_else(|e| panic!("delete {name}: {}", e.message)).value()
}

fn stored(o: &Objects, name: &str) -> Option<(u64, Value)> {
    o.get(pods(), Some("d"), name).ok().map(|s| (s.rv, s.object.value()))
}

/// Seconds from now to the pod's `deletionTimestamp`.
fn due_in(p: &Value) -> i64 {
    let t: jiff::Timestamp = p["metadata"]["deletionTimestamp"].as_str().unwrap_or_else(|| panic!("marked: {p}")).parse().unwrap();
    t.duration_since(jiff::Timestamp::now()).as_secs()
}

#[tokio::test]
async fn a_pod_on_a_node_stays_marked_for_its_grace_until_deleted_with_none() {
    let (_dir, o) = objects().await;
    pod(&o, "p", json!({"nodeName": "n1", "terminationGracePeriodSeconds": 40}), json!({"phase": "Running"})).await;

    let marked = delete(&o, "p", None).await;
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], json!(40), "the pod's own grace");
    assert!((38..=40).contains(&due_in(&marked)), "due in its grace: {marked}");
    let (rv, _) = stored(&o, "p").expect("still there: its kubelet has not stopped it");

    // A longer (or equal) grace changes nothing; a shorter one shortens it.
    delete(&o, "p", Some(60)).await;
    assert_eq!(stored(&o, "p").map(|(r, _)| r), Some(rv), "not written again");
    let shorter = delete(&o, "p", Some(5)).await;
    assert_eq!(shorter["metadata"]["deletionGracePeriodSeconds"], json!(5));
    assert!((3..=5).contains(&due_in(&shorter)), "{shorter}");

    // The kubelet, once the pod's processes are gone: grace 0.
    delete(&o, "p", Some(0)).await;
    assert!(stored(&o, "p").is_none(), "gone");
}

#[tokio::test]
async fn a_pod_no_node_runs_goes_at_once() {
    let (_dir, o) = objects().await;
    pod(&o, "unscheduled", json!({"terminationGracePeriodSeconds": 40}), json!({"phase": "Pending"})).await;
    pod(&o, "finished", json!({"nodeName": "n1"}), json!({"phase": "Failed"})).await;
    pod(&o, "no-grace", json!({"nodeName": "n1", "terminationGracePeriodSeconds": 0}), json!({"phase": "Running"})).await;
    for name in ["unscheduled", "finished", "no-grace"] {
        delete(&o, name, None).await;
        assert!(stored(&o, name).is_none(), "{name} went at once");
    }
    pod(&o, "default", json!({"nodeName": "n1"}), json!({"phase": "Running"})).await;
    assert_eq!(delete(&o, "default", None).await["metadata"]["deletionGracePeriodSeconds"], json!(30), "kube's default grace");
}

#[tokio::test]
async fn a_grace_neither_holds_other_kinds_nor_lengthens_a_finalizers_wait() {
    let (_dir, o) = objects().await;
    let cms = registry::find("", "v1", "configmaps").unwrap_or_else(|| panic!("configmaps are served"));
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d", "uid": "u"}});
    o.store.write(Op::Create { key: cms.key(Some("d"), "c"), object: cm }).await.unwrap_or_else(|e| panic!("stored: {e}"));
    o.delete(cms, Some("d"), "c", &grace(Some(30))).await.unwrap_or_else(|e| panic!("{}", e.message));
    assert!(o.get(cms, Some("d"), "c").is_err(), "a ConfigMap goes at once whatever the grace");

    // A finalizer on a pod on a node: graceful first; deleted with grace 0 it waits for the
    // finalizer with no grace left, and a later graceful delete does not give it one back.
    let p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "f", "namespace": "d", "uid": "uf", "finalizers": ["x/y"]},
        "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
    o.store.write(Op::Create { key: pods().key(Some("d"), "f"), object: p }).await.unwrap_or_else(|e| panic!("stored: {e}"));
    assert_eq!(delete(&o, "f", None).await["metadata"]["deletionGracePeriodSeconds"], json!(30));
    let held = delete(&o, "f", Some(0)).await;
    assert_eq!(held["metadata"]["deletionGracePeriodSeconds"], json!(0), "{held}");
    let again = delete(&o, "f", Some(30)).await;
    assert_eq!(again["metadata"]["deletionGracePeriodSeconds"], json!(0), "{again}");
    assert!(stored(&o, "f").is_some(), "the finalizer holds it");
}
