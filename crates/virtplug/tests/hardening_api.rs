//! The API server's request surface under adversarial input (issue 14, classes 2, 3 and 7):
//! amplification (JSON patch operations, object size and depth after a patch, YAML aliases,
//! annotations), resourceVersion edge cases (a future revision, tampered continue tokens,
//! numbers that overflow) and junk methods in the request metrics. Real server on loopback with
//! TLS and its token; the YAML test runs the real binary to measure its memory.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{vm, TestServer};
use futures::{AsyncBufReadExt, StreamExt};
use serde_json::{json, Value};

const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";

async fn create(s: &TestServer, name: &str) -> Value {
    let (code, body) = s.raw("POST", VMS, "application/json", vm(name).to_string().into_bytes()).await;
    assert_eq!(code, 201, "creating {name}: {}", short(&body));
    body
}

async fn get(s: &TestServer, name: &str) -> Value {
    let (code, body) = s.raw("GET", &format!("{VMS}/{name}"), "", Vec::new()).await;
    assert_eq!(code, 200, "{}", short(&body));
    body
}

/// Sends a patch and checks that it is refused with `code` and `reason` and changed nothing.
async fn refused_patch(s: &TestServer, ct: &str, body: &Value, code: u16, reason: &str) -> Value {
    let before = get(s, "a").await;
    let rev = s.revision();
    let (got, status) = s.raw("PATCH", &format!("{VMS}/a"), ct, body.to_string().into_bytes()).await;
    assert_eq!((got, status["reason"].as_str()), (code, Some(reason)), "{}", &status.to_string()[..status.to_string().len().min(600)]);
    assert_eq!(s.revision(), rev, "nothing was stored");
    assert_eq!(get(s, "a").await, before, "the object is unchanged");
    status
}

/// A body for a failure message: its start only (some are megabytes).
fn short(v: &Value) -> String {
    v.to_string().chars().take(400).collect()
}

fn nested(levels: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..levels {
        v = json!({ "a": v });
    }
    v
}

#[tokio::test]
async fn a_json_patch_of_20000_operations_is_refused_as_kube_apiserver_does() {
    let s = TestServer::start().await;
    create(&s, "a").await;
    // Operations that would all apply: only their number is wrong.
    let mut ops = vec![json!({"op": "add", "path": "/metadata/labels", "value": {}})];
    ops.extend((1..20_000).map(|i| json!({"op": "add", "path": format!("/metadata/labels/l{}", i % 10), "value": "v"})));
    let status = refused_patch(&s, "application/json-patch+json", &json!(ops), 413, "RequestEntityTooLarge").await;
    assert_eq!(status["message"], "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 20000");
}

