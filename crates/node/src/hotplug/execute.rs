//! The executor: runs a pass's [`Step`]s against QEMU and writes what they change.
//!
//! # Flow (one pass)
//! 1. Attach ([`super::attach`]): open every source → stage (bind-mount mode: mount) → plug or
//!    insert, with the `Ready` of what QEMU already held and the failures in the pass's last
//!    attach write.
//! 2. Unplug: `Detaching` for all in one write, `device_del` for each in turn (no query first:
//!    the pass's inventory says the device is there), then QEMU's `DEVICE_DELETED`s awaited
//!    together, the `VolumeUnplugged` Events, then the entries removed in one write.
//! 3. Eject each medium no volume wants (`Detaching`, eject, Event, removal).
//! 4. Delete the block nodes nothing accounts for; a refusal (QEMU still finalising the
//!    device) retries at the base backoff.
//! 5. Bind-mount mode: undo every target QEMU does not hold.
//! 6. Drop the entries of volumes removed while they waited, in one write.
//!
//! # Guarantees
//! Status changes are written in batches — one write (and one watch event for every watcher)
//! per step of the pass at most, not one per volume and step: with many volumes and VMs the
//! writes, not QMP, were the cost. The writes and Events go out in the order they were queued,
//! from the pass's writer, and QMP never waits for them: a status write is two round trips to
//! the API server and a commit, longer than a QMP step, and it used to hold the `device_add` of
//! a hot-plug back. The writer starts once QEMU has answered the pass's plugs and unplugs
//! (`device_add`, `device_del`; the unplugs' `DEVICE_DELETED` is awaited while it writes): on
//! this 2-core machine a write beside the QMP steps (its commit, its watch fan-out, the
//! controller's reconcile of it) slowed them by ~2 ms per plug. So a watcher sees a plugged
//! volume's phase move once `device_add` is answered, and an unplugged one's `Detaching` once
//! `device_del` is, while QEMU finishes the unplug. Batches queued in a row then go
//! out as one write (a plug's `AttachedToNode`, `MountedToPod` and `Ready`: one write, not
//! three). Each batch's phases are stamped when it was queued (when the pass reached them), not
//! when it is written; an Event goes out after the writes queued before it (its volume's status
//! says what the Event reports, as in KubeVirt). The pass ends when the last has returned.
//! Every log line about a volume is in its `volume` span.

use std::time::{Duration, Instant};

use futures::channel::{mpsc, oneshot};
use futures::StreamExt;
use tracing::Instrument;

use api::kubevirt::VirtualMachineInstanceStatus;
use qemu::{Inventory, Machine};

use super::effects::Effects;
use super::plan::{Attach, Step};
use super::status::Change;
use super::waiting::Volumes;
use crate::backoff::Backoff;
use crate::bindmount::Vm;
use crate::reasons::EventReason;
use crate::spans::volume as volume_span;

/// A pass's steps, by kind (each kind runs as one step of the pass).
#[derive(Default)]
struct ByKind {
    /// `Ready` for volumes QEMU held already: written with the attaches' last batch.
    ready: Vec<Change>,
    attaches: Vec<Attach>,
    detaches: Vec<String>,
    /// (drive, node, entry)
    ejects: Vec<(String, String, Option<String>)>,
    nodes: Vec<String>,
    dropped: Vec<String>,
}

/// One pass over a VMI's volumes.
pub(super) struct Pass<'a, E: Effects> {
    pub machine: &'a Machine,
    /// What QEMU held when the pass began (the plan's input; staging and unplugging ask nothing
    /// again).
    pub inventory: &'a Inventory,
    /// Bind-mount mode's view of the VM.
    pub bind: Option<&'a Vm>,
    pub effects: &'a E,
    pub volumes: &'a mut Volumes,
    pub backoff: Backoff,
    /// The VMI's status when the pass began (what a failure's report compares with).
    pub status: Option<&'a VirtualMachineInstanceStatus>,
    /// The volumes QEMU holds at the end of the pass (bind-mount mode: their targets stay).
    held: Vec<String>,
    retry: Option<Duration>,
    /// The status writes, in order, to the pass's writer ([`Pass::run`]).
    writes: mpsc::UnboundedSender<Queued>,
    /// The writer's end, until [`Pass::run`] takes it.
    written: Option<mpsc::UnboundedReceiver<Queued>>,
}

/// How a pass ended.
pub(super) struct Ran {
    /// When to run again, if something waits or a status write failed.
    pub retry: Option<Duration>,
    /// The volumes QEMU holds: those it held already, those attached, those whose unplug or
    /// eject failed.
    pub held: Vec<String>,
}

/// What the pass's writer is given, in order.
enum Queued {
    /// One batch of status changes, and when they were reached.
    Write(Vec<Change>, jiff::Timestamp),
    /// Events on the VMI, raised together.
    Events(Vec<(EventReason, String)>),
}

