//! Ownership and merge cases taken from Kubernetes' server-side apply documentation
//! (<https://kubernetes.io/docs/reference/using-api/server-side-apply/>): conflicts, force,
//! removing what an applier no longer applies, shared ownership, Updates taking ownership, and
//! the three list types.

use serde_json::{json, Value};

use super::*;
use crate::registry::{self, ResourceDef};

fn vm_def() -> &'static ResourceDef {
    registry::find("kubevirt.io", "v1", "virtualmachines").unwrap()
}

fn node_def() -> &'static ResourceDef {
    registry::find("", "v1", "nodes").unwrap()
}

#[allow(clippy::needless_pass_by_value)]
fn vm(spec: Value) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm1", "namespace": "default"}, "spec": spec})
}

#[allow(clippy::needless_pass_by_value)]
fn node(meta: Value, spec: Value) -> Value {
    let mut m = json!({"name": "n1"});
    if let (Some(m), Some(extra)) = (m.as_object_mut(), meta.as_object()) {
        m.extend(extra.clone());
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": m, "spec": spec})
}

/// Applies `config` for `manager` to `live` on the main resource.
fn apply_as(def: &ResourceDef, live: Option<&Value>, config: &Value, manager: &str, force: bool) -> Result<Value, ApiError> {
    apply(def, Part::Main, live, config, manager, force)
}

/// The field paths `manager` owns with `op`, as printed in conflicts.
fn owned(obj: &Value, manager: &str, op: Operation) -> Vec<String> {
    managed::stored(obj)
        .into_iter()
        .find(|e| e.manager == manager && e.operation == op)
        .map(|e| e.fields.paths().iter().map(|p| display_path(p)).collect())
        .unwrap_or_default()
}

fn managers(obj: &Value) -> Vec<(String, Operation)> {
    managed::stored(obj).into_iter().map(|e| (e.manager, e.operation)).collect()
}

#[test]
fn an_apply_that_creates_owns_exactly_what_it_applied_in_fieldsv1() {
    let config = vm(json!({"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {"disks": [{"name": "d"}]}}}}}));
    let mut config = config;
    config["metadata"]["labels"] = json!({"app": "x"});
    let out = apply_as(vm_def(), None, &config, "a", false).unwrap();
    assert_eq!(out["spec"], config["spec"]);
    let entry = &out["metadata"]["managedFields"][0];
    assert_eq!((entry["manager"].as_str(), entry["operation"].as_str()), (Some("a"), Some("Apply")));
    assert_eq!(entry["apiVersion"], "kubevirt.io/v1");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert!(entry["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    // KubeVirt's CRD lists are atomic: the disks list is one leaf. No `.` for maps an apply
    // only passes through.
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:metadata": {"f:labels": {"f:app": {}}},
               "f:spec": {"f:runStrategy": {}, "f:template": {"f:spec": {"f:domain": {"f:devices": {"f:disks": {}}}}}}})
    );
}

#[test]
fn applying_the_same_configuration_again_is_a_no_op_even_for_the_time() {
    let config = vm(json!({"runStrategy": "Halted"}));
    let once = apply_as(vm_def(), None, &config, "a", false).unwrap();
    let twice = apply_as(vm_def(), Some(&once), &config, "a", false).unwrap();
    assert_eq!(twice, once);
}

#[test]
fn changing_a_value_another_applier_owns_is_a_conflict_worded_as_kube() {
    let live = apply_as(vm_def(), None, &vm(json!({"runStrategy": "Halted"})), "a", false).unwrap();
    let e = apply_as(vm_def(), Some(&live), &vm(json!({"runStrategy": "Always"})), "b", false).unwrap_err();
    assert_eq!((e.code, e.reason), (409, "Conflict"));
    assert_eq!(e.message, r#"Apply failed with 1 conflict: conflict with "a": .spec.runStrategy"#);
    let causes = &e.details.unwrap()["causes"];
    assert_eq!(causes, &json!([{"reason": "FieldManagerConflict", "message": "conflict with \"a\"", "field": ".spec.runStrategy"}]));
}

#[test]
fn several_conflicts_are_listed_one_per_line_by_manager() {
    let mut live = apply_as(vm_def(), None, &vm(json!({"runStrategy": "Halted", "x": 1})), "a", false).unwrap();
    live = apply_as(vm_def(), Some(&live), &vm(json!({"y": 1})), "c", false).unwrap();
    let e = apply_as(vm_def(), Some(&live), &vm(json!({"runStrategy": "Always", "x": 2, "y": 2})), "b", false).unwrap_err();
    assert_eq!(
        e.message,
        "Apply failed with 3 conflicts: conflicts with \"a\":\n- .spec.runStrategy\n- .spec.x\nconflicts with \"c\":\n- .spec.y"
    );
}

#[test]
fn force_takes_the_fields_from_the_other_manager() {
    let live = apply_as(vm_def(), None, &vm(json!({"runStrategy": "Halted", "x": 1})), "a", false).unwrap();
    let out = apply_as(vm_def(), Some(&live), &vm(json!({"runStrategy": "Always"})), "b", true).unwrap();
    assert_eq!(out["spec"]["runStrategy"], "Always");
    assert_eq!(owned(&out, "b", Operation::Apply), [".spec.runStrategy"]);
    assert_eq!(owned(&out, "a", Operation::Apply), [".spec.x"], "a keeps what b did not take");
}

#[test]
fn two_managers_applying_the_same_value_share_it_and_it_stays_while_one_applies_it() {
    let live = apply_as(vm_def(), None, &vm(json!({"runStrategy": "Halted"})), "a", false).unwrap();
    let shared = apply_as(vm_def(), Some(&live), &vm(json!({"runStrategy": "Halted"})), "b", false).unwrap();
    assert_eq!(owned(&shared, "a", Operation::Apply), [".spec.runStrategy"]);
    assert_eq!(owned(&shared, "b", Operation::Apply), [".spec.runStrategy"]);
    // a stops applying it: b still owns it, so it stays.
    let out = apply_as(vm_def(), Some(&shared), &vm(json!({})), "a", false).unwrap();
    assert_eq!(out["spec"]["runStrategy"], "Halted");
    assert_eq!(managers(&out), [("b".to_owned(), Operation::Apply)], "a owns nothing now, so its entry goes");
}

#[test]
fn a_field_the_applier_no_longer_applies_is_removed() {
    let mut c = vm(json!({"runStrategy": "Halted"}));
    c["metadata"]["labels"] = json!({"keep": "1", "drop": "2"});
    let live = apply_as(vm_def(), None, &c, "a", false).unwrap();
    c["metadata"]["labels"] = json!({"keep": "1"});
    let out = apply_as(vm_def(), Some(&live), &c, "a", false).unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"keep": "1"}));
    assert_eq!(owned(&out, "a", Operation::Apply), [".metadata.labels.keep", ".spec.runStrategy"]);
}

#[test]
fn a_field_set_by_an_update_is_not_removed_by_an_applier_that_never_owned_it() {
    let live = apply_as(vm_def(), None, &vm(json!({"runStrategy": "Halted"})), "a", false).unwrap();
    let mut edited = live.clone();
    edited["spec"]["x"] = json!(1);
    record_update(vm_def(), Part::Main, Some(&live), &mut edited, Some("kubectl-edit"));
    let out = apply_as(vm_def(), Some(&edited), &vm(json!({"runStrategy": "Halted"})), "a", false).unwrap();
    assert_eq!(out["spec"]["x"], 1);
}

#[test]
fn an_update_takes_ownership_of_what_it_changed_and_then_conflicts_with_the_applier() {
    let live = apply_as(vm_def(), None, &vm(json!({"runStrategy": "Halted", "x": 1})), "a", false).unwrap();
    let mut edited = live.clone();
    edited["spec"]["runStrategy"] = json!("Always");
    record_update(vm_def(), Part::Main, Some(&live), &mut edited, Some("kubectl-edit"));
    assert_eq!(owned(&edited, "kubectl-edit", Operation::Update), [".spec.runStrategy"]);
    assert_eq!(owned(&edited, "a", Operation::Apply), [".spec.x"]);
    let e = apply_as(vm_def(), Some(&edited), &vm(json!({"runStrategy": "Halted", "x": 1})), "a", false).unwrap_err();
    assert_eq!(e.message, r#"Apply failed with 1 conflict: conflict with "kubectl-edit" using kubevirt.io/v1: .spec.runStrategy"#);
    let causes = &e.details.unwrap()["causes"][0];
    assert_eq!(causes["message"], r#"conflict with "kubectl-edit" using kubevirt.io/v1"#);
}

#[test]
fn an_update_records_added_maps_with_a_dot_and_the_server_takes_without_an_entry() {
    let mut created = vm(json!({"runStrategy": "Halted"}));
    created["metadata"]["labels"] = json!({"a": "1"});
    record_update(vm_def(), Part::Main, None, &mut created, Some("kubectl-create"));
    assert_eq!(
        created["metadata"]["managedFields"][0]["fieldsV1"],
        json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}, "f:spec": {".": {}, "f:runStrategy": {}}})
    );
    // The server's own write (garbage collector) records no entry but takes what it changed.
    let mut gc = created.clone();
    gc["metadata"]["labels"] = json!({});
    record_update(vm_def(), Part::Main, Some(&created), &mut gc, None);
    assert_eq!(managers(&gc), [("kubectl-create".to_owned(), Operation::Update)]);
    assert_eq!(owned(&gc, "kubectl-create", Operation::Update), [".metadata.labels", ".spec", ".spec.runStrategy"]);
}

