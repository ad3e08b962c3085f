//! KubeVirt's VM lifecycle requests (`start`, `stop`, `restart`) as changes to the VM: one
//! decision shared by the API server's subresources and the CLI's fallback where the API server
//! has none (a cluster without KubeVirt's virt-api).
//!
//! - a strategy that decides on its own (`Always`, `RerunOnFailure`, `Once`, `Halted`) is
//!   switched: start turns `Halted` into `Always`, stop turns the others into `Halted` (the
//!   legacy `spec.running` is flipped instead when the VM uses it, see [`set_strategy`]);
//! - `Manual` (and a restart under any strategy) appends to `status.stateChangeRequests`:
//!   `Stop` carries the UID of the VMI to stop, so a newer VMI is never stopped by an old
//!   request, then `Start`.
//!
//! Refusals are KubeVirt's wording ([`Refused`]; the API answers them with 409).

use serde_json::{json, Value};

use crate::kubevirt::RunStrategy;
use crate::phases::{StateChangeAction, VmiPhase};

/// Why a request does not apply (KubeVirt's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// What the request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Start,
    Stop,
    Restart,
}

/// How the VM is changed.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// Set the strategy (through `spec.running` when the VM uses it).
    Strategy(RunStrategy),
    /// Append these `status.stateChangeRequests`.
    Requests(Vec<Value>),
    /// Nothing on the VM: its VMI is already stopping (a given grace period still applies to
    /// it, as `virtctl stop --force --grace-period 0` does to a VM stuck stopping).
    AlreadyStopping,
}

pub fn vmi_active(vmi: Option<&Value>) -> bool {
    vmi.is_some_and(|v| {
        v.pointer("/metadata/deletionTimestamp").is_none()
            && !v.pointer("/status/phase").and_then(Value::as_str).map(VmiPhase::parse).is_some_and(|p| p.is_final())
    })
}

/// A VMI being deleted whose QEMU may still run (not in a final phase).
pub fn stopping(vmi: Option<&Value>) -> bool {
    vmi.is_some_and(|v| {
        v.pointer("/metadata/deletionTimestamp").is_some()
            && !v.pointer("/status/phase").and_then(Value::as_str).map(VmiPhase::parse).is_some_and(|p| p.is_final())
    })
}

/// Decides what `action` does to a VM under `strategy` given its VMI, or why it is refused.
pub fn decide(action: Action, strategy: RunStrategy, vmi: Option<&Value>) -> Result<Change, Refused> {
    let active = vmi_active(vmi);
    let uid = vmi.and_then(|v| v.pointer("/metadata/uid")).cloned().unwrap_or(Value::Null);
    let stop = || json!({"action": StateChangeAction::Stop.as_str(), "uid": uid});
    let start = || json!({"action": StateChangeAction::Start.as_str()});
    match action {
        Action::Start => {
            if active {
                return Err(Refused("VM is already running".to_owned()));
            }
            match strategy {
                RunStrategy::Halted => Ok(Change::Strategy(RunStrategy::Always)),
                // A finished VMI is stopped (deleted) first, then a new one is started.
                RunStrategy::Manual | RunStrategy::RerunOnFailure if vmi.is_some() => Ok(Change::Requests(vec![stop(), start()])),
                RunStrategy::Manual | RunStrategy::RerunOnFailure => Ok(Change::Requests(vec![start()])),
                s => Err(Refused(format!("{} does not support manual start requests", s.as_str()))),
            }
        }
        Action::Stop if stopping(vmi) => Ok(Change::AlreadyStopping),
        Action::Stop => match strategy {
            RunStrategy::Halted | RunStrategy::Manual | RunStrategy::WaitAsReceiver if !active => {
                Err(Refused("VM is not running".to_owned()))
            }
            RunStrategy::Halted | RunStrategy::Manual | RunStrategy::WaitAsReceiver => Ok(Change::Requests(vec![stop()])),
            RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once => Ok(Change::Strategy(RunStrategy::Halted)),
        },
        Action::Restart => match strategy {
            RunStrategy::Halted | RunStrategy::Once | RunStrategy::WaitAsReceiver => {
                Err(Refused(format!("{} does not support manual restart requests", strategy.as_str())))
            }
            _ if !active => Err(Refused("VM is not running".to_owned())),
            _ => Ok(Change::Requests(vec![stop(), start()])),
        },
    }
}

