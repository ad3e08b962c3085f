//! A running VMI's hot-plug volumes against what QEMU reports, and their `volumeStatus`.
//!
//! # State machine (per volume, every step idempotent)
//! Attach: claim ready → open the source (`AttachedToNode`) → `add-fd` + `blockdev-add`
//! ([`Machine::stage`]: QEMU holds the block node, `MountedToPod`; in bind-mount mode
//! ([`crate::bindmount`]) `MountedToPod` is the target made in QEMU's namespace, which QEMU then
//! opens) → `device_add` ([`Machine::plug`]) → `Ready`. A CD-ROM medium goes into its drive
//! (`blockdev-change-medium`) → `Ready`.
//! Detach: `Detaching` → `device_del` → `DEVICE_DELETED` (deadline) → `blockdev-del` → the
//! entry is removed and a `VolumeUnplugged` Event is emitted; a CD-ROM medium is ejected.
//!
//! The truth is QEMU ([`Machine::attached`], [`Machine::drives`]): after an agent restart the
//! same reconcile attaches what is missing and detaches what is extra.
//!
//! # Waiting
//! A volume whose claim is not ready keeps its phase with the reason in `message` and is
//! retried on the next wake-up (claim/DataVolume watch) or after the backoff; past the deadline
//! its reason is `HotplugFailed` with a `HotplugFailed` Event, and retries continue at the cap.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::ResourceExt;

use api::kubevirt::{Disk, DiskKind, HotplugVolumeStatus, Volume, VolumeStatus};
use api::VirtualMachineInstance;
use client::events::{self, EventType};
use qemu::ops::{Attach, DeviceKind, Machine, Source};

use crate::agent::Shared;
use crate::bindmount::Vm;
use crate::source::{self, SourceError};

const COMPONENT: &str = "virtplug-node";

/// What the agent remembers about volumes that are not attached yet (in memory only: after a
/// restart the deadline simply starts again).
#[derive(Default)]
pub struct Volumes {
    waiting: HashMap<String, Waiting>,
}

impl Volumes {
    /// Whether a volume waits (for its storage, or after QEMU refused it).
    #[must_use]
    pub fn waits(&self) -> bool {
        !self.waiting.is_empty()
    }

    fn forget(&mut self, name: &str) {
        if self.waiting.remove(name).is_some() {
            crate::metrics::get().waiting.dec();
        }
    }
}

impl Drop for Volumes {
    fn drop(&mut self) {
        let n = i64::try_from(self.waiting.len()).unwrap_or(i64::MAX);
        crate::metrics::get().waiting.dec_by(n);
    }
}

struct Waiting {
    since: Instant,
    attempts: u32,
    reported_failed: bool,
}

/// QEMU's refusal, as the volume's waiting reason.
fn refused(e: &qemu::ops::OpError) -> SourceError {
    SourceError::NotReady(format!("QEMU refused the volume: {}", client::error_chain(e)))
}

/// Bind-mount mode: makes the opened volume reachable inside QEMU's namespace (a helper
/// process; off the async threads).
async fn expose(b: &Vm, volume: &str, opened: source::Opened, readonly: bool) -> Result<PathBuf, SourceError> {
    let (b, volume) = (b.clone(), volume.to_owned());
    tokio::task::spawn_blocking(move || b.expose(&volume, &opened, readonly))
        .await
        .map_err(|e| SourceError::NotReady(e.to_string()))?
        .map_err(|e| SourceError::NotReady(format!("cannot bind-mount it: {}", client::error_chain(&e))))
}

/// One change to a `volumeStatus` entry.
enum Change {
    Set { name: String, phase: &'static str, reason: &'static str, message: String },
    Remove(String),
}

impl Change {
    /// The volume is in QEMU (KubeVirt's reason and message).
    fn ready(name: &str) -> Change {
        Change::Set {
            name: name.to_owned(),
            phase: "Ready",
            reason: "VolumeReady",
            message: "Successfully attach hotplugged volume to VM".into(),
        }
    }
}

