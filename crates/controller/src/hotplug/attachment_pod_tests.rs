use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};

use super::*;

struct Claims(Vec<PersistentVolumeClaim>);
impl Lookup for Claims {
    fn pvc(&self, _: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.0.iter().find(|p| p.metadata.name.as_deref() == Some(name)).cloned().map(Arc::new)
    }
    fn dv(&self, _: &str, _: &str) -> Option<Arc<api::DataVolume>> {
        None
    }
    /// Two classes: `wffc` (`WaitForFirstConsumer`) and `now` (`Immediate`).
    fn storage_class(&self, name: &str) -> Option<Arc<k8s_openapi::api::storage::v1::StorageClass>> {
        let mode = match name {
            "wffc" => "WaitForFirstConsumer",
            "now" => "Immediate",
            _ => return None,
        };
        let sc = json!({"metadata": {"name": name}, "provisioner": "csi.example.com", "volumeBindingMode": mode});
        Some(Arc::new(serde_json::from_value(sc).unwrap()))
    }
}

fn claim(name: &str, mode: &str, phase: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({"metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"volumeMode": mode, "resources": {"requests": {"storage": "16Mi"}}},
        "status": {"phase": phase, "capacity": {"storage": "32Mi"}}}))
    .unwrap()
}

fn vmi(volumes: &[&str], status: &Value) -> VirtualMachineInstance {
    let vols: Vec<Value> = volumes
        .iter()
        .map(|v| json!({"name": v, "persistentVolumeClaim": {"claimName": format!("c-{v}"), "hotpluggable": true}}))
        .collect();
    serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "ns", "uid": "vmi-uid"},
        "spec": {"domain": {}, "volumes": vols},
        "status": {"phase": "Running", "nodeName": "n1", "volumeStatus": status}}))
    .unwrap()
}

fn carried(volumes: &[&str]) -> Vec<Carried> {
    volumes
        .iter()
        .map(|v| Carried { volume: (*v).into(), claim: format!("c-{v}"), block: false, claim_uid: format!("uid-c-{v}"), bytes: Some(1) })
        .collect()
}

/// A pod carrying `volumes`, `Running` or not, created at second `at`.
fn pod(name: &str, volumes: &[&str], running: bool, at: i64) -> Pod {
    let vmi = vmi(&[], &json!([]));
    let mut p = pod_for(&vmi, "n1", &carried(volumes), &cfg()).unwrap();
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + at).unwrap()));
    p.status = Some(serde_json::from_value(json!({"phase": if running { "Running" } else { "Pending" }})).unwrap());
    p
}

fn cfg() -> LauncherPods {
    LauncherPods { image: "virtplug:dev".into(), run_root: PathBuf::from("/var/lib/virtplug/node/vmis") }
}

fn entry(name: &str, pod: Option<(&str, Option<&str>)>) -> Value {
    match pod {
        None => json!({"name": name, "phase": "Bound"}),
        Some((n, None)) => json!({"name": name, "phase": "Bound", "hotplugVolume": {"attachPodName": n}}),
        Some((n, Some(u))) => json!({"name": name, "phase": "Ready", "hotplugVolume": {"attachPodName": n, "attachPodUID": u}}),
    }
}

fn status(writes: &[(&str, &str, Option<&str>)]) -> Step {
    Step::Status(writes.iter().map(|(v, p, u)| ((*v).into(), (*p).into(), u.map(str::to_owned))).collect())
}

