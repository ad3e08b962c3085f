//! Cluster mode on one machine: `virtplug apiserver`, `virtplug controller` and `virtplug node`
//! as separate processes, as they run on Kubernetes (Deployment, DaemonSet).
//!
//! STAND-INS (no real cluster here): the kubelet's node registration and conditions are written
//! by the test (`common::fakenode::kubelet` and the `KubeletReady`/`MemoryPressure` conditions
//! below); where no guest is needed, `common::fakenode` plays the node agent; for launcher pods,
//! [`standins::scheduler`] plays kube-scheduler and [`standins::kubelet`] each node's kubelet
//! (pods as local processes; a launcher pod in a PID namespace of its own), and [`standins::csi`]
//! a CSI provisioner of node-local `WaitForFirstConsumer` volumes. Everything else is the real binary: leader election on a real
//! Lease, real heartbeats, real launchers, real QEMU (TCG) guests.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "cluster/standins.rs"]
mod standins;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use api::{VirtualMachine, VirtualMachineInstance};

const T: Duration = Duration::from_secs(60);
const BOOT: Duration = Duration::from_secs(180);

/// A child process, killed by its PID when dropped (even when the test fails); its output lines
/// are kept for the test to wait on.
struct Proc {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_virtplug"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("virtplug starts");
        let lines = Arc::new(Mutex::new(Vec::new()));
        for out in [Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>, Box::new(child.stderr.take().unwrap())] {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(l);
                }
            });
        }
        Proc { child, lines }
    }

    /// The first output line containing `pat`, waited for.
    async fn line(&self, pat: &str, what: &str) -> String {
        let lines = Arc::clone(&self.lines);
        common::wait_until(T, what, || {
            let l = lines.lock().unwrap().iter().find(|l| l.contains(pat)).cloned();
            async move { l }
        })
        .await
    }

    /// The health endpoint's address, from the start-up line.
    async fn health_url(&self) -> String {
        let l = self.line("/healthz, /readyz, /metrics on http://", "the health endpoint's address").await;
        let url = l.split("on http://").nth(1).unwrap().split(';').next().unwrap();
        format!("http://{url}")
    }

    fn pid(&self) -> rustix::process::Pid {
        rustix::process::Pid::from_raw(i32::try_from(self.child.id()).unwrap()).unwrap()
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

struct Cluster {
    dir: tempfile::TempDir,
    _api: Proc,
    client: kube::Client,
}

/// What [`Cluster::pods_mode`] started; dropped, it stops them, the kubelets first and the
/// controller last (fields drop in declaration order).
struct PodsMode {
    _kubelets: [standins::Task; 2],
    _scheduler: standins::Task,
    n2: Proc,
    _n1: Proc,
    _ctl: Proc,
}

impl Drop for Cluster {
    /// The guests outlive their agents by design: stop every QEMU this test's nodes started (by
    /// PID as the agent finds it, `qemu::process::adopt`: checked against the process's command
    /// line so a reused PID is left alone), even when the test failed.
    fn drop(&mut self) {
        let Ok(nodes) = std::fs::read_dir(self.dir.path()) else { return };
        for node in nodes.flatten() {
            let Ok(runs) = std::fs::read_dir(node.path().join("node/vmis")) else { continue };
            for run in runs.flatten() {
                if let Ok(p) = qemu::process::adopt(&run.path()) {
                    if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
            }
        }
    }
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(&[]).await
    }

    async fn start_with(apiserver_args: &[&str]) -> Cluster {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("api");
        let mut args = vec!["apiserver", "--data-dir", data.to_str().unwrap(), "--listen", "127.0.0.1:0"];
        args.extend(apiserver_args);
        let api = Proc::start(&args);
        api.line("serving the Kubernetes API at https://127.0.0.1:", "the API server to serve").await;
        let client = client::connect(Some(&data.join("kubeconfig"))).await.unwrap();
        Cluster { dir, _api: api, client }
    }

    fn kubeconfig(&self) -> String {
        self.dir.path().join("api/kubeconfig").to_str().unwrap().to_owned()
    }

    fn controller(&self, identity: &str, extra: &[&str]) -> Proc {
        let kc = self.kubeconfig();
        let mut args = vec!["controller", "--kubeconfig", &kc, "--health-listen", "127.0.0.1:0", "--leader-election-identity", identity];
        args.extend(extra);
        Proc::start(&args)
    }

    /// Launcher-pods mode on nodes n1 and n2 (registered first): controller `c` placing pods,
    /// agents with launcher pods (with `attachment_pods`, also the stand-in kubelet's pods dir,
    /// which attachment pods are opened through), the stand-in scheduler and a stand-in kubelet
    /// per node (each node's file system is DIR/NODE; the agents' run dirs, DATA_DIR/node/vmis
    /// with DATA_DIR = DIR/NODE, are the pods' hostPath /node/vmis/UID there).
    async fn pods_mode(&self, attachment_pods: bool) -> PodsMode {
        self.kubelet_nodes(&["n1", "n2"]).await;
        let ctl = self.controller(
            "c",
            &["--leader-elect=false", "--placement", "pods", "--launcher-image", "virtplug:test", "--launcher-run-root", "/node/vmis"],
        );
        let agent = |n: &str| {
            let pods_dir = self.dir.path().join(n).join("var/lib/kubelet/pods").display().to_string();
            let extra: &[&str] = if attachment_pods { &["--launcher-pods", "--kubelet-pods-dir", &pods_dir] } else { &["--launcher-pods"] };
            self.node_with(n, extra)
        };
        PodsMode {
            _ctl: ctl,
            _n1: agent("n1"),
            n2: agent("n2"),
            _scheduler: standins::scheduler(self.client.clone()),
            // The launcher pods' image holds the test guest's kernel (a boot-claim VM's pod is
            // isolated: it sees only its image and volumes).
            _kubelets: [
                standins::kubelet_with_image(self.client.clone(), "n1", &self.dir.path().join("n1"), &[common::guest::guest_dir()]),
                standins::kubelet_with_image(self.client.clone(), "n2", &self.dir.path().join("n2"), &[common::guest::guest_dir()]),
            ],
        }
    }

    fn node(&self, name: &str) -> Proc {
        self.node_with(name, &[])
    }

    fn node_with(&self, name: &str, extra: &[&str]) -> Proc {
        let kc = self.kubeconfig();
        let data = self.dir.path().join(name);
        let mut args = vec![
            "node",
            "--kubeconfig",
            &kc,
            "--node-name",
            name,
            "--data-dir",
            data.to_str().unwrap(),
            "--heartbeat-interval",
            "1s",
            "--health-listen",
            "127.0.0.1:0",
            "--accel",
            "tcg",
        ];
        args.extend(extra);
        Proc::start(&args)
    }

    /// Nodes `names` as their kubelets register them: the hostname label and `Ready=True`
    /// (and `MemoryPressure=False`), which the node agent must never touch.
    async fn kubelet_nodes(&self, names: &[&str]) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        for n in names {
            common::fakenode::kubelet(&self.client, n).await;
            nodes
                .patch(n, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/hostname": n}}})))
                .await
                .unwrap();
            let conditions = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"}]}});
            nodes.patch_status(n, &PatchParams::default(), &Patch::Merge(conditions)).await.unwrap();
        }
    }

    async fn lease_holder(&self) -> Option<(String, i32)> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "virtplug-system");
        let spec = leases.get_opt(controller::leader::LEASE_NAME).await.ok().flatten()?.spec?;
        Some((spec.holder_identity.filter(|h| !h.is_empty())?, spec.lease_transitions.unwrap_or(0)))
    }

    async fn running(&self, name: &str, deadline: Duration) -> VirtualMachineInstance {
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), "default");
        common::wait_until(deadline, &format!("VMI {name} to run"), || {
            let vmis = vmis.clone();
            async move { vmis.get_opt(name).await.ok().flatten().filter(VirtualMachineInstance::is_running) }
        })
        .await
    }
}

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn vm(name: &str) -> VirtualMachine {
    let mut v = common::vm(name);
    v["spec"]["runStrategy"] = json!("Always");
    serde_json::from_value(v).unwrap()
}

