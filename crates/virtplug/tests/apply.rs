//! Server-side apply against a real server: real `kubectl` (the one on PATH, 1.27 and 1.33)
//! with `apply --server-side`, `--field-manager`, `--force-conflicts` and `diff --server-side`,
//! and kube-rs's `Patch::Apply`.

#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::oldest_newest_and_path as kubectls;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{vm, TestServer};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    child.wait_with_output().expect("kubectl finishes")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The managers that own `.spec.runStrategy`.
fn run_strategy_owners(obj: &Value) -> Vec<String> {
    let entries = obj.pointer("/metadata/managedFields").and_then(Value::as_array).cloned().unwrap_or_default();
    entries
        .iter()
        .filter(|e| e.pointer("/fieldsV1/f:spec/f:runStrategy").is_some())
        .map(|e| e["manager"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn manifest(name: &str, run_strategy: &str) -> String {
    let mut v = vm(name);
    v["spec"]["runStrategy"] = json!(run_strategy);
    v.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply_conflicts_force_and_diff() {
    let s = TestServer::start().await;
    for (i, bin) in kubectls().into_iter().enumerate() {
        let v = bin.display().to_string();
        let name = format!("ssa{i}");
        let (bin2, kc) = (bin.clone(), s.kubeconfig.clone());
        let run = move |args: &[&str], stdin: &str| kubectl(&bin2, &kc, args, stdin);
        let get = |run: &dyn Fn(&[&str], &str) -> Output| -> Value {
            let out = run(&["get", "vm", &name, "-o", "json", "--show-managed-fields"], "");
            assert!(out.status.success(), "{v} get: {}", text(&out.stderr));
            serde_json::from_slice(&out.stdout).unwrap()
        };

        // Create, then the same again: nothing is written the second time.
        let out = run(&["apply", "--server-side", "--field-manager", "a", "-f", "-"], &manifest(&name, "Halted"));
        assert!(out.status.success(), "{v} apply: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("serverside-applied"), "{v}: {}", text(&out.stdout));
        let first = get(&run);
        assert_eq!(run_strategy_owners(&first), ["a"], "{v}");
        let revision = s.revision();
        let out = run(&["apply", "--server-side", "--field-manager", "a", "-f", "-"], &manifest(&name, "Halted"));
        assert!(out.status.success(), "{v} re-apply: {}", text(&out.stderr));
        assert_eq!(s.revision(), revision, "{v}: a no-op apply writes nothing (no event on watch)");
        assert_eq!(get(&run)["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"], "{v}");

        // Another manager changing a's value: a conflict naming the field and a.
        let out = run(&["apply", "--server-side", "--field-manager", "b", "-f", "-"], &manifest(&name, "Always"));
        assert!(!out.status.success(), "{v}: b's apply must conflict");
        let err = text(&out.stderr);
        assert!(err.contains(r#"Apply failed with 1 conflict: conflict with "a": .spec.runStrategy"#), "{v}: {err}");
        assert_eq!(get(&run)["spec"]["runStrategy"], "Halted", "{v}: nothing changed");

        // Forced: b takes the field.
        let out = run(&["apply", "--server-side", "--field-manager", "b", "--force-conflicts", "-f", "-"], &manifest(&name, "Always"));
        assert!(out.status.success(), "{v} forced apply: {}", text(&out.stderr));
        let forced = get(&run);
        assert_eq!(forced["spec"]["runStrategy"], "Always", "{v}");
        assert_eq!(run_strategy_owners(&forced), ["b"], "{v}: ownership moved from a to b");

        // diff --server-side shows the change and writes nothing.
        let revision = s.revision();
        let out = run(&["diff", "--server-side", "--field-manager", "b", "-f", "-"], &manifest(&name, "Manual"));
        assert_eq!(out.status.code(), Some(1), "{v} diff exits 1 when it finds a difference: {}", text(&out.stderr));
        let diff = text(&out.stdout);
        assert!(diff.contains("-  runStrategy: Always") && diff.contains("+  runStrategy: Manual"), "{v}: {diff}");
        assert_eq!(s.revision(), revision, "{v}: diff is a dry run");
        assert_eq!(get(&run)["spec"]["runStrategy"], "Always", "{v}");
    }
}

fn vms(s: &TestServer) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"), "virtualmachines");
    Api::namespaced_with(s.client.clone(), "default", &ar)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_patch_apply_creates_is_idempotent_and_conflicts() {
    let s = TestServer::start().await;
    let api = vms(&s);
    let config = vm("kr");
    let created = api.patch("kr", &PatchParams::apply("ctl"), &Patch::Apply(&config)).await.unwrap();
    let created = serde_json::to_value(created).unwrap();
    assert_eq!(run_strategy_owners(&created), ["ctl"]);
    assert_eq!(created["metadata"]["managedFields"][0]["operation"], "Apply");
    let again = api.patch("kr", &PatchParams::apply("ctl"), &Patch::Apply(&config)).await.unwrap();
    assert_eq!(again.metadata.resource_version, created["metadata"]["resourceVersion"].as_str().map(str::to_owned));

    let mut other = vm("kr");
    other["spec"]["runStrategy"] = json!("Always");
    let e = api.patch("kr", &PatchParams::apply("other"), &Patch::Apply(&other)).await.unwrap_err();
    let kube::Error::Api(status) = e else { panic!("an API error: {e}") };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert_eq!(status.message, r#"Apply failed with 1 conflict: conflict with "ctl": .spec.runStrategy"#);
    let forced = api.patch("kr", &PatchParams::apply("other").force(), &Patch::Apply(&other)).await.unwrap();
    assert_eq!(run_strategy_owners(&serde_json::to_value(forced).unwrap()), ["other"]);

    // A merge patch takes the field it changes: an Update by its fieldManager.
    let params = PatchParams { field_manager: Some("editor".into()), ..PatchParams::default() };
    let patched = api.patch("kr", &params, &Patch::Merge(json!({"spec": {"runStrategy": "Manual"}}))).await.unwrap();
    let patched = serde_json::to_value(patched).unwrap();
    assert_eq!(run_strategy_owners(&patched), ["editor"], "the Update took .spec.runStrategy from other");
    let e = api.patch("kr", &PatchParams::apply("other"), &Patch::Apply(&other)).await.unwrap_err();
    assert!(e.to_string().contains(r#"conflict with "editor" using kubevirt.io/v1: .spec.runStrategy"#), "{e}");

    // The status subresource: an apply there manages status only.
    let status = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "kr"},
                        "status": {"printableStatus": "Stopped"}});
    let out = api.patch_status("kr", &PatchParams::apply("status-ctl"), &Patch::Apply(&status)).await.unwrap();
    let out = serde_json::to_value(out).unwrap();
    let entry = out["metadata"]["managedFields"].as_array().unwrap().iter().find(|e| e["manager"] == "status-ctl").unwrap().clone();
    assert_eq!(entry["subresource"], "status");
    assert_eq!(entry["fieldsV1"], json!({"f:status": {"f:printableStatus": {}}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_requests_kube_refuses_are_refused_the_same_way() {
    let s = TestServer::start().await;
    let path = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/raw";
    let body = vm("raw").to_string().into_bytes();
    // No fieldManager: 422 naming it, as kube-apiserver.
    let (code, st) = s.raw("PATCH", path, "application/apply-patch+yaml", body.clone()).await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(st["message"], r#"PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch"#);
    // CBOR: 415 with the accepted types.
    let (code, st) = s.raw("PATCH", &format!("{path}?fieldManager=m"), "application/apply-patch+cbor", body.clone()).await;
    assert_eq!(code, 415, "{st}");
    assert!(st["message"].as_str().unwrap().contains("application/apply-patch+yaml"), "{st}");
    // force on a merge patch: 422.
    let (code, _) = s.raw("PATCH", &format!("{path}?force=true"), "application/merge-patch+json", b"{}".to_vec()).await;
    assert_eq!(code, 422);
    // A dry-run apply that would create answers 201 and stores nothing.
    let (code, st) = s.raw("PATCH", &format!("{path}?fieldManager=m&dryRun=All"), "application/apply-patch+yaml", body.clone()).await;
    assert_eq!(code, 201, "{st}");
    assert_eq!(st["metadata"]["managedFields"][0]["manager"], "m");
    assert_eq!(s.raw("GET", path, "application/json", Vec::new()).await.0, 404);
    // YAML bodies, and a body naming another object.
    let yaml = "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: raw\nspec:\n  runStrategy: Halted\n  template: {spec: {domain: {devices: {}}}}\n";
    let (code, st) = s.raw("PATCH", &format!("{path}?fieldManager=m"), "application/apply-patch+yaml", yaml.as_bytes().to_vec()).await;
    // Read as YAML (the VM's own validation may still refuse this minimal spec, with 422).
    assert!(![400, 415].contains(&code), "{code} {st}");
    let (code, _) =
        s.raw("PATCH", &format!("{path}?fieldManager=m"), "application/apply-patch+yaml", vm("other").to_string().into_bytes()).await;
    assert_eq!(code, 400);
}
