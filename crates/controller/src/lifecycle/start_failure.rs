//! KubeVirt's crash-loop backoff: VMIs of an `Always`, `RerunOnFailure` or `Once` VM that fail
//! before they ever run are counted in `status.startFailure`, and the next VMI is created only
//! after a delay that grows with the count ([`backoff_seconds`], KubeVirt's
//! `calculateStartBackoffTime` with its default cap of 300 s). The VM shows
//! `printableStatus: CrashLoopBackOff` meanwhile.
//!
//! # Rules (KubeVirt's `syncStartFailureStatus`)
//! - A VMI that reached `Running` clears the record: it started, whatever happens to it later
//!   (a guest that crashes after boot is restarted at once, as in KubeVirt).
//! - So does a strategy that does not restart on its own (`Halted`, `Manual`): a user's stop
//!   ends the crash loop.
//! - A VMI in a final phase that never ran adds one failure, once (its UID is remembered in
//!   `lastFailedVMIUID`), and sets `retryAfterTimestamp` to now plus the delay.
//!
//! # Assumptions
//! Whether a VMI ran is read from its `status.phaseTransitionTimestamps` (the node agent adds
//! one entry per phase it sets). A finished VMI without that list (ended under an older agent)
//! counts as one that ran: its history is unknown, and an unknown history is never punished
//! with a delay.
//!
//! # Flow
//! The record is written on its own ([`next`] differs from the stored one: one status write,
//! which wakes the next pass), before the failed VMI is deleted, so the failure is never lost
//! with the VMI. While the delay runs the lifecycle creates nothing and the reconcile asks
//! kube-runtime to requeue the VM when it ends ([`time_left`]): no timer in the controller.

use std::time::Duration;

use kube::ResourceExt;

use api::kubevirt::{RunStrategy, StartFailure};
use api::phases::VmiPhase;
use api::{VirtualMachine, VirtualMachineInstance};

/// KubeVirt's `defaultMaxCrashLoopBackoffDelaySeconds`: the longest delay.
pub const MAX_DELAY_SECONDS: u64 = 300;
/// KubeVirt's `minInterval`: the delay's unit never falls below it.
const MIN_INTERVAL_SECONDS: u64 = 10;

/// Seconds to wait before starting a VM again after `fail_count` start failures in a row:
/// `interval × count²` (`interval` = max(cap / 30, 10 s) = 10 s) plus up to half of that again
/// (`random`, reduced into that range: it keeps VMs that fail together from retrying together),
/// at most [`MAX_DELAY_SECONDS`]. So 10–15 s, 40–60 s, 90–135 s, 160–240 s, then 250–300 s and
/// 300 s from the sixth.
#[must_use]
pub fn backoff_seconds(fail_count: u32, random: u64) -> u64 {
    let n = u64::from(fail_count.max(1));
    let interval = (MAX_DELAY_SECONDS / 30).max(MIN_INTERVAL_SECONDS);
    let delay = interval.saturating_mul(n.saturating_mul(n));
    let spread = delay / 2 + 1;
    delay.saturating_add(random % spread).min(MAX_DELAY_SECONDS)
}

/// Whether `vmi` reached `Running` (see the module's assumptions).
#[must_use]
pub fn ran(vmi: &VirtualMachineInstance) -> bool {
    let Some(s) = vmi.status.as_ref() else { return false };
    if s.phase == Some(VmiPhase::Running) {
        return true;
    }
    match s.extra.get("phaseTransitionTimestamps").and_then(serde_json::Value::as_array) {
        None => s.phase.as_ref().is_some_and(VmiPhase::is_final),
        Some(stamps) => stamps.iter().any(|t| t["phase"] == VmiPhase::Running.as_str()),
    }
}

/// Whether `strategy` starts VMIs on its own (the ones a crash loop applies to).
fn restarts(strategy: RunStrategy) -> bool {
    matches!(strategy, RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once)
}

fn stamp(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The VM's `status.startFailure` after seeing `vmi` at `now` (see the module's rules);
/// `random` spreads the delay ([`backoff_seconds`]).
#[must_use]
pub fn next(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>, now: jiff::Timestamp, random: u64) -> Option<StartFailure> {
    let current = vm.status.as_ref().and_then(|s| s.start_failure.clone());
    if vmi.is_some_and(ran) || !restarts(vm.spec.effective_run_strategy()) {
        return None;
    }
    let Some(failed) = vmi.filter(|v| v.phase().is_some_and(VmiPhase::is_final)) else { return current };
    let uid = failed.uid();
    if current.as_ref().is_some_and(|c| c.last_failed_vmi_uid == uid) {
        return current; // this failure is counted already
    }
    let count = current.map_or(0, |c| c.consecutive_fail_count).saturating_add(1);
    let delay = backoff_seconds(count, random);
    let retry = now.checked_add(jiff::SignedDuration::from_secs(i64::try_from(delay).unwrap_or(i64::MAX))).unwrap_or(now);
    Some(StartFailure {
        consecutive_fail_count: count,
        last_failed_vmi_uid: uid,
        retry_after_timestamp: Some(stamp(retry)),
        ..StartFailure::default()
    })
}

/// Whether the VM is in a crash loop (KubeVirt's `CrashLoopBackOff`, shown while it has no
/// running VMI).
#[must_use]
pub fn crash_looping(vm: &VirtualMachine) -> bool {
    restarts(vm.spec.effective_run_strategy())
        && vm.status.as_ref().and_then(|s| s.start_failure.as_ref()).is_some_and(|f| f.consecutive_fail_count > 0)
}