/// A VM booting the test guest (no volumes), on the node `node` if given.
fn guest_vm(name: &str, node: Option<&str>) -> VirtualMachine {
    let g = common::guest::guest_dir();
    let mut spec = json!({"terminationGracePeriodSeconds": 1,
        "domain": {"resources": {"requests": {"memory": "200Mi"}},
                   "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable",
                       "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}}});
    if let Some(n) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": n});
    }
    serde_json::from_value(
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": spec}}}),
    )
    .unwrap()
}

/// Two controller replicas: exactly one leads (Lease, /readyz, the leader metric); after
/// `kill -9` of the leader the other takes over within the lease time, keeps the running VMI as
/// it is (no re-creation, no rewrite), and works; SIGTERM releases the Lease at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_one_leader_and_a_takeover_without_flip_flops() {
    let c = Cluster::start().await;
    let _n1 = common::fakenode::start(&c.client, "n1").await;
    let lease = ["--leader-election-lease", "3s"];
    let mut procs = [c.controller("c1", &lease), c.controller("c2", &lease)];
    let (leader, transitions) = common::wait_until(T, "a controller to hold the Lease", || c.lease_holder()).await;
    assert_eq!(transitions, 0);
    let (li, si) = if leader == "c1" { (0, 1) } else { (1, 0) };
    let (lurl, surl) = (procs[li].health_url().await, procs[si].health_url().await);
    assert_eq!(get(&format!("{lurl}/readyz")).await, (200, "ok (leader)\n".to_owned()));
    assert_eq!(get(&format!("{surl}/readyz")).await, (200, "ok (standby: another replica leads)\n".to_owned()));
    assert!(get(&format!("{lurl}/metrics")).await.1.contains("virtplug_controller_leader 1"));
    assert!(get(&format!("{surl}/metrics")).await.1.contains("virtplug_controller_leader 0"));

    let vms: Api<VirtualMachine> = Api::namespaced(c.client.clone(), "default");
    vms.create(&PostParams::default(), &vm("a")).await.unwrap();
    let before = c.running("a", T).await;

    procs[li].kill9();
    let other = if leader == "c1" { "c2" } else { "c1" };
    let (now, transitions) = common::wait_until(Duration::from_secs(20), "the standby to take the Lease over", || async {
        c.lease_holder().await.filter(|(h, _)| h == other)
    })
    .await;
    assert_eq!((now.as_str(), transitions), (other, 1));
    procs[si].line(&format!("{other} leads"), "the new leader to say so").await;
    vms.create(&PostParams::default(), &vm("b")).await.unwrap();
    c.running("b", T).await;
    let after = c.running("a", T).await;
    assert_eq!(
        (after.uid(), after.resource_version()),
        (before.uid(), before.resource_version()),
        "the new leader neither re-created nor rewrote the running VMI"
    );

    rustix::process::kill_process(procs[si].pid(), rustix::process::Signal::TERM).unwrap();
    let status = common::wait_until(T, "the controller to exit after SIGTERM", || {
        let r = procs[si].child.try_wait().unwrap();
        async move { r }
    })
    .await;
    assert!(status.success(), "exit {status:?}: {}", procs[si].output());
    assert_eq!(c.lease_holder().await, None, "released on SIGTERM: the next replica need not wait out the lease");
}

/// Two real node agents (n1, n2) under one controller: a VM lands where its node selector says;
/// `kill -9` of n1's agent leaves its guest running, its heartbeat goes stale, n1 is taken out of
/// scheduling (label, Event) with the kubelet's conditions untouched, and new VMs go to n2; the
/// agent's return makes n1 schedulable again and adopts the guest; fencing n1 (its QEMU killed,
/// the out-of-service taint) fails its VMI and the VM starts again on n2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_unscheduled_and_a_fenced_one_gives_its_vms_up() {
    let c = Cluster::start().await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    c.kubelet_nodes(&["n1", "n2"]).await;
    let _ctl = c.controller("c", &["--leader-elect=false", "--node-heartbeat-timeout", "4s"]);
    let mut n1 = c.node("n1");
    let _n2 = c.node("n2");
    let n1_url = n1.health_url().await;
    assert_eq!(get(&format!("{n1_url}/healthz")).await.0, 200);

    let vms: Api<VirtualMachine> = Api::namespaced(c.client.clone(), "default");
    vms.create(&PostParams::default(), &guest_vm("on1", Some("n1"))).await.unwrap();
    let vmi = c.running("on1", BOOT).await;
    assert_eq!(vmi.status.as_ref().unwrap().node_name.as_deref(), Some("n1"));
    let run_dir = c.dir.path().join("n1/node/vmis").join(vmi.uid().unwrap());
    let qemu = qemu_pid(&run_dir);

    n1.kill9();
    let marked = common::wait_until(T, "n1 to be taken out of scheduling", || async {
        nodes.get("n1").await.ok().filter(|n| n.labels().get(api::annotations::NODE_SCHEDULABLE).map(String::as_str) == Some("false"))
    })
    .await;
    let conds: Vec<String> = marked.status.unwrap().conditions.unwrap().iter().map(|c| format!("{}={}", c.type_, c.status)).collect();
    assert_eq!(conds, ["Ready=True", "MemoryPressure=False"], "the kubelet's conditions survive the agent");
    // The Event is written after the label (two writes): wait for it too.
    common::wait_until(T, "a NodeUnresponsive Event on n1", || async {
        client::events::list(&c.client, "default", "n1", "NodeUnresponsive").await.ok().filter(|e| !e.is_empty())
    })
    .await;
    assert!(alive(qemu), "the guest keeps running without its agent");

    vms.create(&PostParams::default(), &guest_vm("next", None)).await.unwrap();
    let next = c.running("next", BOOT).await;
    assert_eq!(next.status.unwrap().node_name.as_deref(), Some("n2"), "a new VM avoids the silent node");

    // The agent comes back: schedulable again, the guest adopted (same QEMU).
    let mut n1 = c.node("n1");
    common::wait_until(T, "n1 to be schedulable again", || async {
        nodes.get("n1").await.ok().filter(|n| n.labels().get(api::annotations::NODE_SCHEDULABLE).map(String::as_str) == Some("true"))
    })
    .await;
    assert_eq!(c.running("on1", T).await.uid(), vmi.uid());
    assert_eq!(qemu_pid(&run_dir), qemu, "adopted, not restarted");

    // Fence n1: the machine is gone (agent and QEMU), and the administrator says so with the
    // out-of-service taint. The VM may run anywhere now (its selector dropped first, so its next
    // VMI is not pinned to n1).
    n1.kill9();
    rustix::process::kill_process(qemu, rustix::process::Signal::KILL).unwrap();
    common::wait_until(T, "n1 to be taken out of scheduling again", || async {
        nodes.get("n1").await.ok().filter(|n| n.labels().get(api::annotations::NODE_SCHEDULABLE).map(String::as_str) == Some("false"))
    })
    .await;
    let mut on1 = vms.get("on1").await.unwrap();
    on1.spec.template.spec.as_mut().unwrap().extra.remove("nodeSelector");
    vms.replace("on1", &PostParams::default(), &on1).await.unwrap();
    let taint =
        json!({"spec": {"taints": [{"key": api::annotations::OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]}});
    nodes.patch("n1", &PatchParams::default(), &Patch::Merge(&taint)).await.unwrap();
    let moved = common::wait_until(BOOT, "VM on1 to run again on n2", || {
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(c.client.clone(), "default");
        async move {
            vmis.get_opt("on1")
                .await
                .ok()
                .flatten()
                .filter(|v| v.is_running() && v.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n2"))
        }
    })
    .await;
    assert_ne!(moved.uid(), vmi.uid(), "a new VMI, after the fenced one failed");
    let fenced = client::events::list(&c.client, "default", "on1", "NodeFenced").await.unwrap();
    assert!(!fenced.is_empty(), "the VMI's failure is explained by a NodeFenced Event");
}

/// The launcher pod of VMI `uid` (label `kubevirt.io/created-by`), once it exists.
async fn launcher_pod(c: &Cluster, uid: &str, what: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    common::wait_until(T, what, || {
        let pods = pods.clone();
        async move { pods.list(&ListParams::default().labels(&format!("kubevirt.io/created-by={uid}"))).await.ok()?.items.into_iter().next() }
    })
    .await
}

/// The parent PID of `pid` and the parent's command line (from `/proc`).
fn parent_of(pid: rustix::process::Pid) -> (i32, String) {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap();
    // `pid (comm) state ppid ...`: comm may hold spaces, so count from its closing parenthesis.
    let ppid: i32 = stat[stat.rfind(')').unwrap() + 2..].split(' ').nth(1).unwrap().parse().unwrap();
    let cmdline = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap();
    (ppid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
}

/// Launcher pods (issue 19, first slice): the controller (`--placement pods`) creates a pod per
/// VMI, the scheduler (stand-in) binds it, the VMI lands where the pod did; the kubelet
/// (stand-in) runs `virtplug launcher`, and the real node agent (`--launcher-pods`) hands QEMU's
/// launch to it, so QEMU is the launcher's child. `kill -9` of the agent leaves the guest running
/// and the next agent adopts it; deleting the pod stops QEMU and fails the VMI (`Always` makes a
/// new VMI and pod); stopping the VM deletes the VMI, then its pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launcher_pods_are_placed_by_the_scheduler_and_own_their_qemu() {
    let c = Cluster::start().await;
    let mut started = c.pods_mode(false).await;

    // n2 by its selector: not where the fewest-VMIs-then-name rule alone would put it.
    let vms: Api<VirtualMachine> = Api::namespaced(c.client.clone(), "default");
    vms.create(&PostParams::default(), &guest_vm("lp", Some("n2"))).await.unwrap();
    let vmi = c.running("lp", BOOT).await;
    let uid = vmi.uid().unwrap();
    let pod = launcher_pod(&c, &uid, "the VMI's launcher pod").await;
    let pod_node = pod.spec.as_ref().unwrap().node_name.clone();
    assert_eq!(pod_node.as_deref(), Some("n2"), "the scheduler put the launcher pod on n2");
    assert_eq!(vmi.status.as_ref().unwrap().node_name, pod_node, "the VMI's node is its pod's");
    assert_eq!(vmi.labels().get("kubevirt.io/nodeName"), pod_node.as_ref());
    assert!(pod.name_any().starts_with("virt-launcher-lp-"));
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("VirtualMachineInstance", uid.as_str(), Some(true)));
    let run_dir = c.dir.path().join("n2/node/vmis").join(&uid);
    let log = run_dir.join("serial.log");
    common::wait_until(BOOT, "the guest to boot (VP-READY on its console)", || {
        let ready = common::guest::console_lines(&log).iter().any(|l| l.starts_with("VP-READY"));
        async move { ready.then_some(()) }
    })
    .await;
    // The console through the API server and n2's agent tunnel (QEMU in its launcher pod).
    console_echo(&c, "lp", "typed on n2").await;
    let qemu = qemu_pid(&run_dir);
    let in_pod: i32 = std::fs::read_to_string(run_dir.join("qemu.pid")).unwrap().trim().parse().unwrap();
    assert_ne!(in_pod, qemu.as_raw_nonzero().get(), "the pod's PID namespace: QEMU's pidfile holds its PID there, not here");
    started.n2.line(&format!("QEMU {} started", qemu.as_raw_nonzero()), "the agent to report QEMU's PID as the node sees it").await;
    let (parent, cmdline) = parent_of(qemu);
    assert!(cmdline.contains(" launcher --uid ") && cmdline.contains(&uid), "QEMU's parent is the launcher, not the agent: {cmdline}");
    assert_ne!(parent, started.n2.pid().as_raw_nonzero().get());

    // The agent dies: the guest does not; the next agent adopts the same QEMU.
    started.n2.kill9();
    assert!(alive(qemu), "the guest keeps running without its agent");
    let n2 = c.node_with("n2", &["--launcher-pods"]);
    n2.line(&format!("adopted QEMU {}", qemu.as_raw_nonzero()), "the restarted agent to adopt the launcher's QEMU").await;
    assert_eq!(c.running("lp", T).await.uid(), vmi.uid());
    // The restarted agent's new tunnel replaces the dead one's.
    console_echo(&c, "lp", "typed after the restart").await;

    // The launcher pod is deleted: the API server keeps it, marked, through its grace (it runs
    // on a node); its kubelet stops it (QEMU goes with it) and then removes it; the VMI ends,
    // and (runStrategy Always) the VM gets a new VMI with a new launcher pod.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let marked = pods.delete(&pod.name_any(), &DeleteParams::default()).await.unwrap().left().expect("kept through its grace");
    assert!(marked.metadata.deletion_timestamp.is_some() && marked.metadata.deletion_grace_period_seconds > Some(0), "{marked:?}");
    common::wait_until(T, "QEMU to stop with its pod", || async { (!alive(qemu)).then_some(()) }).await;
    common::wait_until(T, "the kubelet to remove the stopped pod", || async {
        pods.get_opt(&pod.name_any()).await.ok().flatten().is_none().then_some(())
    })
    .await;
    let next = common::wait_until(BOOT, "a new VMI of VM lp to run", || async {
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(c.client.clone(), "default");
        vmis.get_opt("lp").await.ok().flatten().filter(|v| v.is_running() && v.uid() != vmi.uid())
    })
    .await;
    let next_uid = next.uid().unwrap();
    let next_pod = launcher_pod(&c, &next_uid, "the new VMI's launcher pod").await;
    assert_ne!(next_pod.name_any(), pod.name_any());

    // Stopping the VM deletes the VMI (the agent stops QEMU, removes the finalizer), then the
    // garbage collector deletes its pod.
    let next_qemu =
        qemu_pid(&c.dir.path().join(next_pod.spec.as_ref().unwrap().node_name.as_deref().unwrap()).join("node/vmis").join(&next_uid));
    vms.patch("lp", &PatchParams::default(), &Patch::Merge(json!({"spec": {"runStrategy": "Halted"}}))).await.unwrap();
    common::wait_until(T, "the VMI to be gone", || async {
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(c.client.clone(), "default");
        vmis.get_opt("lp").await.ok().flatten().is_none().then_some(())
    })
    .await;
    assert!(!alive(next_qemu), "QEMU stopped before the VMI's finalizer went");
    common::wait_until(T, "the launcher pod to be garbage-collected", || async {
        pods.get_opt(&next_pod.name_any()).await.ok().flatten().is_none().then_some(())
    })
    .await;
}

/// A line typed into VM `vm`'s console through the API server's `console` websocket (as
/// `virtctl console` from anywhere) reaches the guest, which answers `VP-ECHO <line>` over it.
/// The agent's tunnel may still be connecting: 503 is retried until the deadline.
async fn console_echo(c: &Cluster, vm: &str, line: &str) {
    let streams = client::connect_with(Some(Path::new(&c.kubeconfig())), "test", client::Retries::None).await.unwrap();
    common::guest::console_echo(&streams, vm, line, T).await;
}

/// QEMU's PID here, as the node agent finds it (a launcher pod's QEMU is in the pod's PID
/// namespace: its pidfile holds its PID there).
fn qemu_pid(run_dir: &Path) -> rustix::process::Pid {
    rustix::process::Pid::from_raw(qemu::process::adopt(run_dir).unwrap().pid).unwrap()
}

fn alive(pid: rustix::process::Pid) -> bool {
    rustix::process::test_kill_process(pid).is_ok()
}

/// The CLI on a cluster whose API server has no `subresources.kubevirt.io` (KubeVirt's CRDs, no
/// virt-api; modelled by `virtplug apiserver --without-kubevirt-subresources`): `vm start`,
/// `addvolume`, `removevolume`, `vm restart`, `vm stop` make the same changes by editing the VM
/// (`vm pause`, `vm unpause`, `vm softreboot` by editing its VMI), with the same refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_edits_the_vm_where_no_subresources_api_is_served() {
    let c = Cluster::start_with(&["--without-kubevirt-subresources"]).await;
    let discovery = http::Request::get("/apis/subresources.kubevirt.io/v1").body(Vec::new()).unwrap();
    assert!(c.client.request_text(discovery).await.is_err(), "the subresources API is not served");
    let _n1 = common::fakenode::start(&c.client, "n1").await;
    let _ctl = c.controller("c", &["--leader-elect=false"]);
    let vms: Api<VirtualMachine> = Api::namespaced(c.client.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(common::vm("v")).unwrap()).await.unwrap();
    let kc = c.kubeconfig();
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_virtplug")).args(args).args(["--kubeconfig", &kc]).output().unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };

    let (ok, out) = cli(&["vm", "start", "v"]);
    assert!(ok, "{out}");
    assert_eq!(vms.get("v").await.unwrap().spec.run_strategy.as_deref(), Some("Always"));
    let first = c.running("v", T).await;

    let (ok, out) = cli(&["addvolume", "v", "--volume-name", "hp", "--claim", "data"]);
    assert!(ok, "{out}");
    let spec = vms.get("v").await.unwrap().spec.template.spec.unwrap();
    let hp = spec.volumes.iter().find(|v| v.name == "hp").expect("the volume is in the VM spec");
    assert_eq!(serde_json::to_value(hp).unwrap()["persistentVolumeClaim"], json!({"claimName": "data", "hotpluggable": true}));
    assert!(spec.domain.devices.disks.iter().any(|d| d.name == "hp"), "and its disk");
    let (ok, out) = cli(&["addvolume", "v", "--volume-name", "hp", "--claim", "other"]);
    assert!(!ok && out.contains("already exists"), "KubeVirt's refusal: {out}");
    let (ok, out) = cli(&["removevolume", "v", "--volume-name", "hp"]);
    assert!(ok, "{out}");
    assert!(!vms.get("v").await.unwrap().spec.template.spec.unwrap().volumes.iter().any(|v| v.name == "hp"));

    let (ok, out) = cli(&["vm", "start", "v"]);
    assert!(!ok && out.contains("VM is already running"), "{out}");
    let (ok, out) = cli(&["vm", "restart", "v"]);
    assert!(ok, "{out}");
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(c.client.clone(), "default");
    let first_uid = first.uid();
    common::wait_until(T, "a new VMI after the restart", || {
        let (vmis, first_uid) = (vmis.clone(), first_uid.clone());
        async move { vmis.get_opt("v").await.ok().flatten().filter(|v| v.uid() != first_uid && v.is_running()) }
    })
    .await;
    // The VMI actions: the request the subresource would record, on the VMI (the fake node
    // carries none of them out; `vm_actions.rs` has a real agent do so).
    let pause_requested =
        || async { vmis.get("v").await.unwrap().metadata.annotations.unwrap_or_default().get("virtplug.io/pause-requested").cloned() };
    let (ok, out) = cli(&["vm", "pause", "v"]);
    assert!(ok && out.contains("VMI v was scheduled to pause"), "{out}");
    assert_eq!(pause_requested().await.as_deref(), Some("true"));
    let (ok, out) = cli(&["vm", "pause", "v"]);
    assert!(!ok && out.contains("VMI is already paused"), "{out}");
    let (ok, out) = cli(&["vm", "softreboot", "v"]);
    assert!(!ok && out.contains("VMI is paused"), "{out}");
    let (ok, out) = cli(&["vm", "unpause", "v"]);
    assert!(ok, "{out}");
    assert_eq!(pause_requested().await, None);
    let (ok, out) = cli(&["vm", "softreboot", "v"]);
    assert!(ok, "{out}");
    let ann = vmis.get("v").await.unwrap().metadata.annotations.unwrap_or_default();
    assert!(ann.contains_key("virtplug.io/softreboot-requested"), "{ann:?}");

    let (ok, out) = cli(&["vm", "stop", "v"]);
    assert!(ok, "{out}");
    assert_eq!(vms.get("v").await.unwrap().spec.run_strategy.as_deref(), Some("Halted"));
    common::wait_until(T, "the VMI to be gone after stop", || {
        let vmis = vmis.clone();
        async move { matches!(vmis.get_opt("v").await, Ok(None)).then_some(()) }
    })
    .await;
}

