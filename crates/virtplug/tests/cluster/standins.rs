//! STAND-INS for a cluster's own components, for the launcher-pod test (no real cluster here):
//! [`scheduler`] plays kube-scheduler (with its volume binding), [`kubelet`] plays one node's
//! kubelet, [`csi`] plays a CSI driver's external-provisioner for node-local volumes. All are
//! tasks of the test process talking to the real API server through kube-rs, as the real ones
//! would.
//!
//! Claims: a claim bound to a PV (`spec.volumeName`) lives where the PV says (`local.path` or
//! `hostPath`, a path on the node: `ROOT/PATH` for the node whose root is `ROOT`); a claim
//! marked `Bound` by a test without a PV is a STAND-IN for network storage, the directory
//! `ROOT/../csi/NS/NAME` (one for every node). A Filesystem claim is that directory; a Block
//! claim is the file `block.img` in it, which the kubelet attaches to a loop device (standing in
//! for a CSI driver's block volume on the node).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSelector, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

// Kubernetes' names, as the controller spells them: the claim annotation naming the node the
// scheduler chose for a pod using the claim, and the binding mode that waits for that pod.
use controller::storage::class::{ANN_SELECTED_NODE as SELECTED_NODE, WAIT_FOR_FIRST_CONSUMER};

/// A task aborted when dropped (the stand-in stops with the test).
pub struct Task(tokio::task::JoinHandle<()>);

impl Task {
    /// Runs `f` until the task is dropped.
    #[allow(dead_code)] // tests/rbac.rs does not
    pub fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) -> Task {
        Task(tokio::spawn(f))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// STAND-IN for kube-scheduler: binds every pod without `spec.nodeName` to a node that is
/// `Ready`, not cordoned, untainted (taints are not matched against tolerations: the launcher
/// test needs none), whose labels match the pod's `nodeSelector` and hostname affinity, and that
/// its claims allow — of those, the one with the fewest pods. It binds through `pods/binding`,
/// as kube-scheduler does; a pod that fits no node waits for the next pod, node, claim, PV or
/// StorageClass change.
///
/// Claims, as kube-scheduler's VolumeBinding plugin treats them: a bound claim whose PV has
/// node affinity allows only the nodes it selects; an unbound claim of a
/// `WaitForFirstConsumer` class allows any node (only the one its
/// `volume.kubernetes.io/selected-node` names, once set): the chosen node is written there and
/// the pod is bound only once the claim is `Bound` (its provisioner made the volume there); an
/// unbound claim of any other class, or a missing claim, leaves the pod unscheduled.
pub fn scheduler(client: kube::Client) -> Task {
    Task(tokio::spawn(async move {
        let (pods, pw) = reflector::store::<Pod>();
        let (nodes, nw) = reflector::store::<Node>();
        let (claims, cw) = reflector::store::<PersistentVolumeClaim>();
        let (volumes, vw) = reflector::store::<PersistentVolume>();
        let (classes, sw) = reflector::store::<StorageClass>();
        let all = watcher::Config::default;
        let mut events = futures::stream::select_all([
            reflector::reflector(pw, watcher(Api::<Pod>::all(client.clone()), all())).default_backoff().map(|_| ()).boxed(),
            reflector::reflector(nw, watcher(Api::<Node>::all(client.clone()), all())).default_backoff().map(|_| ()).boxed(),
            reflector::reflector(cw, watcher(Api::<PersistentVolumeClaim>::all(client.clone()), all()))
                .default_backoff()
                .map(|_| ())
                .boxed(),
            reflector::reflector(vw, watcher(Api::<PersistentVolume>::all(client.clone()), all())).default_backoff().map(|_| ()).boxed(),
            reflector::reflector(sw, watcher(Api::<StorageClass>::all(client.clone()), all())).default_backoff().map(|_| ()).boxed(),
        ]);
        while events.next().await.is_some() {
            for pod in pods.state().iter().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none())) {
                let Some(needs) = claim_needs(pod, &claims, &volumes, &classes) else { continue };
                let Some(node) = fit(&pods, &nodes, pod, &needs) else { continue };
                if needs.waiting.is_empty() {
                    bind(&client, pod, &node).await;
                } else {
                    select_node(&client, &needs.waiting, &node).await;
                }
            }
        }
    }))
}

/// What a pod's claims ask of its node.
#[derive(Default)]
struct ClaimNeeds {
    /// The node affinity of each bound claim's PV: a node must match every one.
    affinity: Vec<NodeSelector>,
    /// The unbound `WaitForFirstConsumer` claims.
    waiting: Vec<Arc<PersistentVolumeClaim>>,
}

/// The claims' needs of `pod`; `None` when it cannot be scheduled yet (a claim missing, unbound
/// and not waiting for a consumer, or bound to a PV not seen yet).
fn claim_needs(
    pod: &Pod,
    claims: &Store<PersistentVolumeClaim>,
    volumes: &Store<PersistentVolume>,
    classes: &Store<StorageClass>,
) -> Option<ClaimNeeds> {
    let ns = pod.namespace().unwrap_or_default();
    let mut needs = ClaimNeeds::default();
    for v in pod.spec.as_ref()?.volumes.iter().flatten() {
        let Some(source) = &v.persistent_volume_claim else { continue };
        let claim = claims.get(&ObjectRef::new(&source.claim_name).within(&ns))?;
        let bound = api::phases::ClaimPhase::is_bound(&claim);
        if bound {
            // A claim marked Bound without a PV (network storage): reachable from every node.
            if let Some(pv) = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
                let pv = volumes.get(&ObjectRef::new(pv))?;
                if let Some(required) = pv.spec.as_ref()?.node_affinity.as_ref().and_then(|a| a.required.clone()) {
                    needs.affinity.push(required);
                }
            }
            continue;
        }
        let class = claim.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).and_then(|c| classes.get(&ObjectRef::new(c)))?;
        if class.volume_binding_mode.as_deref() != Some(WAIT_FOR_FIRST_CONSUMER) {
            return None; // its provisioner binds it without a consumer: wait for that
        }
        needs.waiting.push(claim);
    }
    Some(needs)
}

