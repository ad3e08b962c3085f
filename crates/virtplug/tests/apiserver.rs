//! The embedded API server through kube-rs, on a loopback port with TLS and a bearer token:
//! the Kubernetes semantics every virtplug component relies on.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use api::phases::PrintableStatus;
use api::{VirtualMachine, VirtualMachineInstance};
use common::{vm, wait_until, TestServer};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy, WatchEvent, WatchParams};
use kube::runtime::{watcher, Controller};
use serde_json::{json, Value};

fn vms(s: &TestServer) -> Api<VirtualMachine> {
    Api::namespaced(s.client.clone(), "default")
}

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn vm_typed(name: &str) -> VirtualMachine {
    serde_json::from_value(vm(name)).unwrap()
}

#[tokio::test]
async fn crud_round_trip() {
    let s = TestServer::start().await;
    let api = vms(&s);
    let created = api.create(&PostParams::default(), &vm_typed("a")).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    let e = api.create(&PostParams::default(), &vm_typed("a")).await.unwrap_err();
    assert_eq!(code(&e), 409);
    assert!(e.to_string().contains("already exists"), "{e}");

    let mut got = api.get("a").await.unwrap();
    got.spec.run_strategy = Some("Always".into());
    let replaced = api.replace("a", &PostParams::default(), &got).await.unwrap();
    assert_eq!(replaced.metadata.generation, Some(2));
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 1);

    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(&api.get("a").await.unwrap_err()), 404);
    let e = api.delete("a", &DeleteParams::default()).await.unwrap_err();
    assert_eq!(code(&e), 404);
    assert!(e.to_string().contains("virtualmachines.kubevirt.io \"a\" not found"), "{e}");
}

#[tokio::test]
async fn generate_name_gives_unique_names() {
    let s = TestServer::start().await;
    let mut v = vm("x");
    v["metadata"] = json!({"generateName": "gen-"});
    let v: VirtualMachine = serde_json::from_value(v).unwrap();
    let a = vms(&s).create(&PostParams::default(), &v).await.unwrap();
    let b = vms(&s).create(&PostParams::default(), &v).await.unwrap();
    let (a, b) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(a.starts_with("gen-") && b.starts_with("gen-") && a != b);
}

#[tokio::test]
async fn unmodelled_fields_survive_a_round_trip() {
    let s = TestServer::start().await;
    let manifest: Value = serde_yaml::from_str(&std::fs::read_to_string(common::fixture("testvm.yaml")).unwrap()).unwrap();
    let typed: VirtualMachine = serde_json::from_value(manifest.clone()).unwrap();
    let api = vms(&s);
    api.create(&PostParams::default(), &typed).await.unwrap();
    // Read through the typed client, write back, read raw: the spec is what was applied.
    let read = api.get("testvm").await.unwrap();
    api.replace("testvm", &PostParams::default(), &read).await.unwrap();
    let raw: Api<kube::api::DynamicObject> =
        Api::namespaced_with(s.client.clone(), "default", &kube::api::ApiResource::erase::<VirtualMachine>(&()));
    let back = serde_json::to_value(raw.get("testvm").await.unwrap()).unwrap();
    assert_eq!(back["spec"], manifest["spec"]);
    assert_eq!(back["metadata"]["annotations"], manifest["metadata"]["annotations"]);
    assert_eq!(back["metadata"]["generation"], 1, "writing back an unchanged spec is not a spec change");
}

#[tokio::test]
async fn stale_resource_version_is_a_conflict_for_put_and_merge_patch() {
    let s = TestServer::start().await;
    let api = vms(&s);
    let first = api.create(&PostParams::default(), &vm_typed("a")).await.unwrap();
    let stale_rv = first.metadata.resource_version.clone().unwrap();
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}}))).await.unwrap();

    let e = api.replace("a", &PostParams::default(), &first).await.unwrap_err();
    assert_eq!(code(&e), 409);
    assert!(e.to_string().contains("the object has been modified; please apply your changes to the latest version and try again"), "{e}");

    let p = json!({"metadata": {"resourceVersion": stale_rv}, "spec": {"runStrategy": "Always"}});
    assert_eq!(code(&api.patch("a", &PatchParams::default(), &Patch::Merge(p)).await.unwrap_err()), 409);
    assert_eq!(api.get("a").await.unwrap().spec.run_strategy.as_deref(), Some("Halted"), "a refused patch stores nothing");

    let fresh = api.get("a").await.unwrap().metadata.resource_version.unwrap();
    let p = json!({"metadata": {"resourceVersion": fresh}, "spec": {"runStrategy": "Always"}});
    api.patch("a", &PatchParams::default(), &Patch::Merge(p)).await.unwrap();
    assert_eq!(api.get("a").await.unwrap().spec.run_strategy.as_deref(), Some("Always"));
}

