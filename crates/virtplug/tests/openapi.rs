//! The OpenAPI documents through real clients: every kubectl on the machine (`kubectl.1.27` to
//! `kubectl.1.33` next to the `kubectl` on PATH, and that one) explains custom resources and
//! core kinds from v3 and from v2, without any environment variable, and applies a full KubeVirt
//! manifest under `--validate=strict`; raw requests check content negotiation and ETags.

#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::every_version_and_path as kubectls;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::TestServer;

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut c = Command::new(bin);
    // No KUBECTL_EXPLAIN_OPENAPIV3 (or any other switch): the defaults must work. A private
    // cache directory, so no document of another server (or build) is read from disk.
    c.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", kubeconfig.with_file_name(format!("cache-{}", bin.file_name().unwrap().to_string_lossy())))
        .env_remove("KUBECTL_EXPLAIN_OPENAPIV3")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("kubectl runs");
    let input = stdin.unwrap_or_default().to_owned();
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(input.as_bytes()).expect("write stdin");
    drop(pipe);
    child.wait_with_output().expect("kubectl finishes")
}

fn ok(bin: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl(bin, kubeconfig, args, None);
    assert!(out.status.success(), "{} {args:?}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `check` with every kubectl on the machine (off the async workers: kubectl blocks), with
/// its file name, dots made dashes (`kubectl-1-27`), to name what each one creates.
async fn each_kubectl(s: &TestServer, check: impl Fn(&Path, &Path, &str) + Send + 'static) {
    let kc = s.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        for bin in kubectls() {
            let v = bin.file_name().unwrap().to_string_lossy().replace('.', "-");
            check(&bin, &kc, &v);
        }
    })
    .await
    .unwrap();
}

