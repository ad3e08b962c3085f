//! The local PVC provisioner (embedded deployment; the role a CSI driver plays in a cluster).
//!
//! # Flow
//! A claim it serves ([`super::serves`]) gets the [`FINALIZER`] first, then its directory and
//! sparse image of the requested size (`disk.img`, or `block.img` behind a loop device), then
//! `spec.volumeName`, the annotations, and finally `status.phase: Bound` with its capacity and
//! access modes. Each step is idempotent, so a crash anywhere re-runs to the same result (the
//! loop device is found again by its backing file, never attached twice).
//!
//! On deletion the backing is released — loop device detached, directory removed — and the
//! finalizer dropped, but only once no VMI names the claim (directly or through its
//! DataVolume): a running VM's disk is never pulled. The claim waits with a `ClaimInUse` Event
//! and is woken by the VMI's deletion.
//!
//! # Errors
//! A claim it cannot provision (no size, no space, no loop device) keeps `Pending` and gets a
//! `ProvisioningFailed` Warning Event with the reason; it is retried with backoff.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, Controller};
use kube::ResourceExt;
use tracing::Instrument;

use api::phases::ClaimPhase;
use api::VirtualMachineInstance;
use client::events::{self, EventType};

use super::{claim_dir, loopdev, requested_bytes, serves, VolumeMode, ANN_DEVICE, ANN_PATH, FINALIZER};

const COMPONENT: &str = "virtplug-provisioner";

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
}

struct Ctx {
    client: kube::Client,
    root: PathBuf,
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

/// Releases the backing of the claim with `uid`: detaches its loop device, removes its directory.
///
/// # Errors
/// When the device cannot be detached or the directory removed.
pub fn release(root: &Path, uid: &str, claim: &str) -> Result<(), ProvisionError> {
    let dir = claim_dir(root, uid);
    let image = dir.join(VolumeMode::Block.image_name());
    if let Some(dev) = loopdev::find(&image) {
        loopdev::detach(&dev).map_err(|source| ProvisionError::Loop { claim: claim.to_owned(), source })?;
    }
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ProvisionError::Io { claim: claim.to_owned(), what: "remove", path: dir, source }),
    }
}

