//! DataVolume import is a request the server makes for whoever may create a DataVolume (issue
//! 14, class 6). Against the real embedded API server, controller and provisioner, with image
//! servers on loopback: loopback, link-local and this machine's addresses are refused unless
//! allowed, also behind redirects; status messages never tell ports or why a connection failed;
//! a deleted DataVolume's transfer stops; slow and endless transfers are aborted; a planted
//! symlink is not followed.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::TestServer;
use controller::storage::import::ImportConfig;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};

use api::DataVolume;

const T: Duration = Duration::from_secs(30);

struct Env {
    _s: TestServer,
    root: tempfile::TempDir,
    pvcs: Api<PersistentVolumeClaim>,
    dvs: Api<DataVolume>,
    ctl: tokio::task::JoinHandle<()>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.ctl.abort();
    }
}

/// Fast retries (one), frequent progress, and `allow` as the allow-list.
fn config(allow: &[&str]) -> ImportConfig {
    ImportConfig {
        max_retries: 1,
        backoff_base: Duration::from_millis(50),
        backoff_cap: Duration::from_millis(200),
        progress_interval: Duration::from_millis(20),
        allow_hosts: allow.iter().map(|a| a.parse().unwrap()).collect(),
        ..Default::default()
    }
}

async fn env(import: ImportConfig) -> Env {
    let s = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let config = controller::run::Config { storage_root: Some(root.path().to_owned()), import, ..Default::default() };
    let ctl = tokio::spawn(controller::run::run_with(client::in_process(s.server.local_router()), config));
    let pvcs = Api::namespaced(s.client.clone(), "default");
    let dvs = Api::namespaced(s.client.clone(), "default");
    Env { _s: s, root, pvcs, dvs, ctl }
}

fn data_volume(name: &str, url: &str, size: &str) -> DataVolume {
    serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
        "spec": {"source": {"http": {"url": url}}, "storage": {"resources": {"requests": {"storage": size}}}}}))
    .unwrap()
}

impl Env {
    async fn create(&self, name: &str, url: &str, size: &str) {
        self.dvs.create(&PostParams::default(), &data_volume(name, url, size)).await.unwrap();
    }

    async fn phase(&self, name: &str, phase: &str) -> DataVolume {
        let dvs = self.dvs.clone();
        common::wait_until(T, &format!("DataVolume {name} to be {phase}"), || {
            let dvs = dvs.clone();
            async move {
                dvs.get(name)
                    .await
                    .ok()
                    .filter(|d| d.status.as_ref().and_then(|s| s.phase.as_ref()).map(api::phases::DataVolumePhase::as_str) == Some(phase))
            }
        })
        .await
    }

    /// The message of the `Running` condition once the DataVolume is `Failed`.
    async fn failure(&self, name: &str) -> String {
        let dv = self.phase(name, "Failed").await;
        let st = dv.status.unwrap();
        st.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone()).unwrap_or_default()
    }

    /// The claim's directory, once the claim is bound.
    async fn claim_dir(&self, name: &str) -> PathBuf {
        let pvcs = self.pvcs.clone();
        common::wait_until(T, &format!("claim {name} to be bound"), || {
            let pvcs = pvcs.clone();
            async move {
                let p = pvcs.get(name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(())?;
                Some(PathBuf::from(p.metadata.annotations?.get("virtplug.io/local-path")?))
            }
        })
        .await
    }
}

/// What a test server answers every request with.
#[derive(Clone)]
enum Answer {
    Body(Arc<Vec<u8>>),
    Redirect(String),
    /// `len` bytes, sent `piece` bytes at a time every `every`; announced in Content-Length if
    /// `announce`, else delimited by the end of the connection.
    Trickle {
        len: usize,
        piece: usize,
        every: Duration,
        announce: bool,
    },
    /// Reads the request, then closes the connection without an answer.
    Close,
    /// Announces the request on `arrived`, waits for `go`, then answers the body.
    Hold {
        body: Arc<Vec<u8>>,
        arrived: Arc<Notify>,
        go: Arc<Notify>,
    },
}