/// Sets the VM's strategy, through the legacy `spec.running` when the VM uses it, so the two
/// never coexist (kubevirt-redfish #35).
pub fn set_strategy(vm: &mut Value, s: RunStrategy) {
    let uses_running = vm.pointer("/spec/running").is_some_and(Value::is_boolean);
    if uses_running {
        vm["spec"]["running"] = json!(s == RunStrategy::Always);
    } else {
        vm["spec"]["runStrategy"] = json!(s.as_str());
    }
}

/// Sets `status.stateChangeRequests` of the VM to `reqs`.
///
/// # Errors
/// Requests are still pending: the controller has not carried them out yet.
pub fn set_requests(vm: &mut Value, reqs: &[Value]) -> Result<(), Refused> {
    let pending = vm.pointer("/status/stateChangeRequests").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    if pending {
        let ns = vm.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        let name = vm.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        return Err(Refused(format!(
            "VM {ns}/{name} has pending state change requests: wait until the controller has carried them out (status.stateChangeRequests is empty)"
        )));
    }
    if !vm.get("status").is_some_and(Value::is_object) {
        vm["status"] = json!({});
    }
    vm["status"]["stateChangeRequests"] = Value::Array(reqs.to_vec());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(phase: &str) -> Value {
        json!({"metadata": {"uid": "u1"}, "status": {"phase": phase}})
    }

    #[test]
    fn start_switches_halted_and_queues_for_manual() {
        assert_eq!(decide(Action::Start, RunStrategy::Halted, None).unwrap(), Change::Strategy(RunStrategy::Always));
        assert_eq!(decide(Action::Start, RunStrategy::Manual, None).unwrap(), Change::Requests(vec![json!({"action": "Start"})]));
        // A finished VMI is replaced: stop that one (by UID), then start.
        assert_eq!(
            decide(Action::Start, RunStrategy::RerunOnFailure, Some(&vmi("Succeeded"))).unwrap(),
            Change::Requests(vec![json!({"action": "Stop", "uid": "u1"}), json!({"action": "Start"})])
        );
    }

    #[test]
    fn start_refusals_use_kubevirts_wording() {
        for s in RunStrategy::ALL {
            assert_eq!(decide(Action::Start, s, Some(&vmi("Running"))).unwrap_err().0, "VM is already running");
        }
        assert_eq!(decide(Action::Start, RunStrategy::Always, None).unwrap_err().0, "Always does not support manual start requests");
        assert_eq!(decide(Action::Start, RunStrategy::Once, None).unwrap_err().0, "Once does not support manual start requests");
    }

    #[test]
    fn stop_halts_self_deciding_strategies_and_queues_for_manual() {
        for s in [RunStrategy::Always, RunStrategy::RerunOnFailure, RunStrategy::Once] {
            assert_eq!(decide(Action::Stop, s, Some(&vmi("Running"))).unwrap(), Change::Strategy(RunStrategy::Halted));
        }
        assert_eq!(
            decide(Action::Stop, RunStrategy::Manual, Some(&vmi("Running"))).unwrap(),
            Change::Requests(vec![json!({"action": "Stop", "uid": "u1"})])
        );
        assert_eq!(decide(Action::Stop, RunStrategy::Manual, None).unwrap_err().0, "VM is not running");
        assert_eq!(decide(Action::Stop, RunStrategy::Halted, Some(&vmi("Succeeded"))).unwrap_err().0, "VM is not running");
    }

    #[test]
    fn stop_of_a_vmi_already_stopping_changes_nothing_on_the_vm() {
        let mut stopping = vmi("Running");
        stopping["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        for s in RunStrategy::ALL {
            assert_eq!(decide(Action::Stop, s, Some(&stopping)).unwrap(), Change::AlreadyStopping, "{s:?}");
        }
        let mut gone = vmi("Succeeded");
        gone["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        assert_eq!(decide(Action::Stop, RunStrategy::Halted, Some(&gone)).unwrap_err().0, "VM is not running");
    }

    #[test]
    fn restart_needs_an_active_vmi_and_a_strategy_that_restarts() {
        assert_eq!(
            decide(Action::Restart, RunStrategy::Always, Some(&vmi("Running"))).unwrap(),
            Change::Requests(vec![json!({"action": "Stop", "uid": "u1"}), json!({"action": "Start"})])
        );
        assert_eq!(decide(Action::Restart, RunStrategy::Manual, None).unwrap_err().0, "VM is not running");
        assert_eq!(decide(Action::Restart, RunStrategy::Halted, None).unwrap_err().0, "Halted does not support manual restart requests");
        assert_eq!(
            decide(Action::Restart, RunStrategy::Once, Some(&vmi("Running"))).unwrap_err().0,
            "Once does not support manual restart requests"
        );
    }
}
