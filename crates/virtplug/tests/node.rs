//! The node agent with real QEMU (TCG) and the test guest, the real controller and provisioner,
//! and the real embedded API server: hot-plug by fd handoff seen from inside the guest, the
//! phases of `volumeStatus`, agent restarts, and the seed bug (nothing left mounted, storage
//! free the moment QEMU is gone).
//!
//! Every QEMU the agent starts for a test is killed by PID when the test ends (pass or fail);
//! loop devices under the test's storage root are detached; mounts the test made are unmounted.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::TestServer;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use api::phases::VolumePhase;
use api::{VirtualMachine, VirtualMachineInstance};

const BOOT: Duration = Duration::from_secs(120);
const SEE: Duration = Duration::from_secs(60);

struct Env {
    s: TestServer,
    dir: tempfile::TempDir,
    vms: Api<VirtualMachine>,
    vmis: Api<VirtualMachineInstance>,
    pvcs: Api<PersistentVolumeClaim>,
    ctl: tokio::task::JoinHandle<()>,
    agent: Option<tokio::task::JoinHandle<()>>,
    /// Every request the agent sent but its watches: `METHOD path`.
    agent_requests: common::Requests,
    /// Bind-mount mode: the test's own devices cgroup directory (removed when dropped).
    cgroup: Option<PathBuf>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.ctl.abort();
        if let Some(a) = self.agent.take() {
            a.abort();
        }
        // Kill by PID only the QEMUs started for this test (their run dirs are ours).
        for dir in std::fs::read_dir(self.state_dir().join("vmis")).into_iter().flatten().flatten() {
            if let Ok(p) = qemu::process::adopt(&dir.path()) {
                if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
                    let exit = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty());
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    // Gone before its cgroup is removed below.
                    if let Ok(fd) = exit {
                        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
                        let _ = rustix::event::poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 10, tv_nsec: 0 }));
                    }
                }
            }
        }
        if let Some(cg) = &self.cgroup {
            for d in std::fs::read_dir(cg).into_iter().flatten().flatten().filter(|d| d.path().is_dir()) {
                let _ = std::fs::remove_dir(d.path());
            }
            let _ = std::fs::remove_dir(cg);
        }
        for (dev, _) in controller::storage::loopdev::under(&self.storage_root()) {
            let _ = controller::storage::loopdev::detach(&dev);
        }
    }
}

impl Env {
    async fn start() -> Env {
        Self::start_in(tempfile::tempdir().unwrap()).await
    }

    /// An agent in bind-mount mode, with a devices cgroup of the test's own under `hierarchy`
    /// (cgroup v1's devices controller or a cgroup v2 mount).
    async fn start_bind_in(dir: tempfile::TempDir, hierarchy: &Path) -> Env {
        let cgroup = hierarchy.join(format!("virtplug-test-{:016x}", rand::random::<u64>()));
        Self::start_with(dir, Some(cgroup)).await
    }

    async fn start_in(dir: tempfile::TempDir) -> Env {
        Self::start_with(dir, None).await
    }

    async fn start_with(dir: tempfile::TempDir, cgroup: Option<PathBuf>) -> Env {
        let s = TestServer::start().await;
        std::fs::create_dir_all(dir.path().join("storage")).unwrap();
        // The tests' image servers are on loopback, which imports refuse unless allowed.
        let import = controller::storage::import::ImportConfig { allow_hosts: vec!["127.0.0.1".parse().unwrap()], ..Default::default() };
        let config = controller::run::Config { storage_root: Some(dir.path().join("storage")), import, ..Default::default() };
        let ctl = tokio::spawn(controller::run::run_with(client::in_process(s.server.local_router()), config));
        let mut e = Env {
            vms: Api::namespaced(s.client.clone(), "default"),
            vmis: Api::namespaced(s.client.clone(), "default"),
            pvcs: Api::namespaced(s.client.clone(), "default"),
            s,
            dir,
            ctl,
            agent: None,
            agent_requests: common::Requests::default(),
            cgroup,
        };
        e.start_agent();
        e
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("node")
    }

    fn storage_root(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    fn start_agent(&mut self) {
        self.start_agent_with(node::backoff::Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
            deadline: Duration::from_secs(5),
        });
    }

    fn start_agent_with(&mut self, backoff: node::backoff::Backoff) {
        let mut config = node::agent::Config::new("node-t", self.dir.path());
        config.accel = qemu::accel::Accel::Tcg;
        config.stop_grace = Duration::from_secs(2);
        config.backoff = backoff;
        config.kubelet_pods_dir = self.dir.path().join("pods");
        if let Some(cg) = &self.cgroup {
            config.mode = node::bindmount::AttachMode::BindMount;
            config.mount_helper = PathBuf::from(env!("CARGO_BIN_EXE_virtplug"));
            config.devices_cgroup = cg.clone();
        }
        let (counted, log) = common::counted(self.s.server.local_router());
        self.agent_requests = log;
        let client = client::in_process(counted);
        self.agent = Some(tokio::spawn(async move {
            common::fakenode::kubelet(&client, "node-t").await;
            node::agent::run(client, config).await.unwrap();
        }));
    }

    /// Replaces the agent by one whose backoff is 10 minutes: within a test only a wake-up
    /// (a watch event, a mount) can make it retry a waiting volume.
    async fn restart_agent_without_retries(&mut self) {
        self.kill_agent().await;
        let long = Duration::from_secs(600);
        self.start_agent_with(node::backoff::Backoff { base: long, cap: long, deadline: long });
    }

    /// The agent dies (its task is dropped mid-flight, as with `kill -9` of its process): no
    /// cleanup code of it runs; QEMU is a separate process and keeps running.
    async fn kill_agent(&mut self) {
        if let Some(a) = self.agent.take() {
            a.abort();
            let _ = a.await;
        }
    }

    async fn claim(&self, name: &str, size: &str, mode: &str) -> PersistentVolumeClaim {
        let c = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                       "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode, "resources": {"requests": {"storage": size}}}});
        self.pvcs.create(&PostParams::default(), &serde_json::from_value(c).unwrap()).await.unwrap();
        let pvcs = self.pvcs.clone();
        common::wait_until(SEE, &format!("claim {name} bound"), || {
            let pvcs = pvcs.clone();
            async move { pvcs.get(name).await.ok().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")) }
        })
        .await
    }

    /// Creates a running VM booting the test guest; returns its running VMI.
    async fn vm(&self, name: &str) -> VirtualMachineInstance {
        let g = common::guest::guest_dir();
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
            "spec": {"runStrategy": "Always", "template": {"spec": {
                "terminationGracePeriodSeconds": 1,
                "domain": {"resources": {"requests": {"memory": "256Mi"}}, "devices": {"disks": []},
                           "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable",
                               "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}},
                "volumes": []}}}});
        self.vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
        let vmis = self.vmis.clone();
        let vmi = common::wait_until(BOOT, &format!("VMI {name} running"), || {
            let vmis = vmis.clone();
            async move { vmis.get_opt(name).await.ok().flatten().filter(VirtualMachineInstance::is_running) }
        })
        .await;
        self.see(&vmi, "the guest ready", |l| l.starts_with("VP-READY")).await;
        vmi
    }