/// Writes `volume.kubernetes.io/selected-node: node` on each waiting claim that lacks it (as
/// kube-scheduler's PreBind does); the pod is bound on a later pass, once they are `Bound`.
async fn select_node(client: &kube::Client, waiting: &[Arc<PersistentVolumeClaim>], node: &str) {
    for claim in waiting.iter().filter(|c| c.annotations().get(SELECTED_NODE).is_none()) {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &claim.namespace().unwrap_or_default());
        let patch = json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
        // A failure is retried on the next event (the claim's store copy still lacks it).
        let _ = api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(patch)).await;
    }
}

fn fit(pods: &Store<Pod>, nodes: &Store<Node>, pod: &Pod, needs: &ClaimNeeds) -> Option<String> {
    let selector = pod.spec.as_ref().and_then(|s| s.node_selector.clone()).unwrap_or_default();
    let load = |n: &str| pods.state().iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n)).count();
    nodes
        .state()
        .iter()
        .filter(|n| {
            let spec = n.spec.clone().unwrap_or_default();
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            ready
                && spec.unschedulable != Some(true)
                && spec.taints.unwrap_or_default().is_empty()
                && selector.iter().all(|(k, v)| n.labels().get(k) == Some(v))
                && hostname_affinity(pod).is_none_or(|names| names.iter().any(|h| n.labels().get("kubernetes.io/hostname") == Some(h)))
                && needs.affinity.iter().all(|a| selects(a, n))
                && needs.waiting.iter().all(|c| c.annotations().get(SELECTED_NODE).is_none_or(|s| *s == n.name_any()))
        })
        .map(|n| n.name_any())
        .min_by_key(|n| (load(n), n.clone()))
}

/// Whether `node` matches `selector`: any of its terms, a term when all its expressions hold
/// (`In`, `NotIn`, `Exists`, `DoesNotExist` on the node's labels; `matchFields` on
/// `metadata.name`), as Kubernetes evaluates a PV's node affinity.
fn selects(selector: &NodeSelector, node: &Node) -> bool {
    let labels = node.labels();
    let name = node.name_any();
    selector.node_selector_terms.iter().any(|t| {
        let by_label = t.match_expressions.iter().flatten().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        });
        let by_field = t.match_fields.iter().flatten().all(|f| {
            let values = f.values.clone().unwrap_or_default();
            f.key == "metadata.name" && (f.operator == "In") == values.contains(&name)
        });
        by_label && by_field
    })
}

/// The hostnames a pod's required node affinity allows (`kubernetes.io/hostname In [...]`, the
/// one form an attachment pod uses); `None` without such a term.
fn hostname_affinity(pod: &Pod) -> Option<Vec<String>> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let names: Vec<String> = terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
        .flat_map(|e| e.values.clone().unwrap_or_default())
        .collect();
    (!names.is_empty()).then_some(names)
}

async fn bind(client: &kube::Client, pod: &Pod, node: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod.name_any(), "uid": pod.uid()},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    // 409: bound meanwhile (an older event); the store catches up.
    let _ =
        api.create_subresource::<serde_json::Value, serde_json::Value>("binding", &pod.name_any(), &PostParams::default(), &binding).await;
}

/// One pod process run by [`kubelet`].
struct Running {
    pid: i32,
    /// Whether `pid` is `unshare --pid --fork`, whose child (the pod's main process, PID 1 of
    /// the pod's PID namespace) is the one to signal: `unshare` does not pass SIGTERM on.
    forked: bool,
    grace: Duration,
    waiter: tokio::task::JoinHandle<()>,
    /// The claim directories the pod has mounted (an attachment pod's).
    claims: Vec<PathBuf>,
    /// The loop devices of its Block claims (shared with the other pods here using them).
    devices: Vec<Arc<LoopDevice>>,
}

/// A loop device the stand-in kubelet attached for a Block claim on its node (a CSI driver's
/// staged block volume): shared by every pod on the node that uses the claim, detached
/// (`losetup -d`) when the last of them is gone — also when the test ends early, as the
/// kubelet task is dropped.
struct LoopDevice {
    dev: PathBuf,
    backing: PathBuf,
}