/// What each explanation must show: the kind, fields, and their descriptions (from the schemas,
/// not placeholders).
const EXPLAINED: &[(&str, &str, &[&str])] = &[
    ("vm.spec", "VirtualMachine", &["runStrategy", "template"]),
    ("vm.spec.template.spec.domain", "VirtualMachine", &["devices", "cpu", "memory"]),
    ("pvc.spec", "PersistentVolumeClaim", &["storageClassName", "accessModes", "is the name of the StorageClass required by the claim"]),
    ("secret", "Secret", &["stringData", "immutable", "Secret holds secret data of a certain type"]),
    ("namespace.spec", "Namespace", &["finalizers", "Finalizers is an opaque list of values"]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_explains_from_v3_and_from_v2() {
    let s = TestServer::start().await;
    each_kubectl(&s, move |bin, kc, v| {
        for (path, kind, expected) in EXPLAINED {
            // The default (v3 where kubectl finds it, v2 otherwise) and v2 explicitly, which
            // kubectl 1.27 and later render with `--output=plaintext-openapiv2`.
            for extra in [None, Some("--output=plaintext-openapiv2")] {
                // In v2 a node that keeps unknown fields is published without its
                // properties, as kube-apiserver publishes it (kubectl's v2 validation
                // would refuse every field they do not list): the VM's spec is one.
                if extra.is_some() && kind == &"VirtualMachine" {
                    continue;
                }
                let mut args = vec!["explain", *path];
                args.extend(extra);
                let out = ok(bin, kc, &args);
                assert!(out.contains("KIND:") && out.contains(kind), "{v} {args:?}: {out}");
                for e in *expected {
                    assert!(out.contains(e), "{v} {args:?}: no {e:?} in\n{out}");
                }
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_applies_a_full_kubevirt_manifest_under_strict_validation() {
    let s = TestServer::start().await;
    let manifest = std::fs::read_to_string(common::fixture("testvm.yaml")).expect("fixture");
    each_kubectl(&s, move |bin, kc, v| {
        // One VM per kubectl: each creates its own, then applies a change to it.
        let mine = manifest.replace("name: testvm\n", &format!("name: vm-{v}\n"));
        for (doc, expect) in [(mine.clone(), "created"), (mine.replace("runStrategy: Halted", "runStrategy: Manual"), "configured")] {
            let out = kubectl(bin, kc, &["apply", "--validate=strict", "-f", "-"], Some(&doc));
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success() && stdout.contains(expect), "{v}: {stdout}{stderr}");
        }
        let run = ok(bin, kc, &["get", "vm", &format!("vm-{v}"), "-o", "jsonpath={.spec.runStrategy}"]);
        assert_eq!(run, "Manual", "{v}");
        // A core kind's apply: kubectl computes its patch from the documents or its own types.
        let cm = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ns-{v}\n  labels:\n    a: b\n");
        let out = kubectl(bin, kc, &["apply", "--validate=strict", "-f", "-"], Some(&cm));
        assert!(out.status.success(), "{v}: {}", String::from_utf8_lossy(&out.stderr));
        let out = kubectl(bin, kc, &["apply", "--validate=strict", "-f", "-"], Some(&cm.replace("a: b", "a: c")));
        assert!(out.status.success(), "{v}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(ok(bin, kc, &["get", "ns", &format!("ns-{v}"), "-o", "jsonpath={.metadata.labels.a}"]), "c", "{v}");
    })
    .await;
}

/// `kubectl get -o yaml` of several objects writes a `List`; feeding it back is how users copy
/// or restore VMs. kubectl validates a List's items against the OpenAPI v2 document, so a CRD's
/// definition must carry `apiVersion`, `kind` and `metadata` as kube-apiserver publishes them.
#[tokio::test]
async fn every_kubectl_creates_vms_from_a_list_it_printed() {
    let s = TestServer::start().await;
    let manifest = std::fs::read_to_string(common::fixture("testvm.yaml")).expect("fixture");
    each_kubectl(&s, move |bin, kc, v| {
        let ns = format!("list-{v}");
        ok(bin, kc, &["create", "namespace", &ns]);
        for i in 0..2 {
            let doc = manifest.replace("name: testvm\n", &format!("name: vm-{i}\n  namespace: {ns}\n"));
            let out = kubectl(bin, kc, &["create", "-f", "-"], Some(&doc));
            assert!(out.status.success(), "{v}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let printed = ok(bin, kc, &["get", "vm", "-n", &ns, "-o", "yaml"]);
        assert!(printed.contains("kind: List"), "{v}: {printed}");
        // What a user strips before creating again (kube-apiserver refuses a create that
        // carries a resourceVersion).
        let list: String = printed
            .lines()
            .filter(|l| !l.trim_start().starts_with("resourceVersion:") && !l.trim_start().starts_with("uid:"))
            .map(|l| format!("{l}\n"))
            .collect();
        ok(bin, kc, &["delete", "vm", "--all", "-n", &ns]);
        for validate in ["--validate=strict", "--validate=true"] {
            let out = kubectl(bin, kc, &["create", validate, "-f", "-"], Some(&list));
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success() && stdout.matches(" created").count() == 2, "{v} {validate}: {stdout}{stderr}");
            ok(bin, kc, &["delete", "vm", "--all", "-n", &ns]);
        }
    })
    .await;
}

async fn get(s: &TestServer, path: &str, headers: &[(&str, &str)]) -> (u16, http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    let mut req = http::Request::builder().uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = s.client.send(req.body(kube::client::Body::empty()).unwrap()).await.unwrap();
    let (code, headers) = (resp.status().as_u16(), resp.headers().clone());
    (code, headers, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
}

#[tokio::test]
async fn openapi_v2_is_protobuf_for_client_go_json_otherwise_and_honours_etags() {
    let s = TestServer::start().await;
    // client-go's OpenAPISchema() request.
    let pb = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    let (code, headers, body) = get(&s, "/openapi/v2", &[("accept", pb)]).await;
    assert_eq!(code, 200);
    // What kube-openapi answers: Go's mime parser, which client-go runs on every response,
    // refuses the `@` of the requested form.
    assert_eq!(headers["content-type"], "application/com.github.proto-openapi.spec.v2.v1.0+protobuf");
    // swagger = "2.0" is the document's first field.
    assert_eq!(&body[..5], b"\x0a\x032.0");
    let etag = headers["etag"].to_str().unwrap().to_owned();
    let (code, _, body) = get(&s, "/openapi/v2", &[("accept", pb), ("if-none-match", &etag)]).await;
    assert_eq!((code, body.len()), (304, 0));

    let (code, headers, body) = get(&s, "/openapi/v2", &[("accept", "application/json")]).await;
    assert_eq!((code, headers["content-type"].to_str().unwrap()), (200, "application/json"));
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["swagger"], "2.0");
    assert!(doc["definitions"]["io.k8s.api.core.v1.Secret"]["properties"]["stringData"].is_object());
    assert_ne!(headers["etag"].to_str().unwrap(), etag, "the JSON and protobuf forms are different documents");

    let (_, _, index) = get(&s, "/openapi/v3", &[]).await;
    let index: serde_json::Value = serde_json::from_slice(&index).unwrap();
    let url = index["paths"]["apis/kubevirt.io/v1"]["serverRelativeURL"].as_str().unwrap().to_owned();
    let (code, headers, _) = get(&s, &url, &[]).await;
    assert_eq!((code, headers["cache-control"].to_str().unwrap()), (200, "public, immutable"));
    let (code, _, _) = get(&s, &url, &[("if-none-match", headers["etag"].to_str().unwrap())]).await;
    assert_eq!(code, 304);
}
