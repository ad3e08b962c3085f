//! The ClusterRoles of `deploy/20-rbac.yaml` grant exactly what the code calls: every request
//! the controller, the node agent and the subresources API (`virtplug subresources-api`) send is
//! granted by their role, and every verb a role grants is used. The subresources API is also
//! bound to the cluster's own `system:auth-delegator` and `extension-apiserver-authentication-
//! reader`, whose grants ([`BUILTIN`]) count as its own.
//!
//! Method: `virtplug apiserver --audit-log`, `virtplug controller --storage-root` and
//! `virtplug node` as their own processes on loopback (real HTTPS, real QEMU under TCG; the VM
//! boots no OS: the scenario's proof is in the API, not the guest). The test's own client has
//! its own User-Agent; each component has one too (`virtplug-controller/…`, `virtplug-node/…`,
//! and `virtplug-local-storage/…` for the controller's embedded provisioner and importer), and
//! the audit log says, per request, who sent it and what it asked in RBAC's terms (verb, API
//! group, resource, subresource). The scenario drives a VM through create, running, hot-plug
//! of a claim, unplug, stop and delete, and deletes the claim, which is everything the
//! components do on a cluster (imports aside: `virtplug-local-storage` is only for single-node
//! setups and is checked the same way).
//!
//! Caveats: a request the components only send on paths this scenario does not take (an error
//! path, a restart's adoption) would be missed; the "nothing more" half then fails for a grant
//! nobody exercised, so a grant is kept only with a scenario step that uses it.
//!
//! Every process is killed by PID when the test ends, pass or fail, and QEMU too.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "cluster/standins.rs"]
mod standins;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use serde::Deserialize;
use serde_json::{json, Value};

use api::phases::VolumePhase;
use api::{VirtualMachine, VirtualMachineInstance};

/// Deadline of QEMU's start under TCG on a loaded machine.
const RUN: Duration = Duration::from_secs(120);
/// Deadline of each API-level step.
const STEP: Duration = Duration::from_secs(60);

/// A process this test started, killed (SIGKILL, by PID) and reaped when dropped.
struct Proc {
    name: &'static str,
    child: Option<Child>,
}