#[tokio::test]
async fn json_patch_test_op_guards_the_write() {
    let s = TestServer::start().await;
    let api = vms(&s);
    let created = api.create(&PostParams::default(), &vm_typed("a")).await.unwrap();
    let rv = created.metadata.resource_version.unwrap();
    let ops = |rv: &str| -> json_patch::Patch {
        serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "replace", "path": "/spec/runStrategy", "value": "Always"}
        ]))
        .unwrap()
    };
    let e = api.patch("a", &PatchParams::default(), &Patch::Json::<()>(ops("999"))).await.unwrap_err();
    assert_eq!(code(&e), 422);
    assert_eq!(api.get("a").await.unwrap().spec.run_strategy.as_deref(), Some("Halted"));
    api.patch("a", &PatchParams::default(), &Patch::Json::<()>(ops(&rv))).await.unwrap();
    assert_eq!(api.get("a").await.unwrap().spec.run_strategy.as_deref(), Some("Always"));
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status() {
    let s = TestServer::start().await;
    let api = vms(&s);
    api.create(&PostParams::default(), &vm_typed("a")).await.unwrap();
    let st = json!({"status": {"printableStatus": "Running", "ready": true}, "spec": {"runStrategy": "Always"}});
    let after = api.patch_status("a", &PatchParams::default(), &Patch::Merge(&st)).await.unwrap();
    let status = after.status.unwrap();
    assert_eq!(status.printable_status, Some(PrintableStatus::Running));
    assert_eq!(after.spec.run_strategy.as_deref(), Some("Halted"), "spec ignored on a status write");
    assert_eq!(after.metadata.generation, Some(1), "a status write is not a spec change");

    let p = json!({"status": {"printableStatus": "Stopped"}, "spec": {"runStrategy": "Always"}});
    let after = api.patch("a", &PatchParams::default(), &Patch::Merge(&p)).await.unwrap();
    assert_eq!(after.status.unwrap().printable_status, Some(PrintableStatus::Running), "status ignored on a main write");
    assert_eq!(after.metadata.generation, Some(2));

    let mut whole = api.get("a").await.unwrap();
    whole.status.as_mut().unwrap().printable_status = Some(PrintableStatus::Stopping);
    let replaced = api.replace_status("a", &PostParams::default(), &whole).await.unwrap();
    assert_eq!(replaced.status.unwrap().printable_status, Some(PrintableStatus::Stopping));
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let s = TestServer::start().await;
    let api = vms(&s);
    let mut v = vm("a");
    v["metadata"]["finalizers"] = json!(["example.com/keep"]);
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap()).await.unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let held = api.get("a").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
    assert_eq!(code(&api.get("a").await.unwrap_err()), 404);
}

#[tokio::test]
async fn delete_preconditions_are_checked() {
    let s = TestServer::start().await;
    let api = vms(&s);
    api.create(&PostParams::default(), &vm_typed("a")).await.unwrap();
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions { uid: Some("not-the-uid".into()), resource_version: None }),
        ..DeleteParams::default()
    };
    let e = api.delete("a", &dp).await.unwrap_err();
    assert_eq!(code(&e), 409);
    assert!(e.to_string().contains("Precondition failed"), "{e}");
    assert!(api.get("a").await.is_ok());
}

async fn owned_vmi(s: &TestServer, owner: &VirtualMachine) {
    let mut v = vm("x");
    let mut vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": owner.metadata.name, "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "name": owner.metadata.name, "uid": owner.metadata.uid, "controller": true, "blockOwnerDeletion": true}]}});
    vmi["spec"] = v["spec"]["template"]["spec"].take();
    let api: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    api.create(&PostParams::default(), &serde_json::from_value(vmi).unwrap()).await.unwrap();
}

#[tokio::test]
async fn owner_reference_garbage_collection_background_foreground_orphan() {
    let s = TestServer::start().await;
    let api = vms(&s);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(s.client.clone(), "default");
    for (name, policy) in
        [("bg", PropagationPolicy::Background), ("fg", PropagationPolicy::Foreground), ("orphan", PropagationPolicy::Orphan)]
    {
        let owner = api.create(&PostParams::default(), &vm_typed(name)).await.unwrap();
        owned_vmi(&s, &owner).await;
        api.delete(name, &DeleteParams { propagation_policy: Some(policy.clone()), ..DeleteParams::default() }).await.unwrap();
        wait_until(Duration::from_secs(10), "the owner to be gone", || async { api.get_opt(name).await.unwrap().is_none().then_some(()) })
            .await;
        match policy {
            PropagationPolicy::Orphan => {
                let vmi = vmis.get(name).await.unwrap();
                assert!(vmi.metadata.owner_references.unwrap_or_default().is_empty(), "orphaned dependents lose the owner reference");
            }
            _ => {
                wait_until(Duration::from_secs(10), "the dependent to be collected", || async {
                    vmis.get_opt(name).await.unwrap().is_none().then_some(())
                })
                .await;
            }
        }
    }
}