impl LoopDevice {
    fn attach(backing: &Path) -> Result<LoopDevice, String> {
        let out =
            std::process::Command::new("losetup").args(["--find", "--show"]).arg(backing).output().map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!("losetup {}: {}", backing.display(), String::from_utf8_lossy(&out.stderr).trim()));
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(LoopDevice { dev, backing: backing.to_owned() })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// STAND-IN for node `node`'s kubelet: runs each pod bound to the node as a local process — the
/// container's `command` and `args` (`virtplug` is this build's binary: the image's stand-in),
/// its `env`, stdout and stderr in `ROOT/pods/UID.log` — and reports the pod's status (`Running`;
/// `Succeeded` or `Failed` with the exit code when the process ends). A pod marked for deletion
/// (`deletionTimestamp`: the API server keeps a pod on a node through its grace) gets SIGTERM,
/// then SIGKILL after its grace, and once its process is gone the kubelet removes it (a delete
/// with grace 0, preconditioned on its UID), as a kubelet does; a marked pod that does not run
/// here is removed at once. A pod removed by someone else (a force delete) is stopped the same way.
///
/// No container runtime: the node's file system is `root` (hostPath `P` is `ROOT/P`, created
/// for `DirectoryOrCreate`), and a container path under a volume mount is rewritten to its host
/// path in the command line (standing in for the mount). A pod with hostPath volumes only (a
/// launcher pod) runs in a PID namespace of its own, as a container runtime runs a pod
/// (`unshare --pid --fork --mount-proc --kill-child`): its processes' PIDs there (QEMU's
/// pidfile) are not their PIDs on the node. A pod with claim or emptyDir volumes
/// (an attachment pod, or a launcher pod with boot claims) runs in a mount namespace and root of
/// its own instead ([`start_isolated`]): a tmpfs with the host's `/usr` and `image` dirs (the
/// image's content: QEMU's firmware is under `/usr`, the test guest's kernel in its own dir), a
/// container's `/dev` (null, zero, full, random, urandom, tty) and `/proc`, the claims'
/// directories bind-mounted at their mount paths (a `/run/...` path lands on the pod's tmpfs),
/// each Block claim's loop device ([`LoopDevice`]) at its `devicePath`, each emptyDir at its
/// mount path, backed by
/// `ROOT/var/lib/kubelet/pods/UID/volumes/kubernetes.io~empty-dir/NAME` (the kubelet's layout),
/// and each hostPath `P` (`ROOT/P`) at `ROOT/P`, the path its rewritten arguments name.
/// When such a pod is deleted, once its processes are gone (SIGTERM, its grace, SIGKILL; then
/// the descendants it had, such as a launcher's QEMU, waited for), a process that still holds
/// a file of a claim (or the device of a Block claim) no other pod on the node uses gets a line
/// in `ROOT/detached-in-use`: on real storage the claim would be detached under that process
/// (a guest I/O error); tests wait for the pod's [`stopped_marker`] and assert the file stays
/// absent. Then a device no pod uses any more is detached.
/// A claim is found as the module docs say ([`claim_dir`]); a pod whose claim's PV has node
/// affinity that excludes this node fails, with the kubelet's words for it.
#[allow(dead_code)] // tests/cluster.rs gives every kubelet the guest's image
pub fn kubelet(client: kube::Client, node: &str, root: &Path) -> Task {
    kubelet_with_image(client, node, root, &[])
}

/// [`kubelet`], whose isolated pods also see the host directories `image` at their paths.
#[allow(dead_code)] // tests/rbac.rs runs no guest
pub fn kubelet_with_image(client: kube::Client, node: &str, root: &Path, image: &[PathBuf]) -> Task {
    let (node, root, image) = (node.to_owned(), root.to_owned(), image.to_vec());
    Task(tokio::spawn(async move {
        let (pods, writer) = reflector::store::<Pod>();
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let mut events = reflector::reflector(writer, watcher(Api::<Pod>::all(client.clone()), cfg)).default_backoff().boxed();
        let mut running: HashMap<String, Running> = HashMap::new();
        // Pods being stopped (then removed), by UID.
        let mut stopping: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
        while events.next().await.is_some() {
            let present = pods.state();
            stopping.retain(|_, t| !t.is_finished());
            for pod in &present {
                let uid = pod.uid().unwrap_or_default();
                let finished = pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Succeeded" || p == "Failed");
                let marked = pod.metadata.deletion_timestamp.is_some();
                if marked && !running.contains_key(&uid) && !stopping.contains_key(&uid) {
                    stopping.insert(uid.clone(), tokio::spawn(remove(client.clone(), (**pod).clone())));
                }
                if !running.contains_key(&uid) && !finished && !marked {
                    let staged: Vec<Arc<LoopDevice>> = running.values().flat_map(|r| r.devices.iter().cloned()).collect();
                    match start(&client, pod, &root, &node, &image, &staged).await {
                        Ok(r) => {
                            running.insert(uid, r);
                        }
                        Err(e) => report(&client, pod, json!({"phase": "Failed", "message": e})).await,
                    }
                }
            }
            // Gone from the API, or marked for deletion (to be removed once stopped).
            let ending: Vec<(String, Option<Pod>)> = running
                .keys()
                .filter_map(|u| match present.iter().find(|p| p.uid().as_deref() == Some(u.as_str())) {
                    None => Some((u.clone(), None)),
                    Some(p) if p.metadata.deletion_timestamp.is_some() => Some((u.clone(), Some((**p).clone()))),
                    Some(_) => None,
                })
                .collect();
            for (uid, marked) in ending {
                let r = running.remove(&uid).unwrap();
                // A claim (or Block device) no other pod here still uses is detached from the
                // node once the pod's processes are gone (a launcher pod's QEMU may use its boot
                // claim until then): a process still holding it would lose its I/O on real storage.
                let mut r = r;
                let detached: Vec<PathBuf> = r.claims.iter().filter(|d| !running.values().any(|o| o.claims.contains(d))).cloned().collect();
                let devices: Vec<Arc<LoopDevice>> = std::mem::take(&mut r.devices)
                    .into_iter()
                    .filter(|d| !running.values().any(|o| o.devices.iter().any(|x| Arc::ptr_eq(x, d))))
                    .collect();
                let (report, stopped) = (root.join("detached-in-use"), stopped_marker(&root, &uid));
                let client = client.clone();
                stopping.insert(
                    uid.clone(),
                    tokio::spawn(async move {
                        kill(r).await;
                        let mut held: Vec<(String, PathBuf)> = Vec::new();
                        for dir in &detached {
                            held.extend(holders_of(&files_under(dir)).into_iter().map(|h| (h, dir.clone())));
                        }
                        for d in &devices {
                            held.extend(holders_of(&files_of(&d.dev)).into_iter().map(|h| (h, d.backing.clone())));
                        }
                        for (holder, claim) in held {
                            let line = format!("pod {uid} deleted while {holder} holds a file of claim {}\n", claim.display());
                            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&report).unwrap();
                            std::io::Write::write_all(&mut f, line.as_bytes()).unwrap();
                        }
                        drop(devices);
                        // The pod is fully stopped and checked: a test may read `detached-in-use`.
                        std::fs::write(&stopped, b"").unwrap();
                        if let Some(pod) = marked {
                            remove(client, pod).await;
                        }
                    }),
                );
            }
        }
    }))
}

