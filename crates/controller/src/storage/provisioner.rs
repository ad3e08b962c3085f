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

/// The names of the claims a VMI uses: `persistentVolumeClaim.claimName` and `dataVolume.name`
/// (a DataVolume's claim has the DataVolume's name).
#[must_use]
pub fn claims_of(vmi: &VirtualMachineInstance) -> Vec<String> {
    vmi.spec
        .volumes
        .iter()
        .filter_map(|v| {
            v.persistent_volume_claim.as_ref().map(|p| p.claim_name.clone()).or_else(|| v.data_volume.as_ref().map(|d| d.name.clone()))
        })
        .collect()
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

async fn reconcile_once(pvc: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, ProvisionError> {
    if !serves(&pvc) {
        return Ok(Action::await_change());
    }
    let ns = pvc.namespace().unwrap_or_default();
    let name = pvc.name_any();
    let claim = format!("{ns}/{name}");
    let Some(uid) = pvc.uid() else { return Ok(Action::await_change()) };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);

    if pvc.metadata.deletion_timestamp.is_some() {
        if !pvc.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::await_change());
        }
        let users = users(&ctx.client, &ns, &name).await.map_err(|e| ProvisionError::Api { claim: claim.clone(), source: Box::new(e) })?;
        if !users.is_empty() {
            let msg = format!("claim is used by VMI {}; its storage is released when no VMI uses it", users.join(", "));
            events::publish(&ctx.client, COMPONENT, pvc.as_ref(), EventType::Normal, "ClaimInUse", &msg).await;
            return Ok(Action::await_change()); // the VMI's change wakes this claim
        }
        let (root, uid2, claim2) = (ctx.root.clone(), uid.clone(), claim.clone());
        tokio::task::spawn_blocking(move || release(&root, &uid2, &claim2))
            .await
            .map_err(|e| ProvisionError::Api { claim: claim.clone(), source: Box::new(e) })??;
        client::update(&api, &name, |p: &mut PersistentVolumeClaim| {
            if let Some(f) = p.metadata.finalizers.as_mut() {
                f.retain(|x| x != FINALIZER);
            }
        })
        .await
        .map_err(api_err(&claim))?;
        tracing::info!("released the storage of claim {claim}");
        return Ok(Action::await_change());
    }

    let size = match requested_bytes(&pvc) {
        Ok(size) => size,
        Err(message) => {
            // Only an edit of the claim can fix this: report it and wait for one.
            events::publish(&ctx.client, COMPONENT, pvc.as_ref(), EventType::Warning, "ProvisioningFailed", &message).await;
            tracing::warn!("claim {claim}: {message}");
            return Ok(Action::await_change());
        }
    };
    let mode = VolumeMode::of(&pvc);
    if !pvc.finalizers().iter().any(|f| f == FINALIZER) {
        client::update(&api, &name, |p: &mut PersistentVolumeClaim| {
            let f = p.metadata.finalizers.get_or_insert_with(Vec::new);
            if !f.iter().any(|x| x == FINALIZER) {
                f.push(FINALIZER.to_owned());
            }
        })
        .await
        .map_err(api_err(&claim))?;
    }

    // The backing, idempotently (also re-attaches a Block claim's loop device after a reboot).
    let dir = claim_dir(&ctx.root, &uid);
    let image = dir.join(mode.image_name());
    let device = {
        let (dir, image, claim) = (dir.clone(), image.clone(), claim.clone());
        let claim_outer = claim.clone();
        tokio::task::spawn_blocking(move || -> Result<Option<PathBuf>, ProvisionError> {
            std::fs::create_dir_all(&dir).map_err(|source| ProvisionError::Io {
                claim: claim.clone(),
                what: "create",
                path: dir.clone(),
                source,
            })?;
            create_image(&image, size).map_err(|source| ProvisionError::Io {
                claim: claim.clone(),
                what: "create",
                path: image.clone(),
                source,
            })?;
            if mode == VolumeMode::Block {
                let dev = match loopdev::find(&image) {
                    Some(d) => d,
                    None => loopdev::attach(&image, false).map_err(|source| ProvisionError::Loop { claim: claim.clone(), source })?,
                };
                return Ok(Some(dev));
            }
            Ok(None)
        })
        .await
        .map_err(|e| ProvisionError::Api { claim: claim_outer, source: Box::new(e) })??
    };

    let volume_name = format!("pvc-{uid}");
    let dir_s = dir.to_string_lossy().into_owned();
    let dev_s = device.as_ref().map(|d| d.to_string_lossy().into_owned());
    client::update(&api, &name, |p: &mut PersistentVolumeClaim| {
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
    .map_err(api_err(&claim))?;
    let was_bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let capacity =
        pvc.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).cloned();
    let modes = pvc.spec.as_ref().and_then(|s| s.access_modes.clone()).unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
    client::update_status(&api, &name, |p: &mut PersistentVolumeClaim| {
        let st = p.status.get_or_insert_with(Default::default);
        st.phase = Some("Bound".to_owned());
        st.access_modes = Some(modes.clone());
        st.capacity = Some([("storage".to_owned(), capacity.clone().unwrap_or_else(|| Quantity(size.to_string())))].into_iter().collect());
    })
    .await
    .map_err(api_err(&claim))?;
    if !was_bound {
        let what = match &device {
            Some(d) => format!("{mode:?} volume: {} over {}", d.display(), image.display()),
            None => format!("{mode:?} volume: {}", image.display()),
        };
        events::publish(&ctx.client, COMPONENT, pvc.as_ref(), EventType::Normal, "ProvisioningSucceeded", &format!("provisioned {what}"))
            .await;
        tracing::info!("bound claim {claim} ({what})");
    }
    Ok(Action::await_change())
}

// kube-runtime's error policy signature takes the object by value.
#[allow(clippy::needless_pass_by_value)]
fn error_policy(pvc: Arc<PersistentVolumeClaim>, err: &ProvisionError, ctx: Arc<Ctx>) -> Action {
    tracing::warn!("{}", client::error_chain(err));
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