/// A loopback HTTP server on `bind` ("127.0.0.1:0", "127.0.0.2:0"): its address, the number of
/// connections it accepted, the bytes its trickling answers sent, and their ends ("closed after
/// N bytes").
struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    sent: Arc<AtomicUsize>,
    closed: mpsc::UnboundedReceiver<usize>,
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

async fn serve(bind: &str, answer: Answer) -> Server {
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (connections, sent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (tx, closed) = mpsc::unbounded_channel();
    let (count, total) = (Arc::clone(&connections), Arc::clone(&sent));
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer_one(sock, answer.clone(), Arc::clone(&total), tx.clone()));
        }
    });
    Server { addr, connections, sent, closed }
}

async fn answer_one(mut sock: tokio::net::TcpStream, answer: Answer, total: Arc<AtomicUsize>, closed: mpsc::UnboundedSender<usize>) {
    let mut buf = vec![0u8; 4096];
    let _ = sock.read(&mut buf).await;
    let head = |len: usize| format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
    match answer {
        Answer::Body(body) => {
            let _ = sock.write_all(head(body.len()).as_bytes()).await;
            let _ = sock.write_all(&body).await;
        }
        Answer::Redirect(to) => {
            // `Connection: close`, as every answer here: the socket is closed after it, and a
            // client that kept it for the next hop would find it dead (the redirect loop then
            // failed as "could not connect" when the FIN arrived after the reuse: failed CI).
            let _ = sock
                .write_all(format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes())
                .await;
        }
        Answer::Close => return,
        Answer::Hold { body, arrived, go } => {
            arrived.notify_one();
            go.notified().await;
            let _ = sock.write_all(head(body.len()).as_bytes()).await;
            let _ = sock.write_all(&body).await;
        }
        Answer::Trickle { len, piece, every, announce } => {
            let (mut rd, mut wr) = sock.split();
            let head = if announce { head(len) } else { "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_owned() };
            let _ = wr.write_all(head.as_bytes()).await;
            let mut sent = 0;
            while sent < len {
                // The pause paces the answer; the read sees the client close the connection.
                tokio::select! {
                    n = rd.read(&mut buf) => if !matches!(n, Ok(n) if n > 0) { break },
                    () = tokio::time::sleep(every) => {
                        if wr.write_all(&vec![1u8; piece.min(len - sent)]).await.is_err() {
                            break;
                        }
                        total.fetch_add(piece.min(len - sent), Ordering::SeqCst);
                        sent += piece.min(len - sent);
                    }
                }
            }
            let _ = closed.send(sent);
        }
    }
    let _ = sock.shutdown().await;
}

/// A loopback port nothing listens on.
async fn closed_port() -> u16 {
    tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port()
}

/// Whether `msg` names a port: one of `ports`, or a word in `host:port` or `[v6]:port` form.
fn has_port(msg: &str, ports: &[u16]) -> bool {
    let host_port = |w: &str| {
        let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '[' && c != ']');
        w.parse::<SocketAddr>().is_ok()
            || w.rsplit_once(':').is_some_and(|(h, p)| !h.contains(':') && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    ports.iter().any(|p| msg.contains(&p.to_string())) || msg.split_whitespace().any(host_port)
}

/// This machine's own non-loopback address, as the kernel picks it to reach another network
/// (a UDP connect sends nothing).
fn own_address() -> Option<std::net::IpAddr> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect("192.0.2.200:9").or_else(|_| sock.connect("203.0.113.1:9")).ok()?;
    Some(sock.local_addr().ok()?.ip()).filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// Without `--import-allow-host`, loopback (by address, by name, IPv4-mapped) and this
/// machine's own address are refused before any connection: the server never sees one, and an
/// open port and a closed one read exactly the same, with no port in the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_and_own_addresses_are_refused_without_the_allow_flag() {
    let e = env(config(&[])).await;
    let open = serve("127.0.0.1:0", Answer::Body(Arc::new(vec![7u8; 4096]))).await;
    let (port, closed) = (open.addr.port(), closed_port().await);
    let mut cases = vec![
        ("open", open.url("/disk.raw")),
        ("closed", format!("http://127.0.0.1:{closed}/disk.raw")),
        ("by-name", format!("http://localhost:{port}/disk.raw")),
        ("mapped", format!("http://[::ffff:127.0.0.1]:{port}/disk.raw")),
        ("metadata", "http://169.254.169.254/latest/meta-data/".to_owned()),
    ];
    if let Some(own) = own_address() {
        cases.push(("own", format!("http://{}/disk.raw", SocketAddr::new(own, port))));
    }
    for (name, url) in &cases {
        e.create(name, url, "1Mi").await;
    }
    let mut messages = Vec::new();
    for (name, _) in &cases {
        let msg = e.failure(name).await;
        assert!(msg.contains("not allowed"), "{name}: {msg:?} should say the host is not allowed");
        assert!(!has_port(&msg, &[port, closed]), "{name}: {msg:?} names a port");
        messages.push(msg);
    }
    assert_eq!(messages[0], messages[1], "an open and a closed port read the same");
    assert_eq!(open.connections.load(Ordering::SeqCst), 0, "no connection was made to a refused host");
}

/// An allowed server that redirects to a refused address: the redirect is refused, and the
/// message names the refused host without a port. So are a redirect to another scheme and a
/// redirect loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_to_link_local_other_schemes_or_in_a_loop_are_refused() {
    let e = env(config(&["127.0.0.1"])).await;
    let metadata = serve("127.0.0.1:0", Answer::Redirect("http://169.254.169.254/latest/meta-data/".into())).await;
    let file = serve("127.0.0.1:0", Answer::Redirect("ftp://images.example/disk.raw".into())).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let loop_port = listener.local_addr().unwrap().port();
    drop(listener);
    let looping = serve(&format!("127.0.0.1:{loop_port}"), Answer::Redirect(format!("http://127.0.0.1:{loop_port}/again"))).await;
    let ports = [metadata.addr.port(), file.addr.port(), looping.addr.port()];
    e.create("metadata", &metadata.url("/disk.raw"), "1Mi").await;
    e.create("file", &file.url("/disk.raw"), "1Mi").await;
    e.create("looping", &looping.url("/disk.raw"), "1Mi").await;
    for (name, why) in [
        ("metadata", "169.254.169.254: the host is not allowed"),
        ("file", "a redirect to a \"ftp\" URL was refused"),
        ("looping", "more than 10 redirects"),
    ] {
        let msg = e.failure(name).await;
        assert!(msg.contains(why), "{name}: {msg:?} should say {why:?}");
        assert!(!has_port(&msg, &ports), "{name}: {msg:?} names a port");
    }
}