/// On a cluster where KubeVirt is deployed (its KubeVirt CR exists: the CRD registered here as
/// data, as virt-operator would), `virtplug controller` and `virtplug node` refuse to start and
/// say what to use instead; with the CRD but no KubeVirt CR they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_and_agent_refuse_to_run_beside_kubevirt() {
    let c = Cluster::start().await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(c.client.clone());
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "kubevirts.kubevirt.io"},
        "spec": {"group": "kubevirt.io", "scope": "Namespaced", "names": {"plural": "kubevirts", "singular": "kubevirt", "kind": "KubeVirt"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
    crds.create(&PostParams::default(), &serde_json::from_value(crd).unwrap()).await.unwrap();
    let kc = c.kubeconfig();
    let run = |args: &[&str]| {
        let mut child =
            Command::new(env!("CARGO_BIN_EXE_virtplug")).args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        (child.wait().unwrap(), err)
    };
    let kv_api =
        kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk("kubevirt.io", "v1", "KubeVirt"), "kubevirts");
    let kvs: Api<kube::api::DynamicObject> = Api::namespaced_with(c.client.clone(), "kube-system", &kv_api);
    common::wait_until(T, "the KubeVirt CRD to be served", || async { kvs.list(&Default::default()).await.ok().map(|_| ()) }).await;
    // The CRD alone (virt-operator installed, KubeVirt not deployed): the controller runs.
    let mut ctl = c.controller("c", &["--leader-elect=false"]);
    ctl.line("virtplug controller: running", "the controller to start beside a KubeVirt CRD with no KubeVirt").await;
    ctl.kill9();
    let kv: kube::api::DynamicObject =
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "kube-system"}, "spec": {}}))
            .unwrap();
    kvs.create(&PostParams::default(), &kv).await.unwrap();
    for (args, who) in [
        (vec!["controller", "--kubeconfig", &kc, "--leader-elect=false", "--health-listen", "127.0.0.1:0"], "controller"),
        (vec!["node", "--kubeconfig", &kc, "--node-name", "n1", "--health-listen", "127.0.0.1:0"], "node agent"),
    ] {
        let (status, err) = run(&args);
        assert!(!status.success(), "{who} ran beside KubeVirt");
        assert!(
            err.contains("KubeVirt is deployed on this cluster (KubeVirt kube-system/kubevirt)") && err.contains("virtplug redfish"),
            "{who}: {err}"
        );
    }
}

