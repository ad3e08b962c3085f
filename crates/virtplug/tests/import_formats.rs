//! DataVolume import of what cloud images ship as, and clone from a claim (issue 20), against
//! the real embedded API server, controller and provisioner, real `qemu-img`, and images
//! served on loopback: a qcow2 (made by `qemu-img convert`), an xz-compressed raw and a
//! gzip-compressed qcow2 land byte for byte; a corrupt qcow2, a qcow2 larger than its claim
//! and decompression bombs end `Failed` with a clear reason and no file left behind; a
//! `source.pvc` clone copies its source's bytes; unsupported sources are refused at admission.
//! Through `virtplug up`, real `kubectl` and QEMU (TCG): a VM's disks imported from a qcow2 and
//! an xz-compressed image hold, as the guest reads them, the bytes put into those images.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::up::SEE;
use common::TestServer;
use controller::storage::import::ImportConfig;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use api::DataVolume;

const T: Duration = Duration::from_secs(60);

struct Env {
    s: TestServer,
    _root: tempfile::TempDir,
    pvcs: Api<PersistentVolumeClaim>,
    dvs: Api<DataVolume>,
    ctl: tokio::task::JoinHandle<()>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.ctl.abort();
        for (dev, _) in controller::storage::loopdev::under(self._root.path()) {
            let _ = controller::storage::loopdev::detach(&dev);
        }
    }
}

async fn env() -> Env {
    let s = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let import = ImportConfig {
        max_retries: 1,
        backoff_base: Duration::from_millis(50),
        backoff_cap: Duration::from_millis(200),
        progress_interval: Duration::from_millis(10),
        // The test's image server is on loopback, which imports refuse unless allowed.
        allow_hosts: vec!["127.0.0.1".parse().unwrap()],
        ..Default::default()
    };
    let config = controller::run::Config { storage_root: Some(root.path().to_owned()), import, ..Default::default() };
    let ctl = tokio::spawn(controller::run::run_with(client::in_process(s.server.local_router()), config));
    let pvcs = Api::namespaced(s.client.clone(), "default");
    let dvs = Api::namespaced(s.client.clone(), "default");
    Env { s, _root: root, pvcs, dvs, ctl }
}

fn data_volume(name: &str, source: &Value, size: &str, mode: &str) -> DataVolume {
    serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
        "spec": {"source": source, "storage": {"volumeMode": mode, "resources": {"requests": {"storage": size}}}}}))
    .unwrap()
}

impl Env {
    async fn create(&self, name: &str, source: Value, size: &str) {
        self.dvs.create(&PostParams::default(), &data_volume(name, &source, size, "Filesystem")).await.unwrap();
    }

    /// Waits for `name` to end `Succeeded` or `Failed`; returns the phase and the `Running`
    /// condition's message.
    async fn outcome(&self, name: &str) -> (String, String) {
        let dvs = self.dvs.clone();
        common::wait_until(T, &format!("DataVolume {name} to succeed or fail"), || {
            let dvs = dvs.clone();
            async move {
                let st = dvs.get(name).await.ok()?.status?;
                let phase = st.phase.as_ref()?.as_str().to_owned();
                let msg = st.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone()).unwrap_or_default();
                matches!(phase.as_str(), "Succeeded" | "Failed").then_some((phase, msg))
            }
        })
        .await
    }

    /// The bound claim's directory.
    async fn claim_dir(&self, name: &str) -> PathBuf {
        let pvc = self.pvcs.get(name).await.unwrap();
        PathBuf::from(&pvc.metadata.annotations.unwrap()["virtplug.io/local-path"])
    }
}

