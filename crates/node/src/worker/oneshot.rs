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
//! The answer is a single-key annotation write without a resourceVersion (a JSON patch, the
//! marked exception to `client::update`): it touches one map key and no array, so it cannot
//! undo anyone else's change, and its `test`s make it apply only while the same VMI still asks
//! for the same request.

use kube::api::{Api, Patch, PatchParams};
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
pub(super) async fn act(
    client: &kube::Client,
    kind: &'static Kind,
    vmi: &VirtualMachineInstance,
    machine: &Machine,
    done: &mut Option<String>,
) {
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
    let answer = answer(api, vmi.name_any(), Answer { uid: vmi.uid().unwrap_or_default(), kind, id, key, value });
    tokio::spawn(answer.in_current_span());
}

/// The answer `key=value` to request `id` of `kind` on the VMI `uid`.
struct Answer {
    uid: String,
    kind: &'static Kind,
    id: String,
    key: &'static str,
    value: String,
}

/// Writes an answer, again until it is stored ([`client::persist`]); its own task, so that an
/// unavailable API does not hold the worker. A lost answer would leave the request pending in
/// the VMI: the caller waits for it in vain, and the next agent carries it out again.
///
/// A JSON patch whose `test`s require the same VMI (UID) still asking for the same request: an
/// answer sent again after the caller moved on to a newer request (or after the VMI was
/// replaced) is refused (422, not sent again) instead of answering the newer one's key with
/// the old ID.
async fn answer(api: Api<VirtualMachineInstance>, name: String, a: Answer) {
    let pointer = |key: &str| format!("/metadata/annotations/{}", key.replace('~', "~0").replace('/', "~1"));
    let ops = serde_json::json!([
        {"op": "test", "path": "/metadata/uid", "value": a.uid},
        {"op": "test", "path": pointer(a.kind.requested), "value": a.id},
        {"op": "add", "path": pointer(a.key), "value": a.value},
    ]);
    let what = a.kind.what;
    let patch: json_patch::Patch = match serde_json::from_value(ops) {
        Ok(p) => p,
        Err(e) => return tracing::warn!("cannot build the answer to {what}: {e}"),
    };
    let (pp, patch) = (PatchParams::default(), Patch::Json::<()>(patch));
    let (api, name, pp, patch) = (&api, &name, &pp, &patch);
    let r = client::persist(&format!("record the outcome of {what} on the VMI"), || api.patch(name, pp, patch)).await;
    match r {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(kube::Error::Api(s)) if s.code == 422 => {
            tracing::info!(request = %a.id, "the VMI no longer asks for this {what}: its answer is not written");
        }
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
        let refusals = apiserver::testing::Refusals::first(2, |_, _, body| body.contains(r#""op":"test""#));
        let (_dir, _server, client) = crate::worker::test_api(Some(std::sync::Arc::clone(&refusals))).await;
        let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
        let mut requested = vmi(&json!({NMI.requested: "7"}));
        requested.metadata.namespace = Some("default".into());
        api.create(&kube::api::PostParams::default(), &requested).await.unwrap();

        let reply =
            |id: &str, uid: &str| Answer { uid: uid.to_owned(), kind: &NMI, id: id.to_owned(), key: NMI.done, value: id.to_owned() };
        let uid = api.get("v").await.unwrap().uid().unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(30), answer(api.clone(), "v".into(), reply("7", &uid)))
            .await
            .unwrap_or_else(|_| panic!("timed out after 30 s writing the answer; writes {:?}", refusals.seen()));
        assert_eq!(pending(&NMI, &api.get("v").await.unwrap()), None, "answered");
        let answers: Vec<_> = refusals.seen().into_iter().filter(|w| w.body.contains(r#""op":"test""#)).collect();
        assert_eq!((answers.len(), answers.iter().filter(|w| w.refused).count()), (3, 2), "{answers:?}");

        // A newer request, answered: a late answer to the old one (sent again while the API was
        // away) does not undo it, nor does one meant for another VMI of the same name.
        let newer = serde_json::json!({"metadata": {"annotations": {NMI.requested: "8"}}});
        api.patch("v", &PatchParams::default(), &Patch::Merge(newer)).await.unwrap();
        answer(api.clone(), "v".into(), reply("8", &uid)).await;
        answer(api.clone(), "v".into(), reply("7", &uid)).await;
        let elsewhere = Answer { uid: "another-uid".into(), kind: &NMI, id: "8".into(), key: NMI.failed, value: "8: late".into() };
        answer(api.clone(), "v".into(), elsewhere).await;
        let now = api.get("v").await.unwrap();
        assert_eq!(now.annotations().get(NMI.done).map(String::as_str), Some("8"), "{:?}", now.metadata.annotations);
        assert_eq!(pending(&NMI, &now), None);
        assert_eq!(now.annotations().get(NMI.failed), None, "another VMI's answer was not written here");
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