/// A claim bound by the STAND-IN CSI (standins' `ROOT/../csi/NS/NAME` directory; for `Block`
/// mode the caller puts its `block.img` there first): created, then its status set `Bound` with
/// its capacity, as a provisioner would.
async fn csi_claim(c: &Cluster, name: &str, size: &str, mode: &str) {
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode, "resources": {"requests": {"storage": size}}}});
    pvcs.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
    let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}});
    pvcs.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

async fn guest_has(log: &Path, want: &[&str]) {
    let want: std::collections::BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
    common::wait_until(T, &format!("the guest to have exactly the hot-plugged disks {want:?}"), || {
        let ok = common::guest::hotplugged_disks(log) == want;
        async move { ok.then_some(()) }
    })
    .await;
}

/// The VM's hot-plugged claims become exactly `claims` (a disk with serial = volume name); the
/// VM as written.
async fn set_hotplugged(vms: &Api<VirtualMachine>, name: &str, claims: &[&str]) -> VirtualMachine {
    let disks: Vec<_> = claims.iter().map(|v| json!({"name": v, "disk": {"bus": "scsi"}, "serial": v})).collect();
    let volumes: Vec<_> =
        claims.iter().map(|v| json!({"name": v, "persistentVolumeClaim": {"claimName": v, "hotpluggable": true}})).collect();
    let patch = json!({"spec": {"template": {"spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}}}});
    vms.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.unwrap()
}

/// The attachment pods of VMI `uid` (not being deleted), by name.
async fn attachment_pods(pods: &Api<Pod>, uid: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("virtplug.io/attachment-for={uid}"));
    pods.list(&lp).await.map(|l| l.items).unwrap_or_default().into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

/// Waits until every volume in `volumes` names attachment pod `pod` with its UID.
async fn served_by(c: &Cluster, vm: &str, volumes: &[&str], pod: &Pod, what: &str) {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(c.client.clone(), "default");
    common::wait_until(T, what, || {
        let vmis = vmis.clone();
        async move {
            let st = vmis.get_opt(vm).await.ok()??.status?;
            volumes
                .iter()
                .all(|v| {
                    st.volume(v).and_then(|e| e.hotplug_volume.clone()).is_some_and(|h| {
                        h.attach_pod_name.as_deref() == pod.metadata.name.as_deref() && h.attach_pod_uid == pod.metadata.uid
                    })
                })
                .then_some(())
        }
    })
    .await;
}

/// The loop devices attached to `backing` (`losetup -j`).
fn loop_devices_of(backing: &Path) -> Vec<String> {
    let out = std::process::Command::new("losetup").arg("-j").arg(backing).output().expect("losetup");
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split(':').next()).map(str::to_owned).collect()
}

/// Attachment pods (issue 19): with launcher pods, a hot-plugged claim reaches the guest through
/// an `hp-volume-*` pod on the VMI's node, which the real agent opens through `/proc/PID/root`
/// (stand-in kubelet: the pod in its own mount namespace). First a Block claim: a
/// `volumeDevice` at `/path/<volume>/<claim uid>`, where the stand-in kubelet binds the loop
/// device it attached to the claim's bytes; the guest reads those bytes. A second claim, a
/// Filesystem one (bind-mounted at `/<volume>`; the holder creates the empty claim's
/// `disk.img`), swaps the pod (the new one first; the old one deleted only once the new one
/// runs, the first disk staying in the guest on the same device), and unplugging both deletes
/// the last pod, whose going detaches the loop device. The stand-in kubelet records any pod
/// deleted while a process still holds a file or device of a claim that no other pod there
/// uses (`detached-in-use`): on real storage that is a guest I/O error; it must never happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_plugged_claims_reach_the_guest_through_attachment_pods() {
    if !common::guest::is_root() {
        eprintln!("skipped: the stand-in kubelet's mount namespaces need root");
        return;
    }
    let c = Cluster::start().await;
    let _pods = c.pods_mode(true).await;
    let backing = c.dir.path().join("csi/default/hp1/block.img");
    std::fs::create_dir_all(backing.parent().unwrap()).unwrap();
    std::fs::write(&backing, b"VP-BLOCKDEVICE01").unwrap();
    std::fs::File::options().write(true).open(&backing).unwrap().set_len(32 << 20).unwrap();
    csi_claim(&c, "hp1", "32Mi", "Block").await;
    csi_claim(&c, "hp2", "64Mi", "Filesystem").await;

    let vms: Api<VirtualMachine> = Api::namespaced(c.client.clone(), "default");
    vms.create(&PostParams::default(), &guest_vm("ap", Some("n2"))).await.unwrap();
    let vmi = c.running("ap", BOOT).await;
    let uid = vmi.uid().unwrap();
    let log = c.dir.path().join("n2/node/vmis").join(&uid).join("serial.log");
    common::wait_until(BOOT, "the guest to boot (VP-READY on its console)", || {
        let ready = common::guest::console_lines(&log).iter().any(|l| l.starts_with("VP-READY"));
        async move { ready.then_some(()) }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");

    // One claim: a pod on the VMI's node carrying it; its UID in the status; the disk in the guest.
    set_hotplugged(&vms, "ap", &["hp1"]).await;
    let first = common::wait_until(T, "an attachment pod for hp1", || {
        let pods = pods.clone();
        let uid = uid.clone();
        async move {
            attachment_pods(&pods, &uid).await.into_iter().find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        }
    })
    .await;
    assert!(first.name_any().starts_with("hp-volume-"));
    assert_eq!(first.spec.as_ref().unwrap().node_name.as_deref(), Some("n2"), "the scheduler honoured the pod's node affinity");
    served_by(&c, "ap", &["hp1"], &first, "hp1's status to name its attachment pod and UID").await;
    guest_has(&log, &["hp1"]).await;
    let claim_uid = Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default").get("hp1").await.unwrap().uid().unwrap();
    let devices = serde_json::to_value(&first.spec.as_ref().unwrap().containers[0].volume_devices).unwrap();
    assert_eq!(devices, json!([{"name": "hp1", "devicePath": format!("/path/hp1/{claim_uid}")}]), "KubeVirt's Block layout");
    let line = common::guest::console_lines(&log).into_iter().find(|l| l.starts_with("BLOCK+") && l.contains("id=serial.hp1")).unwrap();
    let head: String = b"VP-BLOCKDEVICE01".iter().map(|b| format!("{b:02x}")).collect();
    assert!(line.contains(&format!(" {} ", 32u64 << 20 >> 9)) && line.contains(&head), "the claim's size and bytes in the guest: {line}");
    let device = loop_devices_of(&backing);
    assert_eq!(device.len(), 1, "one loop device for the claim on n2: {device:?}");

    // A second claim: a new pod carrying both; the old one goes only after; hp1 stays.
    set_hotplugged(&vms, "ap", &["hp1", "hp2"]).await;
    let first_uid = first.uid();
    let second = common::wait_until(T, "an attachment pod carrying hp1 and hp2", || {
        let pods = pods.clone();
        let uid = uid.clone();
        let first_uid = first_uid.clone();
        async move {
            attachment_pods(&pods, &uid)
                .await
                .into_iter()
                .find(|p| p.uid() != first_uid && p.spec.as_ref().unwrap().volumes.as_ref().unwrap().len() == 3)
        }
    })
    .await;
    served_by(&c, "ap", &["hp1", "hp2"], &second, "hp1 and hp2 to name the new attachment pod").await;
    guest_has(&log, &["hp1", "hp2"]).await;
    let img = c.dir.path().join("csi/default/hp2/disk.img");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20, "the holder made the empty claim's disk.img, the claim's size");
    common::wait_until(T, "the old attachment pod to be deleted", || {
        let pods = pods.clone();
        let uid = uid.clone();
        let first = first.uid();
        async move { (!attachment_pods(&pods, &uid).await.iter().any(|p| p.uid() == first)).then_some(()) }
    })
    .await;
    assert_eq!(
        common::guest::hotplugged_disks(&log),
        ["hp1", "hp2"].iter().map(|s| (*s).to_owned()).collect(),
        "no disk left the guest in the swap"
    );
    assert_eq!(loop_devices_of(&backing), device, "the Block claim kept its device through the swap");

    // Unplug both: the guest loses them, then the last pod goes.
    set_hotplugged(&vms, "ap", &[]).await;
    guest_has(&log, &[]).await;
    common::wait_until(T, "every attachment pod to be deleted after the unplug", || {
        let pods = pods.clone();
        let uid = uid.clone();
        async move { attachment_pods(&pods, &uid).await.is_empty().then_some(()) }
    })
    .await;
    // The stand-in kubelet checks a deleted pod's claims once its processes are gone.
    for p in [&first, &second] {
        let stopped = standins::stopped_marker(&c.dir.path().join("n2"), &p.uid().unwrap());
        common::wait_until(T, "the kubelet to stop each attachment pod and check its claims", || {
            let done = stopped.exists();
            async move { done.then_some(()) }
        })
        .await;
    }
    common::wait_until(T, "the last pod's going to detach the Block claim's loop device", || {
        let gone = loop_devices_of(&backing).is_empty();
        async move { gone.then_some(()) }
    })
    .await;
    let early = std::fs::read_to_string(c.dir.path().join("n2/detached-in-use")).unwrap_or_default();
    assert!(early.is_empty(), "an attachment pod was deleted while QEMU held its claim:\n{early}");
}

/// Every version of the objects `api` lists with `cfg` that a watch delivers, in revision order,
/// recorded by a task until the returned handle is dropped.
fn record<K>(api: Api<K>, cfg: kube::runtime::watcher::Config) -> (standins::Task, Arc<Mutex<Vec<K>>>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&seen);
    let task = standins::Task::spawn(async move {
        let mut objects = kube::runtime::watcher(api, cfg).default_backoff().applied_objects().boxed();
        while let Some(o) = objects.next().await {
            if let Ok(o) = o {
                out.lock().unwrap().push(o);
            }
        }
    });
    (task, seen)
}

/// The API server's global revision of an object's version (virtplug's server, like etcd, has
/// one counter for every write, so versions of different objects are ordered by it).
fn revision<K: kube::Resource>(o: &K) -> u64 {
    o.meta().resource_version.as_deref().unwrap().parse().unwrap()
}

/// WaitForFirstConsumer (issue 19): a hot-plugged claim of a `WaitForFirstConsumer` class binds
/// because its attachment pod consumes it. With no consumer the claim stays `Pending` without a
/// selected node, through the guest's whole boot (a watch records every version). Plugged into
/// a VM running on n2 (by its selector; the emptier-node rule alone would say n1): the
/// controller creates the attachment pod for the unbound claim; the scheduler (stand-in) picks
/// n2 by the pod's affinity, writes it into the claim's `volume.kubernetes.io/selected-node`,
/// and binds the pod only after the CSI stand-in made the volume on n2 and bound the claim (the
/// revisions say so); the PV's node affinity names n2, the data is under n2's directory (none
/// under n1's); the kubelet (stand-in) attaches it (a Block claim) through the PV's path; the
/// guest sees the disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_first_consumer_claim_binds_on_the_node_of_its_attachment_pod() {
    if !common::guest::is_root() {
        eprintln!("skipped: the stand-in kubelet's mount namespaces need root");
        return;
    }
    let c = Cluster::start().await;
    let _pods = c.pods_mode(true).await;
    let _csi = standins::csi(c.client.clone(), c.dir.path());
    wffc_class(&c).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "late", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "storageClassName": "standin-local",
                 "resources": {"requests": {"storage": "64Mi"}}}});
    pvcs.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
    let (_claim_watch, claim_versions) = record(pvcs.clone(), kube::runtime::watcher::Config::default().fields("metadata.name=late"));

    let vms: Api<VirtualMachine> = Api::namespaced(c.client.clone(), "default");
    vms.create(&PostParams::default(), &guest_vm("wf", Some("n2"))).await.unwrap();
    let vmi = c.running("wf", BOOT).await;
    let uid = vmi.uid().unwrap();
    assert_eq!(vmi.status.as_ref().unwrap().node_name.as_deref(), Some("n2"));
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let (_pod_watch, pod_versions) =
        record(pods.clone(), kube::runtime::watcher::Config::default().labels(&format!("virtplug.io/attachment-for={uid}")));
    let log = c.dir.path().join("n2/node/vmis").join(&uid).join("serial.log");
    common::wait_until(BOOT, "the guest to boot (VP-READY on its console)", || {
        let ready = common::guest::console_lines(&log).iter().any(|l| l.starts_with("VP-READY"));
        async move { ready.then_some(()) }
    })
    .await;

    // No consumer yet (the guest booted meanwhile): checked at the end, on every version.
    let plugged = revision(&set_hotplugged(&vms, "wf", &["late"]).await);

    let pod = common::wait_until(T, "the attachment pod carrying claim late to run", || {
        let (pods, uid) = (pods.clone(), uid.clone());
        async move {
            attachment_pods(&pods, &uid).await.into_iter().find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        }
    })
    .await;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("n2"), "the pod is on the VMI's node");
    served_by(&c, "wf", &["late"], &pod, "volume late's status to name its attachment pod and UID").await;
    guest_has(&log, &["late"]).await;

    let bound = pvcs.get("late").await.unwrap();
    assert_eq!(bound.annotations().get(controller::storage::class::ANN_SELECTED_NODE).map(String::as_str), Some("n2"), "the VMI's node");
    assert_eq!(bound.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
    let pv_name = bound.spec.as_ref().unwrap().volume_name.clone().expect("bound to a PV");
    assert_eq!(pv_name, format!("pvc-{}", bound.uid().unwrap()));
    let pv = Api::<PersistentVolume>::all(c.client.clone()).get(&pv_name).await.unwrap();
    let affinity = serde_json::to_value(&pv.spec.as_ref().unwrap().node_affinity).unwrap();
    assert_eq!(
        affinity["required"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]),
        "the volume was made where the consumer runs"
    );
    let img = c.dir.path().join("n2").join(standins::CSI_DIR.trim_start_matches('/')).join(&pv_name).join("block.img");
    assert_eq!(std::fs::metadata(&img).map(|m| m.len()).ok(), Some(64 << 20), "the volume's bytes are on n2: {}", img.display());
    assert_eq!(loop_devices_of(&img).len(), 1, "n2's kubelet attached them for the pod");
    let line = common::guest::console_lines(&log).into_iter().find(|l| l.starts_with("BLOCK+") && l.contains("id=serial.late")).unwrap();
    assert!(line.contains(&format!(" {} ", 64u64 << 20 >> 9)), "the guest has the volume's size: {line}");
    assert!(!c.dir.path().join("n1").join(standins::CSI_DIR.trim_start_matches('/')).exists(), "nothing was made on n1");

    // The order of binding, by the server's revisions: the claim was Bound before the pod got
    // its node (the stand-in scheduler waited for the stand-in provisioner, as Kubernetes' volume
    // binding does: this checks the simulation, not virtplug), and only one pod was ever made.
    // The recording watches may still be behind the reads above: each is waited for.
    let claim_bound = common::wait_until(T, "the claim watch to deliver the Bound version", || {
        let found = claim_versions.lock().unwrap().iter().find(|p| api::phases::ClaimPhase::is_bound(p)).map(revision);
        async move { found }
    })
    .await;
    let pod_bound = common::wait_until(T, "the pod watch to deliver the version with a node", || {
        let found =
            pod_versions.lock().unwrap().iter().find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some()).map(revision);
        async move { found }
    })
    .await;
    let versions = pod_versions.lock().unwrap().clone();
    assert!(claim_bound < pod_bound, "the claim was Bound (revision {claim_bound}) before its pod was bound (revision {pod_bound})");
    // The watch delivers in revision order and has delivered the Bound version, so it holds
    // every version before the plug: through the guest's whole boot, with no consumer, the
    // claim was unbound and had no selected node.
    let before: Vec<PersistentVolumeClaim> = claim_versions.lock().unwrap().iter().filter(|p| revision(*p) < plugged).cloned().collect();
    assert!(!before.is_empty(), "the watch saw the claim before the plug");
    for p in &before {
        assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"), "no consumer, no binding: {p:?}");
        assert!(!p.annotations().contains_key(controller::storage::class::ANN_SELECTED_NODE), "no consumer, no node: {p:?}");
    }
    let made: std::collections::BTreeSet<String> = versions.iter().map(|p| p.uid().unwrap()).collect();
    assert_eq!(made.len(), 1, "the claim's binding did not replace the attachment pod: {made:?}");
}

