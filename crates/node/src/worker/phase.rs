//! A VMI's phase as the agent sets it: the phase, its reason, KubeVirt's `Ready` condition
//! (`True` only when `Running` and not paused: see [`api::vmi_requests::PAUSED_NOT_READY_REASON`]) and `phaseTransitionTimestamps` (one entry per phase entered:
//! the controller tells a VMI that failed before it ran from one that ran by it, for the
//! crash-loop backoff).

use kube::api::Api;
use kube::ResourceExt;

use api::kubevirt::{Condition, VirtualMachineInstanceStatus};
use api::phases::VmiPhase;
use api::vmi_requests::{PAUSED_CONDITION, PAUSED_NOT_READY_MESSAGE, PAUSED_NOT_READY_REASON};
use api::VirtualMachineInstance;

use crate::reasons::VmiReason;

/// The type of KubeVirt's VMI condition that says whether the VMI runs.
const READY: &str = "Ready";

/// Sets the VMI's phase, reason, `Ready` condition and, for a new phase, its transition time.
pub(super) fn apply_phase(v: &mut VirtualMachineInstance, phase: VmiPhase, reason: Option<VmiReason>, message: &str) {
    let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    if s.phase.as_ref() != Some(&phase) {
        let stamps = s.extra.entry("phaseTransitionTimestamps".to_owned()).or_insert_with(|| serde_json::Value::Array(Vec::new()));
        if let Some(a) = stamps.as_array_mut() {
            a.push(serde_json::json!({"phase": phase.as_str(), "phaseTransitionTimestamp": now}));
        }
    }
    let not_ready = (phase != VmiPhase::Running).then(|| reason.map_or_else(|| phase.as_str().to_owned(), |r| r.as_str().to_owned()));
    s.phase = Some(phase);
    s.reason = reason.map(|r| r.as_str().to_owned());
    set_ready(s, not_ready.as_deref(), message);
}

