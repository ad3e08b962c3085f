//! Shared test harness: a real API server on a loopback port with a temp data dir, reached
//! through a kube-rs client built from the kubeconfig it wrote (TLS and token included).
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub url: String,
    pub client: kube::Client,
    pub server: Arc<apiserver::Server>,
    shutdown: CancellationToken,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tune: impl FnOnce(&mut apiserver::Config)) -> TestServer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = apiserver::Config::new(dir.path());
        tune(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let server = Arc::new(apiserver::Server::open(&config, Some(addr)).await.expect("server opens"));
        let url = format!("https://{addr}");
        let kubeconfig = server.write_kubeconfig(&url).expect("kubeconfig");
        let shutdown = CancellationToken::new();
        {
            let server = Arc::clone(&server);
            let shutdown = shutdown.clone();
            tokio::spawn(async move { server.serve_tls(listener, shutdown).await });
        }
        let client = client::connect(Some(&kubeconfig)).await.expect("client");
        TestServer { dir, kubeconfig, url, client, server, shutdown }
    }

    /// Sends a raw request and returns (status code, JSON body).
    pub async fn raw(&self, method: &str, path: &str, content_type: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
        use http_body_util::BodyExt;
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(kube::client::Body::from(body))
            .expect("request");
        let resp = self.client.send(req).await.expect("send");
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    pub fn revision(&self) -> u64 {
        self.server.objects().store.revision()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Waits until `check` returns `Some`, polling until `deadline`; panics with `what` on timeout.
pub async fn wait_until<T, F, Fut>(deadline: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A minimal valid VM manifest.
pub fn vm(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}}, {"name": "cdrom0", "cdrom": {"bus": "sata"}}]},
                       "resources": {"requests": {"memory": "128Mi"}}},
            "volumes": [{"name": "root", "emptyDisk": {"capacity": "1Gi"}}]}}}
    })
}

/// The fixture manifest with fields virtplug does not model.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}
/// The requests a client sent through [`counted`]: `METHOD path`, watches left out.
pub type Requests = Arc<std::sync::Mutex<Vec<String>>>;

/// `router` with a layer that records every request but watches (long-running, started before
/// what a test counts) into the returned log: an in-process client over it is the one counted.
pub fn counted(router: axum::Router) -> (axum::Router, Requests) {
    let log: Requests = Arc::default();
    let into = Arc::clone(&log);
    let router = router.layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
        let log = Arc::clone(&into);
        async move {
            if !req.uri().query().is_some_and(|q| q.contains("watch=true")) {
                log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(format!("{} {}", req.method(), req.uri().path()));
            }
            next.run(req).await
        }
    }));
    (router, log)
}

pub mod fakenode;
pub mod forks;
pub mod guest;
pub mod kubectl;
pub mod procs;
pub mod up;
pub mod vmops;

/// The kubevirt.io resource of `kind` (`VirtualMachine` or `VirtualMachineInstance`), for
/// dynamic access that keeps every field verbatim.
pub fn kubevirt_resource(kind: &str) -> kube::api::ApiResource {
    if kind == "VirtualMachine" {
        kube::api::ApiResource::erase::<api::VirtualMachine>(&())
    } else {
        kube::api::ApiResource::erase::<api::VirtualMachineInstance>(&())
    }
}