impl<'a, E: Effects> Pass<'a, E> {
    pub fn new(machine: &'a Machine, inventory: &'a Inventory, effects: &'a E, volumes: &'a mut Volumes, backoff: Backoff) -> Self {
        let (writes, written) = mpsc::unbounded();
        let (held, retry, written) = (Vec::new(), None, Some(written));
        Pass { machine, inventory, bind: None, effects, volumes, backoff, status: None, held, retry, writes, written }
    }

    /// Runs `steps`, its status writes beside them, in order, from the moment QEMU has answered
    /// the pass's plugs and unplugs (`device_add`, `device_del`) on; returns, once the last
    /// write has returned, when to retry if something waits or a status write failed (within the
    /// base backoff: nothing else would wake the worker to write it again), and the volumes QEMU
    /// holds.
    pub async fn run(mut self, steps: Vec<Step>) -> Ran {
        let effects = self.effects;
        let written = self.written.take();
        let base = self.backoff.base;
        // Fired (or dropped) by the steps once QEMU has answered the plugs and unplugs.
        let (changed, after_change) = oneshot::channel();
        // One write at a time, in the order they were queued, from then on; the batches queued
        // in a row by then go out as one write. It ends when the pass (which holds the sender)
        // is done and everything queued is written. Whether every write went through.
        let writer = async move {
            let Some(w) = written else { return true };
            // Cancelled only when the pass ended first: write what it queued.
            let _ = after_change.await;
            let mut all = true;
            let mut ready = w.ready_chunks(32);
            while let Some(queued) = ready.next().await {
                let mut batches = Vec::new();
                for q in queued {
                    match q {
                        Queued::Write(changes, at) => batches.push((changes, at)),
                        Queued::Events(events) => {
                            if !batches.is_empty() {
                                all &= effects.write(std::mem::take(&mut batches)).await;
                            }
                            futures::future::join_all(events.into_iter().map(|(reason, message)| effects.event(reason, message))).await;
                        }
                    }
                }
                if !batches.is_empty() {
                    all &= effects.write(batches).await;
                }
            }
            all
        };
        let (all_written, (retry, held)) = tokio::join!(writer, self.steps(steps, changed));
        let retry = if all_written { retry } else { Some(retry.map_or(base, |r| r.min(base))) };
        Ran { retry, held }
    }

    async fn steps(mut self, steps: Vec<Step>, changed: oneshot::Sender<()>) -> (Option<Duration>, Vec<String>) {
        let mut by_kind = ByKind::default();
        for step in steps {
            match step {
                Step::Keep { volume } => self.hold(volume),
                Step::RecordReady { volume } => {
                    by_kind.ready.push(Change::ready(&volume));
                    self.hold(volume);
                }
                Step::Attach(a) => by_kind.attaches.push(a),
                Step::Detach { volume } => by_kind.detaches.push(volume),
                Step::Eject { drive, node, volume } => by_kind.ejects.push((drive, node, volume)),
                Step::RemoveNode { node } => by_kind.nodes.push(node),
                Step::DropEntry { volume } => by_kind.dropped.push(volume),
            }
        }
        self.attach(by_kind.attaches, by_kind.ready).await;
        self.detach(by_kind.detaches, changed).await;
        for (drive, node, volume) in by_kind.ejects {
            let span = volume_span(volume.as_deref().unwrap_or(&node));
            self.eject(drive, &node, volume).instrument(span).await;
        }
        for node in by_kind.nodes {
            self.remove_node(&node).await;
        }
        self.release().await;
        self.drop_entries(by_kind.dropped).await;
        (self.retry, self.held)
    }

    /// QEMU holds `volume`: it waits no more, and (bind-mount mode) its target stays.
    pub(super) fn hold(&mut self, volume: String) {
        self.volumes.forget(&volume);
        self.held.push(volume);
    }

    /// The next pass runs within `d` at the latest.
    pub(super) fn retry_within(&mut self, d: Duration) {
        self.retry = Some(self.retry.map_or(d, |r| r.min(d)));
    }

    /// Queues one batch, reached now, for the pass's writer (nothing for an empty one): it is
    /// written after everything queued before it (once QEMU has answered the pass's plugs and
    /// unplugs), while the pass goes on.
    pub(super) fn write(&self, changes: Vec<Change>) {
        if !changes.is_empty() {
            self.queue(Queued::Write(changes, jiff::Timestamp::now()));
        }
    }

    /// Queues Events on the VMI, raised together once everything queued before them is done.
    pub(super) fn raise(&self, events: Vec<(EventReason, String)>) {
        if !events.is_empty() {
            self.queue(Queued::Events(events));
        }
    }

