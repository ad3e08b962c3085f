//! The attach side of a pass: every source opened, then staged (bind-mount mode: first mounted
//! in QEMU's namespace), then plugged or inserted — each step for all volumes before the next, so
//! that each phase is one batch of status changes, queued for the pass's writer, which writes
//! the step's batches together once QEMU has answered the pass's plugs and unplugs (QMP never
//! waits for a status write).
//!
//! Attach: claim ready → open the source (`AttachedToNode`) → `add-fd` + `blockdev-add`
//! ([`qemu::Machine::stage_with`], against the pass's inventory: QEMU holds the block node,
//! `MountedToPod`; in bind-mount mode `MountedToPod` is the target made in QEMU's namespace,
//! which QEMU then opens) → `device_add` ([`qemu::Machine::plug`]) → `Ready`. A CD-ROM medium
//! goes into its drive ([`qemu::Machine::insert_medium`]) → `Ready`.

use std::path::PathBuf;
use std::time::Instant;

use tracing::Instrument;

use api::phases::VolumePhase;
use qemu::{Source, Staged};

use super::effects::Effects;
use super::execute::Pass;
use super::plan::{Attach, Target};
use super::status::Change;
use super::waiting::Failure;
use crate::bindmount::Vm;
use crate::reasons::EventReason;
use crate::source::{Opened, SourceError};
use crate::spans::volume as volume_span;

/// A volume on its way into QEMU, and when its wait began.
struct Going {
    a: Attach,
    started: Instant,
}

/// A volume that failed in this pass, with the furthest phase the pass took it to.
struct Failed {
    going: Going,
    error: SourceError,
    reached: Option<VolumePhase>,
}

/// What staging did.
#[derive(Default)]
struct Staging {
    /// Disks whose block node is in QEMU, to be plugged.
    staged: Vec<(Going, Staged)>,
    /// Media in their drives.
    in_place: Vec<Going>,
    failed: Vec<Failed>,
}

/// QEMU's refusal, as the volume's waiting reason.
fn refused(e: &qemu::OpError) -> SourceError {
    SourceError::NotReady(format!("QEMU refused the volume: {}", client::error_chain(e)))
}

/// Bind-mount mode: makes the opened volume reachable inside QEMU's namespace (a helper
/// process, the records' fsync: off the async threads).
async fn expose(b: &Vm, volume: &str, opened: Opened, readonly: bool) -> Result<PathBuf, SourceError> {
    let (b, volume) = (b.clone(), volume.to_owned());
    tokio::task::spawn_blocking(move || b.expose(&volume, &opened, readonly))
        .await
        .map_err(|e| SourceError::NotReady(e.to_string()))?
        .map_err(|e| SourceError::NotReady(format!("cannot bind-mount it: {}", client::error_chain(&e))))
}

