//! Volumes that wait: for their claim, their storage, or after QEMU refused them. What the agent
//! remembers of them (in memory only: after a restart the deadline simply starts again), and how
//! a failed attempt is reported — a pure decision, given the clock.
//!
//! A waiting volume keeps the furthest phase it reached (or its entry's), with the error in
//! `message` and KubeVirt's reason for that phase (`PVCNotReady` while `Pending`, else
//! `PVCBound`); past the deadline, or at once when its source is refused, the reason is
//! `HotplugFailed` and one `HotplugFailed` Event is raised per wait. Retries go on at the backoff.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use api::kubevirt::VolumeStatus;
use api::phases::{VolumePhase, VolumeReason};

use super::status::Change;
use crate::source::SourceError;

/// What the agent remembers about volumes that are not attached yet.
#[derive(Default)]
pub struct Volumes {
    waiting: HashMap<String, Waiting>,
}

struct Waiting {
    since: Instant,
    attempts: u32,
    reported_failed: bool,
}

/// A failed attempt of a pass, as the executor saw it.
pub struct Failure<'a> {
    pub volume: &'a str,
    pub error: &'a SourceError,
    /// When the volume's first attempt of this wait started.
    pub started: Instant,
    /// The furthest phase this pass took it to (`None`: it did not get past opening).
    pub reached: Option<VolumePhase>,
    /// Its `volumeStatus` entry when the pass began.
    pub entry: Option<&'a VolumeStatus>,
}

/// How a failed attempt is reported.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    /// The entry's new state; `None` when the entry says it already.
    pub change: Option<Change>,
    /// The `HotplugFailed` Event's message, once per wait.
    pub event: Option<String>,
    /// The failed attempts of this wait so far (the backoff's retry number).
    pub attempts: u32,
}