    fn run_dir(&self, vmi: &VirtualMachineInstance) -> PathBuf {
        self.state_dir().join("vmis").join(vmi.uid().unwrap())
    }

    /// Waits for a serial-console line of the VMI's guest matching `pred` (the log QEMU writes).
    async fn see(&self, vmi: &VirtualMachineInstance, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let log = self.run_dir(vmi).join("serial.log");
        common::wait_until(SEE, what, || {
            let hit = common::guest::console_lines(&log).into_iter().find(|l| pred(l));
            async move { hit }
        })
        .await
    }

    fn lines(&self, vmi: &VirtualMachineInstance) -> Vec<String> {
        common::guest::console_lines(&self.run_dir(vmi).join("serial.log"))
    }

    async fn patch_vm(&self, name: &str, ops: Value) {
        self.vms.patch(name, &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(ops).unwrap())).await.unwrap();
    }

    async fn volume_status(&self, name: &str, volume: &str, phase: VolumePhase) -> api::kubevirt::VolumeStatus {
        let vmis = self.vmis.clone();
        common::wait_until(SEE, &format!("volume {volume} {phase}"), || {
            let (vmis, phase) = (vmis.clone(), phase.clone());
            async move {
                vmis.get(name).await.ok()?.status?.volume_status.into_iter().find(|v| v.name == volume && v.phase.as_ref() == Some(&phase))
            }
        })
        .await
    }

    async fn volume_gone(&self, name: &str, volume: &str) {
        let vmis = self.vmis.clone();
        common::wait_until(SEE, &format!("volume {volume} gone from volumeStatus"), || {
            let vmis = vmis.clone();
            async move { vmis.get(name).await.ok()?.status?.volume_status.iter().all(|v| v.name != volume).then_some(()) }
        })
        .await;
    }
}