#[test]
fn the_pod_is_kubevirts_layout_pinned_to_the_vmis_node_and_owned_by_the_vmi() {
    let v = vmi(&["fs", "blk"], &json!([]));
    let set = wanted(&v, &Claims(vec![claim("c-fs", "Filesystem", "Bound"), claim("c-blk", "Block", "Bound")]));
    let p = serde_json::to_value(pod_for(&v, "n1", &set, &cfg()).unwrap()).unwrap();
    assert_eq!(p["metadata"]["generateName"], "hp-volume-");
    assert_eq!(p["metadata"]["namespace"], "ns");
    assert_eq!(
        p["metadata"]["labels"],
        json!({"kubevirt.io": "hotplug-disk", "virtplug.io/attachment-for": "vmi-uid", "vm.kubevirt.io/name": "vm1"})
    );
    assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "vmi-uid");
    assert_eq!(
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"],
        json!([{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]),
        "KubeVirt pins by affinity, so the scheduler (and WaitForFirstConsumer binding) still runs"
    );
    assert_eq!(
        p["spec"]["volumes"],
        json!([{"name": "hotplug-disks", "emptyDir": {}}, {"name": "blk", "persistentVolumeClaim": {"claimName": "c-blk"}},
               {"name": "fs", "persistentVolumeClaim": {"claimName": "c-fs"}}])
    );
    let c = &p["spec"]["containers"][0];
    assert_eq!(c["volumeMounts"], json!([{"name": "hotplug-disks", "mountPath": "/hotplug-disks"}, {"name": "fs", "mountPath": "/fs"}]));
    assert_eq!(c["volumeDevices"], json!([{"name": "blk", "devicePath": "/path/blk/uid-c-blk"}]));
    assert_eq!(
        c["command"],
        json!(["virtplug", "attachment-holder", "--socket", "/hotplug-disks/hp.sock", "--disk", "/fs/disk.img=33554432"]),
        "the holder creates an empty Filesystem claim's disk.img with the claim's capacity"
    );
}

#[test]
fn only_bound_hotpluggable_claims_are_wanted() {
    let v = vmi(&["a", "b"], &json!([]));
    let set = wanted(&v, &Claims(vec![claim("c-a", "Filesystem", "Bound"), claim("c-b", "Filesystem", "Pending")]));
    assert_eq!(set.iter().map(|c| c.volume.as_str()).collect::<Vec<_>>(), ["a"]);
}

/// `claim` of StorageClass `class`, unbound (no capacity yet) or bound by the provisioner.
fn classed(name: &str, class: &str, bound: bool) -> PersistentVolumeClaim {
    let mut c = claim(name, "Filesystem", "Bound");
    c.spec.as_mut().unwrap().storage_class_name = Some(class.into());
    if !bound {
        c.status = Some(serde_json::from_value(json!({"phase": "Pending"})).unwrap());
    }
    c
}

/// Issue 19: a claim of a `WaitForFirstConsumer` class binds only once a pod using it is
/// scheduled, so the attachment pod must carry it while it is still unbound; an unbound
/// `Immediate` claim waits for its provisioner instead.
#[test]
fn a_pending_wait_for_first_consumer_claim_is_wanted_and_a_pending_immediate_one_is_not() {
    let v = vmi(&["a", "b", "c"], &json!([]));
    let set = wanted(&v, &Claims(vec![classed("c-a", "wffc", false), classed("c-b", "now", false), claim("c-c", "Filesystem", "Pending")]));
    assert_eq!(set.iter().map(|c| c.volume.as_str()).collect::<Vec<_>>(), ["a"]);
    assert_eq!(set[0].bytes, Some(16 << 20), "no capacity before binding: the holder sizes disk.img by the request");
}

/// The claim the pod consumes binds (capacity now known): the pod made for the unbound claim is
/// still the current one — no second pod, no swap.
#[test]
fn a_wait_for_first_consumer_claim_binding_does_not_replace_its_attachment_pod() {
    let v = vmi(&["a"], &json!([entry("a", None)]));
    let pending = wanted(&v, &Claims(vec![classed("c-a", "wffc", false)]));
    assert_eq!(decide(&v, &pending, &[]), [Step::Create(pending.clone())]);
    let mut p = pod_for(&v, "n1", &pending, &cfg()).unwrap();
    p.metadata.name = Some("p1".into());
    p.metadata.uid = Some("uid-p1".into());
    p.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    let bound = wanted(&v, &Claims(vec![classed("c-a", "wffc", true)]));
    assert_ne!(bound, pending, "the capacity changed the carried claim's size");
    assert_eq!(decide(&v, &bound, std::slice::from_ref(&p)), [status(&[("a", "p1", Some("uid-p1"))])], "the same pod serves it");
}

