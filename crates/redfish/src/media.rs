//! Virtual media: the `Cd` device of every System, carried out on the VM
//! ([`api::virtual_media`] edits its spec) and a DataVolume that imports the image.
//!
//! # Insert
//! 1. Take the System's turn (the lock resets and boot overrides take too: an insert and a
//!    boot-override PATCH 35 ms apart run one after the other, each on a fresh read of the VM
//!    with a resourceVersion precondition, so neither undoes the other).
//! 2. The same image already in the drive (and not failed): nothing to do.
//! 3. Create a DataVolume `VM-vmedia-RANDOM` importing the URL, labelled [`MEDIUM_OF`] and owned
//!    by the VM (garbage-collected with it), then put it in the drive through `client::update`.
//!    A running VM's drive must exist already (a SATA drive cannot be hot-plugged).
//! 4. Follow until the medium is in the drive: a running guest's `volumeStatus` says `Ready`
//!    (QEMU reports the medium), a stopped VM's import has `Succeeded`. 204 when that happens
//!    within [`INLINE_WAIT`], else 202 + Task; a failed import ends the Task in `Exception`
//!    with the import's reason and raises a `VirtualMediaInsertFailed` Event on the VM.
//! 5. DataVolumes of the VM no longer in its spec nor in its VMI are deleted ([`sweep`]).
//! 6. A failed insert is taken back ([`rollback`]): the spec as before it, unless the VM waits to
//!    power on (then the failed medium keeps it off).
//!
//! # Eject
//! The medium leaves the drive (the drive stays); an empty drive ejects successfully. The
//! import is freed once the running guest let go of it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Resource, ResourceExt};

use api::cdi::{DataVolumeSource, DataVolumeSpec, HttpSource, StorageResources, StorageSpec};
use api::phases::{DataVolumePhase, VolumePhase};
use api::virtual_media::{self as vmedia, MEDIUM_OF};
use api::{DataVolume, VirtualMachine, VirtualMachineInstance};

use crate::accounts::Scope;
use crate::auth::Caller;
use crate::error::RfError;
use crate::follow::{self, Progress};
use crate::power;
use crate::protocol;
use crate::service::Service;
use crate::uri::{MediaOwner, Uri, INSERT_ACTION};

/// The one virtual-media device of a System.
pub const DEVICE: &str = "Cd";
/// How long an insert or eject waits before answering 202 with a Task.
pub const INLINE_WAIT: Duration = Duration::from_secs(1);
/// How long a Task follows an insert (the import included).
pub const TASK_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// The size of the claim an image is imported into: the largest image accepted (the file is
/// sparse; a larger image fails the import, naming the size).
pub const MAX_IMAGE: &str = "4Gi";
const COMPONENT: &str = "virtplug-redfish";

/// What the `Cd` device shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MediaState {
    /// The URL of the medium in the drive (also while it imports).
    pub image: Option<String>,
    /// Really in the drive: QEMU reports it (running guest), or imported and in the spec.
    pub inserted: bool,
    /// The import failed: why.
    pub failed: Option<String>,
}

fn url_of(dv: &DataVolume) -> Option<String> {
    dv.spec.source.as_ref()?.http.as_ref().map(|h| h.url.clone())
}

fn failure(dv: &DataVolume) -> Option<String> {
    let s = dv.status.as_ref()?;
    if s.phase != Some(DataVolumePhase::Failed) {
        return None;
    }
    let why = s.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone());
    Some(why.unwrap_or_else(|| "the import failed".to_owned()))
}

/// Whether `vmi` has DataVolume `dv` in drive `drive`, reported by QEMU.
fn in_guest(vmi: &VirtualMachineInstance, drive: &str, dv: &str) -> bool {
    let in_spec = vmi.spec.volumes.iter().any(|v| v.name == drive && v.data_volume.as_ref().is_some_and(|d| d.name == dv));
    let ready = vmi.status.as_ref().and_then(|s| s.volume(drive)).is_some_and(|v| v.phase == Some(VolumePhase::Ready));
    in_spec && ready
}

