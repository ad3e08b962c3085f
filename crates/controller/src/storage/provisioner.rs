//! The local PVC provisioner (embedded deployment; the role a CSI driver, its
//! external-provisioner and Kubernetes' PV controller play in a cluster).
//!
//! # Flow
//! A claim's class decides whether it is served ([`super::class`]); a claim without a class
//! takes the default class's name first (the PV controller's retroactive default-class
//! assignment: kube-apiserver's DefaultStorageClass admission would have written it at create
//! time, and this API server has no such admission). A served claim gets the [`FINALIZER`] and
//! `volume.kubernetes.io/storage-provisioner`, then its directory and sparse image of the
//! requested size (`disk.img`, or `block.img` behind a loop device), then its PersistentVolume
//! `pvc-<uid>` ([`volume::build`]: capacity, access and volume mode, `hostPath`, the class's
//! reclaim policy, `claimRef`) and the PV's `status.phase: Bound`, then the claim's
//! `spec.volumeName` and annotations (`pv.kubernetes.io/bind-completed`,
//! `pv.kubernetes.io/bound-by-controller`, the path and loop device), and finally its
//! `status.phase: Bound` with capacity and access modes — the PV controller's order. Each step
//! is idempotent, so a crash anywhere re-runs to the same result (the loop device is found
//! again by its backing file, never attached twice; the PV is found by its name).
//!
//! A claim that already has `spec.volumeName` (bound by this version, or by an earlier one
//! that made no PV objects) is never provisioned again: its image must exist (else
//! `VolumeLost`), and a missing PV is created for the data that is there — the upgrade path.
//!
//! On deletion the claim is let go only once no VMI names it (directly or through its
//! DataVolume): a running VM's disk is never pulled. The claim waits with a `ClaimInUse` Event
//! and is woken by the VMI's deletion. Then the PV's reclaim policy applies
//! ([`volume::reclaim`]: `Delete` removes the data and then the PV; `Retain` keeps the data and
//! marks the PV `Released`; a claim without a PV is `Delete`, as before) and the finalizer is
//! dropped, so a deleted claim's data is gone once the claim is. A PV whose claim went another
//! way is reclaimed by [`volume::run`].
//!
//! # Errors
//! A claim it cannot provision (no size, no space, no loop device, a StorageClass that does
//! not exist) keeps `Pending` and gets a `ProvisioningFailed` Warning Event with the reason;
//! API and file failures are retried with backoff, a missing class when the class appears.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tracing::Instrument;

use api::phases::ClaimPhase;
use api::VirtualMachineInstance;
use client::events::{self, EventType};

use super::class::{self, Decision, ReclaimPolicy, PROVISIONER};
use super::volume::{self, ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_STORAGE_PROVISIONER};
use super::{claim_dir, loopdev, requested_bytes, VolumeMode, ANN_DEVICE, ANN_PATH, FINALIZER};
use crate::runner::{Action, Runner};

const COMPONENT: &str = "virtplug-provisioner";

/// How long claims wait at start for the StorageClass and PersistentVolume watches' first
/// lists (an API server that serves neither never gives them).
const STORES_READY: Duration = Duration::from_secs(10);

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("claim {claim}: cannot {what} {path}")]
    Io {
        claim: String,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("claim {claim}: loop device")]
    Loop {
        claim: String,
        #[source]
        source: loopdev::LoopError,
    },
    #[error("claim {claim}: API request failed")]
    Api {
        claim: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("PersistentVolume {volume}: API request failed")]
    VolumeApi {
        volume: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "claim {claim} is bound, but its image {image} is gone: the data was removed outside virtplug; \
         delete the claim (a new one gets a new, empty volume)"
    )]
    Lost { claim: String, image: PathBuf },
    #[error(
        "claim {claim}: PersistentVolume {volume} belongs to claim UID {other}, not to this claim; \
         delete that PersistentVolume (kubectl delete pv {volume}) if nothing uses it"
    )]
    Foreign { claim: String, volume: String, other: String },
}