/// Serves `files` (path → bytes) on loopback with their Content-Length; returns the base URL.
async fn serve(files: Vec<(&'static str, Vec<u8>)>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let files = Arc::new(files);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let files = Arc::clone(&files);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_owned();
                match files.iter().find(|(p, _)| *p == path) {
                    Some((_, body)) => {
                        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                        let _ = sock.write_all(head.as_bytes()).await;
                        let _ = sock.write_all(body).await;
                    }
                    None => {
                        let _ = sock.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                    }
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// A 3 MiB raw disk: 1 MiB of a pattern, a 1 MiB hole, then 1 MiB of another pattern (so a
/// conversion that lost the layout of clusters would show).
fn pattern() -> Vec<u8> {
    let mut v: Vec<u8> = (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    v.resize(2 << 20, 0);
    v.extend((0..(1u32 << 20)).map(|i| (i % 251) as u8 | 1));
    v
}

fn qemu_img(args: &[&str]) {
    let out = std::process::Command::new("qemu-img").args(args).output().expect("qemu-img runs (qemu-utils)");
    assert!(out.status.success(), "qemu-img {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `raw` as a qcow2 image, made by `qemu-img convert -O qcow2`.
fn to_qcow2(dir: &Path, raw: &[u8]) -> Vec<u8> {
    let (src, dst) = (dir.join("src.raw"), dir.join("src.qcow2"));
    std::fs::write(&src, raw).unwrap();
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2", src.to_str().unwrap(), dst.to_str().unwrap()]);
    let q = std::fs::read(&dst).unwrap();
    assert!(q.starts_with(b"QFI\xfb") && q.len() != raw.len(), "a real qcow2 image");
    q
}

fn xz(data: &[u8], level: u32) -> Vec<u8> {
    let mut e = xz2::write::XzEncoder::new(Vec::new(), level);
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A qcow2 image with a valid magic and garbage after it: version 3, a virtual size of 1 MiB
/// where qcow2 keeps it, garbage everywhere else.
fn corrupt_qcow2() -> Vec<u8> {
    let mut corrupt: Vec<u8> = (0..(256u32 << 10)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    corrupt[..8].copy_from_slice(b"QFI\xfb\x00\x00\x00\x03");
    corrupt[24..32].copy_from_slice(&(1u64 << 20).to_be_bytes());
    corrupt
}

/// Names in `dir` other than the image: what an import left behind.
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "disk.img" && n != "block.img")
        .collect()
}

/// The claim's image holds `want` and zeros after it, at the claim's size.
fn assert_image(dir: &Path, want: &[u8], size: usize, what: &str) {
    let data = std::fs::read(dir.join("disk.img")).unwrap();
    assert_eq!(data.len(), size, "{what}: the image keeps the claim's size");
    assert!(data[..want.len()] == want[..], "{what}: the source's bytes, in order");
    assert!(data[want.len()..].iter().all(|b| *b == 0), "{what}: zeros after the source");
    assert_eq!(leftovers(dir), Vec::<String>::new(), "{what}: no temp file left");
}

/// A qcow2, an xz-compressed raw and a gzip-compressed qcow2 (detected by their bytes: the
/// URLs say nothing) each land as the raw disk they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qcow2_and_compressed_images_land_as_their_raw_disk() {
    let e = env().await;
    let work = tempfile::tempdir().unwrap();
    let raw = pattern();
    let qcow2 = to_qcow2(work.path(), &raw);
    let base = serve(vec![("/a", qcow2.clone()), ("/b", xz(&raw, 6)), ("/c", gzip(&qcow2))]).await;
    for (name, path) in [("qcow2", "/a"), ("raw-xz", "/b"), ("qcow2-gz", "/c")] {
        e.create(name, json!({"http": {"url": format!("{base}{path}")}}), "4Mi").await;
    }
    for name in ["qcow2", "raw-xz", "qcow2-gz"] {
        let (phase, msg) = e.outcome(name).await;
        assert_eq!(phase, "Succeeded", "{name}: {msg}");
        let dv = e.dvs.get(name).await.unwrap();
        assert_eq!(dv.status.unwrap().progress.as_deref(), Some("100.0%"), "{name}");
        assert_image(&e.claim_dir(name).await, &raw, 4 << 20, name);
    }
}

/// A qcow2 image with a valid magic and garbage after it, one whose disk is larger than the
/// claim, and xz and gzip streams that expand past the claim each end `Failed` with a reason
/// and an `ImportFailed` Event, without a retry, leaving only the blank image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_oversized_and_bomb_images_fail_and_leave_nothing_behind() {
    let e = env().await;
    let work = tempfile::tempdir().unwrap();
    let corrupt = corrupt_qcow2();
    let big = work.path().join("big.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", big.to_str().unwrap(), "64M"]);
    // 64 MiB of zeros compress to a few KiB; the claim is 4 MiB.
    let zeros = vec![0u8; 64 << 20];
    let (xz_bomb, gz_bomb) = (xz(&zeros, 1), gzip(&zeros));
    assert!(xz_bomb.len() < 64 << 10 && gz_bomb.len() < 1 << 20, "small bombs: {} and {} bytes", xz_bomb.len(), gz_bomb.len());
    // Half an xz stream, served whole (its Content-Length is its own).
    let truncated_xz = {
        let full = xz(&pattern(), 6);
        full[..full.len() / 2].to_vec()
    };
    let base = serve(vec![
        ("/corrupt", corrupt),
        ("/big", std::fs::read(&big).unwrap()),
        ("/xz-bomb", xz_bomb),
        ("/gz-bomb", gz_bomb),
        ("/truncated-xz", truncated_xz),
    ])
    .await;
    let cases = [
        ("corrupt", "/corrupt", "not a valid qcow2 image"),
        ("big", "/big", "virtual size is 67108864 bytes, larger than the claim's 4194304 bytes"),
        ("xz-bomb", "/xz-bomb", "decompresses (xz) to more than 4194304 bytes"),
        ("gz-bomb", "/gz-bomb", "decompresses (gzip) to more than 4194304 bytes"),
        ("truncated-xz", "/truncated-xz", "xz stream is corrupt"),
    ];
    for (name, path, _) in cases {
        e.create(name, json!({"http": {"url": format!("{base}{path}")}}), "4Mi").await;
    }
    for (name, _, why) in cases {
        let (phase, msg) = e.outcome(name).await;
        assert_eq!(phase, "Failed", "{name}: {msg}");
        assert!(msg.contains(why), "{name}: {msg:?} should say {why:?}");
        let events = client::events::list(&e.s.client, "default", name, "ImportFailed").await.unwrap();
        assert_eq!(events.len(), 1, "{name}: one ImportFailed event");
        let dv = e.dvs.get(name).await.unwrap();
        assert_eq!(dv.status.unwrap().restart_count.unwrap_or(0), 0, "{name}: a permanent failure is not retried");
        assert_image(&e.claim_dir(name).await, &[], 4 << 20, name);
    }
}

/// `source.pvc` copies the source claim's bytes into the new, larger claim; a source larger
/// than the claim, one of another namespace and one that does not exist fail saying so; and
/// sources virtplug does not import from are refused at admission naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_copies_its_source_claim_and_bad_sources_say_why() {
    let e = env().await;
    let raw = pattern();
    let base = serve(vec![("/disk.raw", raw.clone())]).await;
    e.create("golden", json!({"http": {"url": format!("{base}/disk.raw")}}), "4Mi").await;
    assert_eq!(e.outcome("golden").await.0, "Succeeded");

    e.create("copy", json!({"pvc": {"namespace": "default", "name": "golden"}}), "8Mi").await;
    e.create("small", json!({"pvc": {"namespace": "default", "name": "golden"}}), "2Mi").await;
    e.create("elsewhere", json!({"pvc": {"namespace": "kube-system", "name": "golden"}}), "8Mi").await;
    e.create("missing", json!({"pvc": {"namespace": "default", "name": "nope"}}), "8Mi").await;
    let (phase, msg) = e.outcome("copy").await;
    assert_eq!(phase, "Succeeded", "{msg}");
    assert_image(&e.claim_dir("copy").await, &raw, 8 << 20, "clone");
    let golden = std::fs::read(e.claim_dir("golden").await.join("disk.img")).unwrap();
    assert!(golden[..raw.len()] == raw[..], "the source is unchanged");
    for (name, why) in [
        ("small", "the source claim default/golden is 4194304 bytes, larger than this claim's 2097152 bytes"),
        ("elsewhere", "cloning from another namespace (kube-system) is not supported"),
        ("missing", "the source claim default/nope does not exist (gave up after 2 attempts)"),
    ] {
        let (phase, msg) = e.outcome(name).await;
        assert_eq!(phase, "Failed", "{name}: {msg}");
        assert!(msg.contains(why), "{name}: {msg:?} should say {why:?}");
        assert_eq!(leftovers(&e.claim_dir(name).await), Vec::<String>::new(), "{name}: no temp file left");
    }

    let refused = |spec: Value| {
        let mut dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "bad"},
            "spec": {"storage": {"resources": {"requests": {"storage": "1Mi"}}}}});
        dv["spec"].as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
        serde_json::from_value::<DataVolume>(dv).unwrap()
    };
    for (spec, field) in [
        (json!({"sourceRef": {"kind": "DataSource", "name": "fedora"}}), "spec.sourceRef"),
        (json!({"source": {"registry": {"url": "docker://quay.io/containerdisks/fedora"}}}), "spec.source.registry"),
    ] {
        match e.dvs.create(&PostParams::default(), &refused(spec)).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{field}");
                assert!(s.message.contains(field) && s.message.contains("spec.source.pvc"), "{field}: {}", s.message);
            }
            other => panic!("{field} must be refused at admission, got {other:?}"),
        }
    }
}