/// The `Cd` device of `vm` (see [`MediaState`]).
#[must_use]
pub fn state(svc: &Service, vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> MediaState {
    let Some(name) = vmedia::medium(vm) else { return MediaState::default() };
    let ns = vm.namespace().unwrap_or_default();
    let Some(dv) = svc.cache.medium(&ns, &name) else { return MediaState::default() };
    let failed = failure(&dv);
    let imported = dv.status.as_ref().and_then(|s| s.phase.as_ref()) == Some(&DataVolumePhase::Succeeded);
    let inserted = imported
        && match vmi.filter(|v| power::active(v)) {
            Some(v) => in_guest(v, &vmedia::cd_drive(vm), &name),
            None => true,
        };
    MediaState { image: url_of(&dv), inserted, failed }
}

/// How to take back a failed insert: the VM as it was before it, in what the insert changed.
#[derive(Clone, Debug)]
struct Undo {
    /// The DataVolume the insert put in the drive.
    dv: String,
    /// The drive existed before the insert (else the insert added it).
    had_drive: bool,
    /// The medium the insert replaced.
    old: Option<String>,
}

/// What an insert or eject waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Goal {
    Inserted(String),
    Ejected,
}

fn progress(svc: &Service, uid: &str, goal: &Goal) -> Progress {
    let Some(vm) = svc.cache.vm(uid, &Scope::default()) else { return Progress::Failed("the VM was deleted".to_owned()) };
    let vmi = svc.cache.vmi(&vm).filter(|v| power::active(v));
    let ns = vm.namespace().unwrap_or_default();
    match goal {
        Goal::Inserted(dv) => {
            if vmedia::medium(&vm).as_deref() != Some(dv.as_str()) {
                return Progress::Failed("another medium was inserted or the medium was ejected meanwhile".to_owned());
            }
            let Some(d) = svc.cache.medium(&ns, dv) else { return Progress::Moving(5) };
            if let Some(why) = failure(&d) {
                return Progress::Failed(format!("the import of the image failed: {why}"));
            }
            if state(svc, &vm, vmi.as_deref()).inserted {
                return Progress::Reached;
            }
            let pct = d.status.as_ref().and_then(|s| s.progress.as_deref()).and_then(|p| p.trim_end_matches('%').parse::<f64>().ok());
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            pct.map_or(Progress::Moving(10), |p| Progress::Moving((p.clamp(0.0, 100.0) * 0.9) as u8))
        }
        Goal::Ejected => {
            let drive = vmedia::cd_drive(&vm);
            if vmedia::medium(&vm).is_some() {
                return Progress::Failed("a medium was inserted meanwhile".to_owned());
            }
            let held = vmi.as_ref().is_some_and(|v| {
                v.spec.volumes.iter().any(|x| x.name == drive) || v.status.as_ref().and_then(|s| s.volume(&drive)).is_some()
            });
            if held {
                Progress::Moving(50)
            } else {
                Progress::Reached
            }
        }
    }
}

async fn follow(svc: &Service, uid: &str, goal: &Goal, within: Duration, on_progress: impl FnMut(u8)) -> Progress {
    follow::until(&svc.cache, within, || progress(svc, uid, goal), on_progress).await
}

