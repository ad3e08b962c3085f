//! Power: a System's `PowerState` from its VM and VMI, and what each `ResetType` does to the
//! VM's lifecycle.
//!
//! # PowerState (only the schema's values)
//! | VM and VMI | PowerState |
//! |---|---|
//! | a VMI `Running`, its `Paused` condition true | Paused |
//! | a VMI `Running`, and the VM wants it stopped (strategy `Halted`, a pending `Stop`) or it is being deleted | PoweringOff |
//! | a VMI `Running` | On |
//! | a VMI not yet running (`Pending`..`Scheduled`) and the VM wants it | PoweringOn |
//! | no active VMI, and the VM wants one (`Always`, `RerunOnFailure` before a success, a pending `Start`) | PoweringOn |
//! | otherwise | Off |
//!
//! # ResetType -> lifecycle (through the `start`/`stop`/`restart` subresources, which handle
//! `runStrategy` and the legacy `running` alike)
//! | ResetType | Off (or PoweringOff) | On (or PoweringOn) |
//! |---|---|---|
//! | On, ForceOn | start | nothing (already satisfied: success, as Ironic expects) |
//! | ForceOff | nothing (PoweringOff: stop, grace period 0, cutting a graceful stop short) | stop, grace period 0 |
//! | GracefulShutdown | nothing | stop (ACPI power button, then force after the VMI's grace) |
//! | GracefulRestart | start | restart (ACPI, then force after the grace) |
//! | ForceRestart | start | restart, grace period 0 |
//! | PushPowerButton | start | stop (ACPI) |
//! | Nmi | 409 (nothing runs to interrupt) | NMI through QMP `inject-nmi` |

use api::kubevirt::RunStrategy;
use api::phases::{StateChangeAction, VmiPhase};
use api::{VirtualMachine, VirtualMachineInstance};

/// `ComputerSystem.PowerState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    Paused,
}

impl PowerState {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::On => "On",
            PowerState::Off => "Off",
            PowerState::PoweringOn => "PoweringOn",
            PowerState::PoweringOff => "PoweringOff",
            PowerState::Paused => "Paused",
        }
    }

    /// Whether the system is (or is becoming) on.
    #[must_use]
    pub fn is_on(self) -> bool {
        matches!(self, PowerState::On | PowerState::PoweringOn | PowerState::Paused)
    }
}

/// Whether `vmi` is active: not finished, not being deleted.
#[must_use]
pub fn active(vmi: &VirtualMachineInstance) -> bool {
    vmi.metadata.deletion_timestamp.is_none() && !vmi.phase().is_some_and(VmiPhase::is_final)
}

fn paused(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Paused" && c.status == "True"))
}

/// The System's power state (see the module docs).
#[must_use]
pub fn state(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> PowerState {
    let requests = vm.status.as_ref().map(|s| s.state_change_requests.as_slice()).unwrap_or_default();
    let pending_start = requests.iter().any(|r| r.action == StateChangeAction::Start);
    let pending_stop = requests.iter().any(|r| r.action == StateChangeAction::Stop);
    let strategy = vm.spec.effective_run_strategy();
    let vmi = vmi.filter(|v| v.metadata.deletion_timestamp.is_some() || active(v) || v.is_running());
    match vmi {
        Some(v) if v.metadata.deletion_timestamp.is_some() => PowerState::PoweringOff,
        Some(v) if v.is_running() && paused(v) => PowerState::Paused,
        Some(v) if v.is_running() && (strategy == RunStrategy::Halted || pending_stop) => PowerState::PoweringOff,
        Some(v) if v.is_running() => PowerState::On,
        Some(_) if strategy == RunStrategy::Halted => PowerState::PoweringOff,
        Some(_) => PowerState::PoweringOn,
        None if pending_start || matches!(strategy, RunStrategy::Always) => PowerState::PoweringOn,
        None => PowerState::Off,
    }
}

/// `ComputerSystem.Reset`'s `ResetType` values this service implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetType {
    On,
    ForceOn,
    ForceOff,
    GracefulShutdown,
    GracefulRestart,
    ForceRestart,
    Nmi,
    PushPowerButton,
}

impl ResetType {
    pub const ALL: [ResetType; 8] = [
        ResetType::On,
        ResetType::ForceOn,
        ResetType::ForceOff,
        ResetType::GracefulShutdown,
        ResetType::GracefulRestart,
        ResetType::ForceRestart,
        ResetType::Nmi,
        ResetType::PushPowerButton,
    ];

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ResetType::On => "On",
            ResetType::ForceOn => "ForceOn",
            ResetType::ForceOff => "ForceOff",
            ResetType::GracefulShutdown => "GracefulShutdown",
            ResetType::GracefulRestart => "GracefulRestart",
            ResetType::ForceRestart => "ForceRestart",
            ResetType::Nmi => "Nmi",
            ResetType::PushPowerButton => "PushPowerButton",
        }
    }

    #[must_use]
    pub fn parse(s: &str) -> Option<ResetType> {
        ResetType::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// What a reset does to the VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Already satisfied.
    Nothing,
    Start,
    /// `gracePeriod` 0 for a forced stop; `None`: the VMI's own grace.
    Stop {
        grace: Option<u32>,
    },
    Restart {
        grace: Option<u32>,
    },
    Nmi,
}