struct Ctx {
    client: kube::Client,
    root: PathBuf,
    /// The StorageClasses and PersistentVolumes as the provisioner's watches last saw them: a
    /// reconcile reads these, not the API server.
    classes: Store<StorageClass>,
    volumes: Store<PersistentVolume>,
    /// Set once the stores held their first lists (or [`STORES_READY`] passed).
    stores_ready: tokio::sync::OnceCell<()>,
    /// Deleted claims a VMI still used at their last reconcile: any VMI change in their namespace
    /// wakes them (an unplug leaves the claim out of the VMI's new version, yet is what they wait
    /// for). Kept here so a VMI event looks at these few, not at every claim.
    in_use: InUse,
}

/// See [`Ctx::in_use`].
type InUse = Arc<std::sync::Mutex<std::collections::HashSet<ObjectRef<PersistentVolumeClaim>>>>;

fn in_use(set: &InUse) -> std::sync::MutexGuard<'_, std::collections::HashSet<ObjectRef<PersistentVolumeClaim>>> {
    // Every operation is one insert, remove or scan: consistent after any panic.
    set.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn api_err(claim: &str) -> impl FnOnce(client::UpdateError<client::Never>) -> ProvisionError + '_ {
    move |e| ProvisionError::Api { claim: claim.to_owned(), source: Box::new(e) }
}

/// The names of the claims a VMI uses ([`api::kubevirt::Volume::claim_name`]).
#[must_use]
pub fn claims_of(vmi: &VirtualMachineInstance) -> Vec<String> {
    vmi.spec.volumes.iter().filter_map(|v| v.claim_name().map(str::to_owned)).collect()
}

/// The VMIs in `ns` that use claim `name`.
async fn users(client: &kube::Client, ns: &str, name: &str) -> Result<Vec<String>, kube::Error> {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    Ok(vmis
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|v| claims_of(v).iter().any(|c| c == name))
        .map(ResourceExt::name_any)
        .collect())
}

/// Creates the image (sparse, `size` bytes) unless it exists: written under a temp name and
/// renamed, so a crash never leaves a short image under the real name.
fn create_image(path: &Path, size: u64) -> std::io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let tmp = path.with_extension("img.tmp");
    let f = std::fs::File::create(&tmp)?;
    f.set_len(size)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Detaches the loop device of the claim with `uid`, if one is attached (the data stays).
///
/// # Errors
/// When the device cannot be detached.
pub fn release_device(root: &Path, uid: &str, claim: &str) -> Result<(), ProvisionError> {
    let image = claim_dir(root, uid).join(VolumeMode::Block.image_name());
    if let Some(dev) = loopdev::find(&image) {
        loopdev::detach(&dev).map_err(|source| ProvisionError::Loop { claim: claim.to_owned(), source })?;
    }
    Ok(())
}

/// Removes the directory of the claim with `uid` (gone already is fine).
///
/// # Errors
/// When the directory cannot be removed.
pub fn release_dir(root: &Path, uid: &str, claim: &str) -> Result<(), ProvisionError> {
    let dir = claim_dir(root, uid);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ProvisionError::Io { claim: claim.to_owned(), what: "remove", path: dir, source }),
    }
}

/// Releases the backing of the claim with `uid`: detaches its loop device, removes its directory.
///
/// # Errors
/// When the device cannot be detached or the directory removed.
pub fn release(root: &Path, uid: &str, claim: &str) -> Result<(), ProvisionError> {
    release_device(root, uid, claim)?;
    release_dir(root, uid, claim)
}

async fn reconcile(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, ProvisionError> {
    // The first reconciles wait for the StorageClass and PersistentVolume stores' first lists,
    // so a claim naming an existing class is not told it is missing. The wait is here, inside
    // the running controller, because the controller's own loop is what drives those watches:
    // waiting before it ran (as before) could only end by the deadline, 10 s after every start.
    // An API server that serves neither kind never fills them: the claims go on after the
    // deadline as with no class, and later reconciles do not wait again.
    ctx.stores_ready
        .get_or_init(|| async {
            let both = async { tokio::join!(ctx.classes.wait_until_ready(), ctx.volumes.wait_until_ready()) };
            let _ = tokio::time::timeout(STORES_READY, both).await;
        })
        .await;
    let r = reconcile_once(pvc, ctx).await;
    crate::metrics::count("claim", r.is_ok());
    r
}

/// One claim's reconcile, in a span naming it: released when deleted, else provisioned.
async fn reconcile_once(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, ProvisionError> {
    let Some(uid) = pvc.uid() else { return Ok(Action::await_change()) };
    let claim = Claim {
        api: Api::namespaced(ctx.client.clone(), &pvc.namespace().unwrap_or_default()),
        object: format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any()),
        pvc: &pvc,
        ctx: &ctx,
        uid,
    };
    let span = tracing::info_span!("claim", claim = %claim.object);
    async {
        if pvc.metadata.deletion_timestamp.is_some() {
            claim.release().await
        } else {
            claim.provision().await
        }
    }
    .instrument(span)
    .await?;
    Ok(Action::await_change())
}

/// The claim being reconciled.
struct Claim<'a> {
    pvc: &'a PersistentVolumeClaim,
    ctx: &'a Ctx,
    api: Api<PersistentVolumeClaim>,
    /// `ns/name`, for errors (which travel beyond the span).
    object: String,
    uid: String,
}

