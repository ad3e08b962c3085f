//! core/v1 Secret in the embedded API server, through the clients that use it: real `kubectl`
//! (the one on PATH and 1.27 from its directory), kube-rs with k8s-openapi's `Secret`, and raw
//! requests for what clients do not send (bad base64, `stringData` through each write verb).

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::TestServer;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

/// The kubectl on PATH and `kubectl.1.27` from the directory of the real one.
fn kubectls() -> Vec<PathBuf> {
    let on_path = Command::new("sh").args(["-c", "command -v kubectl"]).output().expect("sh runs");
    let path = PathBuf::from(String::from_utf8_lossy(&on_path.stdout).trim());
    assert!(path.is_file(), "kubectl must be on PATH for these tests");
    let real = std::fs::canonicalize(&path).unwrap();
    let old = real.parent().unwrap().join("kubectl.1.27");
    assert!(old.is_file(), "{} is missing", old.display());
    vec![path, old]
}

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(bin).args(args).env("KUBECONFIG", kubeconfig).env_remove("KUBERNETES_SERVICE_HOST").output().expect("kubectl runs")
}

fn ok(bin: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl(bin, kubeconfig, args);
    assert!(out.status.success(), "{} {args:?} failed: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_gets_describes_and_deletes_a_secret() {
    let s = TestServer::start().await;
    for bin in kubectls() {
        let (bin, kc) = (bin.as_path(), s.kubeconfig.as_path());
        let v = bin.display();
        let out = ok(bin, kc, &["create", "secret", "generic", "creds", "--from-literal=user=admin", "--from-literal=pass=s3cr=t"]);
        assert!(out.contains("secret/creds created"), "{v}: {out}");

        let table = ok(bin, kc, &["get", "secret"]);
        let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, ["NAME", "TYPE", "DATA", "AGE"], "{v}: {table}");
        let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[..3], ["creds", "Opaque", "2"], "{v}: {table}");
        assert_eq!(ok(bin, kc, &["get", "secret", "creds", "-o", "jsonpath={.data.pass}"]), "czNjcj10", "{v}");

        let describe = ok(bin, kc, &["describe", "secret", "creds"]);
        assert!(describe.contains("Name:         creds") && describe.contains("Type:  Opaque"), "{v}: {describe}");
        assert!(describe.lines().any(|l| l.starts_with("pass:") && l.ends_with("6 bytes")), "{v}: {describe}");
        assert!(!describe.contains("s3cr=t"), "{v}: describe shows sizes, not values: {describe}");

        let out = ok(bin, kc, &["delete", "secret", "creds"]);
        assert!(out.contains("secret \"creds\" deleted"), "{v}: {out}");
        let gone = kubectl(bin, kc, &["get", "secret", "creds"]);
        assert!(!gone.status.success() && String::from_utf8_lossy(&gone.stderr).contains("NotFound"), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_virtplug_system_namespace_exists_from_the_first_start() {
    let s = TestServer::start().await;
    let names = ok(&kubectls()[0], &s.kubeconfig, &["get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}"]);
    let mut names: Vec<&str> = names.split_whitespace().collect();
    names.sort_unstable();
    assert_eq!(names, ["default", "kube-system", "virtplug-system"]);
    let secrets: Api<Secret> = Api::namespaced(s.client.clone(), "virtplug-system");
    let made = secrets.create(&PostParams::default(), &secret("acct", &[("k", "v")])).await.unwrap();
    assert_eq!(made.metadata.namespace.as_deref(), Some("virtplug-system"));
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

/// A value that is not base64 is 422 naming `data[KEY]`, whichever verb writes it, and nothing
/// is stored.
#[tokio::test]
async fn data_that_is_not_base64_is_refused_naming_the_key() {
    let s = TestServer::start().await;
    let path = "/api/v1/namespaces/default/secrets";
    let before = s.revision();
    let body = json!({"metadata": {"name": "bad"}, "data": {"good": "aGk=", "bad": "not base64!"}});
    let (code, status) = s.raw("POST", path, "application/json", body.to_string().into_bytes()).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["details"]["causes"].as_array().unwrap().len(), 1, "{status}");
    assert_eq!(status["details"]["causes"][0]["field"], "data[bad]", "{status}");
    assert!(status["message"].as_str().unwrap().contains("data[bad]"), "{status}");
    assert_eq!(s.revision(), before, "nothing was stored");

    let (code, _) =
        s.raw("POST", path, "application/json", json!({"metadata": {"name": "ok"}, "data": {"a": "aGk="}}).to_string().into_bytes()).await;
    assert_eq!(code, 201);
    let before = s.revision();
    for (ct, patch) in [
        ("application/merge-patch+json", json!({"data": {"a": "%%%"}})),
        ("application/strategic-merge-patch+json", json!({"data": {"a": "aGk"}})),
        ("application/json-patch+json", json!([{"op": "add", "path": "/data/b", "value": 5}])),
    ] {
        let (code, status) = s.raw("PATCH", &format!("{path}/ok"), ct, patch.to_string().into_bytes()).await;
        assert_eq!(code, 422, "{ct}: {status}");
        assert!(status["details"]["causes"][0]["field"].as_str().unwrap().starts_with("data["), "{ct}: {status}");
    }
    assert_eq!(s.revision(), before, "nothing was stored");
}

/// `stringData` is folded into `data` on create, update (PUT) and patch, overriding `data`, and
/// is never stored or returned.
#[tokio::test]
async fn string_data_is_folded_into_data_on_every_write_and_never_stored() {
    let s = TestServer::start().await;
    let path = "/api/v1/namespaces/default/secrets";
    let get = || async { s.raw("GET", &format!("{path}/sd"), "application/json", Vec::new()).await.1 };

    let body = json!({"metadata": {"name": "sd"}, "data": {"a": "eA==", "b": "eA=="}, "stringData": {"b": "two"}});
    let (code, created) = s.raw("POST", path, "application/json", body.to_string().into_bytes()).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["data"], json!({"a": "eA==", "b": "dHdv"}));
    assert_eq!(created["type"], "Opaque");
    assert!(created.get("stringData").is_none(), "{created}");

    let (code, patched) =
        s.raw("PATCH", &format!("{path}/sd"), "application/merge-patch+json", br#"{"stringData":{"c":"three"}}"#.to_vec()).await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["data"], json!({"a": "eA==", "b": "dHdv", "c": "dGhyZWU="}));

    let ops = br#"[{"op":"add","path":"/stringData","value":{"a":"one"}}]"#.to_vec();
    let (code, patched) = s.raw("PATCH", &format!("{path}/sd"), "application/json-patch+json", ops).await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["data"]["a"], "b25l");

    let mut whole: Value = get().await;
    whole["stringData"] = json!({"d": "four"});
    let (code, replaced) = s.raw("PUT", &format!("{path}/sd"), "application/json", whole.to_string().into_bytes()).await;
    assert_eq!(code, 200, "{replaced}");
    assert_eq!(replaced["data"]["d"], "Zm91cg==");

    let stored = get().await;
    assert!(stored.get("stringData").is_none(), "{stored}");
    assert_eq!(stored["data"], json!({"a": "b25l", "b": "dHdv", "c": "dGhyZWU=", "d": "Zm91cg=="}));
    let raw = s.server.objects().store.get("//secrets/default/sd").unwrap().object.value();
    assert!(raw.get("stringData").is_none(), "not in the store either: {raw}");
}

/// kube-rs with k8s-openapi's typed `Secret`: create, get, list, replace, patch, delete, with
/// binary data surviving byte for byte; `immutable` then freezes the data.
#[tokio::test]
async fn a_typed_secret_round_trips_through_kube_rs() {
    let s = TestServer::start().await;
    let api: Api<Secret> = Api::namespaced(s.client.clone(), "default");
    let mut sec = secret("typed", &[("text", "hello")]);
    let binary: Vec<u8> = (0..=255).collect();
    sec.data.as_mut().unwrap().insert("bin".into(), ByteString(binary.clone()));
    sec.string_data = Some(BTreeMap::from([("plain".to_owned(), "as text".to_owned())]));
    let created = api.create(&PostParams::default(), &sec).await.unwrap();
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
    assert_eq!(created.string_data, None);

    let got = api.get("typed").await.unwrap();
    let data = got.data.clone().unwrap();
    assert_eq!(data["bin"].0, binary);
    assert_eq!(data["text"].0, b"hello");
    assert_eq!(data["plain"].0, b"as text");
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);

    let mut changed = got.clone();
    changed.data.as_mut().unwrap().remove("text");
    changed.immutable = Some(true);
    let replaced = api.replace("typed", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(replaced.data.unwrap().keys().collect::<Vec<_>>(), ["bin", "plain"]);
    assert_eq!(replaced.immutable, Some(true));

    // Immutable: data and the flag are frozen (422), metadata is not.
    let rv = s.revision();
    let e = api.patch("typed", &PatchParams::default(), &Patch::Merge(json!({"stringData": {"plain": "new"}}))).await.unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 422 && s.message.starts_with("Secret \"typed\" is invalid: data: field is immutable")),
        "{e}"
    );
    let e = api.patch("typed", &PatchParams::default(), &Patch::Merge(json!({"immutable": false}))).await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 422 && s.message.contains("immutable")), "{e}");
    let e = api.patch("typed", &PatchParams::default(), &Patch::Merge(json!({"type": "kubernetes.io/tls"}))).await.unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 422 && s.message.contains("type")), "{e}");
    assert_eq!(s.revision(), rv, "nothing was stored");
    let labelled = api.patch("typed", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}))).await.unwrap();
    assert_eq!(labelled.metadata.labels.unwrap()["a"], "b");

    api.delete("typed", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("typed").await.unwrap().is_none());
}
