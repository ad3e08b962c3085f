//! `ComputerSystem.Reset`, carried out: plan ([`crate::power::plan`]), issue the change through
//! the VM's `start`/`stop`/`restart` subresources (or, for `Nmi`, an annotation the node agent
//! acts on), then follow the caches until the System reaches the goal.
//!
//! # Flow
//! 1. Take the System's turn (actions on one System run in order) and plan from the cached
//!    state; a reset already satisfied answers 204 at once.
//! 2. Issue the change; keep the turn until the caches show it (the state moved), so the next
//!    action plans from the new state, never a stale one.
//! 3. Wait up to [`INLINE_WAIT`] for the goal: reached, 204. Otherwise 202 with a Task
//!    (`Location`, `Retry-After`), which follows the same goal for up to [`TASK_DEADLINE`]:
//!    `Completed` when reached, `Exception` naming the cause when the VM cannot get there (it
//!    was deleted, it crash-loops, the agent could not inject the NMI) or the deadline passed.
//!
//! # Nmi
//! The VMI gets the annotation [`NMI_REQUESTED`]`=ID`; the node agent that owns the VMI's QMP
//! connection sends `inject-nmi` and answers with [`NMI_INJECTED`]`=ID` (or [`NMI_FAILED`]`=ID:
//! why`). An annotation rather than a subresource: it needs nothing new from the API server
//! (so it works against a real kube-apiserver in cluster mode), survives an agent restart (the
//! agent acts on what it finds), and is idempotent (one injection per ID).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{header, StatusCode};
use kube::api::Api;
use kube::ResourceExt;
use serde_json::{json, Value};

use api::phases::PrintableStatus;
use api::{VirtualMachine, VirtualMachineInstance};

use crate::accounts::Scope;
use crate::auth::Caller;
use crate::error::RfError;
use crate::follow::{self, Progress};
use crate::power::{self, PowerState, ResetType, Step};
use crate::protocol;
use crate::service::Service;
use crate::uri::Uri;

pub use api::annotations::{NMI_FAILED, NMI_INJECTED, NMI_REQUESTED};

/// How long a reset request waits for its goal before answering 202 with a Task.
pub const INLINE_WAIT: Duration = Duration::from_secs(1);
/// How long a Task follows its goal.
pub const TASK_DEADLINE: Duration = Duration::from_secs(10 * 60);
/// How long the System's turn waits for the caches to show an issued change.
const ISSUED_WAIT: Duration = Duration::from_secs(10);

/// What a reset waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Goal {
    On,
    Off,
    /// Running again, as a VMI other than this one.
    RestartedFrom(String),
    Nmi(String),
}

fn judge(goal: &Goal, vm: Option<&VirtualMachine>, vmi: Option<&VirtualMachineInstance>) -> Progress {
    let Some(vm) = vm else { return Progress::Failed("the VM was deleted".to_owned()) };
    let printable = vm.status.as_ref().and_then(|s| s.printable_status.clone());
    let stuck = matches!(
        printable,
        Some(
            PrintableStatus::CrashLoopBackOff
                | PrintableStatus::ErrorUnschedulable
                | PrintableStatus::ErrorPvcNotFound
                | PrintableStatus::DataVolumeError
        )
    );
    let state = power::state(vm, vmi);
    match goal {
        Goal::On | Goal::RestartedFrom(_) if stuck => Progress::Failed(format!(
            "the VM cannot start: its status is {} (see `virtplug vm get {}` and its Events)",
            printable.map_or_else(String::new, |p| p.to_string()),
            vm.name_any()
        )),
        Goal::On => match state {
            PowerState::On | PowerState::Paused => Progress::Reached,
            _ if vmi.is_some() => Progress::Moving(60),
            _ => Progress::Moving(30),
        },
        Goal::Off => match state {
            PowerState::Off => Progress::Reached,
            _ => Progress::Moving(50),
        },
        Goal::RestartedFrom(old) => match vmi {
            Some(v) if v.uid().as_deref() != Some(old.as_str()) && v.is_running() => Progress::Reached,
            Some(v) if v.uid().as_deref() != Some(old.as_str()) => Progress::Moving(66),
            _ => Progress::Moving(33),
        },
        Goal::Nmi(id) => {
            let Some(v) = vmi else { return Progress::Failed("the VM stopped before the NMI was delivered".to_owned()) };
            let ann = v.annotations();
            if ann.get(NMI_INJECTED) == Some(id) {
                Progress::Reached
            } else if let Some(f) = ann.get(NMI_FAILED).and_then(|f| f.strip_prefix(&format!("{id}: "))) {
                Progress::Failed(format!("the node agent could not inject the NMI: {f}"))
            } else {
                Progress::Moving(50)
            }
        }
    }
}