impl Claim<'_> {
    fn name(&self) -> String {
        self.pvc.name_any()
    }

    fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.ctx.client.clone())
    }

    async fn warn(&self, reason: &str, message: &str) {
        events::publish(&self.ctx.client, COMPONENT, self.pvc, EventType::Warning, reason, message).await;
        tracing::warn!("{message}");
    }

    /// A deleted claim (only one this provisioner took: it has the finalizer): once no VMI uses
    /// it (the VMI's change wakes the claim again), its PV's reclaim policy applies and the
    /// finalizer is dropped.
    async fn release(&self) -> Result<(), ProvisionError> {
        let me = ObjectRef::from_obj(self.pvc);
        if !self.pvc.finalizers().iter().any(|f| f == FINALIZER) {
            in_use(&self.ctx.in_use).remove(&me);
            return Ok(());
        }
        let ns = self.pvc.namespace().unwrap_or_default();
        let users = users(&self.ctx.client, &ns, &self.name())
            .await
            .map_err(|e| ProvisionError::Api { claim: self.object.clone(), source: Box::new(e) })?;
        if users.is_empty() {
            in_use(&self.ctx.in_use).remove(&me);
        } else {
            in_use(&self.ctx.in_use).insert(me);
            let msg = format!("claim is used by VMI {}; its storage is released when no VMI uses it", users.join(", "));
            events::publish(&self.ctx.client, COMPONENT, self.pvc, EventType::Normal, "ClaimInUse", &msg).await;
            return Ok(());
        }
        // Only a PV this provisioner made for this very claim decides the policy; without one
        // (a claim bound by an earlier version) the data goes, as it did then.
        let pv = self
            .volumes()
            .get_opt(&volume::name_for(&self.uid))
            .await
            .map_err(|e| ProvisionError::VolumeApi { volume: volume::name_for(&self.uid), source: Box::new(e) })?
            .filter(|pv| volume::provisioned_here(pv, &self.ctx.root).as_deref() == Some(self.uid.as_str()));
        let policy = volume::reclaim(&self.ctx.client, &self.ctx.root, &self.uid, pv.as_ref(), &self.object).await?;
        client::update(&self.api, &self.name(), |p: &mut PersistentVolumeClaim| {
            if let Some(f) = p.metadata.finalizers.as_mut() {
                f.retain(|x| x != FINALIZER);
            }
        })
        .await
        .map_err(api_err(&self.object))?;
        tracing::info!("released the claim's storage (reclaim policy {})", policy.as_str());
        Ok(())
    }

    /// A live claim: class, finalizer, backing, PV, then bound.
    async fn provision(&self) -> Result<(), ProvisionError> {
        let pv_name = volume::name_for(&self.uid);
        let volume_name = self.pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref());
        // Bound to its PV before (by this version, or one without PV objects).
        let bound_before = volume_name == Some(pv_name.as_str());
        // A claim taken before stays this provisioner's whatever its class became since (the
        // default moved, the class was deleted): binding does not depend on the class.
        let taken = bound_before && self.pvc.finalizers().iter().any(|f| f == FINALIZER);
        let decision = class::resolve(&self.ctx.classes, self.pvc);
        let (class, reclaim, assign) = match decision {
            Decision::Serve { class, reclaim, assign } => (class, reclaim, assign),
            // Only reached without a PV (an existing one is kept as it is): as earlier versions.
            _ if taken => (self.pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()), ReclaimPolicy::Delete, false),
            Decision::Other => return Ok(()),
            Decision::Missing(name) => {
                // As the PV controller says it; the class's creation wakes the claim.
                let msg = format!(
                    "storageclass.storage.k8s.io \"{name}\" not found: create that StorageClass (provisioner {PROVISIONER} for this \
                     machine's storage) or recreate the claim with an existing class (kubectl get storageclass)"
                );
                self.warn("ProvisioningFailed", &msg).await;
                return Ok(());
            }
        };
        if let Some(other) = volume_name.filter(|_| !bound_before) {
            let msg = format!(
                "spec.volumeName names {other}: binding a claim to a PersistentVolume made by hand is not supported by the \
                 local provisioner; remove spec.volumeName (recreate the claim) to have a volume provisioned"
            );
            self.warn("ProvisioningFailed", &msg).await;
            return Ok(());
        }
        let size = match requested_bytes(self.pvc) {
            Ok(size) => size,
            Err(message) => {
                // Only an edit of the claim can fix this: report it and wait for one.
                self.warn("ProvisioningFailed", &message).await;
                return Ok(());
            }
        };
        // A claim bound before keeps its class as it is (Kubernetes assigns the default class to
        // unbound claims only).
        let assign = if assign && !bound_before { class.clone() } else { None };
        client::update_from(&self.api, self.pvc, |p: &mut PersistentVolumeClaim| {
            let f = p.metadata.finalizers.get_or_insert_with(Vec::new);
            if !f.iter().any(|x| x == FINALIZER) {
                f.push(FINALIZER.to_owned());
            }
            p.metadata.annotations.get_or_insert_with(Default::default).insert(ANN_STORAGE_PROVISIONER.to_owned(), PROVISIONER.to_owned());
            if let (Some(spec), Some(c)) = (p.spec.as_mut(), assign.as_ref()) {
                spec.storage_class_name.get_or_insert_with(|| c.clone());
            }
        })
        .await
        .map_err(api_err(&self.object))?;
        let backing = self.backing(size, !bound_before).await?;
        let capacity = self.capacity(bound_before, size);
        let created = self.volume(&backing, class.as_deref(), reclaim, &capacity).await?;
        if created && bound_before {
            let msg = format!("created PersistentVolume {pv_name} for the data of this claim (bound by an earlier virtplug without one)");
            events::publish(&self.ctx.client, COMPONENT, self.pvc, EventType::Normal, "VolumeAdopted", &msg).await;
            tracing::info!("{msg}");
        }
        self.bind(&backing, &capacity).await
    }

    /// The PV's capacity: the claim's recorded one when it was bound before (never a new size
    /// for old data), else what it requests.
    fn capacity(&self, bound_before: bool, size: u64) -> Quantity {
        let spec = self.pvc.spec.as_ref();
        let recorded = self.pvc.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).filter(|_| bound_before);
        let requested = spec.and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage"));
        recorded.or(requested).cloned().unwrap_or_else(|| Quantity(size.to_string()))
    }

    /// The backing, idempotently (also re-attaches a Block claim's loop device after a reboot).
    /// `create: false` (a bound claim) never makes a new image: old data or none.
    async fn backing(&self, size: u64, create: bool) -> Result<Backing, ProvisionError> {
        let mode = VolumeMode::of(self.pvc);
        let dir = claim_dir(&self.ctx.root, &self.uid);
        let image = dir.join(mode.image_name());
        let (d, i, claim) = (dir.clone(), image.clone(), self.object.clone());
        let device = tokio::task::spawn_blocking(move || create_backing(&d, &i, size, mode, &claim, create))
            .await
            .map_err(|e| ProvisionError::Api { claim: self.object.clone(), source: Box::new(e) })??;
        Ok(Backing { mode, dir, image, device })
    }

    /// The claim's PV, created unless it exists, with the loop device recorded and phase
    /// `Bound`. Returns whether it was created now.
    async fn volume(&self, b: &Backing, class: Option<&str>, reclaim: ReclaimPolicy, capacity: &Quantity) -> Result<bool, ProvisionError> {
        let api = self.volumes();
        let name = volume::name_for(&self.uid);
        let verr = |e: kube::Error| ProvisionError::VolumeApi { volume: name.clone(), source: Box::new(e) };
        // The watch's copy; a PV it has not seen yet is created, and a 409 then reads it.
        let known = self.ctx.volumes.get(&ObjectRef::new(&name)).map(|pv| pv.as_ref().clone());
        let (pv, created) = match known {
            Some(pv) => (pv, false),
            None => {
                let new = volume::build(&volume::NewVolume {
                    pvc: self.pvc,
                    uid: &self.uid,
                    root: &self.ctx.root,
                    class,
                    reclaim,
                    capacity: capacity.clone(),
                    device: b.device.as_deref(),
                });
                match api.create(&PostParams::default(), &new).await {
                    Ok(pv) => (pv, true),
                    // Made by an earlier attempt whose answer was lost: use it.
                    Err(kube::Error::Api(s)) if s.code == 409 => (api.get(&name).await.map_err(verr)?, false),
                    Err(e) => return Err(verr(e)),
                }
            }
        };
        let owner = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.clone()).unwrap_or_default();
        if owner != self.uid {
            return Err(ProvisionError::Foreign { claim: self.object.clone(), volume: name, other: owner });
        }
        // The device's number can change (a reboot): the annotation follows it.
        let dev = b.device.as_ref().map(|d| d.to_string_lossy().into_owned());
        let pv = client::update_from(&api, &pv, |p: &mut PersistentVolume| {
            let ann = p.metadata.annotations.get_or_insert_with(Default::default);
            match &dev {
                Some(d) => ann.insert(ANN_DEVICE.to_owned(), d.clone()),
                None => ann.remove(ANN_DEVICE),
            };
        })
        .await
        .map_err(|e| ProvisionError::VolumeApi { volume: name.clone(), source: Box::new(e) })?
        .object;
        volume::set_phase(&api, &pv, volume::BOUND).await?;
        Ok(created)
    }

    /// Records the PV on the claim (volume name, annotations), then binds it.
    async fn bind(&self, b: &Backing, capacity: &Quantity) -> Result<(), ProvisionError> {
        let volume_name = volume::name_for(&self.uid);
        let dir_s = b.dir.to_string_lossy().into_owned();
        let dev_s = b.device.as_ref().map(|d| d.to_string_lossy().into_owned());
        // `self.pvc` is the store's copy: nothing is read or sent when it is already so.
        client::update_from(&self.api, self.pvc, |p: &mut PersistentVolumeClaim| {
            if let Some(spec) = p.spec.as_mut() {
                spec.volume_name = Some(volume_name.clone());
            }
            let ann = p.metadata.annotations.get_or_insert_with(Default::default);
            ann.insert(ANN_PATH.to_owned(), dir_s.clone());
            ann.insert(ANN_BIND_COMPLETED.to_owned(), "yes".to_owned());
            ann.insert(ANN_BOUND_BY_CONTROLLER.to_owned(), "yes".to_owned());
            match &dev_s {
                Some(d) => ann.insert(ANN_DEVICE.to_owned(), d.clone()),
                None => ann.remove(ANN_DEVICE),
            };
        })
        .await
        .map_err(api_err(&self.object))?;
        let was_bound = ClaimPhase::is_bound(self.pvc);
        let modes = self.pvc.spec.as_ref().and_then(|s| s.access_modes.clone()).unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
        client::update_status_from(&self.api, self.pvc, |p: &mut PersistentVolumeClaim| {
            let st = p.status.get_or_insert_with(Default::default);
            st.phase = Some(ClaimPhase::Bound.as_str().to_owned());
            st.access_modes = Some(modes.clone());
            st.capacity = Some([("storage".to_owned(), capacity.clone())].into_iter().collect());
        })
        .await
        .map_err(api_err(&self.object))?;
        if !was_bound {
            let what = match &b.device {
                Some(d) => format!("{:?} volume {volume_name}: {} over {}", b.mode, d.display(), b.image.display()),
                None => format!("{:?} volume {volume_name}: {}", b.mode, b.image.display()),
            };
            events::publish(
                &self.ctx.client,
                COMPONENT,
                self.pvc,
                EventType::Normal,
                "ProvisioningSucceeded",
                &format!("provisioned {what}"),
            )
            .await;
            tracing::info!("bound the claim ({what})");
        }
        Ok(())
    }
}