#[test]
fn an_update_that_changes_nothing_records_nothing() {
    let mut created = vm(json!({"runStrategy": "Halted"}));
    record_update(vm_def(), Part::Main, None, &mut created, Some("a"));
    let mut same = created.clone();
    record_update(vm_def(), Part::Main, Some(&created), &mut same, Some("b"));
    assert_eq!(same, created);
}

#[test]
fn sent_managed_fields_are_used_reset_by_an_empty_list_and_ignored_when_malformed() {
    let mut live = vm(json!({"runStrategy": "Halted"}));
    record_update(vm_def(), Part::Main, None, &mut live, Some("a"));
    // Missing (a PUT that does not send them): the stored ones stay.
    let mut put = live.clone();
    put["metadata"].as_object_mut().unwrap().remove("managedFields");
    record_update(vm_def(), Part::Main, Some(&live), &mut put, Some("b"));
    assert_eq!(put, live);
    // Malformed: ignored, the stored ones stay.
    let mut junk = live.clone();
    junk["metadata"]["managedFields"] = json!([{"manager": "x", "operation": "Steal"}]);
    record_update(vm_def(), Part::Main, Some(&live), &mut junk, Some("b"));
    assert_eq!(junk, live);
    // []: cleared, and nothing changed, so none is left.
    let mut reset = live.clone();
    reset["metadata"]["managedFields"] = json!([]);
    record_update(vm_def(), Part::Main, Some(&live), &mut reset, Some("b"));
    assert!(reset["metadata"].get("managedFields").is_none());
}