impl Env {
    /// Adds a hot-plug disk and its volume to the VM's spec (a JSON patch like `kubectl patch
    /// --type=json`; an empty list is omitted from the object, so the first add creates it).
    async fn add(&self, vm: &str, volume: &str, claim: &str) {
        let cur = serde_json::to_value(self.vms.get(vm).await.unwrap()).unwrap();
        let path = |list: &str| {
            let ptr = format!("/spec/template/spec{list}");
            if cur.pointer(&ptr).and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
                (format!("{ptr}/-"), false)
            } else {
                (ptr, true)
            }
        };
        let disk = json!({"name": volume, "disk": {"bus": "scsi"}, "serial": volume});
        let vol = json!({"name": volume, "persistentVolumeClaim": {"claimName": claim, "hotpluggable": true}});
        let (dp, dnew) = path("/domain/devices/disks");
        let (vp, vnew) = path("/volumes");
        self.patch_vm(
            vm,
            json!([
                {"op": "add", "path": dp, "value": if dnew { json!([disk]) } else { disk }},
                {"op": "add", "path": vp, "value": if vnew { json!([vol]) } else { vol }}
            ]),
        )
        .await;
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The device name in a `BLOCK+ sdX ...` line.
fn dev_of(line: &str) -> String {
    line.split_whitespace().nth(1).unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_and_block_claims_plug_into_a_running_guest_and_unplug() {
    let e = Env::start().await;
    let fs = e.claim("fsdata", "64Mi", "Filesystem").await;
    let fs_img = Path::new(&fs.metadata.annotations.as_ref().unwrap()["virtplug.io/local-path"]).join("disk.img");
    std::fs::write(&fs_img, b"VP-FILESYSTEM-01").unwrap();
    std::fs::File::options().write(true).open(&fs_img).unwrap().set_len(64 << 20).unwrap();
    let block = if common::guest::is_root() {
        let b = e.claim("blkdata", "32Mi", "Block").await;
        let dev = PathBuf::from(&b.metadata.annotations.as_ref().unwrap()["virtplug.io/loop-device"]);
        std::io::Write::write_all(&mut std::fs::File::options().write(true).open(&dev).unwrap(), b"VP-BLOCKDEVICE01").unwrap();
        true
    } else {
        eprintln!("not root: the Block claim is left out (loop devices need root)");
        false
    };

    let vmi = e.vm("guest").await;
    e.agent_requests.lock().unwrap().clear();
    e.add("guest", "fsdata", "fsdata").await;
    if block {
        e.add("guest", "blkdata", "blkdata").await;
    }

    // From inside the guest: both disks, with the claim's size and content, by serial.
    let fs_line = e.see(&vmi, "the Filesystem claim in the guest", |l| l.starts_with("BLOCK+") && l.contains("id=serial.fsdata")).await;
    assert!(fs_line.contains(&format!(" {} ", 64u64 << 20 >> 9)), "64 MiB in 512-byte sectors: {fs_line}");
    assert!(fs_line.contains(&hex(b"VP-FILESYSTEM-01")), "the claim's bytes: {fs_line}");
    let blk_line = if block {
        let l = e.see(&vmi, "the Block claim in the guest", |l| l.starts_with("BLOCK+") && l.contains("id=serial.blkdata")).await;
        assert!(l.contains(&format!(" {} ", 32u64 << 20 >> 9)), "32 MiB: {l}");
        assert!(l.contains(&hex(b"VP-BLOCKDEVICE01")), "the device's bytes: {l}");
        Some(l)
    } else {
        None
    };

    // volumeStatus walked Bound → AttachedToNode → MountedToPod (block node in QEMU) → Ready,
    // with a timestamp per phase.
    let st = e.volume_status("guest", "fsdata", VolumePhase::Ready).await;
    let (bound, attached, ready) = (
        st.entered(&VolumePhase::Bound).unwrap(),
        st.entered(&VolumePhase::AttachedToNode).unwrap(),
        st.entered(&VolumePhase::Ready).unwrap(),
    );
    let mounted = st.entered(&VolumePhase::MountedToPod).unwrap();
    assert!(bound <= attached && attached <= mounted && mounted <= ready, "{st:?}");
    assert_eq!(st.reason, Some(api::phases::VolumeReason::VolumeReady));
    assert_eq!(st.persistent_volume_claim_info.as_ref().unwrap().claim_name.as_deref(), Some("fsdata"));
    if block {
        e.volume_status("guest", "blkdata", VolumePhase::Ready).await;
    }
    // The claims were bound before the VM started: the agent's storage watch had them, and the
    // hot-plugs read neither claim from the API (the counted requests are the agent's: its
    // status writes are among them).
    let sent = e.agent_requests.lock().unwrap().clone();
    assert!(sent.iter().any(|r| r.starts_with("PATCH ") && r.ends_with("/virtualmachineinstances/guest/status")), "{sent:?}");
    let reads: Vec<&String> = sent.iter().filter(|r| r.starts_with("GET ") && r.contains("/persistentvolumeclaims/")).collect();
    assert!(reads.is_empty(), "the agent read claims on the hot-plug's path: {reads:?}");

    // Removed from the spec: the guest loses them, the entries go with a VolumeUnplugged Event.
    let names: Vec<String> = e.vms.get("guest").await.unwrap().spec.template.spec.unwrap().volumes.iter().map(|v| v.name.clone()).collect();
    let mut ops = Vec::new();
    for i in (0..names.len()).rev() {
        ops.push(json!({"op": "remove", "path": format!("/spec/template/spec/volumes/{i}")}));
        ops.push(json!({"op": "remove", "path": format!("/spec/template/spec/domain/devices/disks/{i}")}));
    }
    e.patch_vm("guest", Value::Array(ops)).await;
    let fs_dev = dev_of(&fs_line);
    e.see(&vmi, "the Filesystem disk gone", |l| l.starts_with(&format!("BLOCK- {fs_dev} "))).await;
    if let Some(l) = &blk_line {
        let d = dev_of(l);
        e.see(&vmi, "the Block disk gone", |x| x.starts_with(&format!("BLOCK- {d} "))).await;
        e.volume_gone("guest", "blkdata").await;
    }
    e.volume_gone("guest", "fsdata").await;
    let unplugged = client::events::list(&e.s.client, "default", "guest", "VolumeUnplugged").await.unwrap();
    assert_eq!(unplugged.len(), if block { 2 } else { 1 });

    // The VM never restarted: same VMI, one boot.
    assert_eq!(e.vmis.get("guest").await.unwrap().uid(), vmi.uid());
    // Every QEMU thread runs at the configured nice value (5): the VM yields to the control plane.
    let q = qemu::process::adopt(&e.run_dir(&vmi)).unwrap();
    for t in std::fs::read_dir(format!("/proc/{}/task", q.pid)).unwrap().flatten() {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap();
        let nice: i32 = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(16).unwrap().parse().unwrap();
        assert_eq!(nice, 5, "thread {:?}", t.file_name());
    }
    assert_eq!(e.lines(&vmi).iter().filter(|l| l.starts_with("VP-READY")).count(), 1);

    // Stopped: QEMU goes, then the VMI (the agent removed the finalizer).
    let pid = qemu::process::adopt(&e.run_dir(&vmi)).unwrap();
    e.vms.delete("guest", &DeleteParams::default()).await.unwrap();
    common::wait_until(SEE, "the VMI gone", || {
        let vmis = e.vmis.clone();
        async move { matches!(vmis.get_opt("guest").await, Ok(None)).then_some(()) }
    })
    .await;
    assert!(!pid.alive(), "QEMU stopped");
    assert!(!e.run_dir(&vmi).exists(), "its run dir removed");
}

/// Restart safety: the agent dies with a VM running; the VM spec changes meanwhile; a new
/// agent adopts the same QEMU (no restart of the guest), plugs what was added, and a VM
/// deleted while no agent ran is stopped by the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_adopts_running_vms_and_catches_up() {
    let mut e = Env::start().await;
    e.claim("late", "16Mi", "Filesystem").await;
    let vmi = e.vm("keep").await;
    let qemu_before = qemu::process::adopt(&e.run_dir(&vmi)).unwrap();

    e.kill_agent().await;
    e.add("keep", "late", "late").await;
    // With no agent, nothing is plugged (the controller did its part: the VMI spec has it).
    let vmis = e.vmis.clone();
    common::wait_until(SEE, "the VMI spec to carry the volume", || {
        let vmis = vmis.clone();
        async move { vmis.get("keep").await.ok().filter(|v| v.spec.volumes.iter().any(|x| x.name == "late")) }
    })
    .await;
    assert!(!e.lines(&vmi).iter().any(|l| l.contains("id=serial.late")));

    e.start_agent();
    e.see(&vmi, "the volume added while the agent was down", |l| l.starts_with("BLOCK+") && l.contains("id=serial.late")).await;
    e.volume_status("keep", "late", VolumePhase::Ready).await;
    let qemu_after = qemu::process::adopt(&e.run_dir(&vmi)).unwrap();
    assert_eq!(qemu_after.pid, qemu_before.pid, "the same QEMU, adopted");
    assert_eq!(e.lines(&vmi).iter().filter(|l| l.starts_with("VP-READY")).count(), 1, "the guest never rebooted");

    // Deleted while no agent runs: the VMI waits (finalizer); the next agent stops QEMU.
    e.kill_agent().await;
    e.vms.delete("keep", &DeleteParams::default()).await.unwrap();
    let vmis = e.vmis.clone();
    common::wait_until(SEE, "the VMI marked for deletion", || {
        let vmis = vmis.clone();
        async move { vmis.get_opt("keep").await.ok().flatten().filter(|v| v.metadata.deletion_timestamp.is_some()) }
    })
    .await;
    assert!(qemu_after.alive(), "no agent: nothing stops the VM behind its back");
    e.start_agent();
    common::wait_until(SEE, "the VMI gone", || {
        let vmis = e.vmis.clone();
        async move { matches!(vmis.get_opt("keep").await, Ok(None)).then_some(()) }
    })
    .await;
    assert!(!qemu_after.alive());
}

/// A tmpfs mounted by the test; unmounted (lazily, if still busy) when dropped.
struct TmpfsMount(PathBuf);

impl TmpfsMount {
    /// Mounts a tmpfs at `at`, as a shared mount: VMs of concurrent bind-mount-mode tests run
    /// in namespaces that copy the host's mounts, and only a shared mount's copies go when the
    /// test unmounts it (the agent does the same to its storage root in bind-mount mode).
    fn new(at: &Path) -> TmpfsMount {
        std::fs::create_dir_all(at).unwrap();
        rustix::mount::mount("tmpfs", at, "tmpfs", rustix::mount::MountFlags::empty(), Some(c"size=256m")).unwrap();
        let m = TmpfsMount(at.to_owned());
        let host = node::bindmount::Host { helper: PathBuf::from(env!("CARGO_BIN_EXE_virtplug")) };
        assert!(node::bindmount::share_storage_root(&host, at).unwrap());
        m
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

/// The seed bug (KubeVirt 2040235), as a test: the claims live on their own filesystem; a disk
/// is hot-plugged; the node agent is killed, then the VM dies. KubeVirt leaves a bind mount
/// behind that keeps the filesystem busy forever; here the filesystem unmounts at once, and no
/// mount made by virtplug exists in any namespace. While QEMU runs, the filesystem cannot be
/// unmounted (EBUSY): a running VM's disk cannot be yanked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_agent_is_gone_and_the_vm_dies_the_storage_unmounts_at_once() {
    if !common::guest::is_root() {
        eprintln!("skipped: mounting the storage filesystem needs root");
        return;
    }
    seed_bug_scenario(None).await;
}

/// The seed bug with the agent in bind-mount mode (`hierarchy`: its devices cgroup hierarchy) or
/// fd mode (`None`).
async fn seed_bug_scenario(hierarchy: Option<&Path>) {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("storage");
    let mount = TmpfsMount::new(&storage);
    let mut e = match hierarchy {
        Some(h) => Env::start_bind_in(dir, h).await,
        None => Env::start_in(dir).await,
    };
    e.claim("seed", "32Mi", "Filesystem").await;
    let vmi = e.vm("seed").await;
    e.add("seed", "seed", "seed").await;
    e.see(&vmi, "the disk in the guest", |l| l.starts_with("BLOCK+") && l.contains("id=serial.seed")).await;
    let q = qemu::process::adopt(&e.run_dir(&vmi)).unwrap();
    if hierarchy.is_some() {
        // The bind mount exists, in QEMU's namespace.
        assert!(mount_points(q.pid).contains(&e.run_dir(&vmi).join("hotplug/seed")));
    } else {
        // While QEMU holds the disk's fd, the filesystem is busy: a running VM's disk cannot be
        // yanked. (In bind-mount mode QEMU holds it through its namespace's own clone instead.)
        let busy = rustix::mount::unmount(&storage, rustix::mount::UnmountFlags::empty());
        assert_eq!(busy, Err(rustix::io::Errno::BUSY), "a running VM's storage must not unmount");
    }

    // The agent is killed; then the VM dies.
    e.kill_agent().await;
    rustix::process::kill_process(rustix::process::Pid::from_raw(q.pid).unwrap(), rustix::process::Signal::KILL).unwrap();
    assert!(q.wait_gone(Duration::from_secs(10)).await, "QEMU exits");

    // At once: the first unmount succeeds, and nothing of ours is mounted anywhere.
    rustix::mount::unmount(&storage, rustix::mount::UnmountFlags::empty()).expect("the storage filesystem unmounts at once");
    std::mem::forget(mount);
    assert_eq!(common::guest::mounts_under(e.dir.path()), Vec::<String>::new(), "no mount left in any namespace");
}

/// Storage that becomes ready late: the claim appears 5 s after the volume was added. The
/// backoff is set to 10 minutes, so only the claim watch can wake the agent in time — and it
/// attaches the volume; meanwhile the agent created no process (counted by the kernel's
/// process-event connector: no `findmnt`, no `mount`, nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_whose_storage_appears_late_attaches_on_the_watch_event_without_spawning_anything() {
    if !common::guest::is_root() {
        eprintln!("skipped: counting forks through the proc connector needs root");
        return;
    }
    let mut e = Env::start().await;
    e.restart_agent_without_retries().await;
    let vmi = e.vm("late").await;
    let forks = common::forks::ForkCounter::start(std::process::id());
    e.add("late", "later", "later").await;
    let waiting = e.volume_status("late", "later", VolumePhase::Pending).await;
    assert!(waiting.message.as_deref().unwrap_or("").contains("later"), "{waiting:?}");
    let m = node::metrics::get();
    assert_eq!(m.waiting.get(), 1, "the metrics count the waiting volume");
    assert!(m.failures.get() >= 1);
    // The scenario's delay (not a synchronisation): the claim is created 5 s later.
    tokio::time::sleep(Duration::from_secs(5)).await;
    e.claim("later", "16Mi", "Filesystem").await;
    e.see(&vmi, "the late disk in the guest", |l| l.starts_with("BLOCK+") && l.contains("id=serial.later")).await;
    e.volume_status("late", "later", VolumePhase::Ready).await;
    assert_eq!(node::metrics::get().waiting.get(), 0, "no volume waits once it is Ready");
    assert_eq!(
        forks.count(),
        0,
        "the node agent (and everything else in this process) created no process while the volume waited and attached"
    );
    // Control: the counter does see a process this process creates.
    std::process::Command::new("true").status().unwrap();
    common::wait_until(Duration::from_secs(5), "the control fork to be counted", || {
        let n = forks.count();
        async move { (n == 1).then_some(()) }
    })
    .await;
}

/// Path safety: a claim whose `disk.img` was replaced by a symlink to a file outside it is
/// refused with the reason, and nothing is attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_disk_image_is_refused_with_the_reason() {
    let e = Env::start().await;
    let pvc = e.claim("evil", "16Mi", "Filesystem").await;
    let dir = PathBuf::from(&pvc.metadata.annotations.as_ref().unwrap()["virtplug.io/local-path"]);
    let outside = e.dir.path().join("secret.img");
    std::fs::write(&outside, vec![0x5a; 1 << 20]).unwrap();
    std::fs::remove_file(dir.join("disk.img")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("disk.img")).unwrap();
    let vmi = e.vm("safe").await;
    e.add("safe", "evil", "evil").await;
    let vmis = e.vmis.clone();
    let st = common::wait_until(SEE, "the refusal in volumeStatus", || {
        let vmis = vmis.clone();
        async move {
            vmis.get("safe")
                .await
                .ok()?
                .status?
                .volume_status
                .into_iter()
                .find(|v| v.name == "evil" && v.reason == Some(api::phases::VolumeReason::HotplugFailed))
        }
    })
    .await;
    let msg = st.message.unwrap_or_default();
    assert!(msg.contains("symlink") && msg.contains("refusing"), "{msg}");
    let events = client::events::list(&e.s.client, "default", "safe", "HotplugFailed").await.unwrap();
    assert_eq!(events.len(), 1);
    assert!(!e.lines(&vmi).iter().any(|l| l.contains("id=serial.evil")), "the guest got nothing");