/// The StorageClass `standin-local` of the stand-in CSI (`WaitForFirstConsumer`).
async fn wffc_class(c: &Cluster) {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(c.client.clone());
    let class = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "standin-local"},
        "provisioner": standins::CSI_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"});
    classes.create(&PostParams::default(), &serde_json::from_value(class).unwrap()).await.unwrap();
}

/// [`wffc_class`], and claim `name` of it (Filesystem, `size`), unbound.
async fn wffc_claim(c: &Cluster, name: &str, size: &str) {
    wffc_class(c).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem", "storageClassName": "standin-local",
                 "resources": {"requests": {"storage": size}}}});
    pvcs.create(&PostParams::default(), &serde_json::from_value(claim).unwrap()).await.unwrap();
}

/// VM `name` on n2 (by its selector) booting the test guest with one virtio disk `boot` from
/// volume source `source` (a claim or DataVolume); the VM API.
async fn boot_vm(c: &Cluster, name: &str, source: serde_json::Value) -> Api<VirtualMachine> {
    let mut vm = serde_json::to_value(guest_vm(name, Some("n2"))).unwrap();
    vm["spec"]["template"]["spec"]["domain"]["devices"] = json!({"disks": [{"name": "boot", "disk": {"bus": "virtio"}}]});
    let mut volume = source;
    volume["name"] = json!("boot");
    vm["spec"]["template"]["spec"]["volumes"] = json!([volume]);
    let vms: Api<VirtualMachine> = Api::namespaced(c.client.clone(), "default");
    vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    vms
}