    fn queue(&self, q: Queued) {
        // The writer's end lives as long as the pass (`run` joins it with the steps).
        let _ = self.writes.unbounded_send(q);
    }

    /// Unplugs the devices of `volumes`: `Detaching` for all in one write, queued before QMP
    /// unplugs them; `device_del` for each in turn, then `changed` fires (the pass's writes may
    /// go out), then QEMU's confirmations are awaited together; then the Events, then the entries
    /// removed in one write.
    async fn detach(&mut self, volumes: Vec<String>, changed: oneshot::Sender<()>) {
        self.write(volumes.iter().map(|v| Change::detaching(v, "unplugging")).collect());
        let (machine, inventory) = (self.machine, self.inventory);
        let mut begun = Vec::with_capacity(volumes.len());
        for volume in volumes {
            let span = volume_span(&volume);
            let t = Instant::now();
            let unplugging = machine.unplug_with(inventory, &volume).instrument(span.clone()).await;
            begun.push((volume, span, t, unplugging));
        }
        // The writer may be gone only if the pass is: nothing to tell.
        let _ = changed.send(());
        let unplugged = futures::future::join_all(begun.into_iter().map(|(volume, span, t, unplugging)| async move {
            let detached = match unplugging {
                Ok(u) => u.finish().instrument(span.clone()).await,
                Err(e) => Err(e),
            };
            crate::metrics::observe("unplug", t.elapsed().as_secs_f64());
            (volume, span, detached)
        }))
        .await;
        let (mut gone, mut changes) = (Vec::new(), Vec::new());
        for (volume, span, detached) in unplugged {
            match detached {
                Ok(()) => {
                    span.in_scope(|| tracing::info!("detached"));
                    gone.push(volume);
                }
                Err(e) => {
                    span.in_scope(|| tracing::warn!("cannot detach it yet: {}", client::error_chain(&e)));
                    changes.push(Change::detaching(&volume, client::error_chain(&e)));
                    self.held.push(volume);
                    self.retry_within(self.backoff.base);
                }
            }
        }
        // The Events first (whoever waits for an entry to go then finds its Event).
        self.raise(gone.iter().map(|v| (EventReason::VolumeUnplugged, format!("volume {v} unplugged"))).collect());
        changes.extend(gone.into_iter().map(Change::Remove));
        self.write(changes);
    }

    /// Ejects medium `node` from `drive`; `volume` is its entry (`Detaching` written while QEMU
    /// ejects, as for an unplug).
    async fn eject(&mut self, drive: String, node: &str, volume: Option<String>) {
        self.write(volume.iter().map(|v| Change::detaching(v, "ejecting")).collect());
        let ejected = self.machine.eject(&drive).await;
        match ejected {
            Ok(()) => {
                let what = volume.as_deref().unwrap_or(node);
                self.raise(vec![(EventReason::VolumeUnplugged, format!("medium {what} ejected from {drive}"))]);
                if let Some(v) = volume {
                    self.write(vec![Change::Remove(v)]);
                }
            }
            Err(e) => {
                tracing::warn!("cannot eject the medium of {drive}: {}", client::error_chain(&e));
                self.held.extend(volume);
            }
        }
    }

    /// Deletes a node left without its device (an unplug whose `DEVICE_DELETED` came after its
    /// wait ended: deadline, or an agent killed right after `device_del`). One still bound to a
    /// backend QEMU is finalising refuses deletion: retry soon.
    async fn remove_node(&mut self, node: &str) {
        match self.machine.remove_node(node).await {
            Ok(()) => tracing::info!("removed block node {node}, left by an interrupted unplug"),
            Err(e) => {
                tracing::info!("block node {node} without its device is not free yet ({e}); retrying");
                self.retry_within(self.backoff.base);
            }
        }
    }

    /// Bind-mount mode: undoes every target QEMU does not hold — volumes just detached,
    /// attaches that failed after the mount, and what an agent killed mid-way left (its
    /// records). Off the async threads (a helper process, the records' fsync).
    async fn release(&mut self) {
        let Some(b) = self.bind else { return };
        let (b, keep) = (b.clone(), self.held.clone());
        let released =
            tokio::task::spawn_blocking(move || b.release_all_except(&keep.iter().map(String::as_str).collect::<Vec<_>>())).await;
        match released {
            Ok(Ok(v)) if !v.is_empty() => tracing::info!("bind mounts of {v:?} undone"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!("{}", client::error_chain(&e));
                self.retry_within(self.backoff.base);
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// Drops the entries of volumes removed while they waited.
    async fn drop_entries(&mut self, volumes: Vec<String>) {
        for v in &volumes {
            self.volumes.forget(v);
        }
        self.write(volumes.into_iter().map(Change::Remove).collect());
    }
}
