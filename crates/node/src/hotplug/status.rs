//! The agent's changes to `volumeStatus`, as values: a pass collects them per step and the
//! executor writes the batches queued in a row in one status write; [`apply`] is what that write
//! does to the VMI, batch by batch.

use api::kubevirt::VirtualMachineInstanceStatus;
use api::phases::{VolumePhase, VolumeReason};

/// One change to a `volumeStatus` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The entry of `volume` (created when absent) moves to `phase`, `reason` and `message`.
    Set { volume: String, phase: VolumePhase, reason: VolumeReason, message: String },
    /// The entry of `volume` goes (its unplug is confirmed, or it was removed while it waited).
    Remove(String),
}

impl Change {
    /// `volume` reached `phase`, with the reason KubeVirt pairs with it.
    pub fn reached(volume: &str, phase: VolumePhase, message: impl Into<String>) -> Change {
        Change::Set { volume: volume.to_owned(), reason: phase.reason(), phase, message: message.into() }
    }

    /// The volume is in QEMU (KubeVirt's reason and message).
    #[must_use]
    pub fn ready(volume: &str) -> Change {
        Change::reached(volume, VolumePhase::Ready, "Successfully attach hotplugged volume to VM")
    }

    /// The volume is being unplugged (or its medium ejected); `message` says how far.
    pub fn detaching(volume: &str, message: impl Into<String>) -> Change {
        Change::reached(volume, VolumePhase::Detaching, message)
    }
}

/// Applies `changes`, reached at `at` (one step of a pass: its batch's phases are stamped
/// then, not when the queued write runs), to `status`, in order. An entry the agent creates past `Bound` (it reacted
/// to the spec before the controller's status write) first records `Bound`: the claim was bound
/// when the agent opened it, so the timeline says so (the controller leaves entries past `Bound`
/// alone).
pub fn apply(status: &mut VirtualMachineInstanceStatus, changes: &[Change], at: jiff::Timestamp) {
    for c in changes {
        match c {
            Change::Set { volume, phase, reason, message } => {
                let created = status.volume(volume).is_none();
                let e = status.volume_entry(volume);
                if created && matches!(phase, VolumePhase::AttachedToNode | VolumePhase::MountedToPod | VolumePhase::Ready) {
                    e.transition_at(VolumePhase::Bound, VolumeReason::PvcBound, "the claim is bound (seen by the node agent)", at);
                }
                e.transition_at(phase.clone(), reason.clone(), message, at);
            }
            Change::Remove(volume) => status.volume_status.retain(|e| &e.name != volume),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases(s: &VirtualMachineInstanceStatus, volume: &str) -> Vec<String> {
        let e = s.volume(volume).expect("the entry");
        let stamps = e.extra["phaseTransitionTimestamps"].as_array().expect("its timeline");
        stamps.iter().map(|t| t["phase"].as_str().unwrap_or_default().to_owned()).collect()
    }

    fn now() -> jiff::Timestamp {
        jiff::Timestamp::now()
    }

    #[test]
    fn an_entry_the_agent_creates_past_bound_records_bound_first() {
        let mut s = VirtualMachineInstanceStatus::default();
        apply(&mut s, &[Change::reached("a", VolumePhase::AttachedToNode, "opened /x")], now());
        assert_eq!(phases(&s, "a"), ["Bound", "AttachedToNode"]);
        let e = s.volume("a").expect("the entry");
        assert_eq!((e.phase.as_ref(), e.reason.as_ref()), (Some(&VolumePhase::AttachedToNode), Some(&VolumeReason::SuccessfulCreate)));
        assert!(e.hotplug_volume.is_some(), "a hot-plug entry");
        // An existing entry moves on without a made-up Bound.
        apply(&mut s, &[Change::ready("a")], now());
        assert_eq!(phases(&s, "a"), ["Bound", "AttachedToNode", "Ready"]);
        // Detaching an entry nobody wrote says nothing about its claim.
        apply(&mut s, &[Change::detaching("b", "unplugging")], now());
        assert_eq!(phases(&s, "b"), ["Detaching"]);
    }

    #[test]
    fn a_batch_is_stamped_with_the_time_its_changes_were_reached() {
        let mut s = VirtualMachineInstanceStatus::default();
        let at: jiff::Timestamp = "2026-12-03T12:00:00.125Z".parse().expect("a timestamp");
        apply(&mut s, &[Change::ready("a")], at);
        let e = s.volume("a").expect("the entry");
        assert_eq!(e.entered(&VolumePhase::Ready), Some(at));
        assert_eq!(e.entered(&VolumePhase::Bound), Some(at), "the Bound the agent records for an entry it creates");
    }

    #[test]
    fn a_phase_reached_before_another_writers_later_one_is_stamped_after_it() {
        let at = |t: &str| -> jiff::Timestamp { t.parse().expect("a timestamp") };
        let mut s = VirtualMachineInstanceStatus::default();
        // The controller's Bound lands while the agent's AttachedToNode (reached earlier) waits.
        s.volume_entry("a").transition_at(VolumePhase::Bound, VolumeReason::PvcBound, "bound", at("2026-12-03T12:00:00.200Z"));
        apply(&mut s, &[Change::reached("a", VolumePhase::AttachedToNode, "opened /x")], at("2026-12-03T12:00:00.150Z"));
        let e = s.volume("a").expect("the entry");
        assert_eq!(phases(&s, "a"), ["Bound", "AttachedToNode"]);
        assert_eq!(e.entered(&VolumePhase::AttachedToNode), Some(at("2026-12-03T12:00:00.200Z")), "not before the Bound it follows");
    }

    #[test]
    fn a_batch_applies_in_order_and_a_removal_drops_the_entry() {
        let mut s = VirtualMachineInstanceStatus::default();
        apply(&mut s, &[Change::ready("a"), Change::ready("b"), Change::Remove("a".into())], now());
        let names: Vec<&str> = s.volume_status.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["b"]);
    }
}
