//! Local storage against the real embedded API server and controller: Filesystem and Block
//! claims (real sparse files, real loop devices) provisioned and released with nothing leaked,
//! release held while a VMI uses the claim, their PersistentVolumes (binding, reclaim policies,
//! the upgrade from versions without PVs, PVs orphaned while the controller was down, classes
//! that do not exist, real `kubectl get pv`), and DataVolume import from a loopback HTTP server
//! (progress, success, and each failure with its reason).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::TestServer;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use api::{DataVolume, VirtualMachineInstance};

const T: Duration = Duration::from_secs(30);

struct Env {
    s: TestServer,
    root: tempfile::TempDir,
    pvcs: Api<PersistentVolumeClaim>,
    dvs: Api<DataVolume>,
    pvs: Api<PersistentVolume>,
    ctl: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(ctl) = &self.ctl {
            ctl.abort();
        }
        // Whatever a failed test left attached under our root is detached here, by backing file.
        for (dev, _) in controller::storage::loopdev::under(self.root.path()) {
            let _ = controller::storage::loopdev::detach(&dev);
        }
    }
}

async fn env() -> Env {
    let mut e = env_stopped().await;
    e.start();
    e
}

/// An API server and storage root with no controller running yet.
async fn env_stopped() -> Env {
    let s = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let pvcs = Api::namespaced(s.client.clone(), "default");
    let dvs = Api::namespaced(s.client.clone(), "default");
    let pvs = Api::all(s.client.clone());
    Env { s, root, pvcs, dvs, pvs, ctl: None }
}

fn claim(name: &str, size: &str, mode: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode, "resources": {"requests": {"storage": size}}}}))
    .unwrap()
}

impl Env {
    fn start(&mut self) {
        let import = controller::storage::import::ImportConfig {
            max_retries: 1,
            backoff_base: Duration::from_millis(50),
            backoff_cap: Duration::from_millis(200),
            progress_interval: Duration::from_millis(20),
            // The test's image server is on loopback, which imports refuse unless allowed.
            allow_hosts: vec!["127.0.0.1".parse().unwrap()],
            ..Default::default()
        };
        let config = controller::run::Config { storage_root: Some(self.root.path().to_owned()), import, ..Default::default() };
        self.ctl = Some(tokio::spawn(controller::run::run_with(client::in_process(self.s.server.local_router()), config)));
    }

    /// Stops the controller (and with it the provisioner) and waits until it has stopped.
    async fn stop(&mut self) {
        if let Some(ctl) = self.ctl.take() {
            ctl.abort();
            assert!(ctl.await.unwrap_err().is_cancelled());
        }
    }

    async fn bound(&self, name: &str) -> PersistentVolumeClaim {
        let pvcs = self.pvcs.clone();
        common::wait_until(T, &format!("claim {name} to be Bound"), || {
            let pvcs = pvcs.clone();
            async move { pvcs.get(name).await.ok().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")) }
        })
        .await
    }

    async fn gone(&self, name: &str) {
        let pvcs = self.pvcs.clone();
        common::wait_until(T, &format!("claim {name} to be deleted"), || {
            let pvcs = pvcs.clone();
            async move { matches!(pvcs.get_opt(name).await, Ok(None)).then_some(()) }
        })
        .await;
    }

    fn entries(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.root.path()).unwrap().map(|e| e.unwrap().path()).collect()
    }