/// Removes pod `pod` (stopped, or never started here): a delete with grace 0 for its UID only.
async fn remove(client: kube::Client, pod: Pod) {
    let api: Api<Pod> = Api::namespaced(client, &pod.namespace().unwrap_or_default());
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: pod.uid(), resource_version: None }),
        ..DeleteParams::default()
    };
    if let Err(e) = api.delete(&pod.name_any(), &dp).await {
        eprintln!("stand-in kubelet: cannot remove pod {}: {e}", pod.name_any());
    }
}

/// The file [`kubelet`] (on node root `root`) creates once deleted pod `uid` is stopped and its
/// claims are checked for a process holding them (`ROOT/pods/UID.stopped`).
#[allow(dead_code)] // tests/rbac.rs does not wait for it
pub fn stopped_marker(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(format!("{uid}.stopped"))
}

/// How long the descendants of a killed pod's main process (QEMU, killed by its launcher's
/// death signal) may take to exit after it.
const DESCENDANTS_DEADLINE: Duration = Duration::from_secs(10);

/// SIGTERM to the pod's main process, the grace, SIGKILL (by PID, the process the kubelet
/// started: with `--kill-child`, its SIGKILL takes the pod's main process along); then waits
/// (with [`DESCENDANTS_DEADLINE`]) for the descendants it had at the SIGTERM, as a container
/// runtime ends a container's cgroup.
async fn kill(r: Running) {
    let Some(pid) = rustix::process::Pid::from_raw(r.pid).filter(|_| !r.waiter.is_finished()) else { return };
    let main = if r.forked { child_of(r.pid).and_then(rustix::process::Pid::from_raw) } else { Some(pid) };
    let descendants = descendants_of(r.pid);
    if let Some(main) = main {
        let _ = rustix::process::kill_process(main, rustix::process::Signal::TERM);
    }
    let mut waiter = r.waiter;
    if tokio::time::timeout(r.grace, &mut waiter).await.is_err() {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        let _ = waiter.await;
    }
    let gone = || descendants.iter().all(|(p, start)| start_time(*p).as_ref() != Some(start));
    let deadline = tokio::time::Instant::now() + DESCENDANTS_DEADLINE;
    let mut poll = tokio::time::interval(Duration::from_millis(20));
    while !gone() {
        if tokio::time::Instant::now() > deadline {
            eprintln!("stand-in kubelet: pod process {} left descendants running after {DESCENDANTS_DEADLINE:?}", r.pid);
            return;
        }
        poll.tick().await;
    }
}

/// The start time field of process `pid` (from `/proc/PID/stat`), which tells a process from a
/// later one that reuses its PID; `None` once it is gone (or a zombie, whose files are closed).
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    // After `pid (comm)`: state is field 3, starttime field 22.
    (fields.first() != Some(&"Z")).then(|| fields.get(19).map(|s| (*s).to_owned())).flatten()
}

/// Every descendant of `pid` (PID and start time), from `/proc/*/stat`.
fn descendants_of(pid: i32) -> Vec<(i32, String)> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| {
            let child: i32 = p.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(p.path().join("stat")).ok()?;
            let ppid: i32 = stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()?;
            Some((child, ppid))
        })
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, pp)| *pp == p) {
            frontier.push(*child);
            if let Some(t) = start_time(*child) {
                out.push((*child, t));
            }
        }
    }
    out
}

/// The (first) child of process `pid`, from `/proc/*/stat`.
fn child_of(pid: i32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
        let child: i32 = p.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(p.path().join("stat")).ok()?;
        // `pid (comm) state ppid ...`: comm may hold spaces, so count from its closing parenthesis.
        let ppid: i32 = stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()?;
        (ppid == pid).then_some(child)
    })
}

/// The host path of container path `arg` under the pod's volume mounts, if any.
fn host_path(pod: &Pod, root: &Path, arg: &str) -> Option<PathBuf> {
    let spec = pod.spec.as_ref()?;
    let c = spec.containers.first()?;
    c.volume_mounts.iter().flatten().find_map(|m| {
        let rest = arg.strip_prefix(&m.mount_path)?;
        let v = spec.volumes.iter().flatten().find(|v| v.name == m.name)?;
        let hp = v.host_path.as_ref()?;
        Some(PathBuf::from(format!("{}{}{rest}", root.display(), hp.path)))
    })
}

