//! One VM's reconcile, in order:
//! 1. self-heal: re-add the drive of a marked virtual-media volume that lost it;
//! 2. legacy `status.volumeRequests`: applied (legacy gate on) or reported;
//! 3. `dataVolumeTemplates` → DataVolumes;
//! 4. lifecycle: a start failure recorded ([`lifecycle::start_failure`]), else one
//!    [`lifecycle::Step`], and scheduling of a new VMI;
//! 5. a one-time boot override set while the VMI runs: marked on the VMI, consumed once the
//!    node agent reports the guest reset that used it;
//! 6. declarative hot-plug of the running VMI, its volumes' `Pending`/`Bound` status and (launcher
//!    pods) its attachment pod ([`crate::hotplug::attachment_pod`]);
//! 7. the VM's status, with the `SpecValid` and `VolumeRequestsPending` conditions.
//!
//! # Flow
//! Everything is read from the controller's stores ([`crate::cache`]); an object is read from
//! the API only right before a conditional write. A step that writes ends the pass: its write
//! wakes the next one (the controller watches VMs, VMIs, claims and DataVolumes), which sees it
//! in the stores. Every log line of the pass carries the VM (span `vm`). A VM waiting out a
//! crash-loop delay is requeued for the moment it ends (the one timed wake-up).

use std::sync::Arc;

use crate::runner::Action;
use kube::api::Api;
use kube::ResourceExt;
use tracing::Instrument;

use api::kubevirt::Condition;
use api::{VirtualMachine, VirtualMachineInstance};
use client::events::{self, EventType};

use crate::cache::Cache;
use crate::lifecycle::{self, condition};
use crate::{selfheal, volume_requests};

/// Conflict re-plans per hot-plug reconcile before backing off.
const ATTEMPTS: u32 = 5;
pub(crate) const COMPONENT: &str = "virtplug-controller";

/// What every VM reconcile shares.
pub(crate) struct Ctx {
    pub client: kube::Client,
    /// [`crate::run::Config::legacy_volume_requests`].
    pub legacy_volume_requests: bool,
    pub cache: Cache,
    /// [`crate::run::Config::placement`].
    pub placement: crate::lifecycle::Placement,
}