/// A qcow2 image into a Block claim is converted onto its loop device (`qemu-img convert -n`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_import_into_a_block_claim_lands_on_its_loop_device() {
    if !common::guest::is_root() {
        eprintln!("skipped: Block claims need root for /dev/loop-control");
        return;
    }
    let e = env().await;
    let work = tempfile::tempdir().unwrap();
    let raw = pattern();
    let base = serve(vec![("/img", to_qcow2(work.path(), &raw))]).await;
    let dv = data_volume("blk", &json!({"http": {"url": format!("{base}/img")}}), "4Mi", "Block");
    e.dvs.create(&PostParams::default(), &dv).await.unwrap();
    let (phase, msg) = e.outcome("blk").await;
    assert_eq!(phase, "Succeeded", "{msg}");
    let pvc = e.pvcs.get("blk").await.unwrap();
    let dev = PathBuf::from(&pvc.metadata.annotations.as_ref().unwrap()["virtplug.io/loop-device"]);
    let mut data = vec![0u8; raw.len()];
    std::io::Read::read_exact(&mut std::fs::File::open(&dev).unwrap(), &mut data).unwrap();
    assert!(data == raw, "the disk's bytes, in order, on {}", dev.display());
    assert_eq!(leftovers(&e.claim_dir("blk").await), Vec::<String>::new(), "no scratch file left");
}

