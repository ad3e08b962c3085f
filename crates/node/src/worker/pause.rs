//! Pause and unpause (KubeVirt's `pause`/`unpause` subresources): the VMI's annotation
//! [`PAUSE_REQUESTED`] says whether its vCPUs should stand still; the worker — the only owner
//! of the VMI's QMP connection — makes QEMU match (QMP `stop` / `cont`) and reports what QEMU
//! does in the VMI's `Paused` condition (reason `PausedByUser`, KubeVirt's words) and its `Ready`
//! condition, `False` while paused as in KubeVirt ([`PAUSED_NOT_READY_REASON`]).
//!
//! # Guarantees
//! - The condition follows QEMU, not the request: it is set only once `stop` succeeded and
//!   removed only once `cont` did.
//! - Nothing else in the worker resumes a VMI that is asked to be paused: the resume after the
//!   boot media are plugged ([`super::live::media_at_boot`]) is skipped for it, and an adopted
//!   QEMU is asked for its state (`query-status`) instead of being resumed.
//! - Hot-plug goes on while paused (QEMU plugs into a stopped machine; the guest sees the
//!   device when it runs again).
//!
//! # Caveats
//! A QMP failure is logged and left for the next wake-up of the worker (the VMI's next
//! version); the state is then asked from QEMU again.

use kube::api::Api;
use kube::ResourceExt;

use api::annotations::PAUSE_REQUESTED;
use api::kubevirt::{Condition, VirtualMachineInstanceStatus};
use api::phases::VmiPhase;
#[cfg(doc)]
use api::vmi_requests::PAUSED_NOT_READY_REASON;
use api::vmi_requests::{PAUSED_BY_USER, PAUSED_CONDITION, PAUSED_MESSAGE};
use api::VirtualMachineInstance;
use qemu::Machine;

use crate::config::Shared;

/// Whether `vmi` is asked to be paused.
#[must_use]
pub(super) fn wanted(vmi: &VirtualMachineInstance) -> bool {
    vmi.annotations().get(PAUSE_REQUESTED).map(String::as_str) == Some("true")
}

/// Whether the VMI reports itself paused (its `Paused` condition is `True`).
fn reported(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == PAUSED_CONDITION && c.status == "True"))
}

/// The QMP command that makes QEMU match the wanted state, if one is needed.
fn command(want: bool, paused: bool) -> Option<&'static str> {
    match (want, paused) {
        (true, false) => Some("stop"),
        (false, true) => Some("cont"),
        _ => None,
    }
}

/// Sets (`paused`) or removes the VMI's `Paused` condition; a `Running` VMI's `Ready` condition
/// follows (`False` while paused).
pub(super) fn apply_condition(s: &mut VirtualMachineInstanceStatus, paused: bool) {
    s.conditions.retain(|c| c.type_ != PAUSED_CONDITION);
    if paused {
        s.conditions.push(Condition {
            type_: PAUSED_CONDITION.to_owned(),
            status: "True".to_owned(),
            reason: Some(PAUSED_BY_USER.to_owned()),
            message: Some(PAUSED_MESSAGE.to_owned()),
            last_transition_time: Some(jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
            ..Condition::default()
        });
    }
    if s.phase == Some(VmiPhase::Running) {
        super::phase::set_ready(s, None, "QEMU is running");
    }
}

/// Makes QEMU's vCPUs match what `vmi` asks, then its `Paused` condition match QEMU.
/// `paused`: the vCPUs' state as this worker knows it (`None`: unknown, asked from QEMU).
pub(super) async fn follow(shared: &Shared, vmi: &VirtualMachineInstance, machine: &Machine, paused: &mut Option<bool>) {
    let now = match *paused {
        Some(p) => p,
        None => match machine.paused().await {
            Ok(p) => {
                if p {
                    tracing::info!("QEMU reports the guest paused (query-status)");
                }
                p
            }
            Err(e) => {
                tracing::warn!("cannot ask QEMU whether the guest is paused: {e}");
                return;
            }
        },
    };
    *paused = Some(now);
    let want = wanted(vmi);
    if let Some(cmd) = command(want, now) {
        let r = if want { machine.pause().await } else { machine.resume().await };
        if let Err(e) = r {
            tracing::warn!("cannot {} the guest (QMP {cmd}): {e}", if want { "pause" } else { "unpause" });
            *paused = None;
            return;
        }
        tracing::info!("the guest is {}", if want { "paused" } else { "running again" });
        *paused = Some(want);
    }
    let now = *paused == Some(true);
    if reported(vmi) == now {
        return;
    }
    let api: Api<VirtualMachineInstance> = Api::namespaced(shared.client.clone(), &vmi.namespace().unwrap_or_default());
    let r = client::update_status(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
        apply_condition(v.status.get_or_insert_with(VirtualMachineInstanceStatus::default), now);
    })
    .await;
    if let Err(e) = r {
        tracing::warn!("cannot report the pause in the VMI's Paused condition: {e}");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn qemu_is_told_only_what_differs() {
        assert_eq!(command(true, false), Some("stop"));
        assert_eq!(command(false, true), Some("cont"));
        assert_eq!(command(true, true), None);
        assert_eq!(command(false, false), None, "a running guest is never resumed again");
    }

    /// KubeVirt's paused VMI is not Ready (its launcher pod's readiness gate is False); it is
    /// Ready again once resumed.
    #[test]
    fn a_running_vmi_is_not_ready_while_paused() {
        let ready = |s: &VirtualMachineInstanceStatus| {
            let c = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
            (c.status.clone(), c.reason.clone())
        };
        let mut v = VirtualMachineInstance::new("v", Default::default());
        super::super::phase::apply_phase(&mut v, VmiPhase::Running, None, "QEMU is running");
        let s = v.status.as_mut().unwrap();
        assert_eq!(ready(s), ("True".into(), None));
        apply_condition(s, true);
        assert_eq!(ready(s), ("False".into(), Some("ReadinessGatesNotReady".into())));
        let msg = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap().message.clone().unwrap();
        assert!(msg.contains("kubevirt.io/virtual-machine-unpaused"), "{msg}");
        // A phase write while paused (an adoption's) keeps it not ready.
        super::super::phase::apply_phase(&mut v, VmiPhase::Running, None, "QEMU is running");
        let s = v.status.as_mut().unwrap();
        assert_eq!(ready(s), ("False".into(), Some("ReadinessGatesNotReady".into())));
        apply_condition(s, false);
        assert_eq!(ready(s), ("True".into(), None));
        assert_eq!(s.conditions.len(), 1, "the Paused condition is gone, Ready stays");
    }

    #[test]
    fn the_condition_is_kubevirts_and_goes_away_whole() {
        let mut s = VirtualMachineInstanceStatus::default();
        apply_condition(&mut s, true);
        apply_condition(&mut s, true);
        assert_eq!(s.conditions.len(), 1, "one Paused condition");
        let c = &s.conditions[0];
        assert_eq!((c.type_.as_str(), c.status.as_str(), c.reason.as_deref()), ("Paused", "True", Some("PausedByUser")));
        apply_condition(&mut s, false);
        assert!(s.conditions.is_empty());
    }
}