/// Only 127.0.0.2 is allowed: its redirect to 127.0.0.1 is refused (the target is never
/// connected to), while its own image imports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_from_an_allowed_host_to_a_refused_one_is_refused() {
    let e = env(config(&["127.0.0.2/32"])).await;
    let inner = serve("127.0.0.1:0", Answer::Body(Arc::new(vec![7u8; 4096]))).await;
    let outer = serve("127.0.0.2:0", Answer::Redirect(inner.url("/disk.raw"))).await;
    let direct = serve("127.0.0.2:0", Answer::Body(Arc::new(vec![9u8; 4096]))).await;
    e.create("redirected", &outer.url("/disk.raw"), "1Mi").await;
    e.create("direct", &direct.url("/disk.raw"), "1Mi").await;
    let msg = e.failure("redirected").await;
    assert!(msg.contains("could not connect to 127.0.0.1: the host is not allowed"), "{msg:?}");
    assert!(!has_port(&msg, &[inner.addr.port(), outer.addr.port()]), "{msg:?} names a port");
    assert_eq!(inner.connections.load(Ordering::SeqCst), 0, "the refused target was never connected to");
    e.phase("direct", "Succeeded").await;
}

/// Reaching an allowed host fails the same way whether its port is closed or its server hangs
/// up: "could not connect", no port, no "refused" or "reset".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_hosts_read_the_same_whatever_the_reason() {
    let e = env(config(&["127.0.0.1"])).await;
    let hangup = serve("127.0.0.1:0", Answer::Close).await;
    let closed = closed_port().await;
    e.create("closed", &format!("http://127.0.0.1:{closed}/disk.raw"), "1Mi").await;
    e.create("hangup", &hangup.url("/disk.raw"), "1Mi").await;
    let (a, b) = (e.failure("closed").await, e.failure("hangup").await);
    assert_eq!(a, b, "a closed port and a server that hangs up read the same");
    assert!(a.starts_with("could not connect to 127.0.0.1"), "{a:?}");
    assert!(!has_port(&a, &[closed, hangup.addr.port()]), "{a:?} names a port");
    for word in ["refused", "reset", "closed", "timed out"] {
        assert!(!a.to_lowercase().contains(word), "{a:?} tells why the connection failed ({word})");
    }
}