    // A volume named with `..` never reaches the agent: the API refuses it, naming the field.
    let before = e.vms.get("safe").await.unwrap();
    let bad = json!([{"op": "add", "path": "/spec/template/spec/volumes/-",
                      "value": {"name": "../escape", "persistentVolumeClaim": {"claimName": "evil", "hotpluggable": true}}}]);
    match e.vms.patch("safe", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(bad).unwrap())).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("volumes[1].name") && s.message.contains("DNS-1123"), "{}", s.message);
        }
        other => panic!("a volume named ../escape must be refused, got {other:?}"),
    }
    assert_eq!(e.vms.get("safe").await.unwrap().resource_version(), before.resource_version(), "nothing written");
}

/// The guest's current hot-plugged disks by serial, from its console log (BLOCK+ / BLOCK-).
fn guest_serials(lines: &[String]) -> std::collections::BTreeSet<String> {
    let mut by_dev: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for l in lines {
        let mut w = l.split_whitespace();
        match w.next() {
            Some("BLOCK+") => {
                let dev = w.next().unwrap_or_default().to_owned();
                if let Some(id) = l.split_whitespace().find_map(|t| t.strip_prefix("id=serial.")) {
                    by_dev.insert(dev, id.to_owned());
                }
            }
            Some("BLOCK-") => {
                by_dev.remove(w.next().unwrap_or_default());
            }
            _ => {}
        }
    }
    by_dev.into_values().collect()
}

