//! One-shot actions asked for through the VMI, each carried out once per request ID by the
//! worker — the only owner of the VMI's QMP connection:
//! - [`NMI`]: a non-maskable interrupt (the Redfish service's `ResetType: Nmi`), QMP
//!   `inject-nmi`;
//! - [`SOFT_REBOOT`]: the `softreboot` subresource, QMP `system_reset` (KubeVirt asks its guest
//!   agent, or libvirt's ACPI reboot; there is no guest agent here: the guest is reset).
//!
//! The annotation `requested=ID` asks; the worker answers with `done=ID`, or `failed="ID: why"`.
//!
//! # Guarantees
//! - One action per ID: an ID already answered in the VMI, or already carried out by this
//!   worker (its answer not yet seen in a newer VMI), is not carried out again.
//! - An agent restarted between the request and the answer carries it out then (the request is
//!   in the VMI, not in memory).
//! - The answer is written again until it is stored (an API briefly unavailable does not lose
//!   it), in its own task: the worker goes on meanwhile.
//!
//! The answer is a single-key annotation write without a resourceVersion
//! ([`client::blind_patch`], the marked exception to `client::update`): it touches one map key
//! and no array, so it cannot undo anyone else's change.

use kube::api::Api;
use kube::ResourceExt;
use tracing::Instrument;

use api::annotations as ann;
use api::VirtualMachineInstance;
use qemu::Machine;

/// The QMP command of a one-shot action.
enum Op {
    InjectNmi,
    Reset,
}

/// A kind of one-shot action: its three annotations, its command, and what the log calls it.
pub(super) struct Kind {
    requested: &'static str,
    done: &'static str,
    failed: &'static str,
    op: Op,
    what: &'static str,
}

/// An NMI ([`ann::NMI_REQUESTED`]).
pub(super) const NMI: Kind =
    Kind { requested: ann::NMI_REQUESTED, done: ann::NMI_INJECTED, failed: ann::NMI_FAILED, op: Op::InjectNmi, what: "an NMI" };
/// A soft reboot ([`ann::SOFTREBOOT_REQUESTED`]).
pub(super) const SOFT_REBOOT: Kind = Kind {
    requested: ann::SOFTREBOOT_REQUESTED,
    done: ann::SOFTREBOOT_DONE,
    failed: ann::SOFTREBOOT_FAILED,
    op: Op::Reset,
    what: "a soft reboot",
};

/// The requested action of `kind` not yet answered in `vmi`, if any.
#[must_use]
pub(super) fn pending(kind: &Kind, vmi: &VirtualMachineInstance) -> Option<String> {
    let a = vmi.annotations();
    let id = a.get(kind.requested)?;
    let answered = a.get(kind.done) == Some(id) || a.get(kind.failed).is_some_and(|f| f.starts_with(&format!("{id}: ")));
    (!answered).then(|| id.clone())
}

/// Carries out the pending action of `kind` on `vmi` (if any, and not already done: `done`),
/// and answers.
pub(super) async fn act(client: &kube::Client, kind: &Kind, vmi: &VirtualMachineInstance, machine: &Machine, done: &mut Option<String>) {
    let Some(id) = pending(kind, vmi) else { return };
    if done.as_deref() == Some(id.as_str()) {
        return;
    }
    let r = match kind.op {
        Op::InjectNmi => machine.inject_nmi().await,
        Op::Reset => machine.reset().await,
    };
    *done = Some(id.clone());
    let (key, value) = match &r {
        Ok(()) => {
            tracing::info!(request = %id, "carried out {}", kind.what);
            (kind.done, id.clone())
        }
        Err(e) => {
            tracing::warn!(request = %id, "cannot carry out {}: {e}", kind.what);
            (kind.failed, format!("{id}: {e}"))
        }
    };
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    let answer = answer(api, vmi.name_any(), key, value, kind.what);
    tokio::spawn(answer.in_current_span());
}

/// Writes the answer `key=value`, again until it is stored ([`client::persist`]); its own task,
/// so that an unavailable API does not hold the worker. A lost answer would leave the request
/// pending in the VMI: the caller waits for it in vain, and the next agent carries it out again.
async fn answer(api: Api<VirtualMachineInstance>, name: String, key: &'static str, value: String, what: &'static str) {
    let r = client::persist(&format!("record the outcome of {what} on the VMI"), || {
        client::blind_patch(&api, &name, client::MetaKey::Annotation, key, Some(&value))
    })
    .await;
    match r {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!("cannot record the outcome of {what} on the VMI: {e}"),
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

    /// An answer the API server refuses (here twice, 503) is written again until it is stored.
    /// Against the real API server, in process.
    #[tokio::test]
    async fn a_refused_answer_is_written_again() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let server = apiserver::Server::open(&apiserver::Config::new(dir.path()), None).await.unwrap();
        let refusals = apiserver::testing::Refusals::first(2, |_, _, body| body.contains(NMI.done));
        let client = client::in_process(apiserver::testing::refusing(server.local_router(), std::sync::Arc::clone(&refusals)));
        let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
        let mut requested = vmi(&json!({NMI.requested: "7"}));
        requested.metadata.namespace = Some("default".into());
        api.create(&kube::api::PostParams::default(), &requested).await.unwrap();

        tokio::time::timeout(std::time::Duration::from_secs(30), answer(api.clone(), "v".into(), NMI.done, "7".into(), NMI.what))
            .await
            .unwrap_or_else(|_| panic!("timed out after 30 s writing the answer; writes {:?}", refusals.seen()));
        assert_eq!(pending(&NMI, &api.get("v").await.unwrap()), None, "answered");
        let answers: Vec<_> = refusals.seen().into_iter().filter(|w| w.body.contains(NMI.done)).collect();
        assert_eq!((answers.len(), answers.iter().filter(|w| w.refused).count()), (3, 2), "{answers:?}");
    }

    #[test]
    fn a_request_is_pending_until_its_id_is_answered() {
        for k in [&NMI, &SOFT_REBOOT] {
            assert_eq!(pending(k, &vmi(&json!({}))), None);
            assert_eq!(pending(k, &vmi(&json!({k.requested: "7"}))), Some("7".into()));
            assert_eq!(pending(k, &vmi(&json!({k.requested: "7", k.done: "6"}))), Some("7".into()), "an older answer");
            assert_eq!(pending(k, &vmi(&json!({k.requested: "7", k.done: "7"}))), None);
            assert_eq!(pending(k, &vmi(&json!({k.requested: "7", k.failed: "7: no QMP"}))), None);
            assert_eq!(pending(k, &vmi(&json!({k.requested: "7", k.failed: "70: no QMP"}))), Some("7".into()));
        }
        // The kinds never answer each other's requests.
        assert_eq!(pending(&SOFT_REBOOT, &vmi(&json!({NMI.requested: "7", NMI.done: "7"}))), None);
        assert_eq!(pending(&SOFT_REBOOT, &vmi(&json!({SOFT_REBOOT.requested: "7", NMI.done: "7"}))), Some("7".into()));
    }
}