impl Volumes {
    /// Whether a volume waits (for its storage, or after QEMU refused it).
    #[must_use]
    pub fn waits(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// When the current wait of `volume` began, if it waits.
    pub(super) fn since(&self, volume: &str) -> Option<Instant> {
        self.waiting.get(volume).map(|w| w.since)
    }

    /// `volume` waits no more (it is in QEMU, or no longer wanted).
    pub(super) fn forget(&mut self, volume: &str) {
        if self.waiting.remove(volume).is_some() {
            crate::metrics::get().waiting.dec();
        }
    }

    /// Records the failed attempt `f` at `now` and says how to report it (`deadline`: how long a
    /// volume may wait before it is `HotplugFailed`).
    pub(super) fn failed(&mut self, f: &Failure<'_>, now: Instant, deadline: Duration) -> Report {
        // The metrics: one failure, and the volume counted as waiting until `forget`.
        crate::metrics::get().failures.inc();
        let w = self.waiting.entry(f.volume.to_owned()).or_insert_with(|| {
            crate::metrics::get().waiting.inc();
            Waiting { since: f.started, attempts: 0, reported_failed: false }
        });
        w.attempts += 1;
        let overdue = now.saturating_duration_since(w.since) >= deadline || matches!(f.error, SourceError::Refused(_));
        let message = f.error.to_string();
        let event = (overdue && !w.reported_failed).then(|| format!("volume {}: {message}", f.volume));
        w.reported_failed |= overdue;
        let phase = match f.reached.as_ref().or(f.entry.and_then(|e| e.phase.as_ref())) {
            Some(p @ (VolumePhase::Bound | VolumePhase::AttachedToNode | VolumePhase::MountedToPod)) => p.clone(),
            _ => VolumePhase::Pending,
        };
        let reason = match (&phase, overdue) {
            (_, true) => VolumeReason::HotplugFailed,
            (VolumePhase::Pending, false) => VolumeReason::PvcNotReady,
            (_, false) => VolumeReason::PvcBound,
        };
        let unchanged = f.reached.is_none()
            && f.entry.and_then(|e| e.message.as_deref()) == Some(message.as_str())
            && f.entry.and_then(|e| e.reason.as_ref()) == Some(&reason);
        let change = (!unchanged).then(|| Change::Set { volume: f.volume.to_owned(), phase, reason, message });
        Report { change, event, attempts: w.attempts }
    }
}

impl Drop for Volumes {
    fn drop(&mut self) {
        let n = i64::try_from(self.waiting.len()).unwrap_or(i64::MAX);
        crate::metrics::get().waiting.dec_by(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(60);

    fn not_ready() -> SourceError {
        SourceError::NotReady("claim data is not bound yet".into())
    }

    fn failure<'a>(error: &'a SourceError, started: Instant, reached: Option<VolumePhase>, entry: Option<&'a VolumeStatus>) -> Failure<'a> {
        Failure { volume: "data", error, started, reached, entry }
    }

    fn set(phase: VolumePhase, reason: VolumeReason, message: &str) -> Option<Change> {
        Some(Change::Set { volume: "data".into(), phase, reason, message: message.into() })
    }

    #[test]
    fn a_volume_whose_claim_is_not_ready_waits_pending_with_the_reason() {
        let (mut v, t0, e) = (Volumes::default(), Instant::now(), not_ready());
        let r = v.failed(&failure(&e, t0, None, None), t0, DEADLINE);
        let want = set(VolumePhase::Pending, VolumeReason::PvcNotReady, "claim data is not bound yet");
        assert_eq!(r, Report { change: want, event: None, attempts: 1 });
        assert!(v.waits());
        // Its entry as the controller wrote it (Bound): the phase stays, the reason is PVCBound.
        let bound = VolumeStatus { phase: Some(VolumePhase::Bound), ..VolumeStatus::default() };
        let r = v.failed(&failure(&e, t0, None, Some(&bound)), t0, DEADLINE);
        assert_eq!(r.change, set(VolumePhase::Bound, VolumeReason::PvcBound, "claim data is not bound yet"));
        assert_eq!(r.attempts, 2, "the backoff's retry number grows");
        v.forget("data");
        assert!(!v.waits());
    }

    #[test]
    fn a_failure_after_the_volume_was_opened_keeps_the_phase_it_reached() {
        let (mut v, t0) = (Volumes::default(), Instant::now());
        let e = SourceError::NotReady("QEMU refused the volume: Duplicate ID".into());
        let r = v.failed(&failure(&e, t0, Some(VolumePhase::AttachedToNode), None), t0, DEADLINE);
        assert_eq!(r.change, set(VolumePhase::AttachedToNode, VolumeReason::PvcBound, "QEMU refused the volume: Duplicate ID"));
        // A Ready entry whose volume QEMU lost starts again from Pending.
        let ready = VolumeStatus { phase: Some(VolumePhase::Ready), ..VolumeStatus::default() };
        let r = v.failed(&failure(&not_ready(), t0, None, Some(&ready)), t0, DEADLINE);
        assert_eq!(r.change.map(|c| matches!(c, Change::Set { phase: VolumePhase::Pending, .. })), Some(true));
    }

    #[test]
    fn past_the_deadline_the_reason_is_hotplug_failed_and_the_event_is_raised_once() {
        let (mut v, t0, e) = (Volumes::default(), Instant::now(), not_ready());
        assert_eq!(v.failed(&failure(&e, t0, None, None), t0 + DEADLINE / 2, DEADLINE).event, None, "within the deadline");
        let late = t0 + DEADLINE;
        let r = v.failed(&failure(&e, t0, None, None), late, DEADLINE);
        assert_eq!(r.change, set(VolumePhase::Pending, VolumeReason::HotplugFailed, "claim data is not bound yet"));
        assert_eq!(r.event.as_deref(), Some("volume data: claim data is not bound yet"));
        let again = v.failed(&failure(&e, t0, None, None), late + DEADLINE, DEADLINE);
        assert_eq!(again.event, None, "one Event per wait");
        assert_eq!(again.change.map(|c| matches!(c, Change::Set { reason: VolumeReason::HotplugFailed, .. })), Some(true));
    }

    #[test]
    fn a_refused_source_fails_at_once() {
        let (mut v, t0) = (Volumes::default(), Instant::now());
        let e = SourceError::Refused("disk.img is a symlink; refusing to follow it".into());
        let r = v.failed(&failure(&e, t0, None, None), t0, DEADLINE);
        assert_eq!(r.change, set(VolumePhase::Pending, VolumeReason::HotplugFailed, "disk.img is a symlink; refusing to follow it"));
        assert!(r.event.is_some());
    }

    #[test]
    fn the_same_failure_again_writes_nothing() {
        let (mut v, t0, e) = (Volumes::default(), Instant::now(), not_ready());
        let written = VolumeStatus {
            phase: Some(VolumePhase::Pending),
            reason: Some(VolumeReason::PvcNotReady),
            message: Some(e.to_string()),
            ..VolumeStatus::default()
        };
        assert_eq!(v.failed(&failure(&e, t0, None, Some(&written)), t0, DEADLINE).change, None);
        // A pass that got further writes, even with the same message.
        assert!(v.failed(&failure(&e, t0, Some(VolumePhase::AttachedToNode), Some(&written)), t0, DEADLINE).change.is_some());
    }
}
