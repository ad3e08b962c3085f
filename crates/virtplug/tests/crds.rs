//! CustomResourceDefinitions as data, as kubectl (1.27, 1.33 and the one on PATH) and kube-rs
//! use them against a real API server: a CRD applied is served at once (discovery, Table with
//! its printer columns, explain, pruning, defaults, validation), a reflector follows its
//! objects, and deleting it deletes them; virtplug's own CRDs are listed and cannot be deleted.

#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::oldest_newest_and_path as kubectls;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{reflector, watcher, WatchStreamExt};

use common::{wait_until, TestServer};

fn crd(plural: &str, kind: &str) -> String {
    let (singular, short) = (plural.trim_end_matches('s'), &plural[..2]);
    format!(
        r"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {plural}.example.com}}
spec:
  group: example.com
  scope: Namespaced
  names: {{plural: {plural}, singular: {singular}, kind: {kind}, shortNames: [{short}], categories: [all]}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}, scale: {{specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}}}}
    additionalPrinterColumns:
    - {{name: Size, type: integer, jsonPath: .spec.size}}
    - {{name: Color, type: string, jsonPath: .spec.color}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: What the {kind} should be.
            required: [size]
            properties:
              size: {{type: integer, minimum: 1, description: How big.}}
              color: {{type: string, enum: [red, blue], default: red}}
              replicas: {{type: integer, default: 1}}
          status:
            type: object
            properties:
              ready: {{type: boolean}}
"
    )
}

