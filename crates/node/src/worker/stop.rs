//! Stopping a VMI's QEMU and removing what the VM leaves on the node: on deletion (ACPI power
//! off within the grace, then by force), for a VMI that is gone, and for `up
//! --stop-vms-on-exit`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::Api;
use kube::ResourceExt;
use tracing::Instrument;

use api::phases::VmiPhase;
use api::VirtualMachineInstance;

use super::live::{running_qemu, Live};
use super::phase::apply_phase;
use crate::config::Shared;
use crate::reasons::VmiReason;

/// VMI finalizer the agent removes once QEMU is gone.
pub const FINALIZER: &str = "kubevirt.io/foregroundDeleteVirtualMachine";

/// Stops a live QEMU: `system_powerdown` and up to `grace` for the guest, then `quit`, then
/// SIGKILL after [`qemu::process::QUIT_DEADLINE`] (a launcher pod's launcher stops its QEMU the
/// same way when the pod is deleted, [`qemu::launcher`]). `forced` cuts the grace short (the VMI's grace period was lowered to 0 during the
/// stop: `virtctl stop --force --grace-period 0`, Redfish `ForceOff` of a System powering off).
pub(super) async fn stop(live: Live, grace: Duration, forced: impl std::future::Future<Output = ()>) {
    let gone = tokio::select! {
        r = live.machine.powerdown(grace) => match r {
            Ok(true) => live.process.wait_gone(Duration::from_secs(5)).await,
            _ => false,
        },
        () = forced => {
            tracing::info!("the stop is forced: grace period now 0");
            false
        }
    };
    if !gone {
        live.machine.quit().await;
        if !live.process.wait_gone(qemu::process::QUIT_DEADLINE).await {
            live.process.kill().await;
        }
    }
}

/// Stops the QEMU of `run_dir` (a VMI that is gone, or `up --stop-vms-on-exit`) and removes
/// the dir: SIGTERM (QEMU quits cleanly), then SIGKILL after 5 s; by PID, checked to still be
/// that QEMU. No QMP: a live worker may hold the one QMP connection.
pub async fn stop_orphan(run_dir: &Path) {
    if let Some(p) = running_qemu(run_dir).await {
        if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if !p.wait_gone(Duration::from_secs(5)).await {
            p.kill().await;
        }
    }
    forget(run_dir).await;
}

/// `up --stop-vms-on-exit`: stops the QEMU of `run_dir` ([`stop_orphan`]) and records why on
/// its VMI — `Failed`, reason `NodeShutdown` — so the next `up` treats it like a VM whose node
/// went down (`Always` and `RerunOnFailure` start it again) instead of finding a `Running` VMI
/// without QEMU. Call it after the agent has stopped (no worker may report the exit as a crash)
/// and while the API still serves.
pub async fn stop_for_shutdown(client: &kube::Client, run_dir: &Path, record: &crate::checkpoint::VmiRecord) {
    let stopped = async {
        stop_orphan(run_dir).await;
        let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &record.namespace);
        let r = client::update_status(&api, &record.name, |v: &mut VirtualMachineInstance| {
            // A newer VMI of the same name is not the one stopped.
            if v.metadata.uid.as_deref() == Some(record.uid.as_str()) {
                apply_phase(v, VmiPhase::Failed, Some(VmiReason::NodeShutdown), "stopped with `virtplug up --stop-vms-on-exit`");
            }
        })
        .await;
        match r {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => tracing::warn!("cannot record that it was stopped: {e}"),
        }
    };
    stopped.instrument(crate::spans::vmi(&record.namespace, &record.name)).await;
}

/// Removes what a VM whose QEMU is gone leaves on the node: its devices cgroup (bind-mount
/// mode; its bind mounts went with QEMU's namespace) and its run dir. Off the async threads.
pub(super) async fn forget(run_dir: &Path) {
    let (run_dir, span): (PathBuf, _) = (run_dir.to_owned(), tracing::Span::current());
    let removed = tokio::task::spawn_blocking(move || {
        let _in = span.enter();
        if let Some(cgroup) = crate::checkpoint::read_record(&run_dir).and_then(|r| r.cgroup) {
            if let Err(e) = crate::bindmount::remove_cgroup(&cgroup) {
                tracing::warn!("{e}");
            }
        }
        let _ = std::fs::remove_dir_all(&run_dir);
    });
    let _ = removed.await;
}

/// Removes the agent's finalizer from the VMI, once its QEMU is gone.
pub(super) async fn remove_finalizer(shared: &Shared, vmi: &VirtualMachineInstance) {
    let api: Api<VirtualMachineInstance> = Api::namespaced(shared.client.clone(), &vmi.namespace().unwrap_or_default());
    let r = client::update(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| {
        if let Some(f) = v.metadata.finalizers.as_mut() {
            f.retain(|x| x != FINALIZER);
        }
    })
    .await;
    match r {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => tracing::warn!("cannot remove its finalizer: {e}"),
    }
}