/// Errors of one VM reconcile.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error(transparent)]
    Lifecycle(#[from] lifecycle::LifecycleError),
    #[error(transparent)]
    Hotplug(#[from] crate::hotplug::ReconcileError),
    #[error("VM {object}: cannot {what}")]
    Api {
        object: String,
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The reconcile of this VM panicked (a bug meeting its data); the others go on.
    #[error(transparent)]
    Panicked(#[from] client::panics::Panicked),
}

fn api_err<'a, E: Into<Box<dyn std::error::Error + Send + Sync>>>(object: &'a str, what: &'static str) -> impl FnOnce(E) -> VmError + 'a {
    move |e| VmError::Api { object: object.to_owned(), what, source: e.into() }
}

/// The VM being reconciled and its APIs.
struct Pass<'a> {
    vm: &'a VirtualMachine,
    ctx: &'a Ctx,
    ns: String,
    name: String,
    /// `ns/name`, for errors (which travel beyond the span).
    object: String,
    vms: Api<VirtualMachine>,
}

/// Reconciles one VM (see the module docs), in a span naming it.
pub(crate) async fn reconcile_vm(vm: Arc<VirtualMachine>, ctx: Arc<Ctx>) -> Result<Action, VmError> {
    let (ns, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
    let span = tracing::info_span!("vm", vm = %format!("{ns}/{name}"));
    let pass = Pass { vms: Api::namespaced(ctx.client.clone(), &ns), object: format!("{ns}/{name}"), vm: &vm, ctx: &ctx, ns, name };
    let r = pass.run().instrument(span).await;
    crate::metrics::count("vm", r.is_ok());
    // While a crash-loop delay runs nothing else may wake the VM: kube-runtime is asked to.
    // (A margin, so the pass it wakes finds the delay over.)
    match lifecycle::start_failure::time_left(&vm, jiff::Timestamp::now()) {
        Some(left) => r.map(|_| Action::requeue(left + std::time::Duration::from_millis(50))),
        None => r,
    }
}

impl Pass<'_> {
    async fn run(&self) -> Result<Action, VmError> {
        if self.restore_drives().await? {
            return Ok(Action::await_change()); // the write wakes a fresh reconcile
        }
        let spec_cond = self.report_violations().await;
        let requests = self.vm.status.as_ref().map_or(0, |s| s.volume_requests.len());
        if requests > 0 && self.ctx.legacy_volume_requests {
            self.apply_requests().await?;
            return Ok(Action::await_change());
        }
        let client = &self.ctx.client;
        lifecycle::create_data_volumes(client, &self.ctx.cache, self.vm).await.map_err(api_err(&self.object, "create its DataVolumes"))?;
        let vmi = self.ctx.cache.vmi(&self.ns, &self.name);
        if self.record_start_failure(vmi.as_deref()).await? {
            return Ok(Action::await_change()); // the write wakes the next pass
        }
        let volumes = lifecycle::volumes(&self.ctx.cache, self.vm);
        let backing_off = lifecycle::start_failure::time_left(self.vm, jiff::Timestamp::now()).is_some();
        let can_start = volumes == lifecycle::Volumes::Ready && spec_cond.is_none() && !backing_off;
        let step = lifecycle::decide(self.vm, vmi.as_deref(), can_start);
        lifecycle::apply(client, &self.ctx.cache, self.vm, vmi.as_deref(), &step, &self.ctx.placement).await?;
        if step != lifecycle::Step::Nothing {
            return Ok(Action::await_change()); // the step's write wakes the next pass
        }
        if let Some(v) = vmi.as_deref().filter(|v| self.owns(v)) {
            if self.boot_once(v).await? {
                return Ok(Action::await_change()); // the write wakes the next pass
            }
            if self.hotplug(v).await? {
                return Ok(Action::await_change()); // the VMI's change wakes the next pass
            }
        }
        let extra = [
            (spec_cond.clone().unwrap_or_else(|| condition(selfheal::CONDITION, false, "InvariantViolated", "")), spec_cond.is_some()),
            (
                condition(
                    volume_requests::CONDITION,
                    true,
                    "DeclarativeHotplugEnabled",
                    &volume_requests::pending_message(&self.ns, &self.name, requests),
                ),
                requests > 0,
            ),
        ];
        lifecycle::write_status(client, self.vm, vmi.as_deref(), &volumes, &extra).await?;
        Ok(Action::await_change())
    }

    /// Writes `status.startFailure` when `vmi` changes it (a failure before it ran, or a run
    /// that clears the record), before anything deletes the VMI. Returns whether it wrote.
    async fn record_start_failure(&self, vmi: Option<&VirtualMachineInstance>) -> Result<bool, VmError> {
        use lifecycle::start_failure::next;
        let current = self.vm.status.as_ref().and_then(|s| s.start_failure.clone());
        let (now, random) = (jiff::Timestamp::now(), rand::random::<u64>());
        if next(self.vm, vmi, now, random) == current {
            return Ok(false);
        }
        let mut written = None;
        client::update_status(&self.vms, &self.name, |v: &mut VirtualMachine| {
            let f = next(v, vmi, now, random);
            written.clone_from(&f);
            v.status.get_or_insert_with(Default::default).start_failure = f;
        })
        .await
        .map_err(api_err(&self.object, "record its start failures"))?;
        match written {
            Some(f) => tracing::info!(
                failures = f.consecutive_fail_count,
                retry_after = f.retry_after_timestamp.as_deref().unwrap_or_default(),
                "its VMI failed before it ran: the next start waits (CrashLoopBackOff)"
            ),
            None => tracing::info!("its VMI ran: the start failures are cleared"),
        }
        Ok(true)
    }

    /// Whether the VM owns `vmi` (only such a VMI is hot-plugged).
    fn owns(&self, vmi: &VirtualMachineInstance) -> bool {
        vmi.owner_references().iter().any(|o| o.kind == "VirtualMachine" && Some(&o.uid) == self.vm.uid().as_ref())
    }

    /// Self-heal: a marked virtual-media volume that lost its drive gets it back. Returns
    /// whether it wrote.
    async fn restore_drives(&self) -> Result<bool, VmError> {
        let drives = selfheal::missing_drives(self.vm);
        if drives.is_empty() {
            return Ok(false);
        }
        client::update(&self.vms, &self.name, |v: &mut VirtualMachine| {
            let Some(spec) = v.spec.template.spec.as_mut() else { return };
            for d in &drives {
                if !spec.domain.devices.disks.iter().any(|x| x.name == d.name) && spec.volumes.iter().any(|x| x.name == d.name) {
                    spec.domain.devices.disks.push(d.clone());
                }
            }
        })
        .await
        .map_err(api_err(&self.object, "restore a virtual-media drive"))?;
        let names: Vec<&str> = drives.iter().map(|d| d.name.as_str()).collect();
        let msg = format!("re-added the CD-ROM drive of virtual-media volume(s) {} (their disk was missing)", names.join(", "));
        events::publish(&self.ctx.client, COMPONENT, self.vm, EventType::Normal, "VirtualMediaDriveRestored", &msg).await;
        Ok(true)
    }

    /// The `SpecValid` condition while the template breaks an invariant (with a Warning Event
    /// when the violations changed); `None` while it holds them all.
    async fn report_violations(&self) -> Option<Condition> {
        let violations = selfheal::violations(self.vm);
        if violations.is_empty() {
            return None;
        }
        let cond = condition(selfheal::CONDITION, false, "InvariantViolated", &selfheal::describe(&violations));
        let had = self
            .vm
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == selfheal::CONDITION))
            .and_then(|c| c.message.clone());
        if had != cond.message {
            let msg = cond.message.as_deref().unwrap_or_default();
            events::publish(&self.ctx.client, COMPONENT, self.vm, EventType::Warning, "InvariantViolated", msg).await;
        }
        Some(cond)
    }

    /// The legacy path: applies `status.volumeRequests` to the template, then clears them.
    async fn apply_requests(&self) -> Result<(), VmError> {
        let requests = self.vm.status.as_ref().map(|s| s.volume_requests.clone()).unwrap_or_default();
        let mut refused = Vec::new();
        client::update(&self.vms, &self.name, |v: &mut VirtualMachine| {
            refused.clear();
            let spec = v.spec.template.spec.get_or_insert_with(Default::default);
            for r in &requests {
                if let volume_requests::Outcome::Refused(m) = volume_requests::apply(spec, r) {
                    refused.push(m);
                }
            }
        })
        .await
        .map_err(api_err(&self.object, "apply its volume requests"))?;
        client::update_status(&self.vms, &self.name, |v: &mut VirtualMachine| {
            if let Some(s) = v.status.as_mut() {
                s.volume_requests.retain(|r| !requests.contains(r));
            }
        })
        .await
        .map_err(api_err(&self.object, "clear its volume requests"))?;
        for m in refused {
            events::publish(&self.ctx.client, COMPONENT, self.vm, EventType::Warning, "VolumeRequestRefused", &m).await;
        }
        Ok(())
    }

    /// A one-time boot override set while `vmi` runs ([`api::virtual_media`]): copied to the
    /// VMI (the node agent reports the guest reset that used it), and consumed on the VM once
    /// the VMI says it was used. Returns whether it wrote.
    async fn boot_once(&self, vmi: &VirtualMachineInstance) -> Result<bool, VmError> {
        use api::virtual_media::{boot_override, consume_once, BOOT_ONCE_USED, BOOT_OVERRIDE};
        let vm_value = self.vm.annotations().get(BOOT_OVERRIDE);
        let used = vmi.annotations().get(BOOT_ONCE_USED);
        if vm_value.is_some() && used == vm_value {
            let seen = vm_value.cloned();
            client::update(&self.vms, &self.name, |v: &mut VirtualMachine| {
                if v.annotations().get(BOOT_OVERRIDE) == seen.as_ref() {
                    let _ = consume_once(v);
                }
            })
            .await
            .map_err(api_err(&self.object, "restore its boot order after a one-time override"))?;
            tracing::info!("the running guest reset with the one-time boot override: the VM's boot order is restored");
            return Ok(true);
        }
        let created = vmi.metadata.creation_timestamp.as_ref().map_or(i64::MAX, |t| t.0.as_millisecond());
        let pending = boot_override(self.vm).is_some_and(|o| o.pending_for(created));
        let want = vm_value.filter(|_| pending);
        if vmi.annotations().get(BOOT_OVERRIDE) == want {
            return Ok(false);
        }
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        client::blind_patch(&vmis, &vmi.name_any(), client::MetaKey::Annotation, BOOT_OVERRIDE, want.map(String::as_str))
            .await
            .map_err(api_err(&self.object, "mark its VMI with the one-time boot override"))?;
        Ok(true)
    }

    /// Declarative hot-plug into the running VMI, then its volumes' `Pending`/`Bound` status.
    /// Returns whether the VMI's spec was patched (its status waits for the next pass).
    async fn hotplug(&self, vmi: &VirtualMachineInstance) -> Result<bool, VmError> {
        let Some(template) = self.vm.spec.template.spec.as_ref() else { return Ok(false) };
        let vmis: Api<VirtualMachineInstance> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let opts = client::PatchIfOptions { attempts: ATTEMPTS, ..client::PatchIfOptions::default() };
        if crate::hotplug::reconcile_vmi(&vmis, template, vmi, &opts).await? {
            return Ok(true);
        }
        crate::hotplug::report_claims_with(&self.ctx.client, vmi, &self.ctx.cache)
            .await
            .map_err(api_err(&self.object, "report its hot-plug volumes"))?;
        if let crate::lifecycle::Placement::Pods(cfg) = &self.ctx.placement {
            // Its writes (a pod, a status) wake the next pass through the pod and VMI watches.
            crate::hotplug::attachment_pod::reconcile(&self.ctx.client, &self.ctx.cache, cfg, vmi)
                .await
                .map_err(api_err(&self.object, "keep its attachment pod"))?;
        }
        Ok(false)
    }
}