fn run(bin: &PathBuf, kubeconfig: &PathBuf, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
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
    let input = stdin.unwrap_or_default().to_owned();
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("kubectl finishes");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_applies_a_crd_uses_its_objects_and_deletes_it_with_them() {
    let s = TestServer::start().await;
    let kubeconfig = s.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        for (i, bin) in kubectls().into_iter().enumerate() {
            let v = bin.file_name().unwrap().to_string_lossy().into_owned();
            let k = |args: &[&str], stdin: Option<&str>| run(&bin, &kubeconfig, args, stdin);
            let ok = |args: &[&str], stdin: Option<&str>| {
                let (ok, out, err) = k(args, stdin);
                assert!(ok, "{v} {args:?}: {err}");
                out
            };
            let (plural, kind) = (["gadgets", "widgets", "doodads"][i % 3], ["Gadget", "Widget", "Doodad"][i % 3]);
            let name = format!("{plural}.example.com");
            assert!(ok(&["apply", "-f", "-"], Some(&crd(plural, kind))).contains("created"), "{v}");
            ok(&["wait", "--for", "condition=established", "--timeout=20s", &format!("crd/{name}")], None);
            let crds = ok(&["get", "crd"], None);
            assert!(crds.contains(&name) && crds.contains("virtualmachines.kubevirt.io"), "{v}: {crds}");

            // An object: unknown fields pruned, defaults set, the Table with the printer columns.
            let obj = format!("apiVersion: example.com/v1\nkind: {kind}\nmetadata: {{name: one}}\nspec: {{size: 3, typo: 1}}\n");
            ok(&["apply", "-f", "-"], Some(&obj));
            let table = ok(&["get", &plural[..2]], None);
            let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
            assert_eq!(header, ["NAME", "SIZE", "COLOR"], "{v}: {table}");
            let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
            assert_eq!(row, ["one", "3", "red"], "{v}: {table}");
            assert!(ok(&["get", "all"], None).contains(&format!("{}.example.com/one", kind.to_lowercase())), "{v}: category all");
            let json: serde_json::Value = serde_json::from_str(&ok(&["get", plural, "one", "-o", "json"], None)).unwrap();
            assert_eq!(json["spec"], serde_json::json!({"size": 3, "color": "red", "replicas": 1}), "{v}: pruned and defaulted");
            // The scale subresource: kubectl scale writes spec.replicas through it.
            ok(&["scale", "--replicas=4", &format!("{plural}/one")], None);
            let scale: serde_json::Value =
                serde_json::from_str(&ok(&["get", "--raw", &format!("/apis/example.com/v1/namespaces/default/{plural}/one/scale")], None))
                    .unwrap();
            assert_eq!((scale["kind"].as_str(), scale["spec"]["replicas"].as_i64()), (Some("Scale"), Some(4)), "{v}: {scale}");
            assert_eq!(ok(&["get", plural, "one", "-o", "jsonpath={.spec.replicas}"], None), "4", "{v}");
            let explain = ok(&["explain", &format!("{plural}.spec")], None);
            assert!(explain.contains("What the") && explain.contains("size"), "{v}: {explain}");

            // Invalid objects are refused naming each field.
            let bad = format!("apiVersion: example.com/v1\nkind: {kind}\nmetadata: {{name: bad}}\nspec: {{size: 0, color: green}}\n");
            let (accepted, _, err) = k(&["apply", "-f", "-"], Some(&bad));
            assert!(!accepted && err.contains("spec.size") && err.contains("spec.color"), "{v}: {err}");

            // Deleting the CRD deletes its objects, and its resource is gone.
            assert!(ok(&["delete", "crd", &name], None).contains("deleted"), "{v}");
            let (listed, _, err) = k(&["get", plural], None);
            assert!(!listed, "{v}: {plural} are still served");
            assert!(err.contains("the server doesn't have a resource type") || err.contains("could not find"), "{v}: {err}");
            ok(&["apply", "-f", "-"], Some(&crd(plural, kind)));
            ok(&["wait", "--for", "condition=established", "--timeout=20s", &format!("crd/{name}")], None);
            let again = ok(&["get", plural, "-o", "name"], None);
            assert!(again.trim().is_empty(), "{v}: the objects went with the CRD, found {again}");
            ok(&["delete", "crd", &name], None);

            // virtplug's own CRDs are not deleted with every VM.
            let (deleted, _, err) = k(&["delete", "crd", "virtualmachines.kubevirt.io"], None);
            assert!(!deleted && err.contains("Forbidden"), "{v}: {err}");
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_kube_rs_reflector_follows_a_crd_registered_at_run_time() {
    let s = TestServer::start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    let manifest: serde_json::Value = serde_yaml::from_str(&crd("sprockets", "Sprocket")).unwrap();
    crds.create(&PostParams::default(), &serde_json::from_value(manifest).unwrap()).await.unwrap();
    wait_until(Duration::from_secs(20), "the Sprocket CRD to be Established", || {
        let crds = crds.clone();
        async move {
            let crd = crds.get("sprockets.example.com").await.ok()?;
            let conditions = crd.status?.conditions?;
            conditions.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        }
    })
    .await;

    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Sprocket"), "sprockets");
    let api: Api<DynamicObject> = Api::namespaced_with(s.client.clone(), "default", &ar);
    let writer = reflector::store::Writer::new(ar.clone());
    let reader = writer.as_reader();
    let stream = reflector(writer, watcher(api.clone(), watcher::Config::default())).applied_objects();
    let follow = tokio::spawn(stream.for_each(|_| async {}));
    for i in 0..3 {
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Sprocket", "metadata": {"name": format!("s{i}")}, "spec": {"size": i + 1}
        }))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    }
    wait_until(Duration::from_secs(20), "the reflector to hold the three Sprockets", || {
        let reader = reader.clone();
        async move { (reader.state().len() == 3).then_some(()) }
    })
    .await;
    let sizes: Vec<i64> = {
        let mut v: Vec<i64> =
            reader.state().iter().filter_map(|o| o.data.pointer("/spec/size").and_then(serde_json::Value::as_i64)).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(sizes, [1, 2, 3]);
    // Deleting the CRD deletes the objects; the reflector sees them go.
    crds.delete("sprockets.example.com", &Default::default()).await.unwrap();
    wait_until(Duration::from_secs(20), "the CRD and its objects to be gone", || {
        let crds = crds.clone();
        async move { crds.get_opt("sprockets.example.com").await.ok()?.is_none().then_some(()) }
    })
    .await;
    follow.abort();
}