/// File descriptors of `pid` that point under `dir`.
fn fds_under(pid: &str, dir: &Path) -> usize {
    fd_targets_under(pid, dir).len()
}

/// What process `pid`'s fds under `dir` point at (for failure messages).
fn fd_targets_under(pid: &str, dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).filter(|t| t.starts_with(dir)).collect())
        .unwrap_or_default()
}

/// The agent is killed at random points of attach and detach, 24 times, and restarted at once;
/// afterwards every volume the spec wants is in the guest and `Ready`, nothing else is, and no
/// fd, mount or loop device has leaked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_agent_at_random_points_loses_and_leaks_nothing() {
    use rand::{Rng, SeedableRng};
    let mut e = Env::start().await;
    let mut names: Vec<String> = Vec::new();
    for i in 0..3 {
        e.claim(&format!("r{i}"), "8Mi", "Filesystem").await;
        names.push(format!("r{i}"));
    }
    if common::guest::is_root() {
        e.claim("rb", "8Mi", "Block").await;
        names.push("rb".into());
    }
    let loops_before = controller::storage::loopdev::under(&e.storage_root()).len();
    let vmi = e.vm("chaos").await;
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut want: Vec<String> = Vec::new();
    for _ in 0..24 {
        want = names.iter().filter(|_| rng.random_bool(0.5)).cloned().collect();
        let disks: Vec<Value> = want.iter().map(|n| json!({"name": n, "disk": {"bus": "scsi"}, "serial": n})).collect();
        let vols: Vec<Value> =
            want.iter().map(|n| json!({"name": n, "persistentVolumeClaim": {"claimName": n, "hotpluggable": true}})).collect();
        e.patch_vm(
            "chaos",
            json!([{"op": "add", "path": "/spec/template/spec/domain/devices/disks", "value": disks},
                                     {"op": "add", "path": "/spec/template/spec/volumes", "value": vols}]),
        )
        .await;
        // The random kill point (the scenario, not a synchronisation): somewhere in the attach
        // or detach the change started.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
        e.kill_agent().await;
        e.start_agent();
    }
    let want_set: std::collections::BTreeSet<String> = want.iter().cloned().collect();
    common::wait_until(Duration::from_secs(120), &format!("the guest to have exactly {want_set:?}"), || {
        let got = guest_serials(&e.lines(&vmi));
        let ok = got == want_set;
        async move { ok.then_some(()) }
    })
    .await;
    let vmis = e.vmis.clone();
    let want2 = want_set.clone();
    common::wait_until(SEE, "volumeStatus to list exactly the wanted volumes, Ready", || {
        let (vmis, want) = (vmis.clone(), want2.clone());
        async move {
            let st = vmis.get("chaos").await.ok()?.status?.volume_status;
            let names: std::collections::BTreeSet<String> = st.iter().map(|v| v.name.clone()).collect();
            (names == want && st.iter().all(|v| v.phase == Some(VolumePhase::Ready))).then_some(())
        }
    })
    .await;
    let q = qemu::process::adopt(&e.run_dir(&vmi)).unwrap();
    assert_eq!(e.lines(&vmi).iter().filter(|l| l.starts_with("VP-READY")).count(), 1, "the guest never restarted");
    // QEMU may still finish an unplug an aborted agent started (its node freed by the next
    // agent's retry, at the base backoff, once QEMU lets go of the backend): wait for one fd per
    // attached file volume, with a deadline; a leak stays and is shown below.
    let want_fds = want.iter().filter(|n| *n != "rb").count();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let mut held = fd_targets_under(&q.pid.to_string(), &e.storage_root());
    while held.len() != want_fds && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = fd_targets_under(&q.pid.to_string(), &e.storage_root());
    }
    let claims: Vec<(String, String)> =
        e.pvcs.list(&Default::default()).await.unwrap().items.iter().map(|p| (p.name_any(), p.uid().unwrap_or_default())).collect();
    if held.len() != want_fds {
        // Say what QEMU holds: stop the agent (it owns the one QMP connection) and ask.
        e.kill_agent().await;
        let qmp = qemu::qmp::Qmp::connect_within(&e.run_dir(&vmi).join("qmp.sock"), Duration::from_secs(10)).await.unwrap();
        let mut state = String::new();
        for cmd in ["query-block", "query-named-block-nodes", "query-fdsets"] {
            state.push_str(&format!("{cmd}: {}\n", qmp.execute(cmd, json!({})).await.unwrap()));
        }
        panic!("QEMU holds one fd per attached file volume: it holds {held:?}; claims {claims:?}; wanted {want:?}\n{state}");
    }
    // An fd an aborted agent had in flight (open done, QMP not yet) is closed as its tasks
    // unwind: wait for that, with a deadline — a real leak stays and fails here.
    let root = e.storage_root();
    common::wait_until(Duration::from_secs(10), "the agent to hold no volume fd", || {
        let n = fds_under("self", &root);
        async move { (n == 0).then_some(()) }
    })
    .await;
    assert_eq!(controller::storage::loopdev::under(&e.storage_root()).len(), loops_before, "no loop device leaked");
    assert_eq!(common::guest::mounts_under(e.dir.path()), Vec::<String>::new(), "no mount anywhere");
}

