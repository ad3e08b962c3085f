//! KubeVirt's VMI action subresources: `PUT .../virtualmachineinstances/NAME/pause|unpause|
//! softreboot` (what `virtctl pause vm|vmi NAME` calls: the VM form names the VMI too).
//!
//! Like [`super::lifecycle`] they record intent and leave the work to others: the request
//! becomes an annotation on the VMI ([`api::vmi_requests`], shared with the CLI's fallback),
//! which the node agent that owns the VMI's QMP connection carries out. The decision runs on
//! the VMI as stored, inside the write, so two requests never both pass a check the first
//! one changes.
//!
//! Refusals: 404 for a missing VMI, 409 with KubeVirt's message (see [`api::vmi_requests`]).
//! `dryRun: ["All"]` (body, as `PauseOptions`/`UnpauseOptions`, or query) checks and writes
//! nothing. Success is 202.

use axum::response::Response;

use api::vmi_requests::{decide, VmiAction};

use super::access::ObjectAccess;
use super::Put;
use crate::objects::Part;
use crate::registry;
use crate::status::ApiError;

/// The subresources this module serves, for discovery.
pub const SUBRESOURCES: [&str; 3] = ["pause", "unpause", "softreboot"];

/// Handles `PUT` on `virtualmachineinstances/NAME/pause|unpause|softreboot`.
///
/// # Errors
/// 404 for a missing VMI, 400 for a bad body, 409 when the action does not apply.
pub async fn handle<O: ObjectAccess>(objects: &O, put: &Put<'_>) -> Result<Response, ApiError> {
    let Put { ns, name, sub, body, query_dry_run, .. } = *put;
    let action = VmiAction::parse(sub).ok_or_else(ApiError::no_resource)?;
    // The options bodies carry only `dryRun` (a soft reboot's has nothing else either).
    let (body_dry, _) = super::lifecycle::parse_body(sub, body)?;
    let vmi_def = registry::find("kubevirt.io", "v1", "virtualmachineinstances").ok_or_else(ApiError::no_resource)?;
    let id = format!("{:016x}", rand::random::<u64>());
    objects
        .update_with(vmi_def, Some(ns), name, Part::Main, body_dry || query_dry_run, |cur| {
            let edit = decide(action, cur, &id).map_err(|e| ApiError::conflict_message(e.0))?;
            let mut o = cur.clone();
            edit.apply(&mut o);
            Ok(o)
        })
        .await?;
    Ok(crate::reply::accepted())
}