/// The guest's disk reports (`BLOCK+ dev sectors HEAD16 ...`) once there is one: the guest may
/// print VP-READY before its first.
async fn disk_reports(log: &Path) -> Vec<String> {
    common::wait_until(BOOT, "the guest to report its disk (BLOCK+ on its console)", || {
        let disks: Vec<String> = common::guest::console_lines(log).into_iter().filter(|l| l.starts_with("BLOCK+ ")).collect();
        async move { (!disks.is_empty()).then_some(disks) }
    })
    .await
}

/// Whether process `pid` holds `path` (a file or a device node) open, matched as the stand-in
/// kubelet matches holders: by device and inode (its fds' paths are its pod's).
fn holds(pid: rustix::process::Pid, path: &Path) -> bool {
    standins::holders_of(&standins::files_of(path)).iter().any(|h| h.starts_with(&format!("{} ", pid.as_raw_nonzero())))
}

/// Boot volumes as launcher-pod volumes (issue 19): a VM whose boot disk is an empty claim of
/// the stand-in CSI's `WaitForFirstConsumer` class. The controller creates the VMI although the
/// claim is unbound (its launcher pod is the consumer) and gives the pod the claim as a volume;
/// the claim stays `Pending` without a selected node until that pod exists (a watch records
/// every version), then binds on the pod's node (n2, by the VM's selector; the PV's affinity
/// and the data say so). The stand-in kubelet runs the pod isolated (its own mount namespace
/// and root: the claim mounted at `/run/kubevirt-private/vmi-disks/boot`, the run dir at its
/// path); the launcher made the empty claim's `disk.img` sparse, the claim's size; the agent
/// opened it inside the pod and the fd reached QEMU through the launcher: QEMU's command line
/// names no path of the claim (`/dev/fdset/0` with a `virtplug-boot:` set), one of QEMU's fds
/// is the claim's file, and the guest sees the disk (64 MiB, empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_claim_waiting_for_its_consumer_binds_with_the_launcher_pod_and_reaches_qemu_as_an_fd() {
    if !common::guest::is_root() {
        eprintln!("skipped: the stand-in kubelet's mount namespaces need root");
        return;
    }
    let c = Cluster::start().await;
    let _pods = c.pods_mode(false).await;
    let _csi = standins::csi(c.client.clone(), c.dir.path());
    wffc_claim(&c, "bootclaim", "64Mi").await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let (_claim_watch, claim_versions) = record(pvcs.clone(), kube::runtime::watcher::Config::default().fields("metadata.name=bootclaim"));
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let (_pod_watch, pod_versions) = record(pods.clone(), kube::runtime::watcher::Config::default().labels("kubevirt.io=virt-launcher"));

    let vms = boot_vm(&c, "bv", json!({"persistentVolumeClaim": {"claimName": "bootclaim"}})).await;

    let vmi = c.running("bv", BOOT).await;
    let uid = vmi.uid().unwrap();
    let pod = launcher_pod(&c, &uid, "the VMI's launcher pod").await;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("n2"));
    let run_dir = c.dir.path().join("n2/node/vmis").join(&uid);
    let log = run_dir.join("serial.log");
    common::wait_until(BOOT, "the guest to boot (VP-READY on its console)", || {
        let ready = common::guest::console_lines(&log).iter().any(|l| l.starts_with("VP-READY"));
        async move { ready.then_some(()) }
    })
    .await;
    // The guest sees the boot claim: its one disk, on virtio-blk (the test guest names SCSI
    // disks by serial only), 64 MiB (512-byte sectors), zeros (an empty claim).
    // The guest may print VP-READY before its first disk report.
    let disks = disk_reports(&log).await;
    assert_eq!(disks.len(), 1, "one disk, the boot claim: {disks:?}");
    let w: Vec<&str> = disks[0].split_whitespace().collect();
    assert!(w[1].starts_with("vd"), "a virtio-blk disk: {w:?}");
    assert_eq!((w[2], w[3]), ("131072", "00000000000000000000000000000000"), "64 MiB in sectors, empty: {w:?}");

    // Bound on the launcher pod's node, by the stand-ins, once the pod existed.
    let bound = pvcs.get("bootclaim").await.unwrap();
    assert_eq!(bound.annotations().get(controller::storage::class::ANN_SELECTED_NODE).map(String::as_str), Some("n2"));
    let pv_name = bound.spec.as_ref().unwrap().volume_name.clone().expect("bound to a PV");
    let pv = Api::<PersistentVolume>::all(c.client.clone()).get(&pv_name).await.unwrap();
    let affinity = serde_json::to_value(&pv.spec.as_ref().unwrap().node_affinity).unwrap();
    assert_eq!(
        affinity["required"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}])
    );
    let claim_bound = common::wait_until(T, "the claim watch to deliver the Bound version", || {
        let found = claim_versions.lock().unwrap().iter().find(|p| api::phases::ClaimPhase::is_bound(p)).map(revision);
        async move { found }
    })
    .await;
    let pod_created = common::wait_until(T, "the launcher pod watch to deliver the pod", || {
        let found = pod_versions.lock().unwrap().iter().find(|p| p.uid() == pod.uid()).map(revision);
        async move { found }
    })
    .await;
    assert!(pod_created < claim_bound, "the launcher pod (revision {pod_created}) existed before the claim was Bound ({claim_bound})");
    // The watch delivers in revision order and has delivered the Bound version: it holds every
    // version before the pod's creation, each unbound and without a node.
    let before: Vec<PersistentVolumeClaim> =
        claim_versions.lock().unwrap().iter().filter(|p| revision(*p) < pod_created).cloned().collect();
    assert!(!before.is_empty(), "the watch saw the claim before the launcher pod");
    for p in &before {
        assert_eq!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"), "no consumer, no binding: {p:?}");
        assert!(!p.annotations().contains_key(controller::storage::class::ANN_SELECTED_NODE), "no consumer, no node: {p:?}");
    }

    // The launcher made the empty claim's image: sparse, the claim's size, in n2's volume.
    let img = c.dir.path().join("n2").join(standins::CSI_DIR.trim_start_matches('/')).join(&pv_name).join("disk.img");
    let md = std::fs::metadata(&img).unwrap_or_else(|e| panic!("{}: {e}", img.display()));
    assert_eq!(md.len(), 64 << 20, "the claim's size");
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&md) < 2048,
        "sparse ({} blocks of 512 bytes allocated)",
        std::os::unix::fs::MetadataExt::blocks(&md)
    );

    // The fd reached QEMU from inside the pod: no path to the claim on its command line, and
    // one of its fds is the claim's file (by device and inode: QEMU is in another mount
    // namespace, its fd paths are the pod's).
    let qemu = qemu_pid(&run_dir);
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/cmdline", qemu.as_raw_nonzero())).unwrap()).replace('\0', " ");
    for path in ["disk.img", "vmi-disks", pv_name.as_str(), "standin-csi"] {
        assert!(!cmdline.contains(path), "QEMU's command line names {path}: {cmdline}");
    }
    assert!(cmdline.contains("-add-fd fd=3,set=0,opaque=virtplug-boot:boot") && cmdline.contains("/dev/fdset/0"), "{cmdline}");
    assert!(holds(qemu, &img), "QEMU holds the claim's disk.img open");
    let (_, parent) = parent_of(qemu);
    assert!(parent.contains(" launcher --uid ") && parent.contains(&uid), "QEMU's parent is the launcher: {parent}");

    // Stopping the VM: QEMU stops before the VMI goes, and the pod's deletion finds no process
    // left holding the claim.
    vms.patch("bv", &PatchParams::default(), &Patch::Merge(json!({"spec": {"runStrategy": "Halted"}}))).await.unwrap();
    common::wait_until(T, "the VMI to be gone", || async {
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(c.client.clone(), "default");
        vmis.get_opt("bv").await.ok().flatten().is_none().then_some(())
    })
    .await;
    assert!(!alive(qemu), "QEMU stopped before the VMI's finalizer went");
    common::wait_until(T, "the launcher pod to be garbage-collected", || async {
        pods.get_opt(&pod.name_any()).await.ok().flatten().is_none().then_some(())
    })
    .await;
    let stopped = standins::stopped_marker(&c.dir.path().join("n2"), &pod.uid().unwrap());
    common::wait_until(T, "the kubelet to stop the launcher pod and check its claim", || {
        let done = stopped.exists();
        async move { done.then_some(()) }
    })
    .await;
    let detached = std::fs::read_to_string(c.dir.path().join("n2/detached-in-use")).unwrap_or_default();
    assert!(detached.is_empty(), "the launcher pod was deleted while a process held its claim:\n{detached}");
}

