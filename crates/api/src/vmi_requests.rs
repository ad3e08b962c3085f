//! KubeVirt's VMI action subresources (`pause`, `unpause`, `softreboot`) as changes to the
//! VMI: one decision shared by the API server's subresources and the CLI's fallback where the
//! API server has none.
//!
//! KubeVirt's virt-api calls virt-handler directly; here the request is recorded on the VMI and
//! the node agent that owns its QMP connection carries it out (it works the same against a real
//! kube-apiserver):
//! - `pause` sets [`PAUSE_REQUESTED`]; the agent stops the vCPUs (QMP `stop`) and sets the
//!   condition `Paused` (`PausedByUser`) and `Ready` to `False` (KubeVirt's
//!   [`PAUSED_NOT_READY_REASON`]); `unpause` removes it; the agent resumes them (`cont`)
//!   and removes the condition. The annotation is a wanted state, not an event: an agent that
//!   restarts converges on it.
//! - `softreboot` sets [`SOFTREBOOT_REQUESTED`] to a new ID; the agent resets the guest once per
//!   ID (QMP `system_reset`) and answers with [`SOFTREBOOT_DONE`] or [`SOFTREBOOT_FAILED`].
//!
//! Refusals are KubeVirt's wording ([`Refused`]; the API answers them with 409): pause a VMI
//! that is not `Running` ("VM is not running") or already paused ("VMI is already paused");
//! unpause one that is not `Running` ("VMI is not running") or not paused ("VMI is not
//! paused"); soft-reboot one that is not `Running`, is paused ("VMI is paused"), or has ACPI
//! disabled ("VMI neither have the agent connected nor the ACPI feature enabled": there is no
//! guest agent here).

use serde_json::{json, Value};

use crate::annotations::{PAUSE_REQUESTED, SOFTREBOOT_REQUESTED};
pub use crate::lifecycle_requests::Refused;
use crate::phases::VmiPhase;

/// KubeVirt's VMI condition type for a paused VMI (`VirtualMachineInstancePaused`).
pub const PAUSED_CONDITION: &str = "Paused";
/// Its reason when a user paused it (KubeVirt's `PausedByUser`).
pub const PAUSED_BY_USER: &str = "PausedByUser";
/// Its message (KubeVirt's).
pub const PAUSED_MESSAGE: &str = "VMI was paused by user";
/// The reason of a paused VMI's `Ready` condition, which is `False` while paused: KubeVirt's
/// virt-controller sets its launcher pod's readiness gate `kubevirt.io/virtual-machine-unpaused`
/// to `False`, the kubelet makes the pod not Ready (`ReadinessGatesNotReady`), and the pod's
/// Ready condition is copied to the VMI's (and from there to the VM's).
pub const PAUSED_NOT_READY_REASON: &str = "ReadinessGatesNotReady";
/// Its message (the kubelet's words about KubeVirt's readiness gate).
pub const PAUSED_NOT_READY_MESSAGE: &str =
    "the status of pod readiness gate \"kubevirt.io/virtual-machine-unpaused\" is not \"True\", but False";

/// What the request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmiAction {
    Pause,
    Unpause,
    SoftReboot,
}

impl VmiAction {
    /// The subresource's name.
    #[must_use]
    pub fn subresource(self) -> &'static str {
        match self {
            VmiAction::Pause => "pause",
            VmiAction::Unpause => "unpause",
            VmiAction::SoftReboot => "softreboot",
        }
    }

    /// The action of subresource `sub`.
    #[must_use]
    pub fn parse(sub: &str) -> Option<VmiAction> {
        [VmiAction::Pause, VmiAction::Unpause, VmiAction::SoftReboot].into_iter().find(|a| a.subresource() == sub)
    }
}

/// How the VMI is changed: one annotation set (`Some`) or removed (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edit {
    pub key: &'static str,
    pub value: Option<String>,
}

impl Edit {
    /// Applies the edit to the VMI as JSON.
    pub fn apply(&self, vmi: &mut Value) {
        if !vmi.pointer("/metadata/annotations").is_some_and(Value::is_object) {
            vmi["metadata"]["annotations"] = json!({});
        }
        let Some(a) = vmi.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) else { return };
        match &self.value {
            Some(v) => {
                a.insert(self.key.to_owned(), Value::String(v.clone()));
            }
            None => {
                a.remove(self.key);
            }
        }
    }
}

/// Whether the VMI's `Paused` condition is `True` (what QEMU does, as its agent reported it).
#[must_use]
pub fn paused_condition(vmi: &Value) -> bool {
    vmi.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == PAUSED_CONDITION && c["status"] == "True"))
}

/// Whether the VMI is asked to be paused ([`PAUSE_REQUESTED`]).
#[must_use]
pub fn pause_requested(vmi: &Value) -> bool {
    vmi.pointer("/metadata/annotations").and_then(|a| a.get(PAUSE_REQUESTED)).and_then(Value::as_str) == Some("true")
}

fn running(vmi: &Value) -> bool {
    vmi.pointer("/status/phase").and_then(Value::as_str).map(VmiPhase::parse) == Some(VmiPhase::Running)
}

