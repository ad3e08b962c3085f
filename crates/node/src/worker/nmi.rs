//! A non-maskable interrupt asked for through the VMI (the Redfish service's `ResetType: Nmi`):
//! the annotation [`REQUESTED`]`=ID` asks; the worker — the only owner of the VMI's QMP
//! connection — sends QMP `inject-nmi` once per ID and answers with [`INJECTED`]`=ID`, or
//! [`FAILED`]`="ID: why"`.
//!
//! # Guarantees
//! - One injection per ID: an ID already answered in the VMI, or already injected by this
//!   worker (its answer not yet seen in a newer VMI), is not injected again.
//! - An agent restarted between the request and the answer injects it then (the request is in
//!   the VMI, not in memory).
//!
//! The answer is a single-key annotation write without a resourceVersion
//! ([`client::blind_patch`], the marked exception to `client::update`): it touches one map key
//! and no array, so it cannot undo anyone else's change.

use kube::api::Api;
use kube::ResourceExt;

use api::VirtualMachineInstance;
use qemu::Machine;

use api::annotations::{NMI_FAILED as FAILED, NMI_INJECTED as INJECTED, NMI_REQUESTED as REQUESTED};

/// The requested NMI not yet answered in `vmi`, if any.
#[must_use]
pub fn pending(vmi: &VirtualMachineInstance) -> Option<String> {
    let a = vmi.annotations();
    let id = a.get(REQUESTED)?;
    let answered = a.get(INJECTED) == Some(id) || a.get(FAILED).is_some_and(|f| f.starts_with(&format!("{id}: ")));
    (!answered).then(|| id.clone())
}

/// Injects the pending NMI of `vmi` (if any, and not already injected: `done`), and answers.
pub(super) async fn act(client: &kube::Client, vmi: &VirtualMachineInstance, machine: &Machine, done: &mut Option<String>) {
    let Some(id) = pending(vmi) else { return };
    if done.as_deref() == Some(id.as_str()) {
        return;
    }
    let r = machine.inject_nmi().await;
    *done = Some(id.clone());
    let (key, value) = match &r {
        Ok(()) => {
            tracing::info!(nmi = %id, "injected an NMI");
            (INJECTED, id.clone())
        }
        Err(e) => {
            tracing::warn!(nmi = %id, "cannot inject an NMI: {e}");
            (FAILED, format!("{id}: {e}"))
        }
    };
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    if let Err(e) = client::blind_patch(&api, &vmi.name_any(), client::MetaKey::Annotation, key, Some(&value)).await {
        tracing::warn!(nmi = %id, "cannot record the NMI's outcome on the VMI: {e}");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn vmi(ann: &serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "d", "annotations": ann}, "spec": {"domain": {}}}))
        .unwrap()
    }

    #[test]
    fn an_nmi_is_pending_until_its_id_is_answered() {
        assert_eq!(pending(&vmi(&json!({}))), None);
        assert_eq!(pending(&vmi(&json!({REQUESTED: "7"}))), Some("7".into()));
        assert_eq!(pending(&vmi(&json!({REQUESTED: "7", INJECTED: "6"}))), Some("7".into()), "an older answer");
        assert_eq!(pending(&vmi(&json!({REQUESTED: "7", INJECTED: "7"}))), None);
        assert_eq!(pending(&vmi(&json!({REQUESTED: "7", FAILED: "7: no QMP"}))), None);
        assert_eq!(pending(&vmi(&json!({REQUESTED: "7", FAILED: "70: no QMP"}))), Some("7".into()));
    }
}
