//! KubeVirt's VM lifecycle subresources: `PUT .../virtualmachines/NAME/start|stop|restart`.
//!
//! They never touch the VMI themselves; like KubeVirt's virt-api they record intent on the VM
//! and the controller carries it out:
//! - a strategy that decides on its own (`Always`, `RerunOnFailure`, `Once`, `Halted`) is
//!   switched: start turns `Halted` into `Always`, stop turns the others into `Halted` (the
//!   legacy `spec.running` is flipped instead when the VM uses it, so the two never coexist —
//!   kubevirt-redfish #35);
//! - `Manual` (and a restart under any strategy) appends to `status.stateChangeRequests`:
//!   `Stop` carries the UID of the VMI to stop, so a newer VMI is never stopped by an old
//!   request, then `Start`.
//!
//! Refusals (409, KubeVirt's wording): start when the VMI is active ("VM is already running"),
//! or under `Always`/`Once` ("... does not support manual start requests"); stop when nothing
//! runs under `Halted`/`Manual` ("VM is not running"); restart under `Halted`/`Once`, or with no
//! active VMI. `dryRun: ["All"]` (body or query) checks and writes nothing. Success is 202.

use axum::response::Response;
use serde_json::{json, Value};

use api::kubevirt::{RunStrategy, VirtualMachineSpec};
use api::phases::{StateChangeAction, VmiPhase};
use api::validation::{Cause, CauseType};

use crate::objects::{Objects, Part};
use crate::registry;
use crate::status::ApiError;

/// The subresources this module serves, for discovery.
pub const SUBRESOURCES: [&str; 3] = ["start", "stop", "restart"];

/// What the request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Start,
    Stop,
    Restart,
}

/// How the VM is changed.
#[derive(Debug, PartialEq)]
enum Change {
    /// Set the strategy (through `spec.running` when the VM uses it).
    Strategy(RunStrategy),
    /// Append these `status.stateChangeRequests`.
    Requests(Vec<Value>),
    /// Nothing on the VM: its VMI is already stopping (a given grace period still applies to
    /// it, as `virtctl stop --force --grace-period 0` does to a VM stuck stopping).
    AlreadyStopping,
}

fn parse_body(sub: &str, body: &[u8]) -> Result<(bool, Option<i64>), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((false, None));
    }
    let o: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the {sub} options body is not valid JSON: {e}")))?;
    let dry = match o.get("dryRun") {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) if a.iter().all(|x| x == "All") => !a.is_empty(),
        Some(_) => {
            let c = Cause::new(CauseType::NotSupported, "dryRun", "dryRun must be [\"All\"] or left out");
            return Err(ApiError::bad_request(format!("dryRun: {}", c.message)));
        }
    };
    // StopOptions.gracePeriod, RestartOptions.gracePeriodSeconds.
    let grace = o.get("gracePeriod").or_else(|| o.get("gracePeriodSeconds"));
    let grace = match grace {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(g) if g >= 0 => Some(g),
            _ => return Err(ApiError::bad_request("gracePeriod: must be a whole number of seconds, 0 or more".to_owned())),
        },
    };
    Ok((dry, grace))
}

fn vmi_active(vmi: Option<&Value>) -> bool {
    vmi.is_some_and(|v| {
        v.pointer("/metadata/deletionTimestamp").is_none()
            && !v.pointer("/status/phase").and_then(Value::as_str).map(VmiPhase::parse).is_some_and(|p| p.is_final())
    })
}

/// A VMI being deleted whose QEMU may still run (not in a final phase).
fn stopping(vmi: Option<&Value>) -> bool {
    vmi.is_some_and(|v| {
        v.pointer("/metadata/deletionTimestamp").is_some()
            && !v.pointer("/status/phase").and_then(Value::as_str).map(VmiPhase::parse).is_some_and(|p| p.is_final())
    })
}

fn conflict(msg: impl Into<String>) -> ApiError {
    ApiError::conflict_message(msg.into())
}

/// Decides what `action` does to a VM under `strategy` given its VMI, or why it is refused.
fn decide(action: Action, strategy: RunStrategy, vmi: Option<&Value>) -> Result<Change, ApiError> {
    let active = vmi_active(vmi);
    let uid = vmi.and_then(|v| v.pointer("/metadata/uid")).cloned().unwrap_or(Value::Null);
    let stop = || json!({"action": StateChangeAction::Stop.as_str(), "uid": uid});
    let start = || json!({"action": StateChangeAction::Start.as_str()});
    match action {
        Action::Start => {
            if active {
                return Err(conflict("VM is already running"));
            }
            match strategy {
                RunStrategy::Halted => Ok(Change::Strategy(RunStrategy::Always)),
                // A finished VMI is stopped (deleted) first, then a new one is started.
                RunStrategy::Manual | RunStrategy::RerunOnFailure if vmi.is_some() => Ok(Change::Requests(vec![stop(), start()])),
                RunStrategy::Manual | RunStrategy::RerunOnFailure => Ok(Change::Requests(vec![start()])),
                s => Err(conflict(format!("{} does not support manual start requests", s.as_str()))),
            }
        }
        Action::Stop if stopping(vmi) => Ok(Change::AlreadyStopping),
        Action::Stop => match strategy {
            RunStrategy::Halted | RunStrategy::Manual | RunStrategy::WaitAsReceiver if !active => Err(conflict("VM is not running")),
            RunStrategy::Halted | RunStrategy::Manual | RunStrategy::WaitAsReceiver => Ok(Change::Requests(vec![stop()])),
            RunStrategy::Always | RunStrategy::RerunOnFailure | RunStrategy::Once => Ok(Change::Strategy(RunStrategy::Halted)),
        },
        Action::Restart => match strategy {
            RunStrategy::Halted | RunStrategy::Once | RunStrategy::WaitAsReceiver => {
                Err(conflict(format!("{} does not support manual restart requests", strategy.as_str())))
            }
            _ if !active => Err(conflict("VM is not running")),
            _ => Ok(Change::Requests(vec![stop(), start()])),
        },
    }
}