#[tokio::test]
async fn namespaces_must_exist_and_deleting_one_deletes_its_content() {
    let s = TestServer::start().await;
    let in_missing: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "nowhere");
    let mut v = vm_typed("a");
    v.metadata.namespace = None;
    let e = in_missing.create(&PostParams::default(), &v).await.unwrap_err();
    assert_eq!(code(&e), 404);
    assert!(e.to_string().contains("namespaces \"nowhere\" not found"), "{e}");

    let nss: Api<Namespace> = Api::all(s.client.clone());
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap()).await.unwrap();
    let team: Api<VirtualMachine> = Api::namespaced(s.client.clone(), "team");
    let mut v = vm_typed("a");
    v.metadata.namespace = Some("team".into());
    team.create(&PostParams::default(), &v).await.unwrap();
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    wait_until(Duration::from_secs(10), "namespace team to be gone", || async {
        nss.get_opt("team").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(team.get_opt("a").await.unwrap().is_none());
    assert_eq!(code(&nss.delete("default", &DeleteParams::default()).await.unwrap_err()), 403);
}

#[tokio::test]
async fn pagination_returns_every_object_once() {
    let s = TestServer::start().await;
    let api = vms(&s);
    for i in 0..25 {
        api.create(&PostParams::default(), &vm_typed(&format!("vm-{i:02}"))).await.unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(10);
    let mut pages = 0;
    let mut remaining = Vec::new();
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        remaining.push(page.metadata.remaining_item_count);
        names.extend(page.items.into_iter().map(|v| v.metadata.name.unwrap()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(remaining, [Some(15), Some(5), None], "remainingItemCount after each page, as kube-apiserver counts");
    let selected = api.list(&ListParams::default().limit(10).fields("metadata.namespace=default")).await.unwrap();
    assert_eq!(selected.items.len(), 10);
    assert_eq!(selected.metadata.remaining_item_count, None, "not counted under a selector");
    let want: Vec<String> = (0..25).map(|i| format!("vm-{i:02}")).collect();
    assert_eq!(names, want);
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let s = TestServer::start().await;
    let api = vms(&s);
    for (name, tier) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let mut v = vm_typed(name);
        v.metadata.labels = Some([("tier".to_owned(), tier.to_owned())].into());
        api.create(&PostParams::default(), &v).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<VirtualMachine>| l.items.into_iter().map(|v| v.metadata.name.unwrap()).collect::<Vec<_>>();
    assert_eq!(names(api.list(&ListParams::default().labels("tier=web")).await.unwrap()), ["a", "c"]);
    assert_eq!(names(api.list(&ListParams::default().labels("tier in (db)")).await.unwrap()), ["b"]);
    assert_eq!(names(api.list(&ListParams::default().fields("metadata.name=c")).await.unwrap()), ["c"]);
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version() {
    let s = TestServer::start().await;
    let api = vms(&s);
    let rv0 = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &vm_typed("a")).await.unwrap();
    let mid = api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"n": "1"}}}))).await.unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();

    let collect = |from: String, n: usize| {
        let api = api.clone();
        async move {
            let stream = api.watch(&WatchParams::default().timeout(5), &from).await.unwrap();
            let events: Vec<_> = stream.take(n).try_collect().await.unwrap();
            events
                .into_iter()
                .map(|e| match e {
                    WatchEvent::Added(v) => ("ADDED", v.metadata.resource_version.unwrap()),
                    WatchEvent::Modified(v) => ("MODIFIED", v.metadata.resource_version.unwrap()),
                    WatchEvent::Deleted(v) => ("DELETED", v.metadata.resource_version.unwrap()),
                    other => panic!("unexpected {other:?}"),
                })
                .collect::<Vec<_>>()
        }
    };
    let all = collect(rv0, 3).await;
    assert_eq!(all.iter().map(|e| e.0).collect::<Vec<_>>(), ["ADDED", "MODIFIED", "DELETED"]);
    let rvs: Vec<u64> = all.iter().map(|e| e.1.parse().unwrap()).collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "revisions increase: {rvs:?}");
    let rest = collect(mid.metadata.resource_version.unwrap(), 1).await;
    assert_eq!(rest[0].0, "DELETED", "resuming from the patch's revision yields only what came after");
}