async fn write(shared: &Shared, vmi: &VirtualMachineInstance, changes: Vec<Change>) {
    if changes.is_empty() {
        return;
    }
    let api: Api<VirtualMachineInstance> = Api::namespaced(shared.client.clone(), &vmi.namespace().unwrap_or_default());
    let r = client::update_status(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
        let st = v.status.get_or_insert_with(Default::default);
        for c in &changes {
            match c {
                Change::Set { name, phase, reason, message } => {
                    let idx = match st.volume_status.iter().position(|e| &e.name == name) {
                        Some(i) => i,
                        None => {
                            let mut e = VolumeStatus {
                                name: name.clone(),
                                hotplug_volume: Some(HotplugVolumeStatus::default()),
                                ..VolumeStatus::default()
                            };
                            // The agent reacted to the spec before the controller's status write:
                            // the claim was bound when it was opened, so the timeline says so
                            // (the controller leaves entries past Bound alone).
                            if matches!(*phase, "AttachedToNode" | "MountedToPod" | "Ready") {
                                e.transition("Bound", "PVCBound", "the claim is bound (seen by the node agent)");
                            }
                            st.volume_status.push(e);
                            st.volume_status.len() - 1
                        }
                    };
                    st.volume_status[idx].transition(phase, reason, message);
                }
                Change::Remove(name) => st.volume_status.retain(|e| &e.name != name),
            }
        }
    })
    .await;
    if let Err(e) = r {
        tracing::warn!("VMI {}/{}: cannot write volumeStatus: {e}", vmi.namespace().unwrap_or_default(), vmi.name_any());
    }
}

fn entry<'a>(vmi: &'a VirtualMachineInstance, name: &str) -> Option<&'a VolumeStatus> {
    vmi.status.as_ref()?.volume_status.iter().find(|e| e.name == name)
}

/// The block nodes named by the agent (`ours`) that nothing accounts for: not a wanted volume's
/// (staged, or about to be plugged), not a device's, not a drive's medium, not deleted by this
/// pass already (`gone`).
fn leftover_nodes<'a>(
    ours: &'a [String],
    wanted: &[String],
    attached: &[qemu::ops::Attached],
    drives: &[qemu::ops::Drive],
    gone: &[String],
) -> Vec<&'a str> {
    ours.iter()
        .map(String::as_str)
        .filter(|n| {
            !wanted.iter().any(|w| w == n)
                && !attached.iter().any(|a| a.node.as_deref() == Some(*n))
                && !drives.iter().any(|d| d.medium_node.as_deref() == Some(*n))
                && !gone.iter().any(|g| g == n)
        })
        .collect()
}