/// Waits (bounded) until the cache holds `vm` at least at `version`'s write.
pub(crate) async fn await_vm(svc: &Service, uid: &str, version: Option<&str>) {
    let Some(version) = version else { return };
    let seen = async {
        let mut changed = svc.cache.changed();
        loop {
            changed.borrow_and_update();
            let rv = svc.cache.vm(uid, &Scope::default()).and_then(|v| v.resource_version());
            if rv.as_deref() == Some(version) || rv.and_then(|r| r.parse::<u64>().ok()) >= version.parse::<u64>().ok() {
                return;
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), seen).await.is_err() {
        tracing::warn!(system = uid, "the cache did not show the VM's write within 10 s");
    }
}

fn api_error(what: &str, e: &dyn std::error::Error) -> RfError {
    RfError::internal(&format!("{what}: {}", client::error_chain(e)))
}

fn new_medium(vm: &VirtualMachine, url: &str) -> DataVolume {
    let ns = vm.namespace().unwrap_or_default();
    let base: String = vm.name_any().chars().take(200).collect();
    let name = format!("{base}-vmedia-{:08x}", rand::random::<u32>());
    let owner = OwnerReference {
        api_version: VirtualMachine::api_version(&()).into_owned(),
        kind: VirtualMachine::kind(&()).into_owned(),
        name: vm.name_any(),
        uid: vm.uid().unwrap_or_default(),
        controller: Some(false),
        block_owner_deletion: Some(true),
    };
    let storage = StorageSpec {
        resources: Some(StorageResources {
            requests: [("storage".to_owned(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(MAX_IMAGE.to_owned()))].into(),
            ..StorageResources::default()
        }),
        ..StorageSpec::default()
    };
    let mut dv = DataVolume::new(
        &name,
        DataVolumeSpec {
            source: Some(DataVolumeSource {
                http: Some(HttpSource { url: url.to_owned(), ..HttpSource::default() }),
                ..DataVolumeSource::default()
            }),
            storage: Some(storage),
            ..DataVolumeSpec::default()
        },
    );
    dv.metadata = ObjectMeta {
        name: Some(name),
        namespace: Some(ns),
        labels: Some([(MEDIUM_OF.to_owned(), vm.name_any())].into()),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    };
    dv
}

/// Deletes the virtual-media DataVolumes of `vm` that neither its spec nor its VMI uses.
///
/// The caller holds the System's turn: an insert creates its DataVolume before the VM's spec
/// names it, and holds the turn until then. The spec is read fresh before anything is deleted,
/// so a cache that has not yet seen an insert's write deletes nothing that insert put in the
/// drive. The VMI is the cached one: a VMI the cache has not yet shown (a VM started a moment
/// ago) counts as holding nothing.
pub(crate) async fn sweep(svc: &Service, vm: &VirtualMachine) {
    let ns = vm.namespace().unwrap_or_default();
    let vmi = svc.cache.vmi(vm);
    let used = |vm: &VirtualMachine, name: &str| {
        let in_vm = vm
            .spec
            .template
            .spec
            .as_ref()
            .is_some_and(|s| s.volumes.iter().any(|v| v.data_volume.as_ref().is_some_and(|d| d.name == name)));
        let in_vmi = vmi.as_ref().is_some_and(|v| {
            v.spec.volumes.iter().any(|x| x.data_volume.as_ref().is_some_and(|d| d.name == name))
                || v.status.as_ref().is_some_and(|s| {
                    s.volume_status
                        .iter()
                        .any(|x| x.persistent_volume_claim_info.as_ref().and_then(|c| c.claim_name.as_deref()) == Some(name))
                })
        });
        in_vm || in_vmi
    };
    let unused: Vec<String> = svc
        .cache
        .media_of(&ns, &vm.name_any())
        .into_iter()
        .filter(|dv| dv.metadata.deletion_timestamp.is_none())
        .map(|dv| dv.name_any())
        .filter(|name| !used(vm, name))
        .collect();
    if unused.is_empty() {
        return;
    }
    let vms: Api<VirtualMachine> = Api::namespaced(svc.client.clone(), &ns);
    let fresh = match vms.get(&vm.name_any()).await {
        Ok(v) if v.uid() == vm.uid() => v,
        // Gone or replaced: its media go with it (owner references).
        Ok(_) => return,
        Err(kube::Error::Api(s)) if s.code == 404 => return,
        Err(e) => {
            tracing::warn!(vm = %vm.name_any(), "cannot read the VM to free its unused virtual media (kept): {}", client::error_chain(&e));
            return;
        }
    };
    let api: Api<DataVolume> = Api::namespaced(svc.client.clone(), &ns);
    for name in unused.iter().filter(|n| !used(&fresh, n)) {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(vm = %vm.name_any(), dv = %name, "freed an ejected virtual medium"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(dv = %name, "cannot delete an unused virtual medium: {}", client::error_chain(&e)),
        }
    }
}

/// Puts `url` in the `Cd` drive of System `uid` (see the module docs).
///
/// # Errors
/// 404 for a System the caller does not see; 409 when a running System has no drive for it.
pub async fn insert(
    svc: &Arc<Service>,
    caller: &Caller,
    uid: &str,
    url: &str,
    target: &Uri,
    body: &str,
) -> Result<http::Response<Body>, RfError> {
    let (goal, undo) = {
        let _turn = crate::service::system_turn(uid).await;
        let vm = svc.cache.vm(uid, &caller.scope).ok_or_else(|| RfError::resource_not_found("ComputerSystem", uid))?;
        let ns = vm.namespace().unwrap_or_default();
        let vmi = svc.cache.vmi(&vm).filter(|v| power::active(v));
        let current = vmedia::medium(&vm).and_then(|n| svc.cache.medium(&ns, &n));
        if let Some(dv) = current.filter(|d| url_of(d).as_deref() == Some(url) && failure(d).is_none()) {
            tracing::info!(system = uid, "InsertMedia: the same image is already in the drive");
            (Goal::Inserted(dv.name_any()), None)
        } else {
            let drive = vmedia::cd_drive(&vm);
            let had_drive = vmedia::has_disk(&vm, &drive);
            if let Some(v) = &vmi {
                if !v.spec.domain.devices.disks.iter().any(|d| d.name == drive) {
                    return Err(RfError::action_conflict(
                        "Image",
                        INSERT_ACTION,
                        "the running System has no CD-ROM drive (a SATA drive cannot be added to a running guest); \
                         power it off and insert again: the drive is added at the next power-on",
                    ));
                }
            }
            let dvs: Api<DataVolume> = Api::namespaced(svc.client.clone(), &ns);
            let dv = new_medium(&vm, url);
            let name = dv.name_any();
            dvs.create(&PostParams::default(), &dv).await.map_err(|e| api_error("cannot create the virtual medium's DataVolume", &e))?;
            let vms: Api<VirtualMachine> = Api::namespaced(svc.client.clone(), &ns);
            let r = client::try_update(&vms, &vm.name_any(), &client::UpdateOptions::default(), |v: &mut VirtualMachine| {
                if v.uid() != vm.uid() {
                    return Err(vmedia::OverrideError::NoTemplate);
                }
                vmedia::insert(v, &name).map(|_| ())
            })
            .await;
            let old = vmedia::medium(&vm);
            match r {
                Ok(u) => await_vm(svc, uid, u.object.resource_version().as_deref()).await,
                Err(e) => {
                    let _ = dvs.delete(&name, &DeleteParams::default()).await;
                    return Err(api_error("cannot put the medium in the VM's drive", &e));
                }
            }
            tracing::info!(system = uid, dv = %name, "InsertMedia: importing the image");
            (Goal::Inserted(name.clone()), Some(Undo { dv: name, had_drive, old }))
        }
    };
    finish(svc, caller, uid, goal, undo, target, body).await
}

/// Takes the medium out of the `Cd` drive of System `uid`.
///
/// # Errors
/// 404 for a System the caller does not see.
pub async fn eject(svc: &Arc<Service>, caller: &Caller, uid: &str, target: &Uri, body: &str) -> Result<http::Response<Body>, RfError> {
    {
        let _turn = crate::service::system_turn(uid).await;
        let vm = svc.cache.vm(uid, &caller.scope).ok_or_else(|| RfError::resource_not_found("ComputerSystem", uid))?;
        if vmedia::medium(&vm).is_some() {
            let vms: Api<VirtualMachine> = Api::namespaced(svc.client.clone(), &vm.namespace().unwrap_or_default());
            let u = client::update(&vms, &vm.name_any(), |v: &mut VirtualMachine| {
                if v.uid() == vm.uid() {
                    vmedia::eject(v);
                }
            })
            .await
            .map_err(|e| api_error("cannot take the medium out of the VM's drive", &e))?;
            await_vm(svc, uid, u.object.resource_version().as_deref()).await;
            tracing::info!(system = uid, "EjectMedia: the medium leaves the drive");
        }
    }
    finish(svc, caller, uid, Goal::Ejected, None, target, body).await
}

async fn finish(
    svc: &Arc<Service>,
    caller: &Caller,
    uid: &str,
    goal: Goal,
    undo: Option<Undo>,
    target: &Uri,
    body: &str,
) -> Result<http::Response<Body>, RfError> {
    let action = if matches!(goal, Goal::Ejected) { "EjectMedia" } else { "InsertMedia" };
    let outcome = follow(svc, uid, &goal, INLINE_WAIT, |_| {}).await;
    if let Progress::Moving(_) = outcome {
        return Ok(task(svc, caller, uid, goal, undo, target, body, action));
    }
    settle(svc, uid, &goal, &outcome, undo.as_ref()).await;
    match outcome {
        Progress::Failed(why) => Err(RfError::action_conflict("Image", action, &why)),
        _ => Ok(protocol::empty(StatusCode::NO_CONTENT)),
    }
}

/// What the end of an insert or eject leaves to do: done, free the imports nothing uses any
/// more; a failed insert, its Event and its rollback.
async fn settle(svc: &Service, uid: &str, goal: &Goal, outcome: &Progress, undo: Option<&Undo>) {
    match (outcome, goal) {
        (Progress::Reached, _) => {
            // Under the System's turn (see `sweep`).
            let _turn = crate::service::system_turn(uid).await;
            if let Some(vm) = svc.cache.vm(uid, &Scope::default()) {
                sweep(svc, &vm).await;
            }
        }
        (Progress::Failed(why), Goal::Inserted(_)) => {
            event(svc, uid, why).await;
            rollback(svc, uid, undo).await;
        }
        _ => {}
    }
}

/// Takes back a failed insert: the VM's spec as before it (the drive it added, the medium it
/// replaced), so bad input leaves nothing behind. Not while the VM waits to power on: then the
/// failed medium stays and keeps it off (`DataVolumeError`) — a VM asked to boot from an ISO
/// must never boot without it — until the client ejects or inserts again.
async fn rollback(svc: &Service, uid: &str, undo: Option<&Undo>) {
    let Some(undo) = undo else { return };
    let Some(vm) = svc.cache.vm(uid, &Scope::default()) else { return };
    let _turn = crate::service::system_turn(uid).await;
    let vms: Api<VirtualMachine> = Api::namespaced(svc.client.clone(), &vm.namespace().unwrap_or_default());
    let old_exists = undo.old.as_ref().is_some_and(|o| svc.cache.medium(&vm.namespace().unwrap_or_default(), o).is_some());
    let r = client::update(&vms, &vm.name_any(), |v: &mut VirtualMachine| {
        let waits_to_start = power::state(v, None) == power::PowerState::PoweringOn;
        if v.uid() != vm.uid() || vmedia::medium(v).as_deref() != Some(undo.dv.as_str()) || waits_to_start {
            return;
        }
        match undo.old.as_deref().filter(|_| old_exists) {
            Some(old) => {
                let _ = vmedia::insert(v, old);
            }
            None => {
                let drive = vmedia::cd_drive(v);
                vmedia::eject(v);
                if !undo.had_drive {
                    vmedia::remove_drive(v, &drive);
                }
            }
        }
    })
    .await;
    match r {
        Ok(u) if u.wrote => {
            tracing::info!(system = uid, dv = %undo.dv, "the failed insert was taken back");
            await_vm(svc, uid, u.object.resource_version().as_deref()).await;
            if let Some(vm) = svc.cache.vm(uid, &Scope::default()) {
                sweep(svc, &vm).await;
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(system = uid, "cannot take back the failed insert: {}", client::error_chain(&e)),
    }
}

async fn event(svc: &Service, uid: &str, why: &str) {
    if let Some(vm) = svc.cache.vm(uid, &Scope::default()) {
        client::events::publish(&svc.client, COMPONENT, vm.as_ref(), client::events::EventType::Warning, "VirtualMediaInsertFailed", why)
            .await;
    }
}

#[allow(clippy::too_many_arguments)]
fn task(
    svc: &Arc<Service>,
    caller: &Caller,
    uid: &str,
    goal: Goal,
    undo: Option<Undo>,
    target: &Uri,
    body: &str,
    action: &str,
) -> http::Response<Body> {
    let t = svc.tasks.start(&format!("VirtualMedia.{action} of System {uid}"), &caller.user, &target.path(), body);
    let (svc2, uid2, id) = (Arc::clone(svc), uid.to_owned(), t.id.clone());
    let late = format!("VirtualMedia.{action} did not take effect within {} s", TASK_DEADLINE.as_secs());
    tokio::spawn(async move {
        let tasks = &svc2.tasks;
        let outcome = follow(&svc2, &uid2, &goal, TASK_DEADLINE, |p| tasks.progress(&id, p)).await;
        settle(&svc2, &uid2, &goal, &outcome, undo.as_ref()).await;
        follow::end_task(tasks, &id, &outcome, &late);
    });
    follow::accepted(svc, caller, t.id)
}

/// The `Cd` member's URI under `owner`.
#[must_use]
pub fn member(owner: MediaOwner, uid: &str) -> Uri {
    Uri::VirtualMedia(owner, uid.to_owned(), DEVICE.to_owned())
}