#[tokio::test]
async fn a_watch_from_a_compacted_revision_gets_410() {
    let s = TestServer::start_with(|c| c.store.watch_window = 5).await;
    let api = vms(&s);
    let rv0 = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &vm_typed("a")).await.unwrap();
    for i in 0..10 {
        api.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"n": i.to_string()}}}))).await.unwrap();
    }
    let mut stream = api.watch(&WatchParams::default().timeout(5), &rv0).await.unwrap().boxed();
    match stream.next().await {
        Some(Ok(WatchEvent::Error(e))) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_runtime_watcher_sees_changes() {
    let s = TestServer::start().await;
    let api = vms(&s);
    api.create(&PostParams::default(), &vm_typed("before")).await.unwrap();
    let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut seen = std::collections::BTreeSet::new();
    let creator = {
        let api = api.clone();
        tokio::spawn(async move {
            api.create(&PostParams::default(), &vm_typed("after")).await.unwrap();
        })
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = stream.try_next().await.unwrap() {
            match ev {
                watcher::Event::InitApply(v) | watcher::Event::Apply(v) => {
                    seen.insert(v.metadata.name.unwrap());
                }
                _ => {}
            }
            if seen.len() == 2 {
                break;
            }
        }
    })
    .await
    .expect("the watcher saw both VMs");
    creator.await.unwrap();
}

#[tokio::test]
async fn kube_runtime_controller_reconciles_against_the_server() {
    use std::sync::Arc;
    let s = TestServer::start().await;
    let api = vms(&s);
    for n in ["a", "b"] {
        api.create(&PostParams::default(), &vm_typed(n)).await.unwrap();
    }
    // A toy controller: every VM gets status.printableStatus = Stopped.
    let reconcile = |vm: Arc<VirtualMachine>, api: Arc<Api<VirtualMachine>>| async move {
        let name = vm.metadata.name.clone().unwrap();
        if vm.status.as_ref().and_then(|s| s.printable_status.as_ref()) != Some(&PrintableStatus::Stopped) {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"printableStatus": "Stopped"}}))).await?;
        }
        Ok::<_, kube::Error>(kube::runtime::controller::Action::await_change())
    };
    let ctl = Controller::new(api.clone(), watcher::Config::default())
        .run(reconcile, |_, _, _| kube::runtime::controller::Action::requeue(Duration::from_secs(1)), Arc::new(api.clone()))
        .for_each(|_| async {});
    let handle = tokio::spawn(ctl);
    wait_until(Duration::from_secs(10), "both VMs reconciled", || async {
        let l = api.list(&ListParams::default()).await.unwrap();
        l.items.iter().all(|v| v.status.as_ref().and_then(|s| s.printable_status.as_ref()) == Some(&PrintableStatus::Stopped)).then_some(())
    })
    .await;
    handle.abort();
}

#[tokio::test]
async fn admission_refuses_inconsistent_specs_with_field_causes() {
    let s = TestServer::start().await;
    let mut v = vm("bad");
    // The corruption from the lost-update bug: a CD-ROM volume without its disk.
    v["spec"]["template"]["spec"]["volumes"] = json!([{"name": "root", "emptyDisk": {"capacity": "1Gi"}}, {"name": "cdrom1", "dataVolume": {"name": "iso", "hotpluggable": true}}]);
    let rev = s.revision();
    let (code, status) =
        s.raw("POST", "/apis/kubevirt.io/v1/namespaces/default/virtualmachines", "application/json", v.to_string().into_bytes()).await;
    assert_eq!(code, 422);
    assert_eq!(status["reason"], "Invalid");
    let causes = status["details"]["causes"].as_array().unwrap();
    assert_eq!(causes[0]["field"], "spec.template.spec.volumes[1].name");
    assert!(causes[0]["message"].as_str().unwrap().contains("add a disk named \"cdrom1\""));
    assert_eq!(s.revision(), rev, "nothing stored");
}