/// DataVolumes that wait for their first consumer (issue 19, KubeVirt's ephemeral
/// provisioning): a VM booting from a DataVolume whose claim is of the stand-in CSI's
/// `WaitForFirstConsumer` class, imported by the stand-in CDI once the claim binds. The VMI is
/// created while the DataVolume is `WaitForFirstConsumer` and waits, `Pending` with a
/// `Provisioning` condition naming it; a temporary pod (annotated
/// `kubevirt.io/ephemeral-provisioning`, with the VMI's node selector) consumes the claim, so it
/// binds on n2; only once the DataVolume has `Succeeded` is the temporary pod deleted and the
/// launcher pod created (by the server's revisions), on the same node (the PV's affinity), and
/// the guest boots with the imported bytes on its disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_volume_waiting_for_its_consumer_is_imported_before_its_launcher_pod_exists() {
    if !common::guest::is_root() {
        eprintln!("skipped: the stand-in kubelet's mount namespaces need root");
        return;
    }
    let c = Cluster::start().await;
    let _pods = c.pods_mode(false).await;
    let _csi = standins::csi(c.client.clone(), c.dir.path());
    let _cdi = standins::cdi(c.client.clone(), c.dir.path());
    wffc_class(&c).await;
    let dvs: Api<api::DataVolume> = Api::namespaced(c.client.clone(), "default");
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "imported", "namespace": "default"},
        "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "standin-local", "volumeMode": "Filesystem",
                 "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}}}});
    let (_dv_watch, dv_versions) = record(dvs.clone(), kube::runtime::watcher::Config::default().fields("metadata.name=imported"));
    dvs.create(&PostParams::default(), &serde_json::from_value(dv).unwrap()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let (_pod_watch, pod_versions) = record(pods.clone(), kube::runtime::watcher::Config::default().labels("kubevirt.io=virt-launcher"));
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(c.client.clone(), "default");
    let (_vmi_watch, vmi_versions) = record(vmis.clone(), kube::runtime::watcher::Config::default().fields("metadata.name=dv"));

    boot_vm(&c, "dv", json!({"dataVolume": {"name": "imported"}})).await;

    let vmi = c.running("dv", BOOT).await;
    let uid = vmi.uid().unwrap();
    let log = c.dir.path().join("n2/node/vmis").join(&uid).join("serial.log");
    let disk = disk_reports(&log).await.swap_remove(0);
    let head: String = standins::CDI_IMPORTED.iter().map(|b| format!("{b:02x}")).collect();
    let w: Vec<&str> = disk.split_whitespace().collect();
    assert_eq!((w[2], w[3]), ("131072", head.as_str()), "64 MiB with the imported bytes: {disk}");

    // The order, by the server's revisions: the temporary pod existed while the DataVolume
    // waited for its consumer, the DataVolume Succeeded, and only then the launcher pod was made.
    let succeeded = common::wait_until(T, "the DataVolume watch to deliver Succeeded", || {
        let found = dv_versions
            .lock()
            .unwrap()
            .iter()
            .find(|d| d.status.as_ref().and_then(|s| s.phase.clone()) == Some(api::phases::DataVolumePhase::Succeeded))
            .map(revision);
        async move { found }
    })
    .await;
    let launcher = launcher_pod(&c, &uid, "the VMI's launcher pod").await;
    let is_temporary = |p: &Pod| p.annotations().get("kubevirt.io/ephemeral-provisioning").map(String::as_str) == Some("true");
    let launcher_made = common::wait_until(T, "the pod watch to deliver the launcher pod", || {
        let found = pod_versions.lock().unwrap().iter().find(|p| p.uid() == launcher.uid()).map(revision);
        async move { found }
    })
    .await;
    assert!(!is_temporary(&launcher));
    assert!(succeeded < launcher_made, "the launcher pod (revision {launcher_made}) came after the import ({succeeded})");
    assert_eq!(launcher.spec.as_ref().unwrap().node_name.as_deref(), Some("n2"));
    let versions = pod_versions.lock().unwrap().clone();
    let temporary: Vec<&Pod> = versions.iter().filter(|p| is_temporary(p)).collect();
    assert!(!temporary.is_empty(), "a temporary pod consumed the claim");
    let temporary_uids: std::collections::BTreeSet<_> = temporary.iter().map(|p| p.uid()).collect();
    assert_eq!(temporary_uids.len(), 1, "one temporary pod: {temporary_uids:?}");
    assert!(temporary.iter().all(|p| revision(*p) < launcher_made || p.metadata.deletion_timestamp.is_some()));
    assert!(
        temporary.iter().any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n2")),
        "the temporary pod ran where the VMI may run"
    );
    assert_eq!(temporary[0].labels().get("kubevirt.io/created-by"), Some(&uid));
    common::wait_until(T, "the temporary pod to be deleted", || {
        let pods = pods.clone();
        let uid = temporary[0].uid();
        async move {
            let left = pods.list(&ListParams::default().labels("kubevirt.io=virt-launcher")).await.ok()?;
            (!left.items.iter().any(|p| p.uid() == uid)).then_some(())
        }
    })
    .await;
    let claim = Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default").get("imported").await.unwrap();
    assert_eq!(claim.annotations().get(controller::storage::class::ANN_SELECTED_NODE).map(String::as_str), Some("n2"));

    // Meanwhile the VMI waited, saying for what.
    let waited = vmi_versions.lock().unwrap().iter().any(|v| {
        v.uid() == Some(uid.clone())
            && v.status.as_ref().is_some_and(|s| {
                s.node_name.is_none()
                    && s.conditions.iter().any(|c| {
                        c.type_ == "Provisioning"
                            && c.status == "True"
                            && c.message.as_deref().is_some_and(|m| m.contains("DataVolume imported is"))
                    })
            })
    });
    assert!(waited, "the VMI was Pending with a Provisioning condition naming the DataVolume");
    assert!(vmi.status.as_ref().unwrap().conditions.iter().all(|c| c.type_ != "Provisioning"), "the condition went with the launcher pod");
}