/// A DataVolume imported over HTTP becomes the medium of the running VM's empty CD-ROM drive
/// (no device hot-plug: `blockdev-change-medium`), and is ejected when removed from the spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_iso_becomes_the_medium_of_the_empty_cdrom_drive_and_is_ejected() {
    let e = Env::start().await;
    let iso = std::fs::read(common::guest::guest_dir().join("guest.iso")).unwrap();
    let url = common::guest::serve_file(iso.clone()).await;
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "iso"},
                    "spec": {"source": {"http": {"url": url}}, "storage": {"resources": {"requests": {"storage": "64Mi"}}}}});
    let dvs: Api<api::DataVolume> = Api::namespaced(e.s.client.clone(), "default");
    dvs.create(&PostParams::default(), &serde_json::from_value(dv).unwrap()).await.unwrap();
    let g = common::guest::guest_dir();
    let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "cd"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "terminationGracePeriodSeconds": 1,
            "domain": {"resources": {"requests": {"memory": "256Mi"}}, "devices": {"disks": [{"name": "cd0", "cdrom": {"bus": "sata"}}]},
                       "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable",
                           "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}}}}}});
    e.vms.create(&PostParams::default(), &serde_json::from_value(vm).unwrap()).await.unwrap();
    let vmis = e.vmis.clone();
    let vmi = common::wait_until(BOOT, "VMI cd running", || {
        let vmis = vmis.clone();
        async move { vmis.get_opt("cd").await.ok().flatten().filter(VirtualMachineInstance::is_running) }
    })
    .await;
    e.see(&vmi, "the guest ready", |l| l.starts_with("VP-READY")).await;

    e.patch_vm("cd", json!([{"op": "add", "path": "/spec/template/spec/volumes", "value": [{"name": "cd0", "dataVolume": {"name": "iso", "hotpluggable": true}}]}])).await;
    let line = e.see(&vmi, "the medium in the guest", |l| l.starts_with("MEDIA") && l.contains(" in ")).await;
    assert!(line.contains(&hex(&iso[..16])), "the ISO's first bytes: {line}");
    let st = e.volume_status("cd", "cd0", VolumePhase::Ready).await;
    assert!(st.entered(&VolumePhase::Ready).is_some());

    e.patch_vm("cd", json!([{"op": "remove", "path": "/spec/template/spec/volumes"}])).await;
    // The drive reported "out" at boot too: the eject is an "out" after the "in".
    common::wait_until(SEE, "the medium ejected", || {
        let lines = e.lines(&vmi);
        let after_in = lines
            .iter()
            .position(|l| l.starts_with("MEDIA") && l.contains(" in "))
            .map(|i| lines[i + 1..].iter().any(|l| l.starts_with("MEDIA") && l.contains(" out")));
        async move { (after_in == Some(true)).then_some(()) }
    })
    .await;
    e.volume_gone("cd", "cd0").await;
    let spec = e.vmis.get("cd").await.unwrap().spec;
    assert!(spec.domain.devices.disks.iter().any(|d| d.name == "cd0"), "the drive stays");
    assert_eq!(e.vmis.get("cd").await.unwrap().uid(), vmi.uid(), "no restart");
}

impl Env {
    /// Removes volume `volume` (and its disk) from the VM's spec.
    async fn remove(&self, vm: &str, volume: &str) {
        let spec = self.vms.get(vm).await.unwrap().spec.template.spec.unwrap();
        let vi = spec.volumes.iter().position(|v| v.name == volume).unwrap();
        let di = spec.domain.devices.disks.iter().position(|d| d.name == volume).unwrap();
        self.patch_vm(
            vm,
            json!([
                {"op": "test", "path": format!("/spec/template/spec/volumes/{vi}/name"), "value": volume},
                {"op": "remove", "path": format!("/spec/template/spec/volumes/{vi}")},
                {"op": "test", "path": format!("/spec/template/spec/domain/devices/disks/{di}/name"), "value": volume},
                {"op": "remove", "path": format!("/spec/template/spec/domain/devices/disks/{di}")}
            ]),
        )
        .await;
    }
}

/// The mount points in the mount namespace of process `pid`.
fn mount_points(pid: i32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    node::mountinfo::parse(&text).unwrap().into_iter().map(|m| m.mount_point).collect()
}

const V1_DEVICES: &str = "/sys/fs/cgroup/devices";

/// The cgroup v2 mount of this host: `/sys/fs/cgroup` (unified) or `/sys/fs/cgroup/unified`
/// (hybrid, next to v1 controllers).
fn v2_hierarchy() -> Option<PathBuf> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"].into_iter().map(PathBuf::from).find(|p| p.join("cgroup.controllers").exists())
}

/// Root, and the hierarchy of the wanted cgroup version.
fn bind_mode_hierarchy(v2: bool) -> Option<PathBuf> {
    let h = if v2 { v2_hierarchy() } else { Some(PathBuf::from(V1_DEVICES)).filter(|p| p.join("devices.allow").exists()) };
    if !common::guest::is_root() || h.is_none() {
        eprintln!("skipped: needs root and a cgroup v{} hierarchy", if v2 { 2 } else { 1 });
        return None;
    }
    h
}

/// Whether a process in `cgroup` may read (or write) block device `dev`: a shell moves itself
/// into the cgroup, then `dd` tries the device.
fn probe(cgroup: &Path, dev: &Path, write: bool) -> bool {
    let io = if write {
        format!("if=/dev/zero of={} bs=512 count=1 conv=notrunc", dev.display())
    } else {
        format!("if={} of=/dev/null bs=512 count=1", dev.display())
    };
    let script = format!("echo $$ > {}/cgroup.procs && exec dd {io} status=none", cgroup.display());
    std::process::Command::new("sh").args(["-c", &script]).stderr(std::process::Stdio::null()).status().unwrap().success()
}

fn records(run_dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(run_dir.join("mounts.json")).unwrap_or_else(|_| "[]".into());
    let recs: Vec<node::bindmount::MountRecord> = serde_json::from_str(&text).unwrap();
    recs.into_iter().map(|r| r.volume).collect()
}

/// Bind-mount mode (KubeVirt's way) with real namespaces, mounts, device nodes and the cgroup
/// v1 devices controller: a Filesystem claim is bind-mounted and a Block claim's node created
/// inside QEMU's own mount namespace (never the host's), the block device is allowed in the
/// VM's devices cgroup only while plugged, the guest sees and loses both, `MountedToPod` is
/// reported; after an agent restart a volume removed meanwhile and a stale mount left by an
/// agent killed between mount and attach are both undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_mount_mode_plugs_through_the_vms_namespace_and_undoes_stale_mounts_after_a_restart() {
    if let Some(h) = bind_mode_hierarchy(false) {
        bind_mode_scenario(&h).await;
    }
}

/// The same on cgroup v2: the VM's block devices are governed by the generated eBPF device
/// program (on this hybrid host the v1 devices cgroup of the VM allows everything).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_mount_mode_on_cgroup_v2_allows_the_device_through_its_ebpf_program() {
    if let Some(h) = bind_mode_hierarchy(true) {
        bind_mode_scenario(&h).await;
    }
}