#[tokio::test]
async fn bad_input_gets_a_clear_status_and_stores_nothing() {
    let s = TestServer::start_with(|c| c.body_limit = 64 * 1024).await;
    let coll = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
    let rev = s.revision();
    let mut long = vm("x");
    long["metadata"]["name"] = json!("a".repeat(254));
    let mut wrong_kind = vm("x");
    wrong_kind["kind"] = json!("VirtualMachineInstance");
    let mut wrong_version = vm("x");
    wrong_version["apiVersion"] = json!("kubevirt.io/v2");
    let huge = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "huge", "annotations": {"a": "x".repeat(100_000)}}});
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, &str, &str, Vec<u8>, u16, &str, &str)> = vec![
        ("malformed JSON", "POST", coll, b"{\"apiVersion\": ".to_vec(), 400, "BadRequest", "not valid JSON"),
        ("malformed YAML", "POST", coll, b"metadata: [unclosed".to_vec(), 400, "BadRequest", "not valid YAML"),
        ("wrong kind", "POST", coll, wrong_kind.to_string().into_bytes(), 400, "BadRequest", "does not match the expected kind"),
        (
            "wrong apiVersion",
            "POST",
            coll,
            wrong_version.to_string().into_bytes(),
            400,
            "BadRequest",
            "does not match the expected API version",
        ),
        ("name too long", "POST", coll, long.to_string().into_bytes(), 422, "Invalid", "no more than 253"),
        ("body over the limit", "POST", coll, huge.to_string().into_bytes(), 413, "RequestEntityTooLarge", "larger than the limit"),
        (
            "unknown resource",
            "GET",
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachinez",
            Vec::new(),
            404,
            "NotFound",
            "could not find the requested resource",
        ),
    ];
    for (what, method, path, body, want_code, want_reason, want_msg) in cases {
        let ct = if what.contains("YAML") { "application/yaml" } else { "application/json" };
        let (code, status) = s.raw(method, path, ct, body).await;
        assert_eq!(code, want_code, "{what}: {status}");
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["reason"], want_reason, "{what}: {status}");
        assert!(status["message"].as_str().unwrap().contains(want_msg), "{what}: {status}");
    }
    // Invalid patches on an existing object.
    let api = vms(&s);
    api.create(&PostParams::default(), &vm_typed("p")).await.unwrap();
    let rev_after_create = s.revision();
    let obj = format!("{coll}/p");
    for (what, ct, body, want) in [
        ("JSON patch that is not a list", "application/json-patch+json", "{}", 400),
        ("JSON patch on a missing path", "application/json-patch+json", r#"[{"op":"replace","path":"/spec/nothing/here","value":1}]"#, 422),
        ("merge patch that is not an object", "application/merge-patch+json", "[1]", 400),
        ("strategic merge patch on a custom resource", "application/strategic-merge-patch+json", "{}", 415),
        // Server-side apply is served (tests/apply.rs); these are refused as kube-apiserver does.
        ("server-side apply without fieldManager", "application/apply-patch+yaml", "{}", 422),
        ("server-side apply as CBOR", "application/apply-patch+cbor", "{}", 415),
        ("merge patch making the spec invalid", "application/merge-patch+json", r#"{"spec":{"runStrategy":"Sometimes"}}"#, 422),
    ] {
        let (code, status) = s.raw("PATCH", &obj, ct, body.as_bytes().to_vec()).await;
        assert_eq!(code, want, "{what}: {status}");
        assert_eq!(status["kind"], "Status");
    }
    assert_eq!(s.revision(), rev_after_create, "no bad patch stored anything");
    assert_eq!(rev + 1, rev_after_create);
}

#[tokio::test]
async fn requests_need_the_token_except_health_and_version() {
    let s = TestServer::start().await;
    let http = reqwest_like_get(&s, "/api/v1/namespaces", None).await;
    assert_eq!(http, 401);
    assert_eq!(reqwest_like_get(&s, "/healthz", None).await, 200);
    assert_eq!(reqwest_like_get(&s, "/version", None).await, 200);
    assert_eq!(reqwest_like_get(&s, "/api/v1/namespaces", Some("wrong")).await, 401);
}

/// A GET over TLS with no (or a wrong) token, trusting the server's CA.
async fn reqwest_like_get(s: &TestServer, path: &str, token: Option<&str>) -> u16 {
    let mut config = kube::Config::new(s.url.parse().unwrap());
    config.root_cert = Some(vec![pem_to_der(s.server.ca_pem())]);
    config.auth_info.token = token.map(|t| t.to_owned().into());
    let client = kube::Client::try_from(config).unwrap();
    let req = http::Request::get(path).body(kube::client::Body::empty()).unwrap();
    client.send(req).await.unwrap().status().as_u16()
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(b64).unwrap()
}

#[tokio::test]
async fn pvc_status_starts_pending_and_core_types_accept_strategic_merge() {
    let s = TestServer::start().await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(s.client.clone(), "default");
    let pvc = serde_json::from_value(
        json!({"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .unwrap();
    let created = pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    let after = pvcs.patch("c", &PatchParams::default(), &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}}}))).await.unwrap();
    assert_eq!(after.metadata.labels.unwrap()["a"], "b");
}