#[test]
fn map_lists_merge_by_key_and_each_applier_owns_its_items() {
    let r = |uid: &str| json!({"apiVersion": "v1", "kind": "X", "name": uid, "uid": uid});
    let live = apply_as(node_def(), None, &node(json!({"ownerReferences": [r("u1")]}), json!({})), "a", false).unwrap();
    let out = apply_as(node_def(), Some(&live), &node(json!({"ownerReferences": [r("u2")]}), json!({})), "b", false).unwrap();
    assert_eq!(out["metadata"]["ownerReferences"], json!([r("u1"), r("u2")]));
    assert!(owned(&out, "b", Operation::Apply).contains(&r#".metadata.ownerReferences[uid="u2"]"#.to_owned()));
    let fields = &out["metadata"]["managedFields"][1]["fieldsV1"]["f:metadata"]["f:ownerReferences"];
    assert!(fields[r#"k:{"uid":"u2"}"#]["."].is_object(), "an item is a member with its fields: {fields}");
    // a stops applying its item: it goes, b's stays.
    let out = apply_as(node_def(), Some(&out), &node(json!({}), json!({})), "a", false).unwrap();
    assert_eq!(out["metadata"]["ownerReferences"], json!([r("u2")]));
}

#[test]
fn atomic_lists_are_replaced_whole_and_conflict_whole() {
    let t = |k: &str| json!({"key": k, "effect": "NoSchedule"});
    let live = apply_as(node_def(), None, &node(json!({}), json!({"taints": [t("a"), t("b")]})), "a", false).unwrap();
    let out = apply_as(node_def(), Some(&live), &node(json!({}), json!({"taints": [t("c")]})), "a", false).unwrap();
    assert_eq!(out["spec"]["taints"], json!([t("c")]));
    assert_eq!(owned(&out, "a", Operation::Apply), [".spec.taints"]);
    let e = apply_as(node_def(), Some(&out), &node(json!({}), json!({"taints": [t("c"), t("d")]})), "b", false).unwrap_err();
    assert_eq!(e.message, r#"Apply failed with 1 conflict: conflict with "a": .spec.taints"#);
}

#[test]
fn set_lists_merge_by_value() {
    let live = apply_as(node_def(), None, &node(json!({"finalizers": ["x"]}), json!({"podCIDRs": ["10.0.0.0/24"]})), "a", false).unwrap();
    let out = apply_as(node_def(), Some(&live), &node(json!({"finalizers": ["y"]}), json!({})), "b", false).unwrap();
    assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
    assert_eq!(owned(&out, "b", Operation::Apply), [r#".metadata.finalizers[="y"]"#]);
    assert_eq!(owned(&out, "a", Operation::Apply), [r#".metadata.finalizers[="x"]"#, r#".spec.podCIDRs[="10.0.0.0/24"]"#]);
}

#[test]
fn a_list_whose_items_cannot_be_keyed_is_handled_as_atomic() {
    let r = json!({"name": "no uid"});
    let out = apply_as(node_def(), None, &node(json!({"ownerReferences": [r.clone(), r]}), json!({})), "a", false).unwrap();
    assert_eq!(owned(&out, "a", Operation::Apply), [".metadata.ownerReferences"]);
}

#[test]
fn a_status_apply_manages_status_only_and_a_main_apply_ignores_status() {
    let live = apply_as(vm_def(), None, &vm(json!({"runStrategy": "Halted"})), "a", false).unwrap();
    let mut c = vm(json!({"runStrategy": "Always"}));
    c["status"] = json!({"printableStatus": "Stopped"});
    let out = apply(vm_def(), Part::Status, Some(&live), &c, "ctl", false).unwrap();
    assert_eq!(out["spec"]["runStrategy"], "Halted", "spec is not the status subresource's");
    assert_eq!(out["status"]["printableStatus"], "Stopped");
    let e = managed::stored(&out).into_iter().find(|e| e.manager == "ctl").unwrap();
    assert_eq!((e.subresource.as_str(), display_path(&e.fields.paths()[0])), ("status", ".status.printableStatus".to_owned()));
    let main = apply_as(vm_def(), Some(&out), &c, "b", true).unwrap();
    assert_eq!(owned(&main, "b", Operation::Apply), [".spec.runStrategy"]);
}

#[test]
fn manager_names_come_from_the_user_agent_as_kube_derives_them() {
    assert_eq!(manager_from_user_agent("kubectl/v1.33.0 (linux/amd64) kubernetes/abc").as_deref(), Some("kubectl"));
    assert_eq!(manager_from_user_agent("").as_deref(), None);
    assert_eq!(manager_from_user_agent(&"x".repeat(300)).map(|m| m.len()), Some(MAX_MANAGER_LEN));
    assert_eq!(check_manager(&"x".repeat(129), "PatchOptions").unwrap_err().code, 422);
    assert!(check_manager("a\u{7}", "PatchOptions").is_err());
    assert!(check_manager("kubectl", "PatchOptions").is_ok());
}

#[test]
fn odd_configurations_never_panic() {
    // Through the fuzz entry: duplicate keys and values, items of the wrong type, type changes,
    // nulls, a deep value, forced and not.
    let deep = format!("spec: {}1{}", "{a: ".repeat(120), "}".repeat(120));
    let cases = [
        "metadata: {ownerReferences: [{uid: a}, {uid: a}, 5, null], finalizers: [x, x, {y: 1}]}",
        "spec: {podCIDRs: [[1], {a: 1}], taints: null, runStrategy: {x: [1]}}",
        "status: 7\nspec: [1]\nmetadata: []",
        "metadata: {labels: null, managedFields: [{}]}",
        deep.as_str(),
    ];
    let current = json!({"metadata": {"name": "x", "ownerReferences": [{"uid": "a"}], "managedFields": [{"manager": "m",
        "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:runStrategy": {}}}}]},
        "spec": {"runStrategy": "Halted", "podCIDRs": ["1"]}});
    for body in cases {
        for kind in [3, 3 | 0x80] {
            crate::fuzzing::patch(kind, current.to_string().as_bytes(), body.as_bytes());
        }
    }
}