/// Starts `pod` (see [`kubelet`]); `staged` are the loop devices other pods here use already.
async fn start(
    client: &kube::Client,
    pod: &Pod,
    root: &Path,
    node: &str,
    image: &[PathBuf],
    staged: &[Arc<LoopDevice>],
) -> Result<Running, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    for v in spec.volumes.iter().flatten() {
        if let Some(hp) = &v.host_path {
            std::fs::create_dir_all(format!("{}{}", root.display(), hp.path)).map_err(|e| format!("hostPath {}: {e}", hp.path))?;
        }
    }
    let c = spec.containers.first().ok_or("no container")?;
    let isolated = spec.volumes.iter().flatten().any(|v| v.persistent_volume_claim.is_some() || v.empty_dir.is_some());
    let mut argv: Vec<String> = c.command.iter().flatten().chain(c.args.iter().flatten()).cloned().collect();
    for a in &mut argv {
        if let Some(p) = host_path(pod, root, a) {
            *a = p.display().to_string();
        }
    }
    if argv.first().map(String::as_str) == Some("virtplug") {
        argv[0] = env!("CARGO_BIN_EXE_virtplug").to_owned();
    }
    let logs = root.join("pods");
    std::fs::create_dir_all(&logs).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(logs.join(format!("{}.log", pod.uid().unwrap_or_default()))).map_err(|e| e.to_string())?;
    let mut devices = Vec::new();
    let (mut cmd, claims) = if isolated {
        let mut dirs = HashMap::new();
        for v in spec.volumes.iter().flatten() {
            if let Some(pvc) = &v.persistent_volume_claim {
                dirs.insert(v.name.clone(), claim_dir(client, pod, root, node, &pvc.claim_name).await?);
            }
        }
        let mut nodes = Vec::new();
        for d in c.volume_devices.iter().flatten() {
            let dir = dirs.get(&d.name).ok_or(format!("volumeDevice {}: not a claim volume", d.name))?;
            let backing = dir.join("block.img");
            let device = match staged.iter().find(|s| s.backing == backing) {
                Some(s) => Arc::clone(s),
                None => Arc::new(LoopDevice::attach(&backing)?),
            };
            nodes.push((device.dev.clone(), d.device_path.clone()));
            devices.push(device);
        }
        start_isolated(pod, root, &argv, &dirs, &nodes, image)?
    } else {
        let mut cmd = tokio::process::Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"]).args(&argv);
        (cmd, Vec::new())
    };
    cmd.stdin(std::process::Stdio::null()).stdout(log.try_clone().map_err(|e| e.to_string())?).stderr(log);
    for e in c.env.iter().flatten() {
        cmd.env(&e.name, e.value.clone().unwrap_or_default());
    }
    // The test process's end kills what it started.
    let mut child = cmd.kill_on_drop(true).spawn().map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
    let pid = i32::try_from(child.id().ok_or("no pid")?).unwrap();
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let (name, image) = (c.name.clone(), c.image.clone().unwrap_or_default());
    let container = move |state: serde_json::Value| json!([{"name": name, "image": image, "imageID": "", "ready": state.get("running").is_some(), "restartCount": 0, "state": state}]);
    report(
        client,
        pod,
        json!({"phase": "Running", "startTime": now, "containerStatuses": container(json!({"running": {"startedAt": now}}))}),
    )
    .await;
    let (client, pod_c, started) = (client.clone(), pod.clone(), now.clone());
    let waiter = tokio::spawn(async move {
        let status = child.wait().await;
        let code = status.map_or(1, |s| s.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0)));
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        let end = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let state = json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }, "startedAt": started, "finishedAt": end}});
        report(&client, &pod_c, json!({"phase": phase, "containerStatuses": container(state)})).await;
    });
    let grace = Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).try_into().unwrap_or(30));
    Ok(Running { pid, forked: !isolated, grace, waiter, claims, devices })
}

/// Merges `status` into the pod's status (a pod deleted meanwhile: nothing to report).
async fn report(client: &kube::Client, pod: &Pod, status: serde_json::Value) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let _ = api.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(json!({"status": status}))).await;
}

/// Where claim `name` of `pod`'s namespace is on node `node` (root `root`): its PV's
/// `local.path` (or `hostPath`) under `root` when the claim names a PV, else the shared
/// directory `ROOT/../csi/NS/NAME` (a claim a test marked `Bound` without a PV). A PV whose
/// node affinity excludes this node is refused as the kubelet refuses it.
async fn claim_dir(client: &kube::Client, pod: &Pod, root: &Path, node: &str, name: &str) -> Result<PathBuf, String> {
    let ns = pod.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims.get(name).await.map_err(|e| format!("persistentvolumeclaim \"{name}\": {e}"))?;
    let Some(pv_name) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return Ok(root.join("../csi").join(&ns).join(name));
    };
    let pv =
        Api::<PersistentVolume>::all(client.clone()).get(&pv_name).await.map_err(|e| format!("persistentvolume \"{pv_name}\": {e}"))?;
    let spec = pv.spec.clone().unwrap_or_default();
    if let Some(required) = spec.node_affinity.as_ref().and_then(|a| a.required.as_ref()) {
        let here = Api::<Node>::all(client.clone()).get(node).await.map_err(|e| format!("node \"{node}\": {e}"))?;
        if !selects(required, &here) {
            return Err(format!("MountVolume.NodeAffinity check failed for volume \"{pv_name}\" : no matching NodeSelectorTerms"));
        }
    }
    let path = spec
        .local
        .map(|l| l.path)
        .or(spec.host_path.map(|h| h.path))
        .ok_or(format!("persistentvolume \"{pv_name}\": neither local nor hostPath (the stand-in kubelet mounts only those)"))?;
    Ok(PathBuf::from(format!("{}{path}", root.display())))
}