    /// Waits for PersistentVolume `name` in `phase`.
    async fn pv_in(&self, name: &str, phase: &str) -> PersistentVolume {
        let pvs = self.pvs.clone();
        common::wait_until(T, &format!("PersistentVolume {name} to be {phase}"), || {
            let pvs = pvs.clone();
            async move { pvs.get(name).await.ok().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)) }
        })
        .await
    }

    async fn pv_gone(&self, name: &str) {
        let pvs = self.pvs.clone();
        common::wait_until(T, &format!("PersistentVolume {name} to be deleted"), || {
            let pvs = pvs.clone();
            async move { matches!(pvs.get_opt(name).await, Ok(None)).then_some(()) }
        })
        .await;
    }

    async fn dv_phase(&self, name: &str, phase: &str) -> DataVolume {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_claim_is_a_sparse_image_of_its_size_and_is_released_on_delete() {
    let e = env().await;
    e.pvcs.create(&PostParams::default(), &claim("fs", "64Mi", "Filesystem")).await.unwrap();
    let pvc = e.bound("fs").await;
    let st = pvc.status.unwrap();
    assert_eq!(st.capacity.unwrap()["storage"].0, "64Mi");
    assert_eq!(st.access_modes.unwrap(), ["ReadWriteOnce"]);
    assert_eq!(pvc.spec.unwrap().volume_name, Some(format!("pvc-{}", pvc.metadata.uid.clone().unwrap())));
    let img = Path::new(&pvc.metadata.annotations.unwrap()["virtplug.io/local-path"]).join("disk.img");
    let meta = std::fs::metadata(&img).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) < 64, "sparse: no data blocks written");
    assert!(pvc.metadata.finalizers.unwrap().contains(&"virtplug.io/local-storage".to_owned()));

    e.pvcs.delete("fs", &DeleteParams::default()).await.unwrap();
    e.gone("fs").await;
    assert!(!img.exists());
    assert!(e.entries().is_empty(), "nothing left under the storage root: {:?}", e.entries());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_claim_is_a_loop_device_released_only_when_no_vmi_uses_it() {
    if !common::guest::is_root() {
        eprintln!("skipped: Block claims need root for /dev/loop-control");
        return;
    }
    let e = env().await;
    e.pvcs.create(&PostParams::default(), &claim("blk", "32Mi", "Block")).await.unwrap();
    let pvc = e.bound("blk").await;
    let dev = PathBuf::from(&pvc.metadata.annotations.as_ref().unwrap()["virtplug.io/loop-device"]);
    let attached = controller::storage::loopdev::under(e.root.path());
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].0, dev);
    let sectors = std::fs::read_to_string(format!("/sys/block/{}/size", dev.file_name().unwrap().to_string_lossy())).unwrap();
    assert_eq!(sectors.trim(), (32u64 << 20 >> 9).to_string());

    // A VMI uses the claim: deleting the claim waits.
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(e.s.client.clone(), "default");
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "user"},
        "spec": {"domain": {"devices": {"disks": [{"name": "d", "disk": {"bus": "virtio"}}]}}, "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "blk"}}]}});
    vmis.create(&PostParams::default(), &serde_json::from_value(vmi).unwrap()).await.unwrap();
    e.pvcs.delete("blk", &DeleteParams::default()).await.unwrap();
    common::wait_until(T, "the ClaimInUse event", || {
        let c = e.s.client.clone();
        async move { (!client::events::list(&c, "default", "blk", "ClaimInUse").await.ok()?.is_empty()).then_some(()) }
    })
    .await;
    assert!(e.pvcs.get("blk").await.unwrap().metadata.deletion_timestamp.is_some());
    assert_eq!(controller::storage::loopdev::under(e.root.path()).len(), 1, "still attached while the VMI uses it");

    // The VMI goes: the device is detached, the files removed, the claim deleted.
    vmis.delete("user", &DeleteParams::default()).await.unwrap();
    e.gone("blk").await;
    assert!(controller::storage::loopdev::under(e.root.path()).is_empty(), "no leaked loop device");
    assert!(e.entries().is_empty(), "nothing left under the storage root: {:?}", e.entries());
}

/// The PV of a claim, named as `spec.volumeName` names it.
fn pv_name(pvc: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", pvc.metadata.uid.as_deref().unwrap())
}

fn class(name: &str, provisioner: &str, reclaim: &str) -> StorageClass {
    serde_json::from_value(json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
        "provisioner": provisioner, "reclaimPolicy": reclaim}))
    .unwrap()
}

