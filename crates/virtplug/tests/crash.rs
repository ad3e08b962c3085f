//! `kill -9` of the API server during a stream of concurrent writes: after a restart every
//! acknowledged write is there and resourceVersions keep increasing.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::VirtualMachine;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The server as a child process; killed (by its PID) when dropped, even if the test fails.
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
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Keep draining stdout so the server never blocks on a full pipe.
            for _ in lines {}
        });
        let mut server = ServerProcess { child, kubeconfig: dir.join("kubeconfig") };
        let first = rx.recv_timeout(Duration::from_secs(60)).ok().flatten().and_then(Result::ok);
        let Some(first) = first else {
            server.kill9();
            panic!("the server printed no first line within 60 s");
        };
        assert!(first.contains("serving the Kubernetes API at https://127.0.0.1:"), "{first}");
        server
    }

    fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(dir.path());
    let client = client::connect(Some(&server.kubeconfig)).await.unwrap();
    let api: Api<VirtualMachine> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &serde_json::from_value(common::vm("counter")).unwrap()).await.unwrap();

    // Acknowledged writes: (writer, name, resourceVersion) for creates, counter values for patches.
    let acked = Arc::new(Mutex::new(Vec::<(usize, String, u64)>::new()));
    let counter_acked = Arc::new(Mutex::new(0u64));
    let mut writers = Vec::new();
    for w in 0..8 {
        let api = api.clone();
        let acked = Arc::clone(&acked);
        let counter_acked = Arc::clone(&counter_acked);
        writers.push(tokio::spawn(async move {
            for n in 0.. {
                if w == 0 {
                    let p = json!({"metadata": {"annotations": {"count": n.to_string()}}});
                    match api.patch("counter", &PatchParams::default(), &Patch::Merge(p)).await {
                        Ok(_) => *counter_acked.lock().unwrap() = n,
                        Err(_) => return,
                    }
                    continue;
                }
                let name = format!("w{w}-{n}");
                match api.create(&PostParams::default(), &serde_json::from_value(common::vm(&name)).unwrap()).await {
                    Ok(vm) => {
                        let rv = vm.metadata.resource_version.unwrap().parse().unwrap();
                        acked.lock().unwrap().push((w, name, rv));
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    // Let the stream run until a good number of writes were acknowledged, then kill -9.
    common::wait_until(Duration::from_secs(60), "200 acknowledged writes", || {
        let n = acked.lock().unwrap().len();
        async move { (n >= 200).then_some(()) }
    })
    .await;
    server.kill9();
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().unwrap().clone();
    let counter = *counter_acked.lock().unwrap();

    let _server = ServerProcess::start(dir.path());
    let client = client::connect(Some(&dir.path().join("kubeconfig"))).await.unwrap();
    let api: Api<VirtualMachine> = Api::namespaced(client, "default");
    let list = api.list(&ListParams::default()).await.unwrap();
    let present: std::collections::HashMap<String, u64> = list
        .items
        .iter()
        .map(|v| (v.metadata.name.clone().unwrap(), v.metadata.resource_version.clone().unwrap().parse().unwrap()))
        .collect();
    for (_, name, rv) in &acked {
        assert_eq!(present.get(name), Some(rv), "acknowledged create of {name} at revision {rv} survived");
    }
    let count: u64 = api.get("counter").await.unwrap().metadata.annotations.unwrap()["count"].parse().unwrap();
    assert!(count >= counter, "the counter is at {count}, the last acknowledged value was {counter}");
    for w in 1..8 {
        let rvs: Vec<u64> = acked.iter().filter(|a| a.0 == w).map(|a| a.2).collect();
        assert!(rvs.windows(2).all(|p| p[0] < p[1]), "writer {w} saw increasing revisions: {rvs:?}");
    }
    let max_acked = acked.iter().map(|a| a.2).max().unwrap();
    let after = api.create(&PostParams::default(), &serde_json::from_value(common::vm("after-restart")).unwrap()).await.unwrap();
    let rv_after: u64 = after.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv_after > max_acked, "a write after the restart ({rv_after}) comes after every acknowledged one ({max_acked})");
}

/// SIGTERM (and SIGINT) stop the server cleanly: exit 0, and everything is there on restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_shut_down_cleanly() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    for (signal, name) in [(rustix::process::Signal::TERM, "after-term"), (rustix::process::Signal::INT, "after-int")] {
        let mut server = ServerProcess::start(dir.path());
        let client = client::connect(Some(&server.kubeconfig)).await.unwrap();
        let api: Api<VirtualMachine> = Api::namespaced(client, "default");
        api.create(&PostParams::default(), &serde_json::from_value(common::vm(name)).unwrap()).await.unwrap();
        let pid = rustix::process::Pid::from_raw(i32::try_from(server.child.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
        let status = common::wait_until(Duration::from_secs(60), &format!("the server to exit after {signal:?}"), || {
            let r = server.child.try_wait().unwrap();
            async move { r }
        })
        .await;
        assert!(status.success(), "{signal:?}: exit {status:?}");
    }
    let _server = ServerProcess::start(dir.path());
    let client = client::connect(Some(&dir.path().join("kubeconfig"))).await.unwrap();
    let api: Api<VirtualMachine> = Api::namespaced(client, "default");
    for name in ["after-term", "after-int"] {
        assert!(api.get_opt(name).await.unwrap().is_some(), "{name} kept");
    }
}