/// The command running `argv` in a mount namespace and root of its own (see [`kubelet`]), and
/// the claim directories it mounts (`claims`: each claim volume's directory on this node;
/// `devices`: each Block claim's device node and its `devicePath` in the pod, bound there).
/// `unshare` execs (no fork), so the PID is the pod's process. The mounts live in the pod's
/// mount namespace only (private propagation): they go with its last process.
fn start_isolated(
    pod: &Pod,
    root: &Path,
    argv: &[String],
    claims: &HashMap<String, PathBuf>,
    devices: &[(PathBuf, String)],
    image: &[PathBuf],
) -> Result<(tokio::process::Command, Vec<PathBuf>), String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let c = spec.containers.first().ok_or("no container")?;
    let uid = pod.uid().unwrap_or_default();
    let pod_root = root.join("pod-roots").join(&uid);
    std::fs::create_dir_all(&pod_root).map_err(|e| format!("{}: {e}", pod_root.display()))?;
    let mut binds: Vec<(PathBuf, String)> = Vec::new();
    let mut mounted = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let v = spec.volumes.iter().flatten().find(|v| v.name == m.name).ok_or(format!("no volume {}", m.name))?;
        let host = if v.persistent_volume_claim.is_some() {
            let dir = claims.get(&v.name).cloned().ok_or(format!("volume {}: its claim was not resolved", v.name))?;
            if dir.join("block.img").exists() {
                return Err(format!("volume {}: a Block claim cannot be mounted (a volumeDevice, not a volumeMount)", v.name));
            }
            mounted.push(dir.clone());
            dir
        } else if v.empty_dir.is_some() {
            root.join("var/lib/kubelet/pods").join(&uid).join("volumes/kubernetes.io~empty-dir").join(&v.name)
        } else if let Some(hp) = &v.host_path {
            // At its node path, which the arguments under its mount were rewritten to.
            let host = PathBuf::from(format!("{}{}", root.display(), hp.path));
            binds.push((host.clone(), host.display().to_string()));
            continue;
        } else {
            return Err(format!("volume {}: only claims, emptyDirs and hostPaths in an isolated pod", v.name));
        };
        std::fs::create_dir_all(&host).map_err(|e| format!("{}: {e}", host.display()))?;
        binds.push((host, m.mount_path.clone()));
    }
    binds.extend(devices.iter().cloned());
    for dir in image {
        binds.push((dir.clone(), dir.display().to_string()));
    }
    let script = r#"set -e
R="$1"; BIN="$2"; shift 2
mount -t tmpfs pod-root "$R"
mkdir -p "$R/usr"
mount --rbind /usr "$R/usr"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$R/$d"; done
touch "$R/virtplug"; mount --bind "$BIN" "$R/virtplug"
mkdir -p "$R/dev" "$R/proc"
mount -t tmpfs -o mode=755 pod-dev "$R/dev"
for d in null zero full random urandom tty; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mount -t proc proc "$R/proc"
while [ "$1" != "--" ]; do
  if [ -b "$1" ]; then mkdir -p "$(dirname "$R$2")"; touch "$R$2"; else mkdir -p "$R$2"; fi
  mount --bind "$1" "$R$2"; shift 2
done
shift
exec chroot "$R" "$@"
"#;
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script, "pod"]).arg(&pod_root).arg(env!("CARGO_BIN_EXE_virtplug"));
    for (host, path) in &binds {
        cmd.arg(host).arg(path);
    }
    cmd.arg("--");
    let mut inside = argv.to_vec();
    if c.command.iter().flatten().next().map(String::as_str) == Some("virtplug") {
        inside[0] = "/virtplug".to_owned();
    }
    cmd.args(&inside);
    Ok((cmd, mounted))
}

/// The files of `dir`, by device and inode.
fn files_under(dir: &Path) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|e| e.metadata().ok()).map(|m| (m.dev(), m.ino())).collect()
}

/// File `path` (a device node: the one bound into pods), by device and inode.
#[allow(dead_code)] // tests/rbac.rs does not look
pub fn files_of(path: &Path) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| vec![(m.dev(), m.ino())]).unwrap_or_default()
}

/// The processes (`PID (comm)`) holding one of `files` open, matched by device and inode
/// through `/proc/*/fd` (a path would not do: the file was opened in another mount namespace).
#[allow(dead_code)] // tests/rbac.rs does not look
pub fn holders_of(files: &[(u64, u64)]) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| files.contains(&(m.dev(), m.ino())))) {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            out.push(format!("{} ({})", p.file_name().to_string_lossy(), comm.trim()));
        }
    }
    out
}

/// The provisioner name of the StorageClasses [`csi`] serves.
#[allow(dead_code)] // tests/rbac.rs uses the scheduler and kubelet only
pub const CSI_PROVISIONER: &str = "standin.csi.virtplug.test";
/// Where [`csi`] makes a volume on its node (a node path: `ROOT/var/lib/standin-csi/pvc-UID`).
#[allow(dead_code)]
pub const CSI_DIR: &str = "/var/lib/standin-csi";