async fn reconcile(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, ProvisionError> {
    let r = reconcile_once(pvc, ctx).await;
    crate::metrics::count("claim", r.is_ok());
    r
}

/// One claim's reconcile, in a span naming it: released when deleted, else provisioned.
async fn reconcile_once(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, ProvisionError> {
    if !serves(&pvc) {
        return Ok(Action::await_change());
    }
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

    /// A deleted claim: its backing is released and the finalizer dropped once no VMI uses it
    /// (the VMI's change wakes the claim again).
    async fn release(&self) -> Result<(), ProvisionError> {
        if !self.pvc.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let ns = self.pvc.namespace().unwrap_or_default();
        let users = users(&self.ctx.client, &ns, &self.name())
            .await
            .map_err(|e| ProvisionError::Api { claim: self.object.clone(), source: Box::new(e) })?;
        if !users.is_empty() {
            let msg = format!("claim is used by VMI {}; its storage is released when no VMI uses it", users.join(", "));
            events::publish(&self.ctx.client, COMPONENT, self.pvc, EventType::Normal, "ClaimInUse", &msg).await;
            return Ok(());
        }
        let (root, uid, claim) = (self.ctx.root.clone(), self.uid.clone(), self.object.clone());
        tokio::task::spawn_blocking(move || release(&root, &uid, &claim))
            .await
            .map_err(|e| ProvisionError::Api { claim: self.object.clone(), source: Box::new(e) })??;
        client::update(&self.api, &self.name(), |p: &mut PersistentVolumeClaim| {
            if let Some(f) = p.metadata.finalizers.as_mut() {
                f.retain(|x| x != FINALIZER);
            }
        })
        .await
        .map_err(api_err(&self.object))?;
        tracing::info!("released the claim's storage");
        Ok(())
    }

    /// A live claim: finalizer, backing, then bound.
    async fn provision(&self) -> Result<(), ProvisionError> {
        let size = match requested_bytes(self.pvc) {
            Ok(size) => size,
            Err(message) => {
                // Only an edit of the claim can fix this: report it and wait for one.
                events::publish(&self.ctx.client, COMPONENT, self.pvc, EventType::Warning, "ProvisioningFailed", &message).await;
                tracing::warn!("{message}");
                return Ok(());
            }
        };
        if !self.pvc.finalizers().iter().any(|f| f == FINALIZER) {
            client::update(&self.api, &self.name(), |p: &mut PersistentVolumeClaim| {
                let f = p.metadata.finalizers.get_or_insert_with(Vec::new);
                if !f.iter().any(|x| x == FINALIZER) {
                    f.push(FINALIZER.to_owned());
                }
            })
            .await
            .map_err(api_err(&self.object))?;
        }
        let backing = self.backing(size).await?;
        self.bind(&backing, size).await
    }

    /// The backing, idempotently (also re-attaches a Block claim's loop device after a reboot).
    async fn backing(&self, size: u64) -> Result<Backing, ProvisionError> {
        let mode = VolumeMode::of(self.pvc);
        let dir = claim_dir(&self.ctx.root, &self.uid);
        let image = dir.join(mode.image_name());
        let (d, i, claim) = (dir.clone(), image.clone(), self.object.clone());
        let device = tokio::task::spawn_blocking(move || create_backing(&d, &i, size, mode, &claim))
            .await
            .map_err(|e| ProvisionError::Api { claim: self.object.clone(), source: Box::new(e) })??;
        Ok(Backing { mode, dir, image, device })
    }

    /// Records the backing on the claim (volume name, annotations), then binds it.
    async fn bind(&self, b: &Backing, size: u64) -> Result<(), ProvisionError> {
        let volume_name = format!("pvc-{}", self.uid);
        let dir_s = b.dir.to_string_lossy().into_owned();
        let dev_s = b.device.as_ref().map(|d| d.to_string_lossy().into_owned());
        // `self.pvc` is the store's copy: nothing is read or sent when it is already so.
        client::update_from(&self.api, self.pvc, |p: &mut PersistentVolumeClaim| {
            if let Some(spec) = p.spec.as_mut() {
                spec.volume_name = Some(volume_name.clone());
            }
            let ann = p.metadata.annotations.get_or_insert_with(Default::default);
            ann.insert(ANN_PATH.to_owned(), dir_s.clone());
            ann.insert("pv.kubernetes.io/bind-completed".to_owned(), "yes".to_owned());
            match &dev_s {
                Some(d) => ann.insert(ANN_DEVICE.to_owned(), d.clone()),
                None => ann.remove(ANN_DEVICE),
            };
        })
        .await
        .map_err(api_err(&self.object))?;
        let was_bound = ClaimPhase::is_bound(self.pvc);
        let spec = self.pvc.spec.as_ref();
        let capacity = spec.and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).cloned();
        let modes = spec.and_then(|s| s.access_modes.clone()).unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
        client::update_status_from(&self.api, self.pvc, |p: &mut PersistentVolumeClaim| {
            let st = p.status.get_or_insert_with(Default::default);
            st.phase = Some(ClaimPhase::Bound.as_str().to_owned());
            st.access_modes = Some(modes.clone());
            st.capacity =
                Some([("storage".to_owned(), capacity.clone().unwrap_or_else(|| Quantity(size.to_string())))].into_iter().collect());
        })
        .await
        .map_err(api_err(&self.object))?;
        if !was_bound {
            let what = match &b.device {
                Some(d) => format!("{:?} volume: {} over {}", b.mode, d.display(), b.image.display()),
                None => format!("{:?} volume: {}", b.mode, b.image.display()),
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

/// Creates the claim's directory and image (and attaches a Block claim's loop device unless it
/// is attached already). Blocking: run it off the reactor.
fn create_backing(dir: &Path, image: &Path, size: u64, mode: VolumeMode, claim: &str) -> Result<Option<PathBuf>, ProvisionError> {
    let io = |what, path: &Path| {
        let path = path.to_owned();
        move |source| ProvisionError::Io { claim: claim.to_owned(), what, path, source }
    };
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    create_image(image, size).map_err(io("create", image))?;
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
    tokio::spawn(async move { events::publish(&client, COMPONENT, pvc.as_ref(), EventType::Warning, "ProvisioningFailed", &msg).await });
    Action::requeue(Duration::from_secs(5))
}

/// Runs the provisioner for claims under `root` until the process stops.
pub async fn run(client: kube::Client, root: PathBuf) {
    let pvcs: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let vmis: Api<VirtualMachineInstance> = Api::all(client.clone());
    let ctx = Arc::new(Ctx { client, root });
    Controller::new(pvcs, watcher::Config::default())
        // A VMI's change (its deletion above all) wakes the claims it uses.
        .watches(vmis, watcher::Config::default(), |vmi| {
            let ns = vmi.namespace().unwrap_or_default();
            claims_of(&vmi).into_iter().map(move |c| ObjectRef::new(&c).within(&ns))
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}