fn acpi_disabled(vmi: &Value) -> bool {
    vmi.pointer("/spec/domain/features/acpi/enabled") == Some(&Value::Bool(false))
}

/// Decides what `action` does to `vmi`, or why it is refused. `id` names a new soft reboot.
///
/// # Errors
/// [`Refused`] with KubeVirt's message (see the module docs).
pub fn decide(action: VmiAction, vmi: &Value, id: &str) -> Result<Edit, Refused> {
    // Paused as asked, or as still reported (an unpause the agent has not carried out yet).
    let paused = pause_requested(vmi) || paused_condition(vmi);
    let refuse = |m: &str| Err(Refused(m.to_owned()));
    match action {
        VmiAction::Pause if !running(vmi) => refuse("VM is not running"),
        VmiAction::Pause if paused => refuse("VMI is already paused"),
        VmiAction::Pause => Ok(Edit { key: PAUSE_REQUESTED, value: Some("true".to_owned()) }),
        VmiAction::Unpause if !running(vmi) => refuse("VMI is not running"),
        VmiAction::Unpause if !paused => refuse("VMI is not paused"),
        VmiAction::Unpause => Ok(Edit { key: PAUSE_REQUESTED, value: None }),
        VmiAction::SoftReboot if !running(vmi) => refuse("VM is not running"),
        VmiAction::SoftReboot if paused => refuse("VMI is paused"),
        VmiAction::SoftReboot if acpi_disabled(vmi) => refuse("VMI neither have the agent connected nor the ACPI feature enabled"),
        VmiAction::SoftReboot => Ok(Edit { key: SOFTREBOOT_REQUESTED, value: Some(id.to_owned()) }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn vmi(phase: &str) -> Value {
        json!({"metadata": {"name": "v"}, "spec": {"domain": {}}, "status": {"phase": phase}})
    }

    fn paused(mut v: Value) -> Value {
        v["status"]["conditions"] = json!([{"type": "Paused", "status": "True", "reason": "PausedByUser"}]);
        v
    }

    #[test]
    fn pause_sets_the_wanted_state_and_unpause_removes_it() {
        let mut v = vmi("Running");
        let e = decide(VmiAction::Pause, &v, "x").unwrap();
        e.apply(&mut v);
        assert!(pause_requested(&v));
        let e = decide(VmiAction::Unpause, &v, "x").unwrap();
        e.apply(&mut v);
        assert!(!pause_requested(&v));
        assert_eq!(v["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn refusals_use_kubevirts_wording() {
        for phase in ["Pending", "Scheduled", "Succeeded", "Failed"] {
            assert_eq!(decide(VmiAction::Pause, &vmi(phase), "x").unwrap_err().0, "VM is not running");
            assert_eq!(decide(VmiAction::Unpause, &vmi(phase), "x").unwrap_err().0, "VMI is not running");
            assert_eq!(decide(VmiAction::SoftReboot, &vmi(phase), "x").unwrap_err().0, "VM is not running");
        }
        assert_eq!(decide(VmiAction::Pause, &paused(vmi("Running")), "x").unwrap_err().0, "VMI is already paused");
        assert_eq!(decide(VmiAction::Unpause, &vmi("Running"), "x").unwrap_err().0, "VMI is not paused");
        assert_eq!(decide(VmiAction::SoftReboot, &paused(vmi("Running")), "x").unwrap_err().0, "VMI is paused");
        let mut no_acpi = vmi("Running");
        no_acpi["spec"]["domain"]["features"] = json!({"acpi": {"enabled": false}});
        assert_eq!(
            decide(VmiAction::SoftReboot, &no_acpi, "x").unwrap_err().0,
            "VMI neither have the agent connected nor the ACPI feature enabled"
        );
    }

    #[test]
    fn a_pause_asked_but_not_yet_carried_out_counts_as_paused() {
        // Regression guard: a second pause before the agent reports must not be accepted as
        // new, and an unpause then must be (it cancels the request).
        let mut v = vmi("Running");
        decide(VmiAction::Pause, &v, "x").unwrap().apply(&mut v);
        assert_eq!(decide(VmiAction::Pause, &v, "x").unwrap_err().0, "VMI is already paused");
        assert_eq!(decide(VmiAction::SoftReboot, &v, "x").unwrap_err().0, "VMI is paused");
        // An unpause whose condition the agent has not cleared yet: still paused.
        let v = paused(vmi("Running"));
        assert_eq!(decide(VmiAction::Unpause, &v, "x").unwrap(), Edit { key: PAUSE_REQUESTED, value: None });
    }

    #[test]
    fn softreboot_names_its_request() {
        let e = decide(VmiAction::SoftReboot, &vmi("Running"), "abc").unwrap();
        assert_eq!(e, Edit { key: SOFTREBOOT_REQUESTED, value: Some("abc".into()) });
        assert_eq!(VmiAction::parse("softreboot"), Some(VmiAction::SoftReboot));
        assert_eq!(VmiAction::parse("reset"), None);
    }
}