#[test]
fn a_new_set_creates_a_pod_whose_name_is_written_at_once_and_its_uid_once_it_runs() {
    let v = vmi(&["a"], &json!([entry("a", None)]));
    assert_eq!(decide(&v, &carried(&["a"]), &[]), [Step::Create(carried(&["a"]))]);
    let pending = pod("p1", &["a"], false, 1);
    assert_eq!(decide(&v, &carried(&["a"]), std::slice::from_ref(&pending)), [status(&[("a", "p1", None)])]);
    let v = vmi(&["a"], &json!([entry("a", Some(("p1", None)))]));
    assert_eq!(decide(&v, &carried(&["a"]), &[pending]), [], "nothing more until it runs");
    let ran = pod("p1", &["a"], true, 1);
    assert_eq!(decide(&v, &carried(&["a"]), std::slice::from_ref(&ran)), [status(&[("a", "p1", Some("uid-p1"))])]);
    let v = vmi(&["a"], &json!([entry("a", Some(("p1", Some("uid-p1"))))]));
    assert_eq!(decide(&v, &carried(&["a"]), &[ran]), [], "settled");
}

/// The swap: the old pod (serving `a` to QEMU) stays until the new one, carrying `a` and `b`,
/// runs; `a`'s entry keeps the old pod until then.
#[test]
fn a_changed_set_creates_the_new_pod_first_and_deletes_the_old_only_once_the_new_one_runs() {
    let old = pod("p1", &["a"], true, 1);
    let v = vmi(&["a", "b"], &json!([entry("a", Some(("p1", Some("uid-p1")))), entry("b", None)]));
    let both = carried(&["a", "b"]);
    assert_eq!(decide(&v, &both, std::slice::from_ref(&old)), [Step::Create(both.clone())], "no delete before the new pod exists");
    let new = pod("p2", &["a", "b"], false, 2);
    assert_eq!(
        decide(&v, &both, &[old.clone(), new.clone()]),
        [status(&[("b", "p2", None)])],
        "a keeps the running old pod; the old pod stays while the new one is not running"
    );
    let new = pod("p2", &["a", "b"], true, 2);
    assert_eq!(
        decide(&v, &both, &[old, new]),
        [status(&[("a", "p2", Some("uid-p2")), ("b", "p2", Some("uid-p2"))]), Step::Delete("p1".into())]
    );
}

#[test]
fn a_pod_is_kept_while_an_unplugged_volume_it_carried_still_has_its_status_entry() {
    let p = pod("p1", &["a"], true, 1);
    // `a` left the spec; the agent is still detaching it (device_del … remove-fd).
    let v = vmi(&[], &json!([{"name": "a", "phase": "Detaching", "hotplugVolume": {"attachPodName": "p1", "attachPodUID": "uid-p1"}}]));
    assert_eq!(decide(&v, &[], std::slice::from_ref(&p)), [], "QEMU may still hold a through p1");
    let v = vmi(&[], &json!([]));
    assert_eq!(decide(&v, &[], &[p]), [Step::Delete("p1".into())], "the agent dropped the entry: QEMU holds nothing through p1");
}

#[test]
fn a_shrunk_set_keeps_the_old_pod_until_the_removed_volume_is_unplugged() {
    let old = pod("p1", &["a", "b"], true, 1);
    let new = pod("p2", &["a"], true, 2);
    let detaching = json!({"name": "b", "phase": "Detaching", "hotplugVolume": {"attachPodName": "p1", "attachPodUID": "uid-p1"}});
    let v = vmi(&["a"], &json!([entry("a", Some(("p2", Some("uid-p2")))), detaching]));
    assert_eq!(decide(&v, &carried(&["a"]), &[old.clone(), new.clone()]), [], "b is still held through p1");
    let v = vmi(&["a"], &json!([entry("a", Some(("p2", Some("uid-p2"))))]));
    assert_eq!(decide(&v, &carried(&["a"]), &[old, new]), [Step::Delete("p1".into())]);
}

#[test]
fn of_two_pods_carrying_the_same_set_the_newest_is_current_and_the_other_goes_once_it_runs() {
    let v = vmi(&["a"], &json!([entry("a", Some(("p2", Some("uid-p2"))))]));
    let (p1, p2) = (pod("p1", &["a"], true, 1), pod("p2", &["a"], true, 2));
    assert_eq!(decide(&v, &carried(&["a"]), &[p2, p1]), [Step::Delete("p1".into())]);
}

#[test]
fn a_pod_being_deleted_is_ignored() {
    let v = vmi(&["a"], &json!([entry("a", None)]));
    let mut p = pod("p1", &["a"], true, 1);
    p.metadata.deletion_timestamp = p.metadata.creation_timestamp.clone();
    assert_eq!(decide(&v, &carried(&["a"]), &[p]), [Step::Create(carried(&["a"]))]);
}