/// How long until the VM may start a VMI again (`None`: it may now).
#[must_use]
pub fn time_left(vm: &VirtualMachine, now: jiff::Timestamp) -> Option<Duration> {
    if !crash_looping(vm) {
        return None;
    }
    let at = vm.status.as_ref()?.start_failure.as_ref()?.retry_after_timestamp.as_deref()?;
    // An unreadable time (written by hand) does not hold the VM back.
    let at: jiff::Timestamp = at.parse().ok()?;
    let left = now.duration_until(at);
    (left > jiff::SignedDuration::ZERO).then(|| Duration::try_from(left).ok()).flatten()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn the_delays_are_kubevirts() {
        // (count, lowest, highest): interval 10 s × count², plus up to half again, capped.
        let want = [(0, 10, 15), (1, 10, 15), (2, 40, 60), (3, 90, 135), (4, 160, 240), (5, 250, 300), (6, 300, 300), (100, 300, 300)];
        for (count, lo, hi) in want {
            assert_eq!(backoff_seconds(count, 0), lo, "count {count}, no spread");
            let delay = backoff_seconds(count, 1_000_000);
            assert!((lo..=hi).contains(&delay), "count {count}: {delay} outside {lo}..={hi}");
            let top = (0..200).map(|r| backoff_seconds(count, r)).max().unwrap();
            assert_eq!(top, hi, "count {count}: the spread reaches half the delay, never more");
        }
        assert_eq!(backoff_seconds(u32::MAX, u64::MAX), MAX_DELAY_SECONDS, "no overflow");
    }

    #[allow(clippy::needless_pass_by_value)]
    fn vm(strategy: &str, failure: Value) -> VirtualMachine {
        serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "v", "namespace": "d"},
            "spec": {"runStrategy": strategy, "template": {"spec": {"domain": {}}}}, "status": {"startFailure": failure}}),
        )
        .unwrap()
    }

    fn vmi(uid: &str, phase: &str, stamps: &[&str]) -> VirtualMachineInstance {
        let stamps: Vec<Value> = stamps.iter().map(|p| json!({"phase": p, "phaseTransitionTimestamp": "2026-12-01T00:00:00Z"})).collect();
        serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v", "uid": uid},
            "spec": {"domain": {}}, "status": {"phase": phase, "phaseTransitionTimestamps": stamps}}),
        )
        .unwrap()
    }

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn failures_before_running_count_once_each_and_a_run_clears_them() {
        let now = at("2026-12-01T10:00:00Z");
        let first = next(&vm("Always", Value::Null), Some(&vmi("a", "Failed", &["Failed"])), now, 0).unwrap();
        assert_eq!(
            (first.consecutive_fail_count, first.last_failed_vmi_uid.as_deref(), first.retry_after_timestamp.as_deref()),
            (1, Some("a"), Some("2026-12-01T10:00:10Z"))
        );
        let recorded = vm("Always", serde_json::to_value(&first).unwrap());
        assert_eq!(next(&recorded, Some(&vmi("a", "Failed", &["Failed"])), now, 0), Some(first.clone()), "counted once");
        assert_eq!(next(&recorded, None, now, 0), Some(first.clone()), "kept while no VMI exists");
        assert_eq!(next(&recorded, Some(&vmi("b", "Scheduled", &[])), now, 0), Some(first.clone()), "kept while the next one starts");
        let second = next(&recorded, Some(&vmi("b", "Failed", &["Failed"])), now, 0).unwrap();
        assert_eq!((second.consecutive_fail_count, second.retry_after_timestamp.as_deref()), (2, Some("2026-12-01T10:00:40Z")));
        assert_eq!(next(&recorded, Some(&vmi("c", "Running", &["Running"])), now, 0), None, "a VMI that runs clears it");
        assert_eq!(
            next(&recorded, Some(&vmi("c", "Failed", &["Running", "Failed"])), now, 0),
            None,
            "so does one that ran and then failed"
        );
        assert_eq!(next(&vm("Halted", serde_json::to_value(&first).unwrap()), None, now, 0), None, "a stop ends the loop");
        assert_eq!(next(&vm("Manual", Value::Null), Some(&vmi("a", "Failed", &["Failed"])), now, 0), None, "Manual never loops");
    }

    #[test]
    fn a_vmi_without_phase_history_counts_as_one_that_ran() {
        let mut v = vmi("a", "Failed", &[]);
        v.status.as_mut().unwrap().extra.remove("phaseTransitionTimestamps");
        assert!(ran(&v));
        let mut scheduled = vmi("b", "Scheduled", &[]);
        scheduled.status.as_mut().unwrap().extra.remove("phaseTransitionTimestamps");
        assert!(!ran(&scheduled), "a VMI the controller just scheduled has not run yet");
        assert!(!ran(&vmi("a", "Failed", &["Failed"])));
    }

    #[test]
    fn the_delay_holds_the_start_until_the_retry_time() {
        let looping =
            vm("Always", json!({"consecutiveFailCount": 2, "lastFailedVMIUID": "a", "retryAfterTimestamp": "2026-12-01T10:00:40Z"}));
        assert!(crash_looping(&looping));
        assert_eq!(time_left(&looping, at("2026-12-01T10:00:00Z")), Some(Duration::from_secs(40)));
        assert_eq!(time_left(&looping, at("2026-12-01T10:00:40Z")), None);
        assert_eq!(time_left(&looping, at("2026-12-01T10:01:00Z")), None);
        let halted = vm("Halted", json!({"consecutiveFailCount": 2, "retryAfterTimestamp": "2026-12-01T10:00:40Z"}));
        assert_eq!(time_left(&halted, at("2026-12-01T10:00:00Z")), None, "a stopped VM waits for nothing");
        let garbled = vm("Always", json!({"consecutiveFailCount": 2, "retryAfterTimestamp": "soon"}));
        assert_eq!(time_left(&garbled, at("2026-12-01T10:00:00Z")), None);
    }
}