/// STAND-IN for a CSI driver of node-local volumes and its external-provisioner (with the part
/// of Kubernetes' PV controller that completes a binding), for StorageClasses whose provisioner
/// is [`CSI_PROVISIONER`] and whose `volumeBindingMode` is `WaitForFirstConsumer` (claims of an
/// `Immediate` class of it are left alone: a node-local volume needs a node). A claim of such a
/// class that the scheduler gave `volume.kubernetes.io/selected-node: N` gets, in order: a
/// directory `CSI_DIR/pvc-UID` on node N (root `nodes/N`, the kubelet stand-in's root), with a
/// sparse `block.img` of the requested size in it for a Block claim; a PV
/// `pvc-UID` with `local.path` there, node affinity `kubernetes.io/hostname In [N]`, the claim
/// in `claimRef`, the requested capacity, `Bound`; the claim's `spec.volumeName` and binding
/// annotations; the claim's status `Bound` with capacity and access modes. Each step is
/// idempotent and retried on the next claim or class event when it fails.
#[allow(dead_code)]
pub fn csi(client: kube::Client, nodes: &Path) -> Task {
    let nodes = nodes.to_owned();
    Task(tokio::spawn(async move {
        let (claims, cw) = reflector::store::<PersistentVolumeClaim>();
        let (classes, sw) = reflector::store::<StorageClass>();
        let mut events = futures::stream::select(
            reflector::reflector(cw, watcher(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default()))
                .default_backoff()
                .map(|_| ())
                .boxed(),
            reflector::reflector(sw, watcher(Api::<StorageClass>::all(client.clone()), watcher::Config::default()))
                .default_backoff()
                .map(|_| ())
                .boxed(),
        );
        while events.next().await.is_some() {
            for claim in claims.state() {
                let spec = claim.spec.clone().unwrap_or_default();
                let pending = !api::phases::ClaimPhase::is_bound(&claim);
                let class = spec.storage_class_name.as_deref().and_then(|c| classes.get(&ObjectRef::new(c)));
                let ours = class
                    .as_ref()
                    .is_some_and(|c| c.provisioner == CSI_PROVISIONER && c.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER));
                let Some(node) = claim.annotations().get(SELECTED_NODE).filter(|_| ours && pending) else { continue };
                if let Err(e) = provision(&client, &claim, &nodes.join(node), node).await {
                    eprintln!("stand-in CSI: claim {}/{}: {e}", claim.namespace().unwrap_or_default(), claim.name_any());
                }
            }
        }
    }))
}