async fn bind_mode_scenario(hierarchy: &Path) {
    let mut e = Env::start_bind_in(tempfile::tempdir().unwrap(), hierarchy).await;
    let fs = e.claim("fsdata", "64Mi", "Filesystem").await;
    let fs_img = Path::new(&fs.metadata.annotations.as_ref().unwrap()["virtplug.io/local-path"]).join("disk.img");
    std::fs::write(&fs_img, b"VP-FILESYSTEM-01").unwrap();
    std::fs::File::options().write(true).open(&fs_img).unwrap().set_len(64 << 20).unwrap();
    let b = e.claim("blkdata", "32Mi", "Block").await;
    let loopdev = PathBuf::from(&b.metadata.annotations.as_ref().unwrap()["virtplug.io/loop-device"]);
    std::io::Write::write_all(&mut std::fs::File::options().write(true).open(&loopdev).unwrap(), b"VP-BLOCKDEVICE01").unwrap();
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(&loopdev).unwrap());

    let vmi = e.vm("guest").await;
    let run_dir = e.run_dir(&vmi);
    let q = qemu::process::adopt(&run_dir).unwrap();
    // QEMU has a mount namespace and a devices cgroup of its own.
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(ns(&q.pid.to_string()), ns("self"), "QEMU runs in its own mount namespace");
    let cgroup = e.cgroup.clone().unwrap().join(vmi.uid().unwrap());
    let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap();
    assert!(procs.lines().any(|l| l == q.pid.to_string()), "QEMU in its devices cgroup: {procs}");
    assert!(!probe(&cgroup, &loopdev, false), "the VM's cgroup denies the loop device before the plug");
    assert!(probe(Path::new(hierarchy), &loopdev, false), "control: the device is readable outside it");

    e.add("guest", "fsdata", "fsdata").await;
    e.add("guest", "blkdata", "blkdata").await;
    let fs_line = e.see(&vmi, "the Filesystem claim in the guest", |l| l.starts_with("BLOCK+") && l.contains("id=serial.fsdata")).await;
    assert!(fs_line.contains(&format!(" {} ", 64u64 << 20 >> 9)) && fs_line.contains(&hex(b"VP-FILESYSTEM-01")), "{fs_line}");
    let blk_line = e.see(&vmi, "the Block claim in the guest", |l| l.starts_with("BLOCK+") && l.contains("id=serial.blkdata")).await;
    assert!(
        blk_line.contains(&format!(" {} ", 32u64 << 20 >> 9)) && blk_line.contains(&hex(b"VP-BLOCKDEVICE01")),
        "{blk_line}; the guest's console: {:#?}",
        e.lines(&vmi)
    );

    // volumeStatus walks AttachedToNode → MountedToPod → Ready.
    for v in ["fsdata", "blkdata"] {
        let st = e.volume_status("guest", v, VolumePhase::Ready).await;
        let (a, m, r) = (
            st.entered(&VolumePhase::AttachedToNode).unwrap(),
            st.entered(&VolumePhase::MountedToPod).unwrap(),
            st.entered(&VolumePhase::Ready).unwrap(),
        );
        assert!(a <= m && m <= r, "{st:?}");
    }
    // The bind mount exists in QEMU's namespace and not on the host; the block node is a
    // device node of the loop device, allowed in the VM's cgroup.
    let (fs_target, blk_target) = (run_dir.join("hotplug/fsdata"), run_dir.join("hotplug/blkdata"));
    assert!(mount_points(q.pid).contains(&fs_target), "bind mount in QEMU's namespace");
    assert!(!mount_points(std::process::id().cast_signed()).contains(&fs_target), "no mount on the host");
    let node_meta = std::fs::symlink_metadata(&blk_target).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_block_device(&node_meta.file_type()));
    assert_eq!(std::os::unix::fs::MetadataExt::rdev(&node_meta), rdev);
    assert!(probe(&cgroup, &loopdev, false) && probe(&cgroup, &blk_target, false), "the loop device allowed in the VM's cgroup");
    assert_eq!(records(&run_dir), ["fsdata", "blkdata"]);

    // The agent dies. Meanwhile fsdata is removed from the spec, and a stale mount appears as
    // an agent killed between the mount and `blockdev-add` leaves it (recorded, not in QEMU).
    e.kill_agent().await;
    e.remove("guest", "fsdata").await;
    let ghost_dir = e.dir.path().join("ghost");
    std::fs::create_dir_all(&ghost_dir).unwrap();
    std::fs::write(ghost_dir.join("disk.img"), vec![0u8; 1 << 20]).unwrap();
    let ghost = node::bindmount::Vm {
        host: std::sync::Arc::new(node::bindmount::Host { helper: PathBuf::from(env!("CARGO_BIN_EXE_virtplug")) }),
        pid: q.pid,
        run_dir: run_dir.clone(),
        cgroup: cgroup.clone(),
    };
    let ghost_target = ghost.expose("ghost", &node::source::open_image(&ghost_dir, false).unwrap(), false).unwrap();
    assert!(mount_points(q.pid).contains(&ghost_target));

    // A new agent: fsdata leaves the guest and its mount goes; the stale mount goes; blkdata stays.
    e.start_agent();
    e.see(&vmi, "the Filesystem disk gone", |l| l.starts_with(&format!("BLOCK- {} ", dev_of(&fs_line)))).await;
    e.volume_gone("guest", "fsdata").await;
    common::wait_until(SEE, "only blkdata recorded", || {
        let r = records(&run_dir);
        async move { (r == ["blkdata"]).then_some(()) }
    })
    .await;
    let points = mount_points(q.pid);
    assert!(!points.contains(&fs_target) && !points.contains(&ghost_target), "both mounts undone: {points:?}");
    assert!(!fs_target.exists() && !ghost_target.exists(), "their targets removed");
    assert!(blk_target.exists());

    // blkdata unplugged: node removed, rule withdrawn.
    e.remove("guest", "blkdata").await;
    e.see(&vmi, "the Block disk gone", |l| l.starts_with(&format!("BLOCK- {} ", dev_of(&blk_line)))).await;
    e.volume_gone("guest", "blkdata").await;
    common::wait_until(SEE, "no records", || {
        let r = records(&run_dir);
        async move { r.is_empty().then_some(()) }
    })
    .await;
    assert!(!blk_target.exists());
    assert!(!probe(&cgroup, &loopdev, false), "the rule withdrawn");
    assert_eq!(e.lines(&vmi).iter().filter(|l| l.starts_with("VP-READY")).count(), 1, "the guest never restarted");

    // Deleted: QEMU gone, its cgroup removed.
    e.vms.delete("guest", &DeleteParams::default()).await.unwrap();
    common::wait_until(SEE, "the VMI gone", || {
        let vmis = e.vmis.clone();
        async move { matches!(vmis.get_opt("guest").await, Ok(None)).then_some(()) }
    })
    .await;
    assert!(!q.alive());
    assert!(!cgroup.exists(), "the VM's cgroup removed");
}