/// Why a reset cannot be done in this state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict(pub &'static str);

/// Plans `reset` for a System in `state` (see the module docs).
///
/// # Errors
/// `Nmi` with nothing running.
pub fn plan(reset: ResetType, state: PowerState) -> Result<Step, Conflict> {
    let on = state.is_on();
    Ok(match (reset, on) {
        // A graceful stop under way (the guest may ignore the ACPI button): forced now.
        (ResetType::ForceOff, false) if state == PowerState::PoweringOff => Step::Stop { grace: Some(0) },
        (ResetType::On | ResetType::ForceOn, true) | (ResetType::ForceOff | ResetType::GracefulShutdown, false) => Step::Nothing,
        (ResetType::On | ResetType::ForceOn | ResetType::GracefulRestart | ResetType::ForceRestart | ResetType::PushPowerButton, false) => {
            Step::Start
        }
        (ResetType::ForceOff, true) => Step::Stop { grace: Some(0) },
        (ResetType::GracefulShutdown | ResetType::PushPowerButton, true) => Step::Stop { grace: None },
        (ResetType::GracefulRestart, true) => Step::Restart { grace: None },
        (ResetType::ForceRestart, true) => Step::Restart { grace: Some(0) },
        (ResetType::Nmi, true) if state == PowerState::On || state == PowerState::Paused => Step::Nmi,
        (ResetType::Nmi, _) => return Err(Conflict("the System is not running: there is no guest to interrupt (power it On first)")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[allow(clippy::needless_pass_by_value)]
    fn vm(spec: serde_json::Value, status: serde_json::Value) -> VirtualMachine {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "v", "namespace": "d", "uid": "u"}, "spec": spec, "status": status}))
        .unwrap()
    }

    fn vmi(phase: &str, deleting: bool) -> VirtualMachineInstance {
        let mut meta = json!({"name": "v", "namespace": "d", "uid": "i1"});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": meta, "spec": {"domain": {}}, "status": {"phase": phase}}))
        .unwrap()
    }

    #[test]
    fn power_state_follows_the_strategy_and_the_vmi() {
        let always = vm(json!({"runStrategy": "Always", "template": {}}), json!({}));
        let halted = vm(json!({"runStrategy": "Halted", "template": {}}), json!({}));
        let legacy_on = vm(json!({"running": true, "template": {}}), json!({}));
        assert_eq!(state(&always, Some(&vmi("Running", false))), PowerState::On);
        assert_eq!(state(&legacy_on, Some(&vmi("Running", false))), PowerState::On);
        assert_eq!(state(&always, Some(&vmi("Scheduled", false))), PowerState::PoweringOn);
        assert_eq!(state(&always, None), PowerState::PoweringOn);
        assert_eq!(state(&halted, None), PowerState::Off);
        assert_eq!(state(&halted, Some(&vmi("Running", false))), PowerState::PoweringOff);
        assert_eq!(state(&always, Some(&vmi("Running", true))), PowerState::PoweringOff);
        assert_eq!(state(&halted, Some(&vmi("Succeeded", false))), PowerState::Off);
        let manual_start = vm(json!({"runStrategy": "Manual", "template": {}}), json!({"stateChangeRequests": [{"action": "Start"}]}));
        assert_eq!(state(&manual_start, None), PowerState::PoweringOn);
    }

    #[test]
    fn resets_already_satisfied_do_nothing() {
        assert_eq!(plan(ResetType::On, PowerState::On), Ok(Step::Nothing));
        assert_eq!(plan(ResetType::ForceOn, PowerState::PoweringOn), Ok(Step::Nothing));
        assert_eq!(plan(ResetType::ForceOff, PowerState::Off), Ok(Step::Nothing));
        assert_eq!(plan(ResetType::GracefulShutdown, PowerState::PoweringOff), Ok(Step::Nothing));
    }

    #[test]
    fn resets_map_to_the_lifecycle() {
        assert_eq!(plan(ResetType::On, PowerState::Off), Ok(Step::Start));
        assert_eq!(plan(ResetType::ForceOff, PowerState::On), Ok(Step::Stop { grace: Some(0) }));
        assert_eq!(plan(ResetType::ForceOff, PowerState::PoweringOff), Ok(Step::Stop { grace: Some(0) }), "a graceful stop is cut short");
        assert_eq!(plan(ResetType::GracefulShutdown, PowerState::PoweringOff), Ok(Step::Nothing));
        assert_eq!(plan(ResetType::GracefulShutdown, PowerState::On), Ok(Step::Stop { grace: None }));
        assert_eq!(plan(ResetType::ForceRestart, PowerState::On), Ok(Step::Restart { grace: Some(0) }));
        assert_eq!(plan(ResetType::ForceRestart, PowerState::Off), Ok(Step::Start));
        assert_eq!(plan(ResetType::PushPowerButton, PowerState::On), Ok(Step::Stop { grace: None }));
        assert_eq!(plan(ResetType::PushPowerButton, PowerState::Off), Ok(Step::Start));
        assert_eq!(plan(ResetType::Nmi, PowerState::On), Ok(Step::Nmi));
        assert!(plan(ResetType::Nmi, PowerState::Off).is_err());
        assert!(plan(ResetType::Nmi, PowerState::PoweringOn).is_err());
    }
}