impl<E: Effects> Pass<'_, E> {
    /// Attaches `steps`; `last` (the `Ready` of volumes QEMU held already) goes out with the
    /// pass's last attach write: the new `Ready`s and the failures.
    pub(super) async fn attach(&mut self, steps: Vec<Attach>, mut last: Vec<Change>) {
        let (opened, mut failed) = self.open_all(steps).await;
        let to_node = opened
            .iter()
            .map(|(g, o)| Change::reached(&g.a.volume, VolumePhase::AttachedToNode, format!("opened {}", o.path.display())))
            .collect();
        // Queued: the writer sends it with the later batches once the volumes are plugged.
        self.write(to_node);
        let staging = self.stage_all(opened).await;
        failed.extend(staging.failed);
        let in_qemu = match self.bind {
            Some(_) => Vec::new(),
            None => staging
                .staged
                .iter()
                .map(|(g, _)| {
                    let v = &g.a.volume;
                    let message = format!("Volume {v} is open in QEMU (block node {})", qemu::node_name(v));
                    Change::reached(v, VolumePhase::MountedToPod, message)
                })
                .collect(),
        };
        self.write(in_qemu);
        let plugged = self.plug_all(staging.staged).await;
        let mut in_place = staging.in_place;
        for (going, r) in plugged {
            match r {
                Ok(()) => in_place.push(going),
                // A failed plug removed the node its stage added (fd mode); a bind mount stays.
                Err(e) => {
                    let reached = Some(if self.bind.is_some() { VolumePhase::MountedToPod } else { VolumePhase::AttachedToNode });
                    failed.push(Failed { going, error: refused(&e), reached });
                }
            }
        }
        for g in in_place {
            crate::metrics::observe("total", g.started.elapsed().as_secs_f64());
            volume_span(&g.a.volume).in_scope(|| tracing::info!("attached"));
            last.push(Change::ready(&g.a.volume));
            self.hold(g.a.volume);
        }
        for f in failed {
            self.report(f, &mut last);
        }
        self.write(last);
    }

    /// Opens every source, in turn.
    async fn open_all(&self, steps: Vec<Attach>) -> (Vec<(Going, Opened)>, Vec<Failed>) {
        let (mut opened, mut failed) = (Vec::new(), Vec::new());
        for a in steps {
            crate::metrics::get().attempts.inc();
            let going = Going { started: self.volumes.since(&a.volume).unwrap_or_else(Instant::now), a };
            let t = Instant::now();
            match self.effects.open(&going.a).instrument(volume_span(&going.a.volume)).await {
                Ok(o) => {
                    crate::metrics::observe("open", t.elapsed().as_secs_f64());
                    opened.push((going, o));
                }
                Err(error) => failed.push(Failed { going, error, reached: None }),
            }
        }
        (opened, failed)
    }

    /// Into QEMU, in turn (one QMP connection): bind-mount mode's targets first (their
    /// `MountedToPod` in one batch), then media into their drives and disks staged.
    async fn stage_all(&self, opened: Vec<(Going, Opened)>) -> Staging {
        let mut out = Staging::default();
        let mut sources = Vec::new();
        let mut mounted = Vec::new();
        for (going, o) in opened {
            let Some(b) = self.bind else {
                sources.push((going, Source::Fd(o.fd)));
                continue;
            };
            let (v, t) = (going.a.volume.clone(), Instant::now());
            let readonly = going.a.readonly || matches!(going.a.target, Target::Medium { .. });
            match expose(b, &v, o, readonly).instrument(volume_span(&v)).await {
                Ok(target) => {
                    crate::metrics::observe("mount", t.elapsed().as_secs_f64());
                    let message = format!("Volume {v} has been mounted in virt-launcher pod (at {})", target.display());
                    mounted.push(Change::reached(&v, VolumePhase::MountedToPod, message));
                    sources.push((going, Source::Path(target)));
                }
                Err(error) => out.failed.push(Failed { going, error, reached: Some(VolumePhase::AttachedToNode) }),
            }
        }
        self.write(mounted);
        // What a failure here leaves: the target (bind-mount mode) or the open source.
        let reached = if self.bind.is_some() { VolumePhase::MountedToPod } else { VolumePhase::AttachedToNode };
        for (going, source) in sources {
            let span = volume_span(&going.a.volume);
            let t = Instant::now();
            let r = match &going.a.target {
                Target::Medium { drive } => {
                    let r = self.machine.insert_medium(drive, &going.a.volume, source).instrument(span).await;
                    crate::metrics::observe("qemu", t.elapsed().as_secs_f64());
                    r.map(|()| None)
                }
                Target::Device { kind, serial } => {
                    let a = &going.a;
                    let attach =
                        qemu::Attach { volume: a.volume.clone(), serial: serial.clone(), kind: *kind, readonly: a.readonly, source };
                    let r = self.machine.stage_with(self.inventory, attach).instrument(span).await;
                    crate::metrics::observe("stage", t.elapsed().as_secs_f64());
                    r.map(Some)
                }
            };
            match r {
                Ok(Some(staged)) => out.staged.push((going, staged)),
                Ok(None) => out.in_place.push(going),
                Err(e) => out.failed.push(Failed { going, error: refused(&e), reached: Some(reached.clone()) }),
            }
        }
        out
    }

    /// Plugs the staged disks, in turn.
    async fn plug_all(&self, staged: Vec<(Going, Staged)>) -> Vec<(Going, Result<(), qemu::OpError>)> {
        let mut out = Vec::new();
        for (going, s) in staged {
            let t = Instant::now();
            let r = self.machine.plug(s).instrument(volume_span(&going.a.volume)).await;
            crate::metrics::observe("qemu", t.elapsed().as_secs_f64());
            out.push((going, r));
        }
        out
    }

    /// Records a failure: the entry's new state in `last`, the `HotplugFailed` Event past the
    /// deadline, and the retry at the backoff.
    fn report(&mut self, f: Failed, last: &mut Vec<Change>) {
        let volume = &f.going.a.volume;
        let entry = self.status.and_then(|s| s.volume(volume));
        let failure = Failure { volume, error: &f.error, started: f.going.started, reached: f.reached, entry };
        let r = self.volumes.failed(&failure, Instant::now(), self.backoff.deadline);
        volume_span(volume).in_scope(|| tracing::debug!(attempts = r.attempts, "waiting: {}", f.error));
        self.raise(r.event.into_iter().map(|message| (EventReason::HotplugFailed, message)).collect());
        last.extend(r.change);
        self.retry_within(self.backoff.delay(r.attempts));
    }
}
