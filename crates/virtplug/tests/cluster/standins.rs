//! STAND-INS for a cluster's own components, for the launcher-pod test (no real cluster here):
//! [`scheduler`] plays kube-scheduler, [`kubelet`] plays one node's kubelet. Both are tasks of
//! the test process talking to the real API server through kube-rs, as the real ones would.
//! Claims are a STAND-IN for network storage: claim `NS/NAME` is the directory
//! `ROOT/../csi/NS/NAME` (one for every node), Filesystem mode only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

/// A task aborted when dropped (the stand-in stops with the test).
pub struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// STAND-IN for kube-scheduler: binds every pod without `spec.nodeName` to a node that is
/// `Ready`, not cordoned, untainted (taints are not matched against tolerations: the launcher
/// test needs none) and whose labels match the pod's `nodeSelector` — of those, the one with the
/// fewest pods. It binds through `pods/binding`, as kube-scheduler does; a pod that fits no node
/// waits for the next pod or node change.
pub fn scheduler(client: kube::Client) -> Task {
    Task(tokio::spawn(async move {
        let (pods, pw) = reflector::store::<Pod>();
        let (nodes, nw) = reflector::store::<Node>();
        let pod_events = reflector::reflector(pw, watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())).default_backoff();
        let node_events = reflector::reflector(nw, watcher(Api::<Node>::all(client.clone()), watcher::Config::default())).default_backoff();
        let mut events = futures::stream::select(pod_events.map(|_| ()).boxed(), node_events.map(|_| ()).boxed());
        while events.next().await.is_some() {
            for pod in pods.state().iter().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none())) {
                if let Some(node) = fit(&pods, &nodes, pod) {
                    bind(&client, pod, &node).await;
                }
            }
        }
    }))
}

fn fit(pods: &Store<Pod>, nodes: &Store<Node>, pod: &Pod) -> Option<String> {
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
        })
        .map(|n| n.name_any())
        .min_by_key(|n| (load(n), n.clone()))
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
}

/// STAND-IN for node `node`'s kubelet: runs each pod bound to the node as a local process — the
/// container's `command` and `args` (`virtplug` is this build's binary: the image's stand-in),
/// its `env`, stdout and stderr in `ROOT/pods/UID.log` — and reports the pod's status (`Running`;
/// `Succeeded` or `Failed` with the exit code when the process ends). A pod that is gone from
/// the API gets SIGTERM, then SIGKILL after its grace (the embedded API server deletes pods at
/// once: it has no graceful pod deletion, so there is nothing left to finalize).
///
/// No container runtime: the node's file system is `root` (hostPath `P` is `ROOT/P`, created
/// for `DirectoryOrCreate`), and a container path under a volume mount is rewritten to its host
/// path in the command line (standing in for the mount). A pod with hostPath volumes only (a
/// launcher pod) runs in a PID namespace of its own, as a container runtime runs a pod
/// (`unshare --pid --fork --mount-proc --kill-child`): its processes' PIDs there (QEMU's
/// pidfile) are not their PIDs on the node. A pod with claim or emptyDir volumes
/// (an attachment pod) runs in a mount namespace and root of its own instead ([`start_isolated`]):
/// a tmpfs with the host's `/usr`, the claims' directories bind-mounted at their mount paths
/// and each emptyDir at its mount path, backed by
/// `ROOT/var/lib/kubelet/pods/UID/volumes/kubernetes.io~empty-dir/NAME` (the kubelet's layout).
/// When such a pod is deleted while a process still holds a file of a claim no other pod on
/// the node mounts, a line goes to `ROOT/detached-in-use`: on real storage the claim would be
/// detached under that process (a guest I/O error); tests assert the file stays absent.
pub fn kubelet(client: kube::Client, node: &str, root: &Path) -> Task {
    let (node, root) = (node.to_owned(), root.to_owned());
    Task(tokio::spawn(async move {
        let (pods, writer) = reflector::store::<Pod>();
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let mut events = reflector::reflector(writer, watcher(Api::<Pod>::all(client.clone()), cfg)).default_backoff().boxed();
        let mut running: HashMap<String, Running> = HashMap::new();
        while events.next().await.is_some() {
            let present = pods.state();
            for pod in &present {
                let uid = pod.uid().unwrap_or_default();
                let finished = pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Succeeded" || p == "Failed");
                if !running.contains_key(&uid) && !finished {
                    match start(&client, pod, &root).await {
                        Ok(r) => {
                            running.insert(uid, r);
                        }
                        Err(e) => report(&client, pod, json!({"phase": "Failed", "message": e})).await,
                    }
                }
            }
            let gone: Vec<String> =
                running.keys().filter(|u| !present.iter().any(|p| p.uid().as_deref() == Some(u.as_str()))).cloned().collect();
            for uid in gone {
                let r = running.remove(&uid).unwrap();
                // A claim no other pod here still mounts is detached from the node: a
                // process (QEMU) holding a file of it would lose its I/O on real storage.
                for dir in r.claims.iter().filter(|d| !running.values().any(|o| o.claims.contains(d))) {
                    for holder in holders_under(dir) {
                        let line = format!("pod {uid} deleted while {holder} holds a file of claim {}\n", dir.display());
                        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(root.join("detached-in-use")).unwrap();
                        std::io::Write::write_all(&mut f, line.as_bytes()).unwrap();
                    }
                }
                tokio::spawn(kill(r));
            }
        }
    }))
}