/// [`csi`]'s steps for one claim on `node`, whose root is `node_root`.
async fn provision(client: &kube::Client, claim: &PersistentVolumeClaim, node_root: &Path, node: &str) -> Result<(), String> {
    let (ns, name, uid) = (claim.namespace().unwrap_or_default(), claim.name_any(), claim.uid().ok_or("no uid")?);
    let spec = claim.spec.clone().unwrap_or_default();
    let size = spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).ok_or("no storage request")?;
    let modes = spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
    let pv_name = format!("pvc-{uid}");
    let path = format!("{CSI_DIR}/{pv_name}");
    let dir = PathBuf::from(format!("{}{path}", node_root.display()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if spec.volume_mode.as_deref() == Some("Block") {
        // A block volume: its bytes, which the kubelet attaches to a loop device.
        let bytes = api::quantity::bytes(&size.0)?;
        let img = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("block.img"));
        img.and_then(|f| f.set_len(bytes)).map_err(|e| format!("{}/block.img: {e}", dir.display()))?;
    }
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": CSI_PROVISIONER}},
        "spec": {"capacity": {"storage": size}, "accessModes": modes, "volumeMode": spec.volume_mode.clone().unwrap_or_else(|| "Filesystem".into()),
                 "local": {"path": path}, "storageClassName": spec.storage_class_name, "persistentVolumeReclaimPolicy": "Delete",
                 "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": uid},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [
                     {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}});
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    match pvs.create(&PostParams::default(), &serde_json::from_value(pv).map_err(|e| e.to_string())?).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {} // made on an earlier pass
        Err(e) => return Err(format!("create PV {pv_name}: {e}")),
    }
    let bound = json!({"status": {"phase": "Bound"}});
    pvs.patch_status(&pv_name, &PatchParams::default(), &Patch::Merge(bound)).await.map_err(|e| format!("PV {pv_name} Bound: {e}"))?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let annotations: BTreeMap<&str, &str> =
        BTreeMap::from([("pv.kubernetes.io/bind-completed", "yes"), ("pv.kubernetes.io/bound-by-controller", "yes")]);
    let volume = json!({"metadata": {"annotations": annotations}, "spec": {"volumeName": pv_name}});
    claims.patch(&name, &PatchParams::default(), &Patch::Merge(volume)).await.map_err(|e| format!("claim's volumeName: {e}"))?;
    let status = json!({"status": {"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}}});
    claims.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.map_err(|e| format!("claim Bound: {e}"))?;
    Ok(())
}

/// What [`cdi`] writes at the start of the volume it "imports", standing in for an image's bytes.
#[allow(dead_code)]
pub const CDI_IMPORTED: &[u8; 16] = b"VP-CDI-IMPORTED!";

/// STAND-IN for CDI's DataVolume controller and importer (virtplug's controller leaves
/// DataVolumes to CDI in a cluster), for DataVolumes whose claim is of a class [`csi`] serves:
/// it creates the DataVolume's claim (same name, owned by it, from `spec.storage` or
/// `spec.pvc`); while the claim is unbound the DataVolume's phase is `WaitForFirstConsumer`
/// (CDI's `honorWaitForFirstConsumer`); once the claim is bound it "imports" — writes
/// [`CDI_IMPORTED`] at the start of `disk.img` in the claim's volume on the node its PV names
/// (`nodes/N/<local.path>`) and sizes it to the claim's request, whatever the source says —
/// and the phase goes `ImportInProgress`, then `Succeeded` at `100.0%`. Each step is idempotent
/// and retried on the next DataVolume, claim or PV event.
#[allow(dead_code)]
pub fn cdi(client: kube::Client, nodes: &Path) -> Task {
    let nodes = nodes.to_owned();
    Task(tokio::spawn(async move {
        let (dvs, dw) = reflector::store::<api::DataVolume>();
        let (claims, cw) = reflector::store::<PersistentVolumeClaim>();
        let (volumes, vw) = reflector::store::<PersistentVolume>();
        let mut events = futures::stream::select(
            futures::stream::select(
                reflector::reflector(dw, watcher(Api::<api::DataVolume>::all(client.clone()), watcher::Config::default()))
                    .default_backoff()
                    .map(|_| ())
                    .boxed(),
                reflector::reflector(cw, watcher(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default()))
                    .default_backoff()
                    .map(|_| ())
                    .boxed(),
            ),
            reflector::reflector(vw, watcher(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default()))
                .default_backoff()
                .map(|_| ())
                .boxed(),
        );
        while events.next().await.is_some() {
            for dv in dvs.state() {
                let phase = dv.status.as_ref().and_then(|s| s.phase.clone());
                if phase == Some(api::phases::DataVolumePhase::Succeeded) {
                    continue;
                }
                let ns = dv.namespace().unwrap_or_default();
                let claim = claims.get(&ObjectRef::new(&dv.name_any()).within(&ns));
                let pv = claim.as_ref().and_then(|c| c.spec.as_ref()?.volume_name.clone()).and_then(|n| volumes.get(&ObjectRef::new(&n)));
                if let Err(e) = cdi_step(&client, &dv, claim.as_deref(), pv.as_deref(), &nodes).await {
                    eprintln!("stand-in CDI: DataVolume {ns}/{}: {e}", dv.name_any());
                }
            }
        }
    }))
}

/// [`cdi`]'s next step for `dv`, whose claim (if made) is `claim`, bound to `pv` (if bound).
async fn cdi_step(
    client: &kube::Client,
    dv: &api::DataVolume,
    claim: Option<&PersistentVolumeClaim>,
    pv: Option<&PersistentVolume>,
    nodes: &Path,
) -> Result<(), String> {
    let (ns, name) = (dv.namespace().unwrap_or_default(), dv.name_any());
    let dvs: Api<api::DataVolume> = Api::namespaced(client.clone(), &ns);
    let set_phase = |phase: &'static str, progress: &'static str| {
        let dvs = dvs.clone();
        let name = name.clone();
        async move {
            let status = json!({"status": {"phase": phase, "progress": progress}});
            dvs.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.map_err(|e| format!("phase {phase}: {e}"))
        }
    };
    let Some(claim) = claim else {
        let spec = serde_json::to_value(&dv.spec).map_err(|e| e.to_string())?;
        let mut claim_spec = spec.get("storage").or_else(|| spec.get("pvc")).cloned().ok_or("neither spec.storage nor spec.pvc")?;
        claim_spec["accessModes"] = claim_spec.get("accessModes").cloned().unwrap_or_else(|| json!(["ReadWriteOnce"]));
        let owner = json!([{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": name, "uid": dv.uid(),
                            "controller": true, "blockOwnerDeletion": true}]);
        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": owner}, "spec": claim_spec});
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        return match claims.create(&PostParams::default(), &serde_json::from_value(pvc).map_err(|e| e.to_string())?).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(format!("create its claim: {e}")),
        };
    };
    let Some(pv) = pv.filter(|_| api::phases::ClaimPhase::is_bound(claim)) else {
        let phase = dv.status.as_ref().and_then(|s| s.phase.clone());
        if phase.is_none() || phase == Some(api::phases::DataVolumePhase::Pending) {
            set_phase("WaitForFirstConsumer", "N/A").await?;
        }
        return Ok(());
    };
    // The reflector's copy may be older than this task's own last write: the API decides.
    let fresh = dvs.get(&name).await.map_err(|e| format!("read: {e}"))?;
    if fresh.status.and_then(|s| s.phase) == Some(api::phases::DataVolumePhase::Succeeded) {
        return Ok(());
    }
    set_phase("ImportInProgress", "0.00%").await?;
    let spec = pv.spec.clone().unwrap_or_default();
    let path = spec.local.map(|l| l.path).ok_or("its PV has no local.path")?;
    let node = spec
        .node_affinity
        .and_then(|a| a.required)
        .and_then(|r| r.node_selector_terms.into_iter().next())
        .and_then(|t| t.match_expressions?.into_iter().next())
        .and_then(|e| e.values?.into_iter().next())
        .ok_or("its PV names no node")?;
    let size = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage").cloned())
        .ok_or("its claim has no storage request")?;
    let img = PathBuf::from(format!("{}{path}", nodes.join(&node).display())).join("disk.img");
    let mut f =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&img).map_err(|e| format!("{}: {e}", img.display()))?;
    std::io::Write::write_all(&mut f, CDI_IMPORTED).map_err(|e| format!("{}: {e}", img.display()))?;
    f.set_len(api::quantity::bytes(&size.0)?).map_err(|e| format!("{}: {e}", img.display()))?;
    f.sync_all().map_err(|e| format!("{}: {e}", img.display()))?;
    set_phase("Succeeded", "100.0%").await?;
    Ok(())
}