/// Where `uid`'s System is on the way to `goal`, from the caches.
fn progress(svc: &Service, uid: &str, goal: &Goal) -> Progress {
    let vm = svc.cache.vm(uid, &Scope::default());
    let vmi = vm.as_ref().and_then(|v| svc.cache.vmi(v));
    judge(goal, vm.as_deref(), vmi.as_deref())
}

/// Waits until `goal` is reached or failed, or `within` passed (then the last progress).
async fn follow(svc: &Service, uid: &str, goal: &Goal, within: Duration, on_progress: impl FnMut(u8)) -> Progress {
    follow::until(&svc.cache, within, || progress(svc, uid, goal), on_progress).await
}

/// Calls a VM lifecycle subresource.
async fn subresource(svc: &Service, vm: &VirtualMachine, sub: &str, body: &Value) -> Result<(), RfError> {
    let ns = vm.namespace().unwrap_or_default();
    let path = format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{}/{sub}", vm.name_any());
    let req = http::Request::put(&path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
        .map_err(|e| RfError::internal(&format!("cannot build the {sub} request: {e}")))?;
    match svc.client.request_text(req).await {
        Ok(_) => Ok(()),
        // The lifecycle refuses the change in this state (KubeVirt's own words).
        Err(kube::Error::Api(s)) if s.code == 409 => Err(RfError::action_conflict("ResetType", sub, &s.message)),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(RfError::resource_not_found("ComputerSystem", &vm.uid().unwrap_or_default())),
        Err(e) => Err(RfError::internal(&format!("{sub} of VM {ns}/{}: {}", vm.name_any(), client::error_chain(&e)))),
    }
}

/// Asks the node agent for an NMI: the VMI's [`NMI_REQUESTED`] annotation.
async fn request_nmi(svc: &Service, vmi: &VirtualMachineInstance) -> Result<String, RfError> {
    let id: String = format!("{:016x}", rand::random::<u64>());
    let api: Api<VirtualMachineInstance> = Api::namespaced(svc.client.clone(), &vmi.namespace().unwrap_or_default());
    client::update(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
        v.annotations_mut().insert(NMI_REQUESTED.to_owned(), id.clone());
    })
    .await
    .map_err(|e| RfError::internal(&client::error_chain(&e)))?;
    Ok(id)
}

/// Issues `step`; returns the goal.
async fn issue(svc: &Service, vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>, step: &Step) -> Result<Goal, RfError> {
    let grace = |g: &Option<u32>| g.map_or_else(|| json!({}), |g| json!({"gracePeriod": g, "gracePeriodSeconds": g}));
    Ok(match step {
        // Answered before anything is issued (see `reset`).
        Step::Nothing => return Err(RfError::internal("a satisfied reset has nothing to issue")),
        Step::Start => {
            subresource(svc, vm, "start", &json!({})).await?;
            Goal::On
        }
        Step::Stop { grace: g } => {
            subresource(svc, vm, "stop", &grace(g)).await?;
            Goal::Off
        }
        Step::Restart { grace: g } => {
            let old = vmi.and_then(ResourceExt::uid).unwrap_or_default();
            subresource(svc, vm, "restart", &grace(g)).await?;
            Goal::RestartedFrom(old)
        }
        Step::Nmi => {
            let vmi = vmi.ok_or_else(|| RfError::action_conflict("ResetType", "Nmi", "the System is not running"))?;
            Goal::Nmi(request_nmi(svc, vmi).await?)
        }
    })
}

/// Carries out a reset of System `uid` (see the module docs).
///
/// # Errors
/// 404 for a System the caller does not see; 409 when the reset conflicts with the state.
pub async fn reset(svc: &Arc<Service>, caller: &Caller, uid: &str, reset: ResetType, body: &str) -> Result<http::Response<Body>, RfError> {
    let goal = {
        let _turn = crate::service::system_turn(uid).await;
        let vm = svc.cache.vm(uid, &caller.scope).ok_or_else(|| RfError::resource_not_found("ComputerSystem", uid))?;
        let vmi = svc.cache.vmi(&vm);
        let before = power::state(&vm, vmi.as_deref());
        let step = power::plan(reset, before).map_err(|c| RfError::action_conflict("ResetType", reset.as_str(), c.0))?;
        if step == Step::Nothing {
            tracing::info!(system = uid, reset = reset.as_str(), "reset already satisfied ({})", before.as_str());
            return Ok(protocol::empty(StatusCode::NO_CONTENT));
        }
        let goal = issue(svc, &vm, vmi.as_deref(), &step).await?;
        tracing::info!(system = uid, vm = %format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any()), reset = reset.as_str(), "reset issued");
        wait_issued(svc, uid, before, &goal).await;
        goal
    };
    match follow(svc, uid, &goal, INLINE_WAIT, |_| {}).await {
        Progress::Reached => Ok(protocol::empty(StatusCode::NO_CONTENT)),
        Progress::Failed(why) => Err(RfError::action_conflict("ResetType", reset.as_str(), &why)),
        Progress::Moving(_) => Ok(task(svc, caller, uid, reset, goal, body)),
    }
}