/// `bytes`' first 16 as the test guest prints a disk's (`BLOCK+ dev sectors HEX id=...`).
fn hex16(bytes: &[u8]) -> String {
    bytes[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// What a KubeVirt user writes: a VM whose two disks are DataVolumes of its
/// `dataVolumeTemplates`, imported over HTTP from a qcow2 image and an xz-compressed raw image.
/// The VM starts once both are imported, and the guest reads on its two disks the markers put at
/// the start of the images before they were converted or compressed, at the claim's size: served
/// as they are, the guest would read the qcow2 or xz magic there. Then
/// `virtplug volume import` of a corrupt qcow2 and of an xz bomb exits non-zero saying why,
/// `kubectl` shows the DataVolume `Failed`, and the claim's directory holds only its blank image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_reads_the_bytes_of_disks_imported_from_qcow2_and_xz() {
    let up = common::up::Up::start();
    let work = tempfile::tempdir().unwrap();
    let marked = |marker: &[u8; 16]| {
        let mut v = pattern();
        v[..16].copy_from_slice(marker);
        v
    };
    let (q, x) = (marked(b"VP-IMPORT-QCOW2\n"), marked(b"VP-IMPORT-XZRAW\n"));
    let base = serve(vec![
        ("/disk.qcow2", to_qcow2(work.path(), &q)),
        ("/disk.raw.xz", xz(&x, 6)),
        ("/corrupt.qcow2", corrupt_qcow2()),
        ("/bomb.raw.xz", xz(&vec![0u8; 64 << 20], 1)),
    ])
    .await;
    let template = |name: &str, path: &str| {
        json!({"metadata": {"name": name}, "spec": {"source": {"http": {"url": format!("{base}{path}")}},
            "storage": {"resources": {"requests": {"storage": "8Mi"}}}}})
    };
    let templates = json!([template("imp-q", "/disk.qcow2"), template("imp-x", "/disk.raw.xz")]);
    up.vm_with("imp", |vm| {
        vm["spec"]["dataVolumeTemplates"] = templates;
        let t = &mut vm["spec"]["template"]["spec"];
        t["domain"]["devices"]["disks"] = json!([{"name": "q", "disk": {"bus": "virtio"}}, {"name": "x", "disk": {"bus": "virtio"}}]);
        t["volumes"] = json!([{"name": "q", "dataVolume": {"name": "imp-q"}}, {"name": "x", "dataVolume": {"name": "imp-x"}}]);
    });
    let uid = up.ready("imp").await;
    // Boot disks are virtio-blk, which the test guest reports without a serial: the disks are
    // told apart by what they hold. Each is the claim's size (8 MiB: 16384 sectors) and starts
    // with its image's marker.
    let mut want = vec![format!("16384 {}", hex16(&q)), format!("16384 {}", hex16(&x))];
    want.sort();
    let seen = common::wait_until(SEE, "the guest to read both imported disks", || {
        let mut got: Vec<String> = up
            .serial_log(&uid)
            .iter()
            .filter_map(|l| l.strip_prefix("BLOCK+ vd"))
            .map(|l| l.split_whitespace().skip(1).take(2).collect::<Vec<_>>().join(" "))
            .collect();
        got.sort();
        async move { (got.len() >= 2).then_some(got) }
    })
    .await;
    assert_eq!(seen, want, "the guest reads each image's marker on a disk of the claim's size");
    for dv in ["imp-q", "imp-x"] {
        let doc = up.json(&["get", "dv", dv]);
        assert_eq!((doc["status"]["phase"].as_str(), doc["status"]["progress"].as_str()), (Some("Succeeded"), Some("100.0%")), "{doc}");
    }

    for (name, path, why) in
        [("corrupt", "/corrupt.qcow2", "not a valid qcow2 image"), ("bomb", "/bomb.raw.xz", "decompresses (xz) to more than 4194304 bytes")]
    {
        let url = format!("{base}{path}");
        let (ok, out) = up.run(env!("CARGO_BIN_EXE_virtplug"), &["volume", "import", name, "--url", &url, "--size", "4Mi"]);
        assert!(!ok && out.contains(&format!("import of {name} failed")) && out.contains(why), "{name}: {out}");
        let doc = up.json(&["get", "dv", name]);
        assert_eq!(doc["status"]["phase"].as_str(), Some("Failed"), "{doc}");
        let pvc = up.json(&["get", "pvc", name]);
        let dir = PathBuf::from(pvc["metadata"]["annotations"]["virtplug.io/local-path"].as_str().unwrap());
        assert_image(&dir, &[], 4 << 20, name);
    }
}
