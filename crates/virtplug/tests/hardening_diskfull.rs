//! Issue 14, class 5: a full filesystem under the API server's store. The real `virtplug
//! apiserver` runs on a 32 MiB tmpfs; a filler file takes the space. Writes are refused cleanly
//! (507 with a message saying the data dir's filesystem is full and how much is free), reads,
//! lists and watches go on, writes resume by themselves when the filler goes, and after `kill -9`
//! every acknowledged write is there and no refused one.
//!
//! Twice: with a reserve (`--store-reserve 4Mi`: refused before the filesystem is full), and
//! with the check off (`--store-reserve 0`: the real ENOSPC reaches SQLite as `SQLITE_FULL`
//! mid-commit and the batch is rolled back whole).
//!
//! Needs root (mount); skipped with a message otherwise. The tmpfs is unmounted and the server
//! killed (by PID) even when the test fails.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::ResourceExt;
use serde_json::json;

use api::VirtualMachine;

/// A tmpfs of `size` mounted on a fresh temp dir; unmounted when dropped (lazily if still busy).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let opts = std::ffi::CString::new(format!("size={size},mode=0700")).unwrap();
        rustix::mount::mount("virtplug-diskfull", dir.path(), "tmpfs", rustix::mount::MountFlags::empty(), opts.as_c_str()).unwrap();
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn free(&self) -> u64 {
        let st = rustix::fs::statvfs(self.path()).unwrap();
        st.f_bavail * st.f_frsize
    }

    /// Writes a filler file leaving about `leave` bytes free (0: until ENOSPC).
    fn fill(&self, leave: u64) -> PathBuf {
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5au8; 64 << 10];
        loop {
            let free = self.free();
            if leave > 0 && free <= leave {
                break;
            }
            let n = if leave > 0 { usize::try_from((free - leave).min(chunk.len() as u64)).unwrap() } else { chunk.len() };
            match f.write(&chunk[..n]) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        path
    }
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if rustix::mount::unmount(self.dir.path(), rustix::mount::UnmountFlags::empty()).is_err() {
            let _ = rustix::mount::unmount(self.dir.path(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// `virtplug apiserver` as a child; killed by its PID when dropped.
struct Server {
    child: Child,
    client: kube::Client,
}

impl Server {
    async fn start(data_dir: &Path, reserve: &str) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_virtplug"))
            .args(["apiserver", "--listen", "127.0.0.1:0", "--store-reserve", reserve, "--data-dir"])
            .arg(data_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("virtplug apiserver starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a first line").expect("readable");
        assert!(first.contains("serving the Kubernetes API at https://127.0.0.1:"), "{first}");
        std::thread::spawn(move || for _ in lines {});
        let client = client::connect(Some(&data_dir.join("kubeconfig"))).await.unwrap();
        Server { child, client }
    }

    fn vms(&self) -> Api<VirtualMachine> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn vm(name: &str, payload: usize) -> VirtualMachine {
    let mut v = common::vm(name);
    v["metadata"]["annotations"] = json!({"payload": "p".repeat(payload)});
    serde_json::from_value(v).unwrap()
}

/// The refusal a write must get: 507, saying the filesystem is full and what to do.
fn assert_refused(r: Result<impl std::fmt::Debug, kube::Error>, what: &str, words: &[&str]) {
    match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 507, "{what}: {s:?}");
            for w in words {
                assert!(s.message.contains(w), "{what}: {w:?} missing in {:?}", s.message);
            }
            assert!(s.message.contains("nothing") && s.message.contains("stored"), "{what}: {:?}", s.message);
        }
        other => panic!("{what}: expected 507, got {other:?}"),
    }
}

/// Every acknowledged create is there at its revision; nothing refused is.
async fn assert_exactly(server: &Server, acked: &BTreeMap<String, String>, refused: &[String]) {
    let list = server.vms().list(&ListParams::default()).await.unwrap();
    let present: BTreeMap<String, String> = list.items.iter().map(|v| (v.name_any(), v.resource_version().unwrap())).collect();
    for (name, rv) in acked {
        assert_eq!(present.get(name), Some(rv), "acknowledged {name} at {rv}");
    }
    for name in refused {
        assert!(!present.contains_key(name), "refused {name} is not there");
    }
}

/// Regression (issue 14): on a full filesystem every write failed with a bare 500 "the commit
/// failed" and nothing told the operator why or that the store would recover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_the_store_refuses_writes_cleanly_serves_reads_and_recovers() {
    if !common::guest::is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fs = Tmpfs::mount("32m");
    let data = fs.path().join("data");
    let mut acked: BTreeMap<String, String> = BTreeMap::new();
    let mut refused: Vec<String> = Vec::new();

    // Phase 1: a reserve of 4 MiB, 2 MiB left: refused before the filesystem is full.
    let mut server = Server::start(&data, "4Mi").await;
    let vms = server.vms();
    let mut mid_rv = String::new();
    for i in 0..20 {
        let v = vms.create(&PostParams::default(), &vm(&format!("vm-{i}"), 1000)).await.unwrap();
        if i == 9 {
            mid_rv = v.resource_version().unwrap();
        }
        acked.insert(v.name_any(), v.resource_version().unwrap());
    }
    let filler = fs.fill(2 << 20);
    assert_refused(vms.create(&PostParams::default(), &vm("refused-create", 1000)).await, "create", &["nearly full", "--store-reserve"]);
    refused.push("refused-create".into());
    let patch = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    assert_refused(vms.patch("vm-0", &PatchParams::default(), &patch).await, "patch", &["nearly full", "free"]);
    assert_refused(vms.delete("vm-1", &DeleteParams::default()).await, "delete", &["nearly full"]);
    // Reads go on: get, list, and a watch from before the refusals (the refused writes left no
    // events), which then sees the first write after space returns.
    assert!(vms.get("vm-0").await.unwrap().labels().get("x").is_none());
    assert_exactly(&server, &acked, &refused).await;
    let mut watch = vms.watch(&WatchParams::default(), &mid_rv).await.unwrap().boxed();
    for i in 10..20 {
        let ev = tokio::time::timeout(Duration::from_secs(10), watch.try_next()).await.expect("a watch event within 10 s").unwrap();
        assert!(matches!(ev, Some(WatchEvent::Added(v)) if v.name_any() == format!("vm-{i}")), "vm-{i}");
    }
    std::fs::remove_file(&filler).unwrap();
    let v = vms.create(&PostParams::default(), &vm("after-space", 1000)).await.expect("writes resume by themselves");
    acked.insert(v.name_any(), v.resource_version().unwrap());
    let ev = tokio::time::timeout(Duration::from_secs(10), watch.try_next()).await.expect("the watch sees the new write").unwrap();
    assert!(matches!(ev, Some(WatchEvent::Added(v)) if v.name_any() == "after-space"));
    drop(watch);

    // Phase 2: kill -9, restart with the check off; fill the filesystem to ENOSPC and write big
    // objects until SQLite itself runs out of space (SQLITE_FULL mid-commit).
    server.kill9();
    let mut server = Server::start(&data, "0").await;
    assert_exactly(&server, &acked, &refused).await;
    let vms = server.vms();
    let filler = fs.fill(0);
    let mut full = None;
    for i in 0..200 {
        let name = format!("big-{i}");
        match vms.create(&PostParams::default(), &vm(&name, 200 << 10)).await {
            Ok(v) => {
                acked.insert(name, v.resource_version().unwrap());
            }
            Err(e) => {
                refused.push(name);
                full = Some(e);
                break;
            }
        }
    }
    let full = full.expect("a write refused on a full filesystem within 40 MiB of writes");
    eprintln!(
        "{} big writes acknowledged on the full filesystem before SQLite ran out of space",
        acked.keys().filter(|k| k.starts_with("big-")).count()
    );
    assert_refused(Err::<(), _>(full), "create on ENOSPC", &["is full", "database or disk is full"]);
    assert_exactly(&server, &acked, &refused).await;
    assert_eq!(vms.get("vm-0").await.unwrap().name_any(), "vm-0");
    std::fs::remove_file(&filler).unwrap();
    let v = vms.create(&PostParams::default(), &vm("after-enospc", 1000)).await.expect("writes resume by themselves");
    acked.insert(v.name_any(), v.resource_version().unwrap());

    // Nothing acknowledged is lost, nothing refused appears, across kill -9.
    server.kill9();
    let server = Server::start(&data, "1Mi").await;
    assert_exactly(&server, &acked, &refused).await;
    let count = server.vms().list(&ListParams::default()).await.unwrap().items.len();
    assert_eq!(count, acked.len(), "exactly the acknowledged objects");
}