/// A Block boot claim (issue 19): a `volumeDevice` of the launcher pod at `/dev/<volume>`, where
/// the stand-in kubelet binds the loop device it attached to the claim's bytes; the agent opens
/// it inside the pod and QEMU gets the fd (no device path on its command line, the device among
/// its fds); the guest boots with the claim's size and bytes. Stopping the VM ends the pod only
/// after QEMU let the device go (nothing in `detached-in-use`), and the device goes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_boot_claim_is_a_device_of_the_launcher_pod_handed_to_qemu_as_an_fd() {
    if !common::guest::is_root() {
        eprintln!("skipped: loop devices and the stand-in kubelet's mount namespaces need root");
        return;
    }
    let c = Cluster::start().await;
    let _pods = c.pods_mode(false).await;
    let backing = c.dir.path().join("csi/default/bootblk/block.img");
    std::fs::create_dir_all(backing.parent().unwrap()).unwrap();
    std::fs::write(&backing, b"VP-BLOCKBOOT0001").unwrap();
    std::fs::File::options().write(true).open(&backing).unwrap().set_len(32 << 20).unwrap();
    csi_claim(&c, "bootblk", "32Mi", "Block").await;

    let vms = boot_vm(&c, "bb", json!({"persistentVolumeClaim": {"claimName": "bootblk"}})).await;
    let vmi = c.running("bb", BOOT).await;
    let uid = vmi.uid().unwrap();
    let pod = launcher_pod(&c, &uid, "the VMI's launcher pod").await;
    let devices = serde_json::to_value(&pod.spec.as_ref().unwrap().containers[0].volume_devices).unwrap();
    assert_eq!(devices, json!([{"name": "boot", "devicePath": "/dev/boot"}]), "KubeVirt's layout for a Block boot claim");

    let run_dir = c.dir.path().join("n2/node/vmis").join(&uid);
    let log = run_dir.join("serial.log");
    let disk = disk_reports(&log).await.swap_remove(0);
    let head: String = b"VP-BLOCKBOOT0001".iter().map(|b| format!("{b:02x}")).collect();
    let w: Vec<&str> = disk.split_whitespace().collect();
    assert_eq!((w[2], w[3]), ("65536", head.as_str()), "32 MiB with the claim's bytes: {disk}");

    let device = loop_devices_of(&backing);
    assert_eq!(device.len(), 1, "n2's kubelet attached the claim: {device:?}");
    let qemu = qemu_pid(&run_dir);
    let cmdline = String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/cmdline", qemu.as_raw_nonzero())).unwrap()).replace('\0', " ");
    assert!(!cmdline.contains("/dev/boot") && !cmdline.contains(&device[0]) && cmdline.contains("/dev/fdset/0"), "{cmdline}");
    assert!(holds(qemu, Path::new(&device[0])), "QEMU holds the claim's device open");

    vms.patch("bb", &PatchParams::default(), &Patch::Merge(json!({"spec": {"runStrategy": "Halted"}}))).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    common::wait_until(T, "the launcher pod to be gone", || {
        let pods = pods.clone();
        let name = pod.name_any();
        async move { pods.get_opt(&name).await.ok().flatten().is_none().then_some(()) }
    })
    .await;
    let stopped = standins::stopped_marker(&c.dir.path().join("n2"), &pod.uid().unwrap());
    common::wait_until(T, "the kubelet to stop the launcher pod and check its claims", || {
        let done = stopped.exists();
        async move { done.then_some(()) }
    })
    .await;
    common::wait_until(T, "the pod's going to detach the claim's loop device", || {
        let gone = loop_devices_of(&backing).is_empty();
        async move { gone.then_some(()) }
    })
    .await;
    let early = std::fs::read_to_string(c.dir.path().join("n2/detached-in-use")).unwrap_or_default();
    assert!(early.is_empty(), "the launcher pod went while QEMU held its device:\n{early}");
}