/// `kubectl get pv NAME --no-headers`, split into its columns.
fn kubectl_pv(kubeconfig: &Path, name: &str) -> Vec<String> {
    let out = std::process::Command::new("kubectl")
        .args(["get", "pv", name, "--no-headers"])
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("kubectl runs");
    assert!(out.status.success(), "kubectl get pv: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_gets_a_bound_pv_of_its_size_modes_class_and_policy_which_goes_with_it() {
    let e = env().await;
    let mut c = claim("fs", "64Mi", "Filesystem");
    c.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOnce".into(), "ReadOnlyMany".into()]);
    e.pvcs.create(&PostParams::default(), &c).await.unwrap();
    let pvc = e.bound("fs").await;
    let name = pv_name(&pvc);
    assert_eq!(pvc.spec.as_ref().unwrap().volume_name.as_deref(), Some(name.as_str()));
    // The default class was written onto the claim (it had none), as Kubernetes does.
    assert_eq!(pvc.spec.as_ref().unwrap().storage_class_name.as_deref(), Some("local"));
    let ann = pvc.metadata.annotations.clone().unwrap();
    assert_eq!(ann["pv.kubernetes.io/bind-completed"], "yes");
    assert_eq!(ann["pv.kubernetes.io/bound-by-controller"], "yes");
    assert_eq!(ann["volume.kubernetes.io/storage-provisioner"], "virtplug.io/local");

    // The claim is Bound only after its PV is: the PV is Bound when we see the claim Bound.
    let pv = e.pvs.get(&name).await.unwrap();
    let spec = pv.spec.clone().unwrap();
    assert_eq!(pv.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "64Mi");
    assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce", "ReadOnlyMany"]);
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("local"));
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(
        (claim_ref.kind.as_deref(), claim_ref.namespace.as_deref(), claim_ref.name.as_deref(), claim_ref.uid.as_deref()),
        (Some("PersistentVolumeClaim"), Some("default"), Some("fs"), pvc.metadata.uid.as_deref())
    );
    let dir = PathBuf::from(&ann["virtplug.io/local-path"]);
    assert_eq!(spec.host_path.unwrap().path, dir.to_string_lossy());
    assert_eq!(pv.annotations()["pv.kubernetes.io/provisioned-by"], "virtplug.io/local");
    assert_eq!(pv.finalizers(), ["kubernetes.io/pv-protection"]);
    // What people see: NAME CAPACITY ACCESS-MODES RECLAIM-POLICY STATUS CLAIM STORAGECLASS ...
    let cols = kubectl_pv(&e.s.kubeconfig, &name);
    assert_eq!(cols[..7], [name.as_str(), "64Mi", "RWO,ROX", "Delete", "Bound", "default/fs", "local"], "{cols:?}");

    // Reclaim policy Delete: the claim takes its PV and its data with it.
    e.pvcs.delete("fs", &DeleteParams::default()).await.unwrap();
    e.gone("fs").await;
    assert!(!dir.exists(), "the data is gone once the claim is");
    e.pv_gone(&name).await;
    assert!(e.entries().is_empty(), "nothing left under the storage root: {:?}", e.entries());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retain_class_keeps_the_data_and_marks_the_pv_released() {
    let e = env().await;
    let classes: Api<StorageClass> = Api::all(e.s.client.clone());
    classes.create(&PostParams::default(), &class("keep", "virtplug.io/local", "Retain")).await.unwrap();
    let mut c = claim("kept", "16Mi", "Filesystem");
    c.spec.as_mut().unwrap().storage_class_name = Some("keep".into());
    e.pvcs.create(&PostParams::default(), &c).await.unwrap();
    let pvc = e.bound("kept").await;
    let name = pv_name(&pvc);
    let pv = e.pvs.get(&name).await.unwrap();
    assert_eq!(pv.spec.as_ref().unwrap().persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
    assert_eq!(pv.spec.as_ref().unwrap().storage_class_name.as_deref(), Some("keep"));
    let img = Path::new(&pvc.metadata.annotations.unwrap()["virtplug.io/local-path"]).join("disk.img");
    std::fs::write(&img, b"precious").unwrap();

    e.pvcs.delete("kept", &DeleteParams::default()).await.unwrap();
    e.gone("kept").await;
    let released = e.pv_in(&name, "Released").await;
    assert_eq!(released.spec.unwrap().claim_ref.unwrap().name.as_deref(), Some("kept"), "a Released PV keeps its claimRef");
    assert_eq!(&std::fs::read(&img).unwrap()[..8], b"precious", "the data stays");
    assert_eq!(kubectl_pv(&e.s.kubeconfig, &name)[3..5], ["Retain", "Released"]);

    // Deleting the Released PV is let through by pv-protection; the data still stays.
    e.pvs.delete(&name, &DeleteParams::default()).await.unwrap();
    e.pv_gone(&name).await;
    assert_eq!(&std::fs::read(&img).unwrap()[..8], b"precious", "Retain: the data outlives the PV");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_bound_by_a_version_without_pvs_gets_its_pv_without_being_provisioned_again() {
    let mut e = env_stopped().await;
    // What an earlier version left: a Bound claim with its data, finalizer and annotations,
    // `spec.volumeName` set and no PV.
    e.pvcs.create(&PostParams::default(), &claim("old", "16Mi", "Filesystem")).await.unwrap();
    let uid = e.pvcs.get("old").await.unwrap().metadata.uid.unwrap();
    let dir = e.root.path().join(&uid);
    std::fs::create_dir(&dir).unwrap();
    let img = dir.join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(16 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"old data", 4096).unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&img).unwrap());
    let old = json!({"metadata": {"finalizers": ["virtplug.io/local-storage"],
                                  "annotations": {"virtplug.io/local-path": dir.to_string_lossy(), "pv.kubernetes.io/bind-completed": "yes"}},
                     "spec": {"volumeName": format!("pvc-{uid}")}});
    e.pvcs.patch("old", &PatchParams::default(), &Patch::Merge(&old)).await.unwrap();
    let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "16Mi"}}});
    e.pvcs.patch_status("old", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    e.start();
    let pv = e.pv_in(&format!("pvc-{uid}"), "Bound").await;
    let spec = pv.spec.unwrap();
    assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some(uid.as_str()));
    assert_eq!(spec.capacity.unwrap()["storage"].0, "16Mi");
    assert_eq!(spec.host_path.unwrap().path, dir.to_string_lossy());
    // Not provisioned again: the same file, the same bytes.
    let meta = std::fs::metadata(&img).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&meta), inode, "the image was not replaced");
    let mut buf = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(&img).unwrap(), &mut buf, 4096).unwrap();
    assert_eq!(&buf, b"old data");
    let pvc = common::wait_until(T, "the claim to carry bound-by-controller", || {
        let pvcs = e.pvcs.clone();
        async move { pvcs.get("old").await.ok().filter(|p| p.annotations().contains_key("pv.kubernetes.io/bound-by-controller")) }
    })
    .await;
    assert_eq!(pvc.spec.unwrap().storage_class_name, None, "a bound claim keeps its class as it was");
    assert!(!client::events::list(&e.s.client, "default", "old", "VolumeAdopted").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pv_whose_claim_went_while_the_controller_was_down_is_reclaimed_on_start() {
    let mut e = env().await;
    e.pvcs.create(&PostParams::default(), &claim("orphan", "16Mi", "Filesystem")).await.unwrap();
    let pvc = e.bound("orphan").await;
    let name = pv_name(&pvc);
    e.pv_in(&name, "Bound").await;
    e.stop().await;
    // The claim goes without the provisioner: its finalizer removed by hand, then deleted.
    let drop_finalizer = json!({"metadata": {"finalizers": null}});
    e.pvcs.patch("orphan", &PatchParams::default(), &Patch::Merge(&drop_finalizer)).await.unwrap();
    e.pvcs.delete("orphan", &DeleteParams::default()).await.unwrap();
    e.gone("orphan").await;
    assert_eq!(e.entries().len(), 1, "the data is still there while the controller is down");

    e.start();
    e.pv_gone(&name).await;
    assert!(e.entries().is_empty(), "Delete: the orphan's data is removed too: {:?}", e.entries());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_naming_an_unknown_class_stays_pending_until_the_class_exists() {
    let e = env().await;
    let mut c = claim("later", "16Mi", "Filesystem");
    c.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
    e.pvcs.create(&PostParams::default(), &c).await.unwrap();
    let events = common::wait_until(T, "a ProvisioningFailed event for the missing class", || {
        let c = e.s.client.clone();
        async move { Some(client::events::list(&c, "default", "later", "ProvisioningFailed").await.ok()?).filter(|v| !v.is_empty()) }
    })
    .await;
    let msg = events[0].message.clone().unwrap_or_default();
    assert!(msg.contains(r#"storageclass.storage.k8s.io "fast" not found"#), "{msg}");
    let pvc = e.pvcs.get("later").await.unwrap();
    assert!(pvc.status.and_then(|s| s.phase).is_none_or(|p| p == "Pending"), "not bound");
    assert!(pvc.metadata.finalizers.is_none(), "not taken by the provisioner");
    assert!(e.pvs.list(&Default::default()).await.unwrap().items.is_empty(), "no PV");
    assert!(e.entries().is_empty(), "no data");
    let classes: Api<StorageClass> = Api::all(e.s.client.clone());

    // The class name of earlier versions needs no class object (claims made by them go on).
    let mut legacy = claim("legacy", "16Mi", "Filesystem");
    legacy.spec.as_mut().unwrap().storage_class_name = Some("virtplug-local".into());
    e.pvcs.create(&PostParams::default(), &legacy).await.unwrap();
    let pv = e.pv_in(&pv_name(&e.bound("legacy").await), "Bound").await;
    assert_eq!(pv.spec.unwrap().storage_class_name.as_deref(), Some("virtplug-local"));
    assert!(classes.get_opt("virtplug-local").await.unwrap().is_none());

    // The class's creation wakes the claim (no retry timer): it is served now.
    classes.create(&PostParams::default(), &class("fast", "virtplug.io/local", "Delete")).await.unwrap();
    let pvc = e.bound("later").await;
    e.pv_in(&pv_name(&pvc), "Bound").await;
}

/// A loopback HTTP server with one behaviour per path. Returns its base URL.
async fn http_server(body: Vec<u8>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let head = |len: usize| format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
                match path.as_str() {
                    // Paced in 64 KiB pieces so progress is visible between 0 and 100 %.
                    "/disk.raw" => {
                        let _ = sock.write_all(head(body.len()).as_bytes()).await;
                        for piece in body.chunks(64 << 10) {
                            if sock.write_all(piece).await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(15)).await;
                        }
                    }
                    "/truncated.raw" => {
                        let _ = sock.write_all(head(body.len()).as_bytes()).await;
                        let _ = sock.write_all(&body[..body.len() / 3]).await;
                    }
                    "/huge.raw" => {
                        let _ = sock.write_all(head(1 << 30).as_bytes()).await;
                    }
                    // A qcow2 magic and version, then nothing: a header cut short.
                    "/qcow2" => {
                        let _ = sock.write_all(head(8).as_bytes()).await;
                        let _ = sock.write_all(b"QFI\xfb\0\0\0\x03").await;
                    }
                    _ => {
                        let _ = sock.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                    }
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

fn data_volume(name: &str, url: &str, size: &str) -> DataVolume {
    serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name},
        "spec": {"source": {"http": {"url": url}}, "storage": {"resources": {"requests": {"storage": size}}}}}))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_import_shows_progress_and_lands_byte_for_byte_in_the_claim() {
    let e = env().await;
    let body: Vec<u8> = (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let base = http_server(body.clone()).await;
    e.dvs.create(&PostParams::default(), &data_volume("img", &format!("{base}/disk.raw"), "4Mi")).await.unwrap();

    // Watch every progress value the DataVolume goes through.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let done = common::wait_until(T, "the import to succeed", || {
        let dvs = e.dvs.clone();
        let seen = seen.clone();
        async move {
            let dv = dvs.get("img").await.ok()?;
            let st = dv.status.clone()?;
            if let Some(p) = st.progress.clone() {
                let mut seen = seen.lock().unwrap();
                if seen.last() != Some(&p) {
                    seen.push(p);
                }
            }
            (st.phase == Some(api::phases::DataVolumePhase::Succeeded)).then_some(dv)
        }
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(done.status.as_ref().unwrap().progress.as_deref(), Some("100.0%"));
    let partial: Vec<&String> = seen.iter().filter(|p| *p != "N/A" && *p != "0.00%" && *p != "100.0%").collect();
    assert!(!partial.is_empty(), "an intermediate progress value was reported: {seen:?}");
    let pvc = e.pvcs.get("img").await.unwrap();
    assert_eq!(pvc.owner_references()[0].kind, "DataVolume", "the claim belongs to the DataVolume");
    let img = Path::new(&pvc.metadata.annotations.unwrap()["virtplug.io/local-path"]).join("disk.img");
    let data = std::fs::read(&img).unwrap();
    assert_eq!(data.len(), 4 << 20, "the image keeps the claim's size");
    assert_eq!(&data[..body.len()], &body[..], "the source's bytes, in order");
    assert!(data[body.len()..].iter().all(|b| *b == 0));

    // Deleting the DataVolume takes its claim and storage with it.
    e.dvs.delete("img", &DeleteParams::default()).await.unwrap();
    e.gone("img").await;
    assert!(e.entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_imports_say_why() {
    let e = env().await;
    let base = http_server(vec![7u8; 256 << 10]).await;
    let cases = [
        ("missing", format!("{base}/nope.raw"), "404"),
        ("truncated", format!("{base}/truncated.raw"), "262144 bytes"),
        ("huge", format!("{base}/huge.raw"), "larger than the claim's"),
        ("qcow", format!("{base}/qcow2"), "qcow2 image is truncated"),
    ];
    // A local file is refused at admission already, naming the field (the importer refuses it
    // again for clusters without virtplug's admission).
    match e.dvs.create(&PostParams::default(), &data_volume("local", "file:///etc/passwd", "1Mi")).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert!(s.message.contains("spec.source.http.url") && s.message.contains("http"), "{}", s.message);
        }
        other => panic!("file:// must be refused, got {other:?}"),
    }
    for (name, url, _) in &cases {
        e.dvs.create(&PostParams::default(), &data_volume(name, url, "1Mi")).await.unwrap();
    }
    for (name, _, why) in &cases {
        let dv = e.dv_phase(name, "Failed").await;
        let st = dv.status.unwrap();
        let msg = st.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone()).unwrap_or_default();
        assert!(msg.contains(why), "{name}: {msg:?} should say {why:?}");
        let events = client::events::list(&e.s.client, "default", name, "ImportFailed").await.unwrap();
        assert_eq!(events.len(), 1, "{name}: one ImportFailed event");
        // Transient failures were retried (max_retries = 1) before giving up; permanent ones not.
        let retried = matches!(*name, "missing" | "truncated");
        assert_eq!(st.restart_count.unwrap_or(0), i32::from(retried), "{name}");
    }
}

/// A Block DataVolume's import lands on its loop device (opened without following symlinks and
/// checked to be a block device), byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_import_into_a_block_claim_lands_on_its_loop_device() {
    if !common::guest::is_root() {
        eprintln!("skipped: Block claims need root for /dev/loop-control");
        return;
    }
    let e = env().await;
    let body: Vec<u8> = (0..(256u32 << 10)).map(|i| (i % 251) as u8).collect();
    let base = http_server(body.clone()).await;
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "blk"},
        "spec": {"source": {"http": {"url": format!("{base}/disk.raw")}},
                 "storage": {"volumeMode": "Block", "resources": {"requests": {"storage": "1Mi"}}}}});
    e.dvs.create(&PostParams::default(), &serde_json::from_value(dv).unwrap()).await.unwrap();
    e.dv_phase("blk", "Succeeded").await;
    let pvc = e.pvcs.get("blk").await.unwrap();
    let dev = PathBuf::from(&pvc.metadata.annotations.as_ref().unwrap()["virtplug.io/loop-device"]);
    let mut data = vec![0u8; body.len()];
    std::io::Read::read_exact(&mut std::fs::File::open(&dev).unwrap(), &mut data).unwrap();
    assert_eq!(data, body, "the source's bytes, in order, on {}", dev.display());
    e.dvs.delete("blk", &DeleteParams::default()).await.unwrap();
    e.gone("blk").await;
    assert!(controller::storage::loopdev::under(e.root.path()).is_empty(), "no leaked loop device");
}