/// The seed bug in bind-mount mode: the bind mount lives only in QEMU's namespace, so once
/// the agent is gone and the VM dies, the storage filesystem unmounts at once and nothing of
/// ours stays mounted in any namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_bind_mount_mode_too_the_storage_unmounts_at_once_when_the_vm_dies_without_the_agent() {
    if let Some(h) = bind_mode_hierarchy(false) {
        seed_bug_scenario(Some(&h)).await;
    }
}

/// Storage can become reachable by a mount (a filesystem mounted under the storage root, an
/// attachment's mount in cluster mode) with no API object changing. A volume waits for a claim
/// with a 10-minute backoff, so nothing but the mount-table notification (`POLLPRI` on
/// `/proc/self/mountinfo`) can make the agent try again soon: a mount makes it try at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_the_mount_table_wakes_a_waiting_volume_at_once() {
    if !common::guest::is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let mut e = Env::start().await;
    e.restart_agent_without_retries().await;
    e.vm("mnt").await;
    e.add("mnt", "absent", "absent").await;
    let st = e.volume_status("mnt", "absent", VolumePhase::Pending).await;
    assert!(st.message.as_deref().unwrap_or("").contains("absent"), "{st:?}");
    let attempts = node::metrics::get().attempts.get();

    let _fs = TmpfsMount::new(&e.dir.path().join("appeared"));
    common::wait_until(Duration::from_secs(10), "another attempt after the mount", || {
        let now = node::metrics::get().attempts.get();
        async move { (now > attempts).then_some(()) }
    })
    .await;
}

/// A stand-in for KubeVirt's attachment pod (named as such: there is no kubelet here): a
/// process in a mount namespace and root of its own (a tmpfs with the host's `/usr`), with the
/// claim's filesystem mounted at `/<volume>` — visible only inside it — and a listener on
/// `hp.sock` in the emptyDir shared with the host, as KubeVirt's attachment pod has them. Killed
/// by PID when dropped; its namespace and mounts go with it.
struct FakeAttachmentPod {
    child: std::process::Child,
}

impl FakeAttachmentPod {
    fn start(root: &Path, emptydir: &Path, volume: &str, content: &[u8]) -> FakeAttachmentPod {
        std::fs::create_dir_all(root).unwrap();
        std::fs::create_dir_all(emptydir).unwrap();
        let script = r#"set -e
R="$1"; V="$2"; E="$3"; C="$4"
mount -t tmpfs pod-root "$R"
mkdir -p "$R/usr" "$R/$V" "$R/escape" "$R/hotplug-disks"
mount --rbind /usr "$R/usr"
for d in bin lib lib64 sbin; do ln -s "usr/$d" "$R/$d"; done
mount -t tmpfs pvc "$R/$V"
printf '%s' "$C" > "$R/$V/disk.img"
truncate -s 16M "$R/$V/disk.img"
ln -s ../../../../../../etc/hostname "$R/escape/disk.img"
mount --bind "$E" "$R/hotplug-disks"
exec chroot "$R" python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind("/hotplug-disks/hp.sock")
s.listen(16)
print("ready", flush=True)
while True:
    s.accept()[0].close()
'
"#;
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script, "pod"])
            .arg(root)
            .arg(volume)
            .arg(emptydir)
            .arg(std::str::from_utf8(content).unwrap())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the stand-in pod started");
        FakeAttachmentPod { child }
    }
}

impl Drop for FakeAttachmentPod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cluster mode's source: the volume lives in its attachment pod — on a filesystem mounted only
/// inside the pod's mount namespace, under the pod's own root — and the agent finds the pod's
/// process by its `hp.sock` (`SO_PEERCRED`) and opens `/<volume>/disk.img` through
/// `/proc/PID/root` without following symlinks. The guest reads the pod's bytes (the local
/// claim's image holds zeros), and a symlink in the pod pointing out of it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_mode_a_volume_is_opened_inside_its_attachment_pod() {
    if !common::guest::is_root() {
        eprintln!("skipped: the stand-in attachment pod needs root (mount namespace, chroot)");
        return;
    }
    let mut e = Env::start().await;
    e.claim("podvol", "16Mi", "Filesystem").await;
    let vmi = e.vm("cluster").await;
    let pod_uid = "0f8e2c1a-5b7d-4e3f-9a6b-1c2d3e4f5a6b";
    let emptydir = e.dir.path().join("pods").join(pod_uid).join("volumes/kubernetes.io~empty-dir/hotplug-disks");
    let pod = FakeAttachmentPod::start(&e.dir.path().join("podroot"), &emptydir, "podvol", b"VP-FROM-THE-POD1");
    let pid = node::source::attachment_pod_pid(&e.dir.path().join("pods"), pod_uid).unwrap();
    assert_eq!(pid, i32::try_from(pod.child.id()).unwrap(), "the pod's process, by SO_PEERCRED (chroot exec'd python in place)");
    assert!(!e.dir.path().join("podroot/podvol/disk.img").exists(), "the pod's filesystem is not visible on the host");
    let escape = node::source::open_in_pod(pid, Path::new("/escape/disk.img"), true, false).unwrap_err();
    assert!(escape.to_string().contains("symlink"), "{escape}");

    // The agent is stopped while the volume enters the spec and its status names the pod — as
    // KubeVirt's virt-controller publishes `attachPodUID` once the attachment pod runs.
    e.kill_agent().await;
    e.add("cluster", "podvol", "podvol").await;
    e.volume_status("cluster", "podvol", VolumePhase::Bound).await;
    client::update_status(&e.vmis, "cluster", |v: &mut VirtualMachineInstance| {
        if let Some(st) = v.status.as_mut().and_then(|s| s.volume_status.iter_mut().find(|x| x.name == "podvol")) {
            st.hotplug_volume.get_or_insert_with(Default::default).attach_pod_uid = Some(pod_uid.to_owned());
        }
    })
    .await
    .unwrap();
    e.start_agent();
    let line = e.see(&vmi, "the pod's disk in the guest", |l| l.starts_with("BLOCK+") && l.contains("id=serial.podvol")).await;
    assert!(line.contains(&hex(b"VP-FROM-THE-POD1")), "the bytes come from inside the pod: {line}");
    let st = e.volume_status("cluster", "podvol", VolumePhase::Ready).await;
    assert_eq!(st.hotplug_volume.unwrap().attach_pod_uid.as_deref(), Some(pod_uid));
}