/// Sets the `Ready` condition: `True`, or `False` with `not_ready` as its reason; a paused
/// `Running` VMI is not ready, as in KubeVirt ([`PAUSED_NOT_READY_REASON`]). The transition
/// time changes only with the status.
pub(super) fn set_ready(s: &mut VirtualMachineInstanceStatus, not_ready: Option<&str>, message: &str) {
    let paused = s.conditions.iter().any(|c| c.type_ == PAUSED_CONDITION && c.status == "True");
    let (reason, message) = match not_ready {
        None if paused => (Some(PAUSED_NOT_READY_REASON), PAUSED_NOT_READY_MESSAGE),
        r => (r, message),
    };
    let c = Condition {
        type_: READY.into(),
        status: if reason.is_none() { "True" } else { "False" }.into(),
        reason: reason.map(str::to_owned),
        message: Some(message.to_owned()),
        last_transition_time: Some(jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        ..Condition::default()
    };
    match s.conditions.iter_mut().find(|x| x.type_ == READY) {
        Some(x) if x.status == c.status => {
            x.reason = c.reason;
            x.message = c.message;
        }
        Some(x) => *x = c,
        None => s.conditions.push(c),
    }
}

/// A VMI that ended keeps its phase: `Succeeded` and `Failed` are final (as in KubeVirt, where
/// running again takes a new VMI).
#[derive(Debug, thiserror::Error)]
enum Kept {
    #[error("the VMI has ended (phase {0}); its phase is final")]
    Ended(VmiPhase),
    #[error("the VMI was replaced by another of the same name")]
    Replaced,
}

/// Writes the VMI's phase ([`apply_phase`]) unless the VMI, as the write reads it, has ended
/// (a caller may hold a copy from before its end); a failure is logged.
pub(super) async fn set_phase(
    client: &kube::Client,
    vmi: &VirtualMachineInstance,
    phase: VmiPhase,
    reason: Option<VmiReason>,
    message: &str,
) {
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    let shown = phase.to_string();
    let r = client::try_update_status(&api, &vmi.name_any(), &client::UpdateOptions::default(), |v: &mut VirtualMachineInstance| {
        if v.uid() != vmi.uid() {
            return Err(Kept::Replaced);
        }
        match v.status.as_ref().and_then(|s| s.phase.clone()) {
            Some(ended @ (VmiPhase::Succeeded | VmiPhase::Failed)) => Err(Kept::Ended(ended)),
            _ => {
                apply_phase(v, phase.clone(), reason, message);
                Ok(())
            }
        }
    })
    .await;
    match r {
        Ok(_) => {}
        Err(client::UpdateError::Mutate { source, .. }) => tracing::info!("not setting phase {shown}: {source}"),
        Err(e) => tracing::warn!("cannot set phase {shown}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A copy of the VMI from before its end (a worker's, right after QEMU exited) writes
    /// nothing over `Succeeded` or `Failed`; a VMI that has not ended gets the phase. Against the
    /// real API server, in process.
    #[tokio::test]
    async fn a_copy_from_before_the_end_does_not_rewrite_an_ended_vmi() {
        let (_dir, _server, client) = crate::worker::test_api(None).await;
        let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
        let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v", "namespace": "default"},
            "spec": {"domain": {"devices": {}}}}))
        .unwrap();
        api.create(&kube::api::PostParams::default(), &vmi).await.unwrap();
        let phase_of = |v: &VirtualMachineInstance| v.status.as_ref().map(|s| (s.phase.clone(), s.reason.clone()));
        set_phase(&client, &api.get("v").await.unwrap(), VmiPhase::Running, None, "QEMU is running").await;
        let running = api.get("v").await.unwrap();
        assert_eq!(phase_of(&running), Some((Some(VmiPhase::Running), None)));
        for (end, reason) in [(VmiPhase::Failed, VmiReason::QemuExited), (VmiPhase::Succeeded, VmiReason::GuestShutdown)] {
            let mut ended = api.get("v").await.unwrap();
            apply_phase(&mut ended, end.clone(), Some(reason), "ended");
            let ended = api.replace_status("v", &kube::api::PostParams::default(), &ended).await.unwrap();
            for (phase, why) in [(VmiPhase::Failed, Some(VmiReason::QemuGone)), (VmiPhase::Running, None), (VmiPhase::Scheduled, None)] {
                set_phase(&client, &running, phase, why, "from the old copy").await;
                let now = api.get("v").await.unwrap();
                assert_eq!(phase_of(&now), Some((Some(end.clone()), Some(reason.as_str().to_owned()))));
                assert_eq!(now.metadata.resource_version, ended.metadata.resource_version, "nothing was written");
            }
        }
    }

    #[test]
    fn ready_is_true_only_when_running_and_names_the_reason_otherwise() {
        let mut v = VirtualMachineInstance::new("v", Default::default());
        apply_phase(&mut v, VmiPhase::Running, None, "QEMU is running");
        let ready = |v: &VirtualMachineInstance| v.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == READY)).cloned();
        assert_eq!(ready(&v).map(|c| (c.status, c.reason)), Some(("True".into(), None)));
        apply_phase(&mut v, VmiPhase::Failed, Some(VmiReason::QemuExited), "QEMU exited");
        let s = v.status.as_ref().map(|s| (s.phase.clone(), s.reason.clone()));
        assert_eq!(s, Some((Some(VmiPhase::Failed), Some("QEMUExited".into()))));
        assert_eq!(ready(&v).map(|c| (c.status, c.reason)), Some(("False".into(), Some("QEMUExited".into()))));
        assert_eq!(v.status.as_ref().map(|s| s.conditions.len()), Some(1), "one Ready condition");
        apply_phase(&mut v, VmiPhase::Failed, Some(VmiReason::QemuExited), "again");
        let phases: Vec<String> = v.status.as_ref().unwrap().extra["phaseTransitionTimestamps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["phase"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(phases, ["Running", "Failed"], "one entry per phase entered");
    }
}