/// SIGTERM to the pod's main process, the grace, SIGKILL (by PID, the process the kubelet
/// started: with `--kill-child`, its SIGKILL takes the pod's main process along).
async fn kill(r: Running) {
    let Some(pid) = rustix::process::Pid::from_raw(r.pid).filter(|_| !r.waiter.is_finished()) else { return };
    let main = if r.forked { child_of(r.pid).and_then(rustix::process::Pid::from_raw) } else { Some(pid) };
    if let Some(main) = main {
        let _ = rustix::process::kill_process(main, rustix::process::Signal::TERM);
    }
    let mut waiter = r.waiter;
    if tokio::time::timeout(r.grace, &mut waiter).await.is_err() {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        let _ = waiter.await;
    }
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

async fn start(client: &kube::Client, pod: &Pod, root: &Path) -> Result<Running, String> {
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
    let (mut cmd, claims) = if isolated {
        start_isolated(pod, root, &argv)?
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
    Ok(Running { pid, forked: !isolated, grace, waiter, claims })
}

/// Merges `status` into the pod's status (a pod deleted meanwhile: nothing to report).
async fn report(client: &kube::Client, pod: &Pod, status: serde_json::Value) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let _ = api.patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(json!({"status": status}))).await;
}

/// The command running `argv` in a mount namespace and root of its own (see [`kubelet`]), and
/// the claim directories it mounts. `unshare` execs (no fork), so the PID is the pod's process.
fn start_isolated(pod: &Pod, root: &Path, argv: &[String]) -> Result<(tokio::process::Command, Vec<PathBuf>), String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let c = spec.containers.first().ok_or("no container")?;
    let uid = pod.uid().unwrap_or_default();
    let pod_root = root.join("pod-roots").join(&uid);
    std::fs::create_dir_all(&pod_root).map_err(|e| format!("{}: {e}", pod_root.display()))?;
    let mut binds: Vec<(PathBuf, String)> = Vec::new();
    let mut claims = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let v = spec.volumes.iter().flatten().find(|v| v.name == m.name).ok_or(format!("no volume {}", m.name))?;
        let host = if let Some(pvc) = &v.persistent_volume_claim {
            let dir = root.join("../csi").join(pod.namespace().unwrap_or_default()).join(&pvc.claim_name);
            claims.push(dir.clone());
            dir
        } else if v.empty_dir.is_some() {
            root.join("var/lib/kubelet/pods").join(&uid).join("volumes/kubernetes.io~empty-dir").join(&v.name)
        } else {
            return Err(format!("volume {}: only claims and emptyDirs in an isolated pod", v.name));
        };
        std::fs::create_dir_all(&host).map_err(|e| format!("{}: {e}", host.display()))?;
        binds.push((host, m.mount_path.clone()));
    }
    let script = r#"set -e
R="$1"; BIN="$2"; shift 2
mount -t tmpfs pod-root "$R"
mkdir -p "$R/usr"
mount --rbind /usr "$R/usr"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$R/$d"; done
touch "$R/virtplug"; mount --bind "$BIN" "$R/virtplug"
while [ "$1" != "--" ]; do mkdir -p "$R$2"; mount --bind "$1" "$R$2"; shift 2; done
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
    Ok((cmd, claims))
}

/// The processes (`PID (comm)`) holding a file of `dir` open, matched by device and inode
/// through `/proc/*/fd` (a path would not do: the file was opened in another mount namespace).
fn holders_under(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let files: Vec<(u64, u64)> =
        std::fs::read_dir(dir).into_iter().flatten().flatten().filter_map(|e| e.metadata().ok()).map(|m| (m.dev(), m.ino())).collect();
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
