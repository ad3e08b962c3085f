//! `PATCH System {"Boot": ...}`: the boot override and the boot mode, written into the VM
//! ([`api::virtual_media`]), so they survive restarts of the service and of `up`.
//!
//! # Semantics
//! - `BootSourceOverrideEnabled` `Disabled` or `BootSourceOverrideTarget` `None`: no override;
//!   the VM's own boot order is back.
//! - A target without `Enabled` keeps the current `Enabled`; from `Disabled` it means `Once`
//!   (sushy sends `Enabled` only when it differs from what the System reports).
//! - `Once`: the next start boots the target (the controller then restores the order, and the
//!   System reports `Disabled`); `Continuous` stays until changed.
//! - `BootSourceOverrideMode`: `UEFI` is `firmware.bootloader.efi`, `Legacy` is `bios`; it takes
//!   effect at the next power-on.
//!
//! The write runs in the System's turn (as inserts and resets), on a fresh read with a
//! resourceVersion precondition, after checking `If-Match` against the System's ETag.

use std::sync::Arc;

use axum::body::Body;
use http::{HeaderMap, StatusCode};
use kube::api::Api;
use kube::ResourceExt;

use api::virtual_media::{self as vmedia, Enabled, OverrideError, Target};
use api::VirtualMachine;

use crate::actions::BootPatch;
use crate::auth::Caller;
use crate::error::{Message, RfError};
use crate::protocol;
use crate::registry::MessageId;
use crate::resources::{self, Ctx};
use crate::service::Service;
use crate::uri::Uri;

/// The override `patch` asks for, given the current one.
fn wanted(current: Option<(Target, Enabled)>, patch: &BootPatch) -> Option<(Target, Enabled)> {
    let enabled = match (patch.enabled, patch.target, current) {
        (Some(e), _, _) => e,
        // A target from Disabled: Once.
        (None, Some(Some(_)), None) => Some(Enabled::Once),
        (None, _, c) => c.map(|(_, e)| e),
    };
    let target = match patch.target {
        Some(t) => t,
        None => current.map(|(t, _)| t),
    };
    Some((target?, enabled?))
}

fn refused(e: &OverrideError) -> RfError {
    let property = match e {
        OverrideError::NoTemplate => "Boot",
        _ => "Boot/BootSourceOverrideTarget",
    };
    RfError::new(StatusCode::BAD_REQUEST, Message::new(MessageId::PropertyValueConflict, &[property, "the VM's devices"]).about(property))
        .and(Message::new(MessageId::GeneralError, &[]).explained(&e.to_string()))
}

/// Carries out a PATCH of System `uid`'s `Boot`.
///
/// # Errors
/// 404 for a System the caller does not see, 412 for a stale `If-Match`, 400 for a target the
/// VM has no device for.
pub async fn set(svc: &Arc<Service>, caller: &Caller, uid: &str, patch: BootPatch, h: &HeaderMap) -> Result<http::Response<Body>, RfError> {
    let _turn = crate::service::system_turn(uid).await;
    let ctx = Ctx { svc, caller: Some(caller) };
    let shown = resources::get(&ctx, &Uri::System(uid.to_owned()))?;
    protocol::check_if_match(h, &protocol::etag(&shown))?;
    let vm = svc.cache.vm(uid, &caller.scope).ok_or_else(|| RfError::resource_not_found("ComputerSystem", uid))?;
    let vms: Api<VirtualMachine> = Api::namespaced(svc.client.clone(), &vm.namespace().unwrap_or_default());
    let r = client::try_update(&vms, &vm.name_any(), &client::UpdateOptions::default(), |v: &mut VirtualMachine| {
        if v.uid() != vm.uid() {
            return Err(OverrideError::NoTemplate);
        }
        let current = vmedia::boot_override(v).map(|o| (o.target, o.enabled));
        let want = wanted(current, &patch);
        if want != current {
            vmedia::set_override(v, want)?;
        }
        if let Some(u) = patch.uefi {
            vmedia::set_uefi(v, u)?;
        }
        Ok(())
    })
    .await;
    let updated = match r {
        Ok(u) => u,
        Err(client::UpdateError::Mutate { source, .. }) => return Err(refused(&source)),
        Err(client::UpdateError::Conflict { .. }) => return Err(RfError::unavailable(1)),
        Err(e) => return Err(RfError::internal(&client::error_chain(&e))),
    };
    crate::media::await_vm(svc, uid, updated.object.resource_version().as_deref()).await;
    tracing::info!(system = uid, "boot settings written: {patch:?}");
    Ok(protocol::empty(StatusCode::NO_CONTENT))
}

/// The `Boot` object of a System.
#[must_use]
pub fn render(vm: &VirtualMachine) -> serde_json::Value {
    let o = vmedia::boot_override(vm);
    let target = match o.as_ref().map(|o| o.target) {
        None => "None",
        Some(Target::Pxe) => "Pxe",
        Some(Target::Cd) => "Cd",
        Some(Target::Hdd) => "Hdd",
    };
    let enabled = match o.as_ref().map(|o| o.enabled) {
        None => "Disabled",
        Some(Enabled::Once) => "Once",
        Some(Enabled::Continuous) => "Continuous",
    };
    serde_json::json!({
        "BootSourceOverrideEnabled": enabled,
        "BootSourceOverrideEnabled@Redfish.AllowableValues": ["Disabled", "Once", "Continuous"],
        "BootSourceOverrideTarget": target,
        "BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Cd", "Hdd"],
        "BootSourceOverrideMode": if vmedia::uefi(vm) { "UEFI" } else { "Legacy" },
        "BootSourceOverrideMode@Redfish.AllowableValues": ["Legacy", "UEFI"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_combines_with_the_current_override_as_sushy_expects() {
        let p = |target, enabled| BootPatch { target, enabled, uefi: None };
        // Ironic's Cd/Once from Disabled.
        assert_eq!(wanted(None, &p(Some(Some(Target::Cd)), Some(Some(Enabled::Once)))), Some((Target::Cd, Enabled::Once)));
        // A target alone from Disabled is Once; from Continuous it stays Continuous.
        assert_eq!(wanted(None, &p(Some(Some(Target::Hdd)), None)), Some((Target::Hdd, Enabled::Once)));
        assert_eq!(
            wanted(Some((Target::Cd, Enabled::Continuous)), &p(Some(Some(Target::Hdd)), None)),
            Some((Target::Hdd, Enabled::Continuous))
        );
        // Enabled alone keeps the target; Disabled or None removes the override.
        assert_eq!(
            wanted(Some((Target::Cd, Enabled::Once)), &p(None, Some(Some(Enabled::Continuous)))),
            Some((Target::Cd, Enabled::Continuous))
        );
        assert_eq!(wanted(Some((Target::Cd, Enabled::Once)), &p(None, Some(None))), None);
        assert_eq!(wanted(Some((Target::Cd, Enabled::Once)), &p(Some(None), None)), None);
        // Enabled without any target from Disabled: nothing to boot, no override.
        assert_eq!(wanted(None, &p(None, Some(Some(Enabled::Once)))), None);
    }
}