/// Handles `PUT` on `virtualmachines/NAME/start|stop|restart`.
///
/// # Errors
/// 404 for a missing VM, 400 for a bad body, 409 when the action does not apply (see the module
/// docs).
pub async fn handle(objects: &Objects, ns: &str, name: &str, sub: &str, body: &[u8], query_dry_run: bool) -> Result<Response, ApiError> {
    let action = match sub {
        "start" => Action::Start,
        "stop" => Action::Stop,
        "restart" => Action::Restart,
        _ => return Err(ApiError::no_resource()),
    };
    let (body_dry, grace) = parse_body(sub, body)?;
    let dry = body_dry || query_dry_run;
    let vm_def = registry::find("kubevirt.io", "v1", "virtualmachines").ok_or_else(ApiError::no_resource)?;
    let vmi_def = registry::find("kubevirt.io", "v1", "virtualmachineinstances").ok_or_else(ApiError::no_resource)?;
    let vm = objects.get(vm_def, Some(ns), name)?.object;
    let vm: &Value = &vm;
    let spec: VirtualMachineSpec = serde_json::from_value(vm.get("spec").cloned().unwrap_or(Value::Null))
        .map_err(|e| ApiError::internal(format!("VM {ns}/{name} has a spec that cannot be read: {e}")))?;
    let vmi = match objects.get(vmi_def, Some(ns), name) {
        Ok(s) => Some((*s.object).clone()),
        Err(e) if e.code == 404 => None,
        Err(e) => return Err(e),
    };
    let change = decide(action, spec.effective_run_strategy(), vmi.as_ref())?;
    // A grace period given to stop or restart applies to the VMI being stopped.
    if let (Some(g), Some(_)) = (grace, &vmi) {
        if action != Action::Start && !dry {
            objects
                .update_with(vmi_def, Some(ns), name, Part::Main, false, |cur| {
                    let mut o = cur.clone();
                    o["spec"]["terminationGracePeriodSeconds"] = json!(g);
                    Ok(o)
                })
                .await?;
        }
    }
    match change {
        Change::AlreadyStopping => {}
        Change::Strategy(s) => {
            objects
                .update_with(vm_def, Some(ns), name, Part::Main, dry, |cur| {
                    let mut o = cur.clone();
                    let uses_running = o.pointer("/spec/running").is_some_and(Value::is_boolean);
                    if uses_running {
                        o["spec"]["running"] = json!(s == RunStrategy::Always);
                    } else {
                        o["spec"]["runStrategy"] = json!(s.as_str());
                    }
                    Ok(o)
                })
                .await?;
        }
        Change::Requests(reqs) => {
            objects
                .update_with(vm_def, Some(ns), name, Part::Status, dry, |cur| {
                    let mut o = cur.clone();
                    let pending = o.pointer("/status/stateChangeRequests").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
                    if pending {
                        return Err(conflict(format!(
                            "VM {ns}/{name} has pending state change requests: wait until the controller has carried them out (status.stateChangeRequests is empty)"
                        )));
                    }
                    if !o.get("status").is_some_and(Value::is_object) {
                        o["status"] = json!({});
                    }
                    o["status"]["stateChangeRequests"] = Value::Array(reqs.clone());
                    Ok(o)
                })
                .await?;
        }
    }
    Ok(crate::reply::accepted())
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
            assert_eq!(decide(Action::Start, s, Some(&vmi("Running"))).unwrap_err().message, "VM is already running");
        }
        assert_eq!(decide(Action::Start, RunStrategy::Always, None).unwrap_err().message, "Always does not support manual start requests");
        assert_eq!(decide(Action::Start, RunStrategy::Once, None).unwrap_err().message, "Once does not support manual start requests");
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
        assert_eq!(decide(Action::Stop, RunStrategy::Manual, None).unwrap_err().message, "VM is not running");
        assert_eq!(decide(Action::Stop, RunStrategy::Halted, Some(&vmi("Succeeded"))).unwrap_err().message, "VM is not running");
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
        assert_eq!(decide(Action::Stop, RunStrategy::Halted, Some(&gone)).unwrap_err().message, "VM is not running");
    }

    #[test]
    fn restart_needs_an_active_vmi_and_a_strategy_that_restarts() {
        assert_eq!(
            decide(Action::Restart, RunStrategy::Always, Some(&vmi("Running"))).unwrap(),
            Change::Requests(vec![json!({"action": "Stop", "uid": "u1"}), json!({"action": "Start"})])
        );
        assert_eq!(decide(Action::Restart, RunStrategy::Manual, None).unwrap_err().message, "VM is not running");
        assert_eq!(
            decide(Action::Restart, RunStrategy::Halted, None).unwrap_err().message,
            "Halted does not support manual restart requests"
        );
        assert_eq!(
            decide(Action::Restart, RunStrategy::Once, Some(&vmi("Running"))).unwrap_err().message,
            "Once does not support manual restart requests"
        );
    }
}
