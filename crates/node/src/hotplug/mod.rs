//! A running VMI's hot-plug volumes against what QEMU reports, and their `volumeStatus`: a pure
//! plan and an executor.
//!
//! # One pass
//! 1. Ask QEMU what it holds, once: its [`qemu::Inventory`] (devices, this agent's block nodes)
//!    and its CD-ROM drives — or take what the last pass left, while that is known exactly
//!    ([`Known`]).
//! 2. [`plan::plan`] turns what the spec wants, what QEMU holds and what `volumeStatus` says into
//!    [`plan::Step`]s — pure, and unit-tested rule by rule.
//! 3. The executor (`execute`, `attach`) runs them against QEMU; what they change in
//!    `volumeStatus` are values ([`status::Change`]) it writes in one batch per step of the pass;
//!    what a failure reports (the phase reached, `HotplugFailed` past the deadline) is decided
//!    by `waiting`. Its effects outside QEMU go through `effects::Effects`.
//!
//! The truth is QEMU: after an agent restart the same pass attaches what is missing, adopts what
//! is there and detaches what is extra.
//!
//! # Waiting
//! A volume whose claim is not ready keeps its phase with the reason in `message` and is
//! retried on the next wake-up (claim/DataVolume watch, mount-table change) or after the
//! backoff; past the deadline its reason is `HotplugFailed` with a `HotplugFailed` Event, and
//! retries continue at the cap.

mod attach;
mod effects;
mod execute;
mod known;
pub mod plan;
pub mod status;
mod waiting;

use std::time::Duration;

use api::VirtualMachineInstance;
use qemu::Machine;

pub use known::Known;
pub use waiting::Volumes;

use crate::bindmount::Vm;
use crate::config::Shared;

/// Reconciles the VMI's hot-plug volumes with QEMU. Returns when to retry if something waits.
pub async fn reconcile(
    shared: &Shared,
    vmi: &VirtualMachineInstance,
    machine: &Machine,
    known: &mut Known,
    bind: Option<&Vm>,
    volumes: &mut Volumes,
) -> Option<Duration> {
    let snapshot = match known.current(machine).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot ask QEMU what is attached: {e}");
            return Some(shared.config.backoff.cap);
        }
    };
    let steps = plan::plan(&plan::wanted(&vmi.spec), &snapshot.inventory, &snapshot.drives, vmi.status.as_ref());
    let effects = effects::ApiEffects { shared, vmi };
    let mut pass = execute::Pass::new(machine, &snapshot.inventory, &effects, volumes, shared.config.backoff);
    pass.bind = bind;
    pass.status = vmi.status.as_ref();
    let ran = pass.run(steps.clone()).await;
    known.after(snapshot, &steps, &ran.held);
    ran.retry
}

#[cfg(test)]
mod execute_tests;