/// Holds the System's turn until the caches show the change (or the goal), so the next action
/// does not plan from the state before it.
async fn wait_issued(svc: &Service, uid: &str, before: PowerState, goal: &Goal) {
    let moved = async {
        let mut changed = svc.cache.changed();
        loop {
            changed.borrow_and_update();
            let vm = svc.cache.vm(uid, &Scope::default());
            let vmi = vm.as_ref().and_then(|v| svc.cache.vmi(v));
            let now = vm.as_deref().map(|v| power::state(v, vmi.as_deref()));
            let nmi = matches!(goal, Goal::Nmi(id) if vmi.as_ref().is_some_and(|v| v.annotations().get(NMI_REQUESTED) == Some(id)));
            if now != Some(before) || nmi || progress(svc, uid, goal) == Progress::Reached {
                return;
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    };
    if tokio::time::timeout(ISSUED_WAIT, moved).await.is_err() {
        tracing::warn!(system = uid, "the caches did not show the issued reset within {ISSUED_WAIT:?}");
    }
}

/// Answers 202 with a Task that follows `goal` in the background.
fn task(svc: &Arc<Service>, caller: &Caller, uid: &str, reset: ResetType, goal: Goal, body: &str) -> http::Response<Body> {
    let target = Uri::SystemReset(uid.to_owned()).path();
    let t = svc.tasks.start(&format!("ComputerSystem.Reset {} of System {uid}", reset.as_str()), &caller.user, &target, body);
    let (svc2, uid2, id) = (Arc::clone(svc), uid.to_owned(), t.id.clone());
    tokio::spawn(async move {
        let tasks = &svc2.tasks;
        let outcome = follow(&svc2, &uid2, &goal, TASK_DEADLINE, |p| tasks.progress(&id, p)).await;
        let late = format!(
            "the System did not reach the state asked for within {} s; see `virtplug vm get` and the VM's Events",
            TASK_DEADLINE.as_secs()
        );
        follow::end_task(tasks, &id, &outcome, &late);
    });
    follow::accepted(svc, caller, t.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(strategy: &str) -> VirtualMachine {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "v", "namespace": "d", "uid": "u"}, "spec": {"runStrategy": strategy, "template": {}}}))
        .unwrap()
    }

    #[allow(clippy::needless_pass_by_value)]
    fn vmi(uid: &str, phase: &str, ann: Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "d", "uid": uid, "annotations": ann}, "spec": {"domain": {}}, "status": {"phase": phase}}))
        .unwrap()
    }

    #[test]
    fn goals_are_judged_from_the_vm_and_vmi() {
        let on = vm("Always");
        assert_eq!(judge(&Goal::On, Some(&on), Some(&vmi("a", "Running", json!({})))), Progress::Reached);
        assert_eq!(judge(&Goal::On, Some(&on), Some(&vmi("a", "Scheduled", json!({})))), Progress::Moving(60));
        assert_eq!(judge(&Goal::Off, Some(&vm("Halted")), None), Progress::Reached);
        assert_eq!(judge(&Goal::RestartedFrom("a".into()), Some(&on), Some(&vmi("a", "Running", json!({})))), Progress::Moving(33));
        assert_eq!(judge(&Goal::RestartedFrom("a".into()), Some(&on), Some(&vmi("b", "Running", json!({})))), Progress::Reached);
        assert!(matches!(judge(&Goal::On, None, None), Progress::Failed(_)));
    }

    #[test]
    fn an_nmi_is_done_when_the_agent_answers_its_id() {
        let on = vm("Always");
        let goal = Goal::Nmi("7".into());
        assert_eq!(judge(&goal, Some(&on), Some(&vmi("a", "Running", json!({NMI_REQUESTED: "7"})))), Progress::Moving(50));
        assert_eq!(judge(&goal, Some(&on), Some(&vmi("a", "Running", json!({NMI_INJECTED: "7"})))), Progress::Reached);
        assert_eq!(judge(&goal, Some(&on), Some(&vmi("a", "Running", json!({NMI_INJECTED: "6"})))), Progress::Moving(50));
        let failed = judge(&goal, Some(&on), Some(&vmi("a", "Running", json!({NMI_FAILED: "7: QMP is gone"}))));
        assert_eq!(failed, Progress::Failed("the node agent could not inject the NMI: QMP is gone".into()));
    }
}