/// Reconciles the VMI's hot-plug volumes with QEMU. Returns when to retry if something waits.
pub async fn reconcile(
    shared: &Shared,
    vmi: &VirtualMachineInstance,
    machine: &Machine,
    bind: Option<&Vm>,
    volumes: &mut Volumes,
) -> Option<Duration> {
    let ns = vmi.namespace().unwrap_or_default();
    let object = format!("{ns}/{}", vmi.name_any());
    let wanted: Vec<(&Volume, &Disk)> = vmi
        .spec
        .volumes
        .iter()
        .filter(|v| v.is_hotpluggable())
        .filter_map(|v| vmi.spec.domain.devices.disks.iter().find(|d| d.name == v.name).map(|d| (v, d)))
        .collect();
    let (attached, our_nodes) = match machine.inventory().await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("VMI {object}: cannot ask QEMU what is attached: {e}");
            return Some(shared.config.backoff.cap);
        }
    };
    let drives = machine.drives().await.unwrap_or_default();
    let mut retry: Option<Duration> = None;
    // Bind-mount mode: the volumes QEMU holds at the end of the pass (their targets stay).
    let mut held: Vec<String> = Vec::new();
    // Status changes are written in batches — one write (and one watch event for every
    // watcher) per step of the pass instead of one per volume and step: with many volumes
    // and VMs the writes, not QMP, were the cost.
    let mut last_changes: Vec<Change> = Vec::new();
    // The furthest phase each volume reached in this pass (a failure later keeps it).
    let mut reached: HashMap<String, &'static str> = HashMap::new();
    let mut failed: Vec<(&Volume, SourceError, Instant)> = Vec::new();

    // 1. What QEMU holds is Ready; the rest is opened.
    let mut opened: Vec<(&Volume, &Disk, source::Opened, Instant)> = Vec::new();
    for &(v, d) in &wanted {
        let is_cdrom = d.kind() == DiskKind::Cdrom;
        let node = qemu::ops::node_name(&v.name);
        let present = if is_cdrom {
            drives.iter().any(|dr| dr.id == d.name && dr.medium_node.as_deref() == Some(node.as_str()))
        } else {
            attached.iter().any(|a| a.volume == v.name)
        };
        if present {
            held.push(v.name.clone());
            volumes.forget(&v.name);
            if entry(vmi, &v.name).and_then(|e| e.phase.as_deref()) != Some("Ready") {
                last_changes.push(Change::ready(&v.name));
            }
            continue;
        }
        crate::metrics::get().attempts.inc();
        let started = volumes.waiting.get(&v.name).map_or_else(Instant::now, |w| w.since);
        let t = Instant::now();
        let attach_pod = entry(vmi, &v.name).and_then(|e| e.hotplug_volume.as_ref()).and_then(|h| h.attach_pod_uid.clone());
        match crate::claims::open(shared, &ns, v, d.readonly(), attach_pod).await {
            Ok(o) => {
                crate::metrics::observe("open", t.elapsed().as_secs_f64());
                reached.insert(v.name.clone(), "AttachedToNode");
                opened.push((v, d, o, started));
            }
            Err(e) => failed.push((v, e, started)),
        }
    }
    let attached_to_node = opened
        .iter()
        .map(|(v, _, o, _)| Change::Set {
            name: v.name.clone(),
            phase: "AttachedToNode",
            reason: "SuccessfulCreate",
            message: format!("opened {}", o.path.display()),
        })
        .collect();
    let mut staged: Vec<(&Volume, qemu::ops::Staged, Instant)> = Vec::new();
    // What QEMU took in this pass: Ready below, in one place for media and disks.
    let mut in_place: Vec<(&Volume, Instant)> = Vec::new();
    // The `AttachedToNode` write goes out while the volumes are staged, not before: it is off
    // the hot-plug's critical path. Writes of one object queue in order on its lock (FIFO), and
    // this one is polled first, so `MountedToPod` still lands after it.
    let staging = async {
        // 2. Bind-mount mode: each target made in QEMU's namespace (QEMU opens the path).
        let mut sources: Vec<(&Volume, &Disk, Source, Instant)> = Vec::new();
        let mut mounted: Vec<Change> = Vec::new();
        for (v, d, o, started) in opened {
            let Some(b) = bind else {
                sources.push((v, d, Source::Fd(o.fd), started));
                continue;
            };
            let t = Instant::now();
            match expose(b, &v.name, o, d.readonly() || d.kind() == DiskKind::Cdrom).await {
                Ok(target) => {
                    crate::metrics::observe("mount", t.elapsed().as_secs_f64());
                    reached.insert(v.name.clone(), "MountedToPod");
                    mounted.push(Change::Set {
                        name: v.name.clone(),
                        phase: "MountedToPod",
                        reason: "VolumeMountedToPod",
                        message: format!("Volume {} has been mounted in virt-launcher pod (at {})", v.name, target.display()),
                    });
                    sources.push((v, d, Source::Path(target), started));
                }
                Err(e) => failed.push((v, e, started)),
            }
        }
        write(shared, vmi, mounted).await;

        // 3. Into QEMU, in turn (one QMP connection): media into their drives; disks staged
        // (their block nodes — `MountedToPod` in fd mode), then their devices added while that
        // one write goes out.
        for (v, d, source, started) in sources {
            let t = Instant::now();
            if d.kind() == DiskKind::Cdrom {
                let r = machine.insert_medium(&d.name, &v.name, source).await;
                crate::metrics::observe("qemu", t.elapsed().as_secs_f64());
                match r {
                    Ok(()) => in_place.push((v, started)),
                    Err(e) => failed.push((v, refused(&e), started)),
                }
                continue;
            }
            let kind = if d.kind() == DiskKind::Lun { DeviceKind::Lun } else { DeviceKind::Disk };
            let serial = d.serial.clone().unwrap_or_else(|| v.name.clone());
            match machine.stage(Attach { volume: v.name.clone(), serial, kind, readonly: d.readonly(), source }).await {
                Ok(s) => {
                    crate::metrics::observe("stage", t.elapsed().as_secs_f64());
                    staged.push((v, s, started));
                }
                Err(e) => failed.push((v, refused(&e), started)),
            }
        }
    };
    tokio::join!(write(shared, vmi, attached_to_node), staging);
    let in_qemu: Vec<Change> = if bind.is_none() {
        staged
            .iter()
            .map(|(v, _, _)| {
                reached.insert(v.name.clone(), "MountedToPod");
                Change::Set {
                    name: v.name.clone(),
                    phase: "MountedToPod",
                    reason: "VolumeMountedToPod",
                    message: format!("Volume {} is open in QEMU (block node {})", v.name, qemu::ops::node_name(&v.name)),
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    let plugs = async {
        let mut out = Vec::new();
        for (v, s, started) in staged {
            let t = Instant::now();
            let r = machine.plug(s).await;
            crate::metrics::observe("qemu", t.elapsed().as_secs_f64());
            out.push((v, r, started));
        }
        out
    };
    let ((), plugged) = tokio::join!(write(shared, vmi, in_qemu), plugs);
    for (v, r, started) in plugged {
        match r {
            Ok(()) => in_place.push((v, started)),
            Err(e) => {
                // A failed plug removed the node it staged.
                if bind.is_none() {
                    reached.insert(v.name.clone(), "AttachedToNode");
                }
                failed.push((v, refused(&e), started));
            }
        }
    }

    for (v, started) in in_place {
        crate::metrics::observe("total", started.elapsed().as_secs_f64());
        held.push(v.name.clone());
        volumes.forget(&v.name);
        last_changes.push(Change::ready(&v.name));
        tracing::info!("VMI {object}: volume {} attached", v.name);
    }

    // 4. What failed waits: its reason and last error, `HotplugFailed` past the deadline.
    for (v, e, started) in failed {
        // The metrics: one failure, and the volume counted as waiting until `forget`.
        crate::metrics::get().failures.inc();
        let w = volumes.waiting.entry(v.name.clone()).or_insert_with(|| {
            crate::metrics::get().waiting.inc();
            Waiting { since: started, attempts: 0, reported_failed: false }
        });
        w.attempts += 1;
        let msg = e.to_string();
        let overdue = w.since.elapsed() >= shared.config.backoff.deadline || matches!(e, SourceError::Refused(_));
        let cur = entry(vmi, &v.name);
        let phase: &'static str = match reached.get(&v.name).copied().or(cur.and_then(|e| e.phase.as_deref())) {
            Some("Bound") => "Bound",
            Some("AttachedToNode") => "AttachedToNode",
            Some("MountedToPod") => "MountedToPod",
            _ => "Pending",
        };
        let reason = if overdue {
            "HotplugFailed"
        } else if phase == "Pending" {
            "PVCNotReady"
        } else {
            "PVCBound"
        };
        if overdue && !w.reported_failed {
            w.reported_failed = true;
            events::publish(&shared.client, COMPONENT, vmi, EventType::Warning, "HotplugFailed", &format!("volume {}: {msg}", v.name))
                .await;
        }
        let unchanged = !reached.contains_key(&v.name)
            && cur.and_then(|e| e.message.as_deref()) == Some(msg.as_str())
            && cur.and_then(|e| e.reason.as_deref()) == Some(reason);
        if !unchanged {
            last_changes.push(Change::Set { name: v.name.clone(), phase, reason, message: msg });
        }
        let d = shared.config.backoff.delay(w.attempts);
        retry = Some(retry.map_or(d, |r| r.min(d)));
    }
    write(shared, vmi, last_changes).await;

    // 5. Unplug what QEMU has and the spec no longer wants: `Detaching` for all in one write,
    // QMP in turn, the Events, then the entries removed in one write.
    let wanted_names: Vec<&str> = wanted.iter().map(|(v, _)| v.name.as_str()).collect();
    let extra: Vec<&qemu::ops::Attached> = attached.iter().filter(|a| !wanted_names.contains(&a.volume.as_str())).collect();
    let detaching = extra
        .iter()
        .map(|a| Change::Set { name: a.volume.clone(), phase: "Detaching", reason: "SuccessfulDelete", message: "unplugging".into() })
        .collect();
    write(shared, vmi, detaching).await;
    let mut unplugged: Vec<String> = Vec::new();
    // Nodes this pass deleted itself (detach, eject): not leftovers.
    let mut unplugged_nodes: Vec<String> = Vec::new();
    let mut unplug_changes: Vec<Change> = Vec::new();
    for a in extra {
        let t = Instant::now();
        let detached = machine.detach(&a.volume).await;
        crate::metrics::observe("unplug", t.elapsed().as_secs_f64());
        match detached {
            Ok(()) => {
                tracing::info!("VMI {object}: volume {} detached", a.volume);
                // Its target, if bind-mounted, is undone with the stale ones below.
                held.retain(|h| h != &a.volume);
                unplugged_nodes.push(qemu::ops::node_name(&a.volume));
                unplugged.push(a.volume.clone());
            }
            Err(e) => {
                unplug_changes.push(Change::Set {
                    name: a.volume.clone(),
                    phase: "Detaching",
                    reason: "SuccessfulDelete",
                    message: client::error_chain(&e),
                });
                held.push(a.volume.clone());
                retry = Some(retry.map_or(shared.config.backoff.base, |r| r.min(shared.config.backoff.base)));
            }
        }
    }
    // The Events first (whoever waits for an entry to go then finds its Event), concurrently.
    let messages: Vec<String> = unplugged.iter().map(|v| format!("volume {v} unplugged")).collect();
    futures::future::join_all(
        messages.iter().map(|m| events::publish(&shared.client, COMPONENT, vmi, EventType::Normal, "VolumeUnplugged", m)),
    )
    .await;
    unplug_changes.extend(unplugged.into_iter().map(Change::Remove));
    write(shared, vmi, unplug_changes).await;
    let wanted_nodes: Vec<String> = wanted_names.iter().map(|n| qemu::ops::node_name(n)).collect();
    for dr in &drives {
        let Some(node) = dr.medium_node.as_deref().filter(|n| n.starts_with("n-") && !wanted_nodes.iter().any(|w| w == n)) else {
            continue;
        };
        // The status entry of the medium, found by its node name (long names are hashed).
        let medium = vmi
            .status
            .as_ref()
            .and_then(|s| s.volume_status.iter().find(|e| qemu::ops::node_name(&e.name) == node))
            .map(|e| e.name.clone());
        if let Some(m) = &medium {
            write(
                shared,
                vmi,
                vec![Change::Set { name: m.clone(), phase: "Detaching", reason: "SuccessfulDelete", message: "ejecting".into() }],
            )
            .await;
        }
        match machine.eject(&dr.id).await {
            Ok(()) => {
                unplugged_nodes.push(node.to_owned());
                let what = medium.as_deref().unwrap_or(node);
                events::publish(
                    &shared.client,
                    COMPONENT,
                    vmi,
                    EventType::Normal,
                    "VolumeUnplugged",
                    &format!("medium {what} ejected from {}", dr.id),
                )
                .await;
                if let Some(m) = &medium {
                    write(shared, vmi, vec![Change::Remove(m.clone())]).await;
                }
            }
            Err(e) => {
                held.extend(medium);
                tracing::warn!("VMI {object}: cannot eject the medium of {}: {}", dr.id, client::error_chain(&e));
            }
        }
    }
    // Nodes left without their device: an unplug whose `DEVICE_DELETED` came after its wait
    // ended (deadline, or an agent killed right after `device_del`). `attached` lists devices, so
    // nothing above sees them, and they hold their images open. A node still bound to a backend
    // QEMU is finalising refuses deletion: retry soon.
    for node in leftover_nodes(&our_nodes, &wanted_nodes, &attached, &drives, &unplugged_nodes) {
        match machine.remove_node(node).await {
            Ok(()) => tracing::info!("VMI {object}: removed block node {node}, left by an interrupted unplug"),
            Err(e) => {
                tracing::info!("VMI {object}: block node {node} without its device is not free yet ({e}); retrying");
                retry = Some(retry.map_or(shared.config.backoff.base, |r| r.min(shared.config.backoff.base)));
            }
        }
    }
    // Bind-mount mode: undo every target QEMU does not hold — volumes just detached, attaches
    // that failed after the mount, and what an agent killed mid-way left (its records).
    if let Some(b) = bind {
        let b = b.clone();
        let keep = held.clone();
        let released =
            tokio::task::spawn_blocking(move || b.release_all_except(&keep.iter().map(String::as_str).collect::<Vec<_>>())).await;
        match released {
            Ok(Ok(v)) if !v.is_empty() => tracing::info!("VMI {object}: bind mounts of {v:?} undone"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!("VMI {object}: {}", client::error_chain(&e));
                retry = Some(retry.map_or(shared.config.backoff.base, |r| r.min(shared.config.backoff.base)));
            }
            Err(e) => tracing::warn!("VMI {object}: {e}"),
        }
    }
    // Entries of hot-plug volumes that are neither wanted nor in QEMU (removed while pending).
    let stale: Vec<Change> = vmi
        .status
        .as_ref()
        .map(|s| {
            s.volume_status
                .iter()
                .filter(|e| e.hotplug_volume.is_some() && !wanted_names.contains(&e.name.as_str()))
                .map(|e| e.name.clone())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|n| {
            !attached.iter().any(|a| &a.volume == n)
                && !drives.iter().any(|d| d.medium_node.as_deref() == Some(qemu::ops::node_name(n).as_str()))
        })
        .map(|n| {
            volumes.forget(&n);
            Change::Remove(n)
        })
        .collect();
    write(shared, vmi, stale).await;
    retry
}

#[cfg(test)]
mod tests {
    use qemu::ops::{Attached, Drive};

    use super::leftover_nodes;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// An unplug interrupted after `device_del` leaves `n-old` without its device: it is the only
    /// leftover; wanted nodes (even without a device yet), devices' nodes, media and what this
    /// pass deleted are not.
    #[test]
    fn a_node_whose_device_is_gone_and_that_nothing_wants_is_a_leftover() {
        let ours = names(&["n-old", "n-plugged", "n-staged", "n-medium", "n-detached"]);
        let attached =
            [Attached { volume: "plugged".into(), device_type: "scsi-hd".into(), node: Some("n-plugged".into()), readonly: false }];
        let drives = [Drive { id: "cd0".into(), medium_node: Some("n-medium".into()), tray_open: false }];
        let left = leftover_nodes(&ours, &names(&["n-plugged", "n-staged"]), &attached, &drives, &names(&["n-detached"]));
        assert_eq!(left, ["n-old"]);
        assert!(leftover_nodes(&[], &[], &attached, &drives, &[]).is_empty());
    }
}