/// Where a claim's bytes are.
struct Backing {
    mode: VolumeMode,
    dir: PathBuf,
    image: PathBuf,
    /// The loop device of a Block claim.
    device: Option<PathBuf>,
}

/// Creates the claim's directory and image unless `create` is false (then the image must
/// exist), and attaches a Block claim's loop device unless it is attached already. Blocking:
/// run it off the reactor.
fn create_backing(
    dir: &Path,
    image: &Path,
    size: u64,
    mode: VolumeMode,
    claim: &str,
    create: bool,
) -> Result<Option<PathBuf>, ProvisionError> {
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| ProvisionError::Io { claim: claim.to_owned(), what, path, source }
    };
    if create {
        std::fs::create_dir_all(dir).map_err(io("create", dir))?;
        create_image(image, size).map_err(io("create", image))?;
    } else if !image.exists() {
        return Err(ProvisionError::Lost { claim: claim.to_owned(), image: image.to_owned() });
    }
    if mode == VolumeMode::Block {
        let dev = match loopdev::find(image) {
            Some(d) => d,
            None => loopdev::attach(image, false).map_err(|source| ProvisionError::Loop { claim: claim.to_owned(), source })?,
        };
        return Ok(Some(dev));
    }
    Ok(None)
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(pvc: Arc<PersistentVolumeClaim>, err: &ProvisionError, ctx: Arc<Ctx>) -> Action {
    let object = format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any());
    tracing::warn!(claim = %object, "{}", client::error_chain(err));
    let client = ctx.client.clone();
    let msg = client::error_chain(err);
    let reason = if matches!(err, ProvisionError::Lost { .. }) { "VolumeLost" } else { "ProvisioningFailed" };
    tokio::spawn(async move { events::publish(&client, COMPONENT, pvc.as_ref(), EventType::Warning, reason, &msg).await });
    Action::requeue(Duration::from_secs(5))
}