/// Starts DataVolume `name` from a source trickling 4 MiB at 100 KiB/s (40 s, above the
/// default minimum rate; no Content-Length) and waits until 64 KiB went out: the server and the
/// claim's directory.
async fn transfer_under_way(e: &Env, name: &str) -> (Server, PathBuf) {
    let trickle = Answer::Trickle { len: 4 << 20, piece: 2048, every: Duration::from_millis(20), announce: false };
    let server = serve("127.0.0.1:0", trickle).await;
    e.create(name, &server.url("/disk.raw"), "4Mi").await;
    let dir = e.claim_dir(name).await;
    let sent = Arc::clone(&server.sent);
    common::wait_until(T, "the transfer to be under way (64 KiB sent)", || {
        let under_way = sent.load(Ordering::SeqCst) >= 64 << 10;
        async move { under_way.then_some(()) }
    })
    .await;
    (server, dir)
}

/// The import's partial files in `dir`.
fn partial_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".import-"))
        .collect()
}

/// Deleting a DataVolume mid-transfer stops the download (the server sees the connection
/// closed within seconds, not when the 40 s transfer would end), and nothing is left on disk.
/// The source has no Content-Length, so no progress write fails on the deleted object: only
/// the deletion itself can stop the transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_data_volume_stops_its_transfer_and_removes_the_partial_file() {
    let e = env(config(&["127.0.0.1"])).await;
    let (mut server, dir) = transfer_under_way(&e, "slow").await;
    e.phase("slow", "ImportInProgress").await;
    let partial = partial_files(&dir);

    e.dvs.delete("slow", &DeleteParams::default()).await.unwrap();
    let sent = tokio::time::timeout(Duration::from_secs(10), server.closed.recv())
        .await
        .expect("the server saw the connection closed within 10 s of the deletion")
        .unwrap();
    assert!(sent < 4 << 20, "the transfer stopped before its end ({sent} bytes sent)");
    assert_eq!(partial.len(), 1, "the transfer wrote a partial file beside the image: {partial:?}");
    common::wait_until(T, "the claim's directory and the partial file to be removed", || {
        let gone = !dir.exists() && std::fs::read_dir(e.root.path()).unwrap().next().is_none();
        async move { gone.then_some(()) }
    })
    .await;
}

/// A controller that stops (here: its task aborted, as a leader that lost its lease is) stops
/// its transfers with it: the connection closes and the partial file goes. Left running, an
/// attempt would race the next leader's on the same claim (the new attempt sweeps the old
/// one's temp file, the old one then writes its failure over the new one's progress).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_controllers_transfers_stop_with_it() {
    let e = env(config(&["127.0.0.1"])).await;
    let (mut server, dir) = transfer_under_way(&e, "orphan").await;
    assert_eq!(partial_files(&dir).len(), 1, "the transfer writes a partial file beside the image");
    e.ctl.abort();
    let sent = tokio::time::timeout(Duration::from_secs(10), server.closed.recv())
        .await
        .expect("the server saw the connection closed within 10 s of the controller's end")
        .unwrap();
    assert!(sent < 4 << 20, "the transfer stopped before its end ({sent} bytes sent)");
    common::wait_until(T, "the partial file to be removed", || {
        let gone = partial_files(&dir).is_empty();
        async move { gone.then_some(()) }
    })
    .await;
}