impl Proc {
    /// Stops it with SIGINT (what `virtplug controller` and `node` stop on) and waits for its
    /// exit; panics naming it if it does not exit within the deadline.
    async fn interrupt(&mut self) {
        let Some(mut c) = self.child.take() else { return };
        let pid = rustix::process::Pid::from_raw(i32::try_from(c.id()).unwrap()).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        let name = self.name;
        let exited = common::wait_until(STEP, &format!("{name} to exit after SIGINT"), || {
            let r = c.try_wait().unwrap();
            async move { r }
        })
        .await;
        eprintln!("{name} exited: {exited}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The test's directory; dropped last: kills the QEMUs under it and detaches its loop devices.
struct Dir(tempfile::TempDir);

impl Drop for Dir {
    fn drop(&mut self) {
        // On failure, the components' logs say why (the directory goes with the test).
        if std::thread::panicking() {
            for name in ["apiserver", "controller", "node", "subresources-api"] {
                let text = std::fs::read_to_string(self.0.path().join(format!("{name}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                eprintln!("--- {name}.log (last 40 lines)\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            }
        }
        common::guest::kill_qemus_under(&self.0.path().join("node/vmis"));
        for (dev, _) in controller::storage::loopdev::under(&self.0.path().join("storage")) {
            let _ = controller::storage::loopdev::detach(&dev);
        }
    }
}

/// Starts `virtplug ARGS`, its stderr (and, unless `piped`, its stdout) in `DIR/NAME.log`.
fn spawn(name: &'static str, dir: &Path, args: &[&str], piped: bool) -> Proc {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let stdout = if piped { Stdio::piped() } else { Stdio::from(log.try_clone().unwrap()) };
    let child = Command::new(env!("CARGO_BIN_EXE_virtplug")).args(args).stdout(stdout).stderr(log).spawn().unwrap();
    Proc { name, child: Some(child) }
}

/// Starts the API server with the audit log and waits (deadline 60 s) for its URL line.
fn apiserver(dir: &Path) -> Proc {
    let data = dir.join("api");
    let audit = dir.join("audit.log");
    let mut p = spawn(
        "apiserver",
        dir,
        // --admit-invalid-vms: as on a cluster, where no webhook checks VM specs and the
        // controller's self-heal (its Events, its VM writes) has work to do.
        &[
            "apiserver",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--audit-log",
            audit.to_str().unwrap(),
            "--admit-invalid-vms",
        ],
        true,
    );
    let stdout = p.child.as_mut().and_then(|c| c.stdout.take()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.by_ref().map_while(Result::ok).any(|l| l.contains("is serving the Kubernetes API at")));
        // Keep draining stdout so the server never blocks on a full pipe.
        for _ in lines {}
    });
    if rx.recv_timeout(Duration::from_secs(60)) != Ok(true) {
        drop(p);
        panic!("the API server printed no URL within 60 s:\n{}", std::fs::read_to_string(dir.join("apiserver.log")).unwrap_or_default());
    }
    p
}

/// A rule of a ClusterRole, flattened: (API group, resource[/subresource], verb).
type Grant = (String, String, String);

/// The grants of each ClusterRole in `deploy/20-rbac.yaml`, by role name. Wildcards are refused:
/// a least-privilege role names what it grants.
fn roles() -> BTreeMap<String, BTreeSet<Grant>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/20-rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let doc = Value::deserialize(doc).unwrap();
        if doc["kind"] != "ClusterRole" {
            continue;
        }
        let mut grants = BTreeSet::new();
        for rule in doc["rules"].as_array().unwrap() {
            assert!(rule.get("nonResourceURLs").is_none() && rule.get("resourceNames").is_none(), "unexpected rule shape: {rule}");
            let strings = |k: &str| -> Vec<String> { rule[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect() };
            for g in strings("apiGroups") {
                for r in strings("resources") {
                    for v in strings("verbs") {
                        assert!(![&g, &r, &v].iter().any(|s| s.contains('*')), "a wildcard in {}: {rule}", doc["metadata"]["name"]);
                        grants.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
        out.insert(doc["metadata"]["name"].as_str().unwrap().to_owned(), grants);
    }
    out
}

/// The audit log's lines.
fn audit(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit.log")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The User-Agent of the test's own client.
const TEST_AGENT: &str = "virtplug-rbac-test/0";

/// Which role each component's User-Agent (up to `/`) must be granted by.
const COMPONENTS: [(&str, &str); 4] = [
    ("virtplug-controller", "virtplug-controller"),
    ("virtplug-node", "virtplug-node"),
    ("virtplug-local-storage", "virtplug-local-storage"),
    ("virtplug-subresources-api", "virtplug-subresources-api"),
];

/// What the cluster's own roles bound in deploy/20-rbac.yaml grant: `system:auth-delegator`
/// (reviews) and, in kube-system, `extension-apiserver-authentication-reader` (its ConfigMap).
const BUILTIN: [(&str, [&str; 3]); 3] = [
    ("virtplug-subresources-api", ["authentication.k8s.io", "tokenreviews", "create"]),
    ("virtplug-subresources-api", ["authorization.k8s.io", "subjectaccessreviews", "create"]),
    ("virtplug-subresources-api", ["", "configmaps", "get"]),
];

/// STAND-IN for a node agent's credential: a token of the `default` ServiceAccount bound to Node
/// `node`, which a test ClusterRole lets open node tunnels (the test's own requests, not a
/// component's: deploy/20-rbac.yaml's node role is what the agent's are checked against).
async fn node_bound_token(client: &kube::Client, node: &str) -> String {
    let send = |path: &str, body: Value| {
        let req = http::Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(body.to_string().into_bytes())
            .unwrap();
        let client = client.clone();
        async move { client.request::<Value>(req).await.unwrap() }
    };
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    send(
        &format!("{rbac}/clusterroles"),
        json!({"metadata": {"name": "rbac-test-tunnels"},
            "rules": [{"apiGroups": ["subresources.virtplug.io"], "resources": ["nodes/tunnel"], "verbs": ["get"]}]}),
    )
    .await;
    send(
        &format!("{rbac}/clusterrolebindings"),
        json!({"metadata": {"name": "rbac-test-tunnels"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rbac-test-tunnels"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]}),
    )
    .await;
    let answer = send(
        "/api/v1/namespaces/default/serviceaccounts/default/token",
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"boundObjectRef": {"kind": "Node", "apiVersion": "v1", "name": node}}}),
    )
    .await;
    answer["status"]["token"].as_str().unwrap().to_owned()
}

/// Starts `virtplug subresources-api` against the API server and waits (60 s) for its URL.
fn subresources_api(dir: &Path, kubeconfig: &str) -> (Proc, String) {
    let certs = dir.join("virtapi");
    let mut p = spawn(
        "subresources-api",
        dir,
        &["subresources-api", "--kubeconfig", kubeconfig, "--listen", "127.0.0.1:0", "--cert-dir", certs.to_str().unwrap()],
        true,
    );
    let out = common::procs::line_reader(p.child.as_mut().and_then(|c| c.stdout.take()).unwrap());
    let line = common::procs::wait_line(&out, Duration::from_secs(60), "the subresources API's URL", |l| l.contains("https://"));
    std::thread::spawn(move || for _ in out {});
    (p, line.split_whitespace().find(|w| w.starts_with("https://")).unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_roles_grant_exactly_what_the_components_call() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = Dir(tempfile::tempdir().unwrap());
    let d = dir.0.path().to_owned();
    let mut api = apiserver(&d);
    let kubeconfig: PathBuf = d.join("api/kubeconfig");
    let kc = kubeconfig.to_str().unwrap();
    let storage = d.join("storage");
    // The DataVolume's image is served on loopback, which imports refuse unless allowed.
    let ctl_args = [
        "controller",
        "--kubeconfig",
        kc,
        "--storage-root",
        storage.to_str().unwrap(),
        "--import-allow-host",
        "127.0.0.1",
        "--health-listen",
        "127.0.0.1:0",
        "--node-heartbeat-timeout",
        "3s",
        // As deploy/30-controller.yaml: a launcher pod per VMI.
        "--placement",
        "pods",
        "--launcher-image",
        "virtplug:test",
        "--launcher-run-root",
        "/node/vmis",
    ];
    let mut ctl = spawn("controller", &d, &ctl_args, false);
    let mut node = spawn(
        "node",
        &d,
        &[
            "node",
            "--kubeconfig",
            kc,
            "--node-name",
            "rbac-node",
            "--data-dir",
            d.to_str().unwrap(),
            "--accel",
            "tcg",
            "--health-listen",
            "127.0.0.1:0",
            "--heartbeat-interval",
            "1s",
        ],
        false,
    );
    let client = client::connect_as(Some(&kubeconfig), TEST_AGENT).await.unwrap();
    // KubeVirt's subresources go to `virtplug subresources-api`, as kube-apiserver proxies them
    // (the test's requests carry its token, which the component reviews: a TokenReview and a
    // SubjectAccessReview per request, audited as the component's).
    let (_virtapi, virtapi_url) = subresources_api(&d, kc);
    let virtapi_ca = std::fs::read_to_string(d.join("virtapi/ca.crt")).unwrap();
    let virtapi_ca: Vec<Vec<u8>> = rustls_pemfile::certs(&mut virtapi_ca.as_bytes()).map(|c| c.unwrap().to_vec()).collect();
    let virtapi = client::connect_to(
        Some(&kubeconfig),
        TEST_AGENT,
        client::Retries::Default,
        client::Elsewhere { server: Some(virtapi_url.parse().unwrap()), roots: Some(virtapi_ca.clone()), token_file: None },
    )
    .await
    .unwrap();
    // The kubelet registers the Node and runs its pods; kube-scheduler binds them (STAND-INS:
    // the test, with its own User-Agent, so their requests are not the components').
    common::fakenode::kubelet(&client, "rbac-node").await;
    let _scheduler = standins::scheduler(client.clone());
    let _kubelet = standins::kubelet(client.clone(), "rbac-node", &d);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), "default");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let put = |sub: &'static str, body: Value| {
        let client = virtapi.clone();
        async move {
            let plural = if sub == "pause" { "virtualmachineinstances" } else { "virtualmachines" };
            let req = http::Request::builder()
                .method("PUT")
                .uri(format!("/apis/subresources.kubevirt.io/v1/namespaces/default/{plural}/r/{sub}"))
                .header("content-type", "application/json")
                .body(kube::client::Body::from(body.to_string().into_bytes()))
                .unwrap();
            let code = client.send(req).await.unwrap().status().as_u16();
            assert_eq!(code, 202, "PUT {sub}");
        }
    };

    // Self-heal, what the controller writes VMs and Events for: a halted VM whose CD-ROM
    // volume lost its drive is reported (Event InvariantViolated); marked as virtual media, its
    // drive is re-added (a VM write, Event VirtualMediaDriveRestored); lost again, re-added again
    // (the same Event, counted: a patch).
    // Its dataVolumeTemplates give a DataVolume (the controller creates it) that the local
    // importer fills from a loopback HTTP server.
    let url = common::guest::serve_file(vec![0x5a; 1 << 20]).await;
    let mut heal = common::vm("heal");
    heal["spec"]["dataVolumeTemplates"] = json!([{"metadata": {"name": "img"}, "spec": {"source": {"http": {"url": url}}, "storage": {"resources": {"requests": {"storage": "4Mi"}}}}}]);
    heal["spec"]["template"]["spec"]["domain"]["devices"]["disks"] = json!([{"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}}]);
    heal["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "cdrom0", "dataVolume": {"name": "iso", "hotpluggable": true}}));
    vms.create(&PostParams::default(), &serde_json::from_value(heal).unwrap()).await.unwrap();
    let reported = |reason: &'static str, count: i32| {
        let client = client.clone();
        async move {
            let found = client::events::list(&client, "default", "heal", reason).await.ok()?;
            found.iter().any(|e| e.count.unwrap_or(1) >= count).then_some(())
        }
    };
    common::wait_until(STEP, "Event InvariantViolated about VM heal", || reported("InvariantViolated", 1)).await;
    for round in 1..=2 {
        if round == 2 {
            let lose = json!([{"op": "replace", "path": "/spec/template/spec/domain/devices/disks", "value": [{"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}}]}]);
            vms.patch("heal", &kube::api::PatchParams::default(), &kube::api::Patch::Json::<()>(serde_json::from_value(lose).unwrap()))
                .await
                .unwrap();
        } else {
            client::blind_patch(&vms, "heal", client::MetaKey::Annotation, controller::selfheal::VIRTUAL_MEDIA, Some("cdrom0"))
                .await
                .unwrap();
        }
        common::wait_until(STEP, &format!("Event VirtualMediaDriveRestored about VM heal counted {round} time(s)"), || {
            reported("VirtualMediaDriveRestored", round)
        })
        .await;
    }
    let dvs: Api<api::DataVolume> = Api::namespaced(client.clone(), "default");
    common::wait_until(STEP, "DataVolume img (VM heal's template) imported: phase Succeeded", || {
        let dvs = dvs.clone();
        async move {
            let phase = dvs.get("img").await.ok()?.status?.phase?;
            (serde_json::to_value(phase).ok()? == "Succeeded").then_some(())
        }
    })
    .await;
    // Its DataVolume goes with it (owner reference).
    vms.delete("heal", &DeleteParams::default()).await.unwrap();

    // Create -> running, with cloud-init user data from a Secret created after the VM: the agent
    // reads it, finds it missing, and watches it (list, then watch) until it is created.
    let mut vm = common::vm("r");
    vm["spec"]["runStrategy"] = json!("Always");
    vm["spec"]["template"]["spec"]["domain"]["devices"]["disks"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "ci", "disk": {"bus": "virtio"}}));
    vm["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "ci", "cloudInitNoCloud": {"secretRef": {"name": "r-userdata"}}}));
    // No OS answers the ACPI shutdown: the stop kills QEMU after the grace period.
    vm["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(1);
    vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    common::wait_until(RUN, "the node agent's watch of Secret r-userdata (VMI r waits for it)", || {
        let watching = audit(&d).iter().any(|l| {
            l["userAgent"].as_str().is_some_and(|a| a.starts_with("virtplug-node/"))
                && l["verb"] == "watch"
                && l["resource"] == "secrets"
                && l["name"] == "r-userdata"
        });
        async move { watching.then_some(()) }
    })
    .await;
    let secret = json!({"metadata": {"name": "r-userdata"}, "stringData": {"userdata": "#cloud-config\n"}});
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), "default");
    secrets.create(&PostParams::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();
    common::wait_until(RUN, "VMI r Running on rbac-node", || {
        let vmis = vmis.clone();
        async move { vmis.get_opt("r").await.ok()?.filter(VirtualMachineInstance::is_running).map(|_| ()) }
    })
    .await;
    // Its console through the API: the node agent's tunnel (nodes/tunnel) is asked to open a
    // stream, which the agent dials back (nodes/streams). 503 while the tunnel still connects.
    let streams = client::connect_with(Some(&kubeconfig), TEST_AGENT, client::Retries::None).await.unwrap();
    let console = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/r/console";
    let ws = common::wait_until(RUN, "VMI r's console through the node agent's tunnel", || {
        let streams = streams.clone();
        async move { client::upgrade::websocket(&streams, console, api::tunnel::PLAIN_SUBPROTOCOL).await.ok() }
    })
    .await;
    drop(ws);
    // The subresources API reads the Node of an agent's tunnel (STAND-IN: the test opens one as
    // an agent would, with a token bound to Node rbac-node, the only kind of credential a node's
    // tunnel takes there; the real agent's goes to the API server here).
    let token_file = d.join("rbac-node.token");
    std::fs::write(&token_file, node_bound_token(&client, "rbac-node").await).unwrap();
    let as_node = client::connect_to(
        Some(&kubeconfig),
        TEST_AGENT,
        client::Retries::Default,
        client::Elsewhere { server: Some(virtapi_url.parse().unwrap()), roots: Some(virtapi_ca), token_file: Some(token_file) },
    )
    .await
    .unwrap();
    let tunnel = "/apis/subresources.virtplug.io/v1/nodes/rbac-node/tunnel";
    drop(client::upgrade::raw(&as_node, tunnel, api::tunnel::TUNNEL_UPGRADE).await.unwrap());
    // A restart writes the VM's status, a pause the VMI: checked and authorized in full, not
    // carried out (dryRun, which kube-apiserver authorizes as the write itself).
    put("restart", json!({"dryRun": ["All"]})).await;
    put("pause", json!({"dryRun": ["All"]})).await;

    // A claim the local provisioner binds.
    let claim =
        json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}}});
    pvcs.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
    let data_pv = std::sync::Mutex::new(String::new());
    // Plug, unplug, and plug and unplug again: the second unplug's Event is the first one,
    // counted (the node agent's Event patch).
    for round in 1..=2 {
        put(
            "addvolume",
            json!({"name": "data", "disk": {"disk": {"bus": "scsi"}}, "volumeSource": {"persistentVolumeClaim": {"claimName": "data"}}}),
        )
        .await;
        common::wait_until(RUN, &format!("volume data Ready in VMI r (attached by the node agent, round {round})"), || {
            let vmis = vmis.clone();
            async move { (vmis.get("r").await.ok()?.status?.volume("data")?.phase == Some(VolumePhase::Ready)).then_some(()) }
        })
        .await;
        if round == 2 {
            // Deleted while plugged: the provisioner keeps the storage and says why (Event
            // ClaimInUse); woken again by a label, it says so again (the Event counted).
            *data_pv.lock().unwrap() = pvcs.get("data").await.unwrap().spec.unwrap().volume_name.unwrap();
            pvcs.delete("data", &DeleteParams::default()).await.unwrap();
            for count in 1..=2 {
                if count == 2 {
                    let label = json!({"metadata": {"labels": {"rbac-test": "poke"}}});
                    pvcs.patch("data", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(label)).await.unwrap();
                }
                common::wait_until(STEP, &format!("Event ClaimInUse about claim data counted {count} time(s)"), || {
                    let client = client.clone();
                    async move {
                        let found = client::events::list(&client, "default", "data", "ClaimInUse").await.ok()?;
                        found.iter().any(|e| e.count.unwrap_or(1) >= count).then_some(())
                    }
                })
                .await;
            }
        }
        put("removevolume", json!({"name": "data"})).await;
        common::wait_until(RUN, &format!("volume data gone from VMI r's status and Event VolumeUnplugged counted {round} time(s)"), || {
            let (vmis, client) = (vmis.clone(), client.clone());
            async move {
                vmis.get("r").await.ok()?.status?.volume("data").is_none().then_some(())?;
                let found = client::events::list(&client, "default", "r", "VolumeUnplugged").await.ok()?;
                found.iter().any(|e| e.count.unwrap_or(1) >= round).then_some(())
            }
        })
        .await;
    }

    // Stop, delete; the claim (and its volume) too.
    put("stop", json!({})).await;
    common::wait_until(RUN, "VMI r gone after stop", || {
        let vmis = vmis.clone();
        async move { vmis.get_opt("r").await.ok()?.is_none().then_some(()) }
    })
    .await;
    // A second VM on the node, for its loss.
    let mut vm = common::vm("f");
    vm["spec"]["runStrategy"] = json!("Always");
    vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    common::wait_until(RUN, "VMI f Running on rbac-node", || {
        let vmis = vmis.clone();
        async move { vmis.get_opt("f").await.ok()?.filter(VirtualMachineInstance::is_running).map(|_| ()) }
    })
    .await;
    // The node is lost (its agent killed, its QEMU with it, as a machine's loss would) and fenced
    // by its administrator: the controller takes it out of scheduling (a Node patch), fails VMI f,
    // and releases the failed VMI's finalizer once a fresh read confirms the node is fenced (a
    // Node get).
    if let Some(mut c) = node.child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let first_uid = vmis.get("f").await.unwrap().metadata.uid;
    common::guest::kill_qemus_under(&d.join("node/vmis"));
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    common::wait_until(STEP, "rbac-node taken out of scheduling after its heartbeat stopped", || {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get("rbac-node").await.ok()?;
            (n.metadata.labels?.get(api::annotations::NODE_SCHEDULABLE)? == "false").then_some(())
        }
    })
    .await;
    let taint =
        json!({"spec": {"taints": [{"key": api::annotations::OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]}});
    nodes.patch("rbac-node", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(taint)).await.unwrap();
    common::wait_until(STEP, "the fenced node's VMI f failed and replaced (its finalizer released)", || {
        let (vmis, first_uid) = (vmis.clone(), first_uid.clone());
        async move { vmis.get_opt("f").await.ok()?.filter(|v| v.metadata.uid != first_uid).map(|_| ()) }
    })
    .await;

    vms.delete("f", &DeleteParams::default()).await.unwrap();
    vms.delete("r", &DeleteParams::default()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    // The claim deleted while plugged is released by the unplug alone (the provisioner wakes
    // the namespace's terminating claims on any VMI change: no nudge here).
    let pv = data_pv.lock().unwrap().clone();
    common::wait_until(STEP, &format!("VMs r and heal, DataVolume img, claim data and its PersistentVolume {pv} gone"), || {
        let (vms, pvcs, pvs, pv, dvs) = (vms.clone(), pvcs.clone(), pvs.clone(), pv.clone(), dvs.clone());
        async move {
            let gone = vms.list(&Default::default()).await.ok()?.items.is_empty()
                && dvs.get_opt("img").await.ok()?.is_none()
                && pvcs.get_opt("data").await.ok()?.is_none()
                && pvs.get_opt(&pv).await.ok()?.is_none();
            gone.then_some(())
        }
    })
    .await;
    ctl.interrupt().await;
    node.interrupt().await;
    api.interrupt().await;

    let roles = roles();
    let lines = audit(&d);
    let mut used: BTreeMap<&str, BTreeSet<Grant>> = BTreeMap::new();
    let mut refused = Vec::new();
    for l in &lines {
        let agent = l["userAgent"].as_str().unwrap();
        if agent == TEST_AGENT {
            continue;
        }
        let component = agent.split('/').next().unwrap();
        let Some((_, role)) = COMPONENTS.iter().find(|(c, _)| *c == component) else {
            panic!("a request from an unknown client (every component must say who it is): {l}");
        };
        let grants = roles.get(*role).unwrap_or_else(|| panic!("no ClusterRole {role} in deploy/20-rbac.yaml"));
        assert!(l.get("nonResourceURL").is_none(), "{component} asked a non-resource URL, which no role grants: {l}");
        let s = |k: &str| l[k].as_str().unwrap().to_owned();
        let resource = if s("subresource").is_empty() { s("resource") } else { format!("{}/{}", s("resource"), s("subresource")) };
        let grant = (s("apiGroup"), resource, s("verb"));
        let builtin =
            BUILTIN.iter().any(|(r, [g, res, v])| r == role && (*g, *res, *v) == (grant.0.as_str(), grant.1.as_str(), grant.2.as_str()));
        if builtin {
            used.entry(role).or_default().insert(grant);
            continue;
        }
        if !grants.contains(&grant) {
            refused.push(format!("{role}: {grant:?} ({} {} -> {})", l["method"], l["requestURI"], l["code"]));
        }
        used.entry(role).or_default().insert(grant);
    }
    refused.sort();
    refused.dedup();
    assert!(refused.is_empty(), "requests the roles do not grant:\n  {}", refused.join("\n  "));
    for (_, role) in COMPONENTS {
        let unused: Vec<&Grant> = roles[role].iter().filter(|g| !used.get(role).is_some_and(|u| u.contains(*g))).collect();
        assert!(unused.is_empty(), "{role} grants what no request used: {unused:?}");
    }
    eprintln!("{} audited requests; every grant used:", lines.len());
    for (role, grants) in &used {
        for (g, r, v) in grants {
            eprintln!("  {role}: {v} {}{r}", if g.is_empty() { String::new() } else { format!("{g}/") });
        }
    }
}