/// Runs the provisioner for claims under `root` until the process stops, with the PV side
/// ([`volume::run`]) beside it.
pub async fn run(client: kube::Client, root: PathBuf) {
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let vmis: Api<VirtualMachineInstance> = Api::all(client.clone());
    // Backoff: an API server that does not serve these kinds answers 404 to every retry.
    let (class_store, class_writer) = reflector::store();
    let (volume_store, volume_writer) = reflector::store();
    let classes = reflector::reflector(class_writer, watcher(Api::<StorageClass>::all(client.clone()), watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    let pvs = reflector::reflector(volume_writer, watcher(Api::<PersistentVolume>::all(client.clone()), watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    let waiting = InUse::default();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        root: root.clone(),
        classes: class_store.clone(),
        volumes: volume_store.clone(),
        stores_ready: tokio::sync::OnceCell::new(),
        in_use: Arc::clone(&waiting),
    });
    let controller = Runner::new(pvcs, watcher::Config::default());
    let store = controller.store();
    let claims = controller
        // A VMI's change (its deletion above all) wakes the claims it uses, and the deleted
        // claims of its namespace still waiting for a VMI to let go ([`Ctx::in_use`]).
        .watches(vmis, watcher::Config::default(), move |vmi| {
            let ns = vmi.namespace().unwrap_or_default();
            let waiting: Vec<ObjectRef<PersistentVolumeClaim>> =
                in_use(&waiting).iter().filter(|c| c.namespace.as_deref() == Some(ns.as_str())).cloned().collect();
            claims_of(&vmi).into_iter().map(|c| ObjectRef::new(&c).within(&ns)).chain(waiting).collect::<Vec<_>>()
        })
        // A class's change wakes the claims that name it and those without a class (the default
        // may have changed): a claim waiting for a missing class is provisioned when it appears.
        .watches_stream(classes, move |sc: StorageClass| {
            let name = sc.name_any();
            store
                .state()
                .iter()
                .filter(|c| c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).is_none_or(|n| n == name))
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect::<Vec<_>>()
        })
        // A PV's change (a PV deleted by force, say) wakes its claim.
        .watches_stream(pvs, |pv: PersistentVolume| {
            let r = pv.spec.and_then(|s| s.claim_ref)?;
            Some(ObjectRef::new(r.name.as_deref()?).within(r.namespace.as_deref()?))
        })
        .run(reconcile, error_policy, ctx);
    tokio::join!(claims, volume::run(client, root));
}