/// A transfer below the minimum rate is aborted at the end of its window; one that keeps the
/// rate but outlasts the deadline is aborted at the deadline. Both are retried, then fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_endless_transfers_are_aborted() {
    let e = env(ImportConfig {
        min_rate: 16 << 10,
        min_rate_window: Duration::from_millis(500),
        deadline: Duration::from_secs(2),
        ..config(&["127.0.0.1"])
    })
    .await;
    // 10 KiB/s against a minimum of 16 KiB/s.
    let slow = serve("127.0.0.1:0", Answer::Trickle { len: 1 << 20, piece: 512, every: Duration::from_millis(50), announce: true }).await;
    // 640 KiB/s, so 4 MiB take 6.4 s against a 2 s deadline.
    let endless =
        serve("127.0.0.1:0", Answer::Trickle { len: 4 << 20, piece: 32 << 10, every: Duration::from_millis(50), announce: true }).await;
    e.create("slow", &slow.url("/disk.raw"), "1Mi").await;
    e.create("endless", &endless.url("/disk.raw"), "4Mi").await;
    for (name, server, why) in [("slow", &slow, "slower than 16384 bytes/s over 500ms"), ("endless", &endless, "did not finish within 2s")]
    {
        let msg = e.failure(name).await;
        assert!(msg.contains(why) && msg.contains("gave up after 2 attempts"), "{name}: {msg:?} should say {why:?}");
        assert!(!has_port(&msg, &[server.addr.port()]), "{name}: {msg:?} names a port");
    }
}

/// Waits for the held request of `name`, runs `plant` on the claim's directory, then lets the
/// server answer.
async fn plant_then_answer(e: &Env, name: &str, body: &[u8], plant: impl FnOnce(&Path)) {
    let (arrived, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let server = serve("127.0.0.1:0", Answer::Hold { body: Arc::new(body.to_vec()), arrived: arrived.clone(), go: go.clone() }).await;
    e.create(name, &server.url("/disk.raw"), "1Mi").await;
    let dir = e.claim_dir(name).await;
    tokio::time::timeout(T, arrived.notified()).await.expect("the importer's request arrived");
    plant(&dir);
    go.notify_one();
}

/// A symlink planted where the image goes is not followed: the file it points to keeps its
/// bytes and the image is a regular file with the import; a symlink in place of the claim's
/// directory fails the import and leaves its target untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_planted_at_the_target_is_not_followed() {
    let e = env(config(&["127.0.0.1"])).await;
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("disk.img");
    std::fs::write(&victim, b"keep me").unwrap();
    let body = vec![5u8; 64 << 10];

    plant_then_answer(&e, "at-image", &body, |dir| {
        std::fs::remove_file(dir.join("disk.img")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("disk.img")).unwrap();
    })
    .await;
    e.phase("at-image", "Succeeded").await;
    assert!(std::fs::read(&victim).unwrap() == b"keep me", "the symlink's target was written through");
    let dir = e.claim_dir("at-image").await;
    assert!(std::fs::symlink_metadata(dir.join("disk.img")).unwrap().is_file(), "the image is a regular file again");
    let image = std::fs::read(dir.join("disk.img")).unwrap();
    assert!(image.len() == 1 << 20 && image[..body.len()] == body[..], "the image holds the import and keeps the claim's size");

    plant_then_answer(&e, "at-dir", &body, |dir| {
        std::fs::remove_dir_all(dir).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir).unwrap();
    })
    .await;
    let msg = e.failure("at-dir").await;
    assert!(msg.contains("symbolic link"), "{msg:?}");
    assert!(std::fs::read(&victim).unwrap() == b"keep me", "the symlinked directory's file was written through");
    let names: Vec<_> = std::fs::read_dir(outside.path()).unwrap().map(|d| d.unwrap().file_name()).collect();
    assert_eq!(names, ["disk.img"], "nothing was created in the symlinked directory");
}