#[tokio::test]
async fn patches_that_make_the_object_larger_than_1_5_mib_are_refused_and_change_nothing() {
    let s = TestServer::start().await;
    create(&s, "a").await;
    let merge = json!({"spec": {"filler": "x".repeat(1_600_000)}});
    let status = refused_patch(&s, "application/merge-patch+json", &merge, 413, "RequestEntityTooLarge").await;
    assert!(status["message"].as_str().unwrap().contains("more than the 1572864 bytes (1.5 MiB)"), "{}", status["message"]);
    // A body well under the request limit that doubles itself with a copy.
    let copy = json!([
        {"op": "add", "path": "/spec/filler", "value": "x".repeat(900_000)},
        {"op": "copy", "from": "/spec/filler", "path": "/spec/filler2"},
    ]);
    refused_patch(&s, "application/json-patch+json", &copy, 413, "RequestEntityTooLarge").await;
    // Just under the limit is still fine.
    let (code, _) = s
        .raw(
            "PATCH",
            &format!("{VMS}/a"),
            "application/merge-patch+json",
            json!({"spec": {"filler": "x".repeat(1_500_000)}}).to_string().into_bytes(),
        )
        .await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn patches_that_nest_deeper_than_clients_can_read_are_refused() {
    let s = TestServer::start().await;
    create(&s, "a").await;
    // 200 levels from a body of 100: the copy lands at the bottom of the first value.
    let bottom = "/a".repeat(99);
    let ops = json!([
        {"op": "add", "path": "/spec/d", "value": nested(100)},
        {"op": "copy", "from": "/spec/d", "path": format!("/spec/d{bottom}/x")},
    ]);
    let status = refused_patch(&s, "application/json-patch+json", &ops, 422, "Invalid").await;
    assert!(status["message"].as_str().unwrap().contains("levels"), "{}", status["message"]);
    // A merge patch as deep as a request body may be (127 levels) makes a 127-level object.
    let merge = json!({"spec": nested(125)});
    let status = refused_patch(&s, "application/merge-patch+json", &merge, 422, "Invalid").await;
    assert!(status["details"]["causes"][0]["field"].as_str().unwrap().starts_with("spec.a.a.a"), "{}", short(&status));
    // 125 levels, the most a List of it can carry to serde_json, is stored and listed.
    let (code, _) =
        s.raw("PATCH", &format!("{VMS}/a"), "application/merge-patch+json", json!({"spec": nested(123)}).to_string().into_bytes()).await;
    assert_eq!(code, 200);
    let api: kube::Api<api::VirtualMachine> = kube::Api::namespaced(s.client.clone(), "default");
    api.list(&Default::default()).await.expect("kube-rs reads the deepest object back in a list");
}

#[tokio::test]
async fn annotations_and_labels_are_validated_as_kubernetes_does() {
    let s = TestServer::start().await;
    let rev = s.revision();
    let mut big = vm("big");
    big["metadata"]["annotations"] = json!({"a": "x".repeat(262_144)});
    let (code, status) = s.raw("POST", VMS, "application/json", big.to_string().into_bytes()).await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")), "{}", short(&status));
    let cause = &status["details"]["causes"][0];
    assert_eq!(cause["field"], "metadata.annotations");
    assert!(cause["message"].as_str().unwrap().starts_with("Too long: must have at most 262144 bytes"), "{cause}");
    assert_eq!(s.revision(), rev, "nothing stored");

    create(&s, "a").await;
    let patch = json!({"metadata": {"annotations": {"a": "x".repeat(200_000), "b": "y".repeat(100_000)}}});
    refused_patch(&s, "application/merge-patch+json", &patch, 422, "Invalid").await;
    let status =
        refused_patch(&s, "application/merge-patch+json", &json!({"metadata": {"labels": {"bad key": "v"}}}), 422, "Invalid").await;
    assert!(status["message"].as_str().unwrap().contains("metadata.labels: Invalid value: \"bad key\""), "{}", status["message"]);
    refused_patch(&s, "application/merge-patch+json", &json!({"metadata": {"labels": {"k": "x".repeat(64)}}}), 422, "Invalid").await;
}

/// Reads the first line of a watch stream, waiting at most `within`.
async fn first_watch_line(s: &TestServer, query: &str, within: Duration) -> Option<Value> {
    let req = http::Request::get(format!("{VMS}?watch=1&{query}")).body(Vec::new()).unwrap();
    let mut lines = s.client.request_stream(req).await.unwrap().lines();
    match tokio::time::timeout(within, lines.next()).await {
        Ok(Some(Ok(line))) => Some(serde_json::from_str(&line).unwrap()),
        Ok(_) => panic!("the watch stream ended without a line"),
        Err(_) => None,
    }
}

fn assert_too_large_rv(status: &Value, requested: u64) {
    assert_eq!(status["code"], 504, "{}", short(status));
    assert_eq!(status["reason"], "Timeout", "{}", short(status));
    assert!(
        status["message"].as_str().unwrap().starts_with(&format!("Timeout: Too large resource version: {requested}, current: ")),
        "{}",
        short(status)
    );
    assert_eq!(status["details"]["causes"][0]["reason"], "ResourceVersionTooLarge", "{}", short(status));
    assert_eq!(status["details"]["causes"][0]["message"], "Too large resource version", "{}", short(status));
}

/// A client without kube-rs' default retries (it retries a 504 up to 15 times, as it would
/// against kube-apiserver), to see the server's first answer.
async fn no_retry_client(s: &TestServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(&s.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn a_list_and_a_watch_from_a_future_resource_version_get_too_large_resource_version() {
    let s = TestServer::start().await;
    create(&s, "a").await;
    let future = s.revision() + 1000;
    let t = Instant::now();
    let req = http::Request::get(format!("{VMS}?resourceVersion={future}")).body(kube::client::Body::empty()).unwrap();
    let resp = no_retry_client(&s).await.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let retry_after = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let status: Value = serde_json::from_slice(&http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes()).unwrap();
    assert_eq!(code, 504, "{}", short(&status));
    assert_eq!(retry_after.as_deref(), Some("1"), "clients are told when to retry");
    assert_too_large_rv(&status, future);
    assert!(t.elapsed() >= Duration::from_secs(2), "it waited for the revision first, as kube-apiserver does");
    let event = first_watch_line(&s, &format!("resourceVersion={future}"), Duration::from_secs(15))
        .await
        .expect("an ERROR event within 15 s, not a watch that silently waits for revision +1000");
    assert_eq!(event["type"], "ERROR", "{}", short(&event));
    assert_too_large_rv(&event["object"], future);
}

#[tokio::test]
async fn a_watch_from_the_next_revision_is_served_once_it_arrives() {
    let s = TestServer::start().await;
    let next = s.revision() + 1;
    let req = http::Request::get(format!("{VMS}?watch=1&resourceVersion={next}")).body(Vec::new()).unwrap();
    let mut lines = s.client.request_stream(req).await.unwrap().lines();
    create(&s, "a").await; // revision `next`: not after it, so not sent
    create(&s, "b").await;
    let line = tokio::time::timeout(Duration::from_secs(15), lines.next()).await.expect("an event within 15 s").unwrap().unwrap();
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!((event["type"].as_str(), event["object"]["metadata"]["name"].as_str()), (Some("ADDED"), Some("b")), "{}", short(&event));
}

#[tokio::test]
async fn tampered_continue_tokens_are_refused_never_reinterpreted() {
    let s = TestServer::start_with(|c| c.store.watch_window = 20).await;
    for i in 0..3 {
        create(&s, &format!("vm-{i}")).await;
    }
    let (code, page) = s.raw("GET", &format!("{VMS}?limit=1"), "", Vec::new()).await;
    assert_eq!(code, 200);
    let token = page["metadata"]["continue"].as_str().unwrap().to_owned();
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let decoded: Value = serde_json::from_slice(&engine.decode(&token).unwrap()).unwrap();
    let tampered = |k: &str, v: Value| {
        let mut t = decoded.clone();
        t[k] = v;
        engine.encode(t.to_string())
    };
    let future = s.revision() + 5;
    for (what, bad) in [
        ("bad base64", "%%%".to_owned()),
        ("bad JSON", engine.encode("{\"rv\":")),
        ("another namespace", tampered("prefix", json!("/kubevirt.io/virtualmachines/kube-system/"))),
        ("another resource", tampered("prefix", json!("/cdi.kubevirt.io/datavolumes/default/"))),
        ("a start key outside the list", tampered("start", json!("../../../namespaces/default"))),
        ("a future revision", tampered("rv", json!(future))),
        (
            "a key without the list's prefix",
            engine.encode(json!({"rv": decoded["rv"], "start": "/kubevirt.io/virtualmachines/default/vm-0"}).to_string()),
        ),
    ] {
        let (code, status) = s.raw("GET", &format!("{VMS}?limit=1&continue={bad}"), "", Vec::new()).await;
        assert_eq!(code, 400, "{what}: {}", short(&status));
        assert!(
            status["message"].as_str().unwrap().starts_with("invalid continue token: continue key is not valid"),
            "{what}: {}",
            short(&status)
        );
    }
    // The real token still pages on, and once its revision leaves the window it is 410.
    let (code, next) = s.raw("GET", &format!("{VMS}?limit=1&continue={token}"), "", Vec::new()).await;
    assert_eq!((code, next["items"][0]["metadata"]["name"].as_str()), (200, Some("vm-1")));
    for i in 0..25 {
        let (code, _) = s
            .raw(
                "PATCH",
                &format!("{VMS}/vm-0"),
                "application/merge-patch+json",
                json!({"metadata": {"labels": {"n": i.to_string()}}}).to_string().into_bytes(),
            )
            .await;
        assert_eq!(code, 200);
    }
    let (code, status) = s.raw("GET", &format!("{VMS}?limit=1&continue={token}"), "", Vec::new()).await;
    assert_eq!((code, status["reason"].as_str()), (410, Some("Expired")), "{}", short(&status));
}

#[tokio::test]
async fn numbers_in_the_query_never_overflow_or_panic() {
    let s = TestServer::start().await;
    create(&s, "a").await;
    for (query, want) in [
        ("watch=1&timeoutSeconds=18446744073709551615", 400),
        ("resourceVersion=abc", 400),
        ("resourceVersion=99999999999999999999999", 400),
        ("limit=99999999999999999999999", 400),
        ("limit=-1", 200),
    ] {
        let (code, status) = s.raw("GET", &format!("{VMS}?{query}"), "", Vec::new()).await;
        assert_eq!(code, want, "{query}: {}", short(&status));
    }
    let (code, _) = s.raw("DELETE", &format!("{VMS}/a?gracePeriodSeconds=-9223372036854775808"), "", Vec::new()).await;
    assert_eq!(code, 400);
    // The largest int64 timeout is capped: the watch stays open and delivers events.
    let req =
        http::Request::get(format!("{VMS}?watch=1&resourceVersion={}&timeoutSeconds={}", s.revision(), i64::MAX)).body(Vec::new()).unwrap();
    let mut lines = s.client.request_stream(req).await.unwrap().lines();
    create(&s, "b").await;
    let line = tokio::time::timeout(Duration::from_secs(15), lines.next()).await.expect("an event within 15 s");
    let event: Value = serde_json::from_str(&line.expect("the stream is still open").unwrap()).unwrap();
    assert_eq!(event["type"], "ADDED", "{}", short(&event));
}

#[tokio::test]
async fn junk_methods_add_no_metric_series() {
    let s = TestServer::start_with(|c| {
        let mut r = prometheus_client::registry::Registry::default();
        apiserver::metrics::register(&mut r);
        c.metrics = Some(std::sync::Arc::new(std::sync::Mutex::new(r)));
    })
    .await;
    for i in 0..1000 {
        let (code, _) = s.raw(&format!("JUNK{i}"), VMS, "", Vec::new()).await;
        assert_eq!(code, 405);
    }
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = s.client.request_text(req).await.unwrap();
    let methods: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("virtplug_apiserver_requests"))
        .filter_map(|l| l.split("method=\"").nth(1)?.split('"').next())
        .collect();
    assert!(methods.contains("other"), "{text}");
    assert!(methods.iter().all(|m| ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"].contains(m)), "{methods:?}");
}

/// `virtplug apiserver` as a child process, killed by its PID when dropped.
struct ServerProcess {
    child: Child,
    kubeconfig: std::path::PathBuf,
}

impl ServerProcess {
    fn start(dir: &std::path::Path) -> ServerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_virtplug"))
            .args(["apiserver", "--data-dir"])
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("virtplug apiserver starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().expect("a first line").expect("readable");
        assert!(first.contains("serving the Kubernetes API at https://127.0.0.1:"), "{first}");
        std::thread::spawn(move || for _ in lines {});
        ServerProcess { child, kubeconfig: dir.join("kubeconfig") }
    }

    /// `VmHWM` (peak resident memory) of the server, in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("the server is alive");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One anchored list of 1,000 strings of 100 bytes and `aliases` aliases to it: 100 KB per
/// alias once expanded, within serde_yaml's own limit of 100 alias jumps per event.
fn wide_laughs(aliases: usize) -> String {
    let item = "x".repeat(100);
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {{name: laughs}}\nanchor: &a [{}]\nspec: {{runStrategy: Halted, x: [{}]}}\n",
        vec![item.as_str(); 1000].join(","),
        vec!["*a"; aliases].join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billion_laughs_yaml_is_refused_quickly_and_the_server_stays_small() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let client = client::connect(Some(&server.kubeconfig)).await.unwrap();
    // Classic: nine levels of nine aliases. Wide: 5,000 aliases to 100 KB (500 MB expanded).
    let mut classic = String::from(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: lol}\na0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n",
    );
    for i in 1..9 {
        let p = i - 1;
        classic += &format!("a{i}: &a{i} [*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p}]\n");
    }
    let before = server.peak_rss_kib();
    for (what, doc) in [("classic", classic), ("wide", wide_laughs(5000))] {
        let t = Instant::now();
        let req = http::Request::post(VMS).header("content-type", "application/yaml").body(doc.into_bytes()).unwrap();
        let resp = client.send(req.map(kube::client::Body::from)).await.unwrap_or_else(|e| panic!("{what}: the server answers: {e}"));
        let code = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        assert!((400..500).contains(&code), "{what}: {code} {}", String::from_utf8_lossy(&body));
        assert!(t.elapsed() < Duration::from_secs(10), "{what} took {:?}", t.elapsed());
    }
    let peak = server.peak_rss_kib();
    eprintln!("peak RSS of the server: {before} KiB before, {peak} KiB after");
    assert!(peak < before + 200 * 1024, "the server's peak RSS grew from {before} KiB to {peak} KiB");
    let api: kube::Api<api::VirtualMachine> = kube::Api::namespaced(client, "default");
    assert!(api.list(&Default::default()).await.unwrap().items.is_empty(), "nothing was stored");
}
