//! The VM's `status`: `printableStatus`, `ready`, `created` and its conditions (its own, and the
//! VMI's `Paused`, copied as KubeVirt copies the VMI's conditions). A paused VM is not ready
//! (`ready: false`, `Ready=False` with the VMI's reason
//! [`api::vmi_requests::PAUSED_NOT_READY_REASON`]), as KubeVirt copies the VMI's `Ready`.

use kube::api::Api;
use kube::ResourceExt;

use api::kubevirt::Condition;
use api::phases::VmiPhase;
use api::{VirtualMachine, VirtualMachineInstance};

use super::{api_err, deleting, paused_condition, printable_status, LifecycleError, Volumes};

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Sets condition `c` in `conds`, keeping `lastTransitionTime` when the status did not change.
pub fn set_condition(conds: &mut Vec<Condition>, mut c: Condition) {
    match conds.iter_mut().find(|x| x.type_ == c.type_) {
        Some(x) => {
            c.last_transition_time = if x.status == c.status { x.last_transition_time.clone() } else { Some(now()) };
            *x = c;
        }
        None => {
            c.last_transition_time = Some(now());
            conds.push(c);
        }
    }
}

/// A condition with `type_`, `status`, `reason` and `message`.
#[must_use]
pub fn condition(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        ..Condition::default()
    }
}

/// Writes the VM's `status` from what was observed (after the step).
///
/// # Errors
/// When the write fails.
pub async fn write_status(
    client: &kube::Client,
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    volumes: &Volumes,
    extra: &[(Condition, bool)],
) -> Result<(), LifecycleError> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let object = format!("{ns}/{name}");
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let printable = printable_status(vm, vmi, volumes);
    let paused = vmi.is_some_and(|v| paused_condition(v).is_some());
    let ready = vmi.is_some_and(|v| v.is_running() && !deleting(v)) && !paused;
    let ready_cond = match vmi {
        None => condition("Ready", false, "VMINotExists", "VMI does not exist"),
        Some(v) if ready => condition("Ready", true, "", &format!("VMI {} is running", v.name_any())),
        Some(v) if v.is_running() && !deleting(v) => {
            condition("Ready", false, api::vmi_requests::PAUSED_NOT_READY_REASON, api::vmi_requests::PAUSED_NOT_READY_MESSAGE)
        }
        Some(v) => {
            let phase = v.phase().map_or("", VmiPhase::as_str);
            let phase = if phase.is_empty() { VmiPhase::Pending.as_str() } else { phase };
            condition("Ready", false, "VMINotRunning", &format!("VMI is {phase}"))
        }
    };
    let paused_cond = vmi.and_then(paused_condition).cloned();
    let volumes_cond = match volumes {
        Volumes::Ready => None,
        other => other.printable().map(|(s, m)| condition("DataVolumesReady", false, s.as_str(), m)),
    };
    // `vm` is the store's copy: nothing is read or sent when the status is already so.
    client::update_status_from(&vms, vm, |v: &mut VirtualMachine| {
        let s = v.status.get_or_insert_with(Default::default);
        s.printable_status = Some(printable.clone());
        s.ready = Some(ready);
        s.created = Some(vmi.is_some());
        let mut rc = ready_cond.clone();
        if rc.reason.as_deref() == Some("") {
            rc.reason = None;
        }
        set_condition(&mut s.conditions, rc);
        match &volumes_cond {
            Some(c) => set_condition(&mut s.conditions, c.clone()),
            None => s.conditions.retain(|c| c.type_ != "DataVolumesReady"),
        }
        match &paused_cond {
            Some(c) => set_condition(&mut s.conditions, c.clone()),
            None => s.conditions.retain(|c| c.type_ != api::vmi_requests::PAUSED_CONDITION),
        }
        for (c, present) in extra {
            if *present {
                set_condition(&mut s.conditions, c.clone());
            } else {
                s.conditions.retain(|x| x.type_ != c.type_);
            }
        }
    })
    .await
    .map_err(api_err(&object, "write its status"))?;
    Ok(())
}
