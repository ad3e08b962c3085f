//! KubeVirt's VM lifecycle subresources: `PUT .../virtualmachines/NAME/start|stop|restart`.
//!
//! They never touch the VMI themselves; like KubeVirt's virt-api they record intent on the VM
//! and the controller carries it out. What each request does to the VM is decided in
//! [`api::lifecycle_requests`] (shared with the CLI's fallback).
//!
//! Refusals (409, KubeVirt's wording): start when the VMI is active ("VM is already running"),
//! or under `Always`/`Once` ("... does not support manual start requests"); stop when nothing
//! runs under `Halted`/`Manual` ("VM is not running"); restart under `Halted`/`Once`, or with no
//! active VMI. `dryRun: ["All"]` (body or query) checks and writes nothing. Success is 202.

use axum::response::Response;
use serde_json::{json, Value};

use api::kubevirt::VirtualMachineSpec;
use api::lifecycle_requests::{decide, set_requests, set_strategy, Action, Change};
use api::validation::{Cause, CauseType};

use super::access::ObjectAccess;
use super::Put;
use crate::objects::Part;
use crate::registry;
use crate::status::ApiError;

/// The subresources this module serves, for discovery.
pub const SUBRESOURCES: [&str; 3] = ["start", "stop", "restart"];

/// The options body: its `dryRun` and its grace period (stop, restart).
pub(super) fn parse_body(sub: &str, body: &[u8]) -> Result<(bool, Option<i64>), ApiError> {
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

/// Handles `PUT` on `virtualmachines/NAME/start|stop|restart`.
///
/// # Errors
/// 404 for a missing VM, 400 for a bad body, 409 when the action does not apply (see the module
/// docs).
pub async fn handle<O: ObjectAccess>(objects: &O, put: &Put<'_>) -> Result<Response, ApiError> {
    let Put { ns, name, sub, body, query_dry_run, .. } = *put;
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
    let vm = objects.get(vm_def, Some(ns), name).await?;
    let spec: VirtualMachineSpec = serde_json::from_value(vm.get("spec").cloned().unwrap_or(Value::Null))
        .map_err(|e| ApiError::internal(format!("VM {ns}/{name} has a spec that cannot be read: {e}")))?;
    let vmi = match objects.get(vmi_def, Some(ns), name).await {
        Ok(s) => Some(s),
        Err(e) if e.code == 404 => None,
        Err(e) => return Err(e),
    };
    let change = decide(action, spec.effective_run_strategy(), vmi.as_ref()).map_err(|e| ApiError::conflict_message(e.0))?;
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
                    set_strategy(&mut o, s);
                    Ok(o)
                })
                .await?;
        }
        Change::Requests(reqs) => {
            objects
                .update_with(vm_def, Some(ns), name, Part::Status, dry, |cur| {
                    let mut o = cur.clone();
                    set_requests(&mut o, &reqs).map_err(|e| ApiError::conflict_message(e.0))?;
                    Ok(o)
                })
                .await?;
        }
    }
    Ok(crate::reply::accepted())
}
