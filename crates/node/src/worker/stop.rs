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

/// Removes the agent's finalizer from the VMI, once its QEMU is gone; again until it is
/// written ([`client::persist`]): the worker ends after this, so nothing else would remove it,
/// and a lost write left the VMI terminating until the agent restarted. A newer VMI of the same
/// name keeps its finalizer (its own worker removes it).
pub(super) async fn remove_finalizer(client: &kube::Client, vmi: &VirtualMachineInstance) {
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    let (name, uid, opts) = (vmi.name_any(), vmi.uid(), client::UpdateOptions::default());
    let (api, name, uid, opts) = (&api, &name, &uid, &opts);
    let r = client::persist("remove its finalizer", || {
        client::try_update(api, name, opts, |v: &mut VirtualMachineInstance| {
            if v.uid() != *uid {
                return Err(Replaced);
            }
            if let Some(f) = v.metadata.finalizers.as_mut() {
                f.retain(|x| x != FINALIZER);
            }
            Ok(())
        })
    })
    .await;
    match r {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(client::UpdateError::Mutate { .. }) => tracing::debug!("a newer VMI of the same name: its finalizer stays"),
        Err(e) => tracing::warn!("cannot remove its finalizer: {e}"),
    }
}

/// The VMI a write was meant for was replaced by another of the same name.
#[derive(Debug, thiserror::Error)]
#[error("the VMI was replaced by another of the same name")]
struct Replaced;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use kube::api::PostParams;

    use super::*;

    fn vmi_with_finalizer() -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "default", "finalizers": [FINALIZER, "example.com/other"]},
            "spec": {"domain": {"devices": {}}}}))
        .unwrap()
    }

    /// The finalizer's removal is the worker's last write: refused by the API server (here three
    /// times, 503) it is sent again until stored, and only the agent's finalizer goes. A newer
    /// VMI of the same name keeps its own. Against the real API server, in process.
    #[tokio::test]
    async fn a_refused_finalizer_removal_is_written_again_and_spares_a_newer_vmi() {
        let refusals = apiserver::testing::Refusals::first(3, |m, path, _| *m == "PATCH" && path.ends_with("/virtualmachineinstances/v"));
        let (_dir, _server, client) = crate::worker::test_api(Some(Arc::clone(&refusals))).await;
        let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), "default");
        let vmi = api.create(&PostParams::default(), &vmi_with_finalizer()).await.unwrap();

        tokio::time::timeout(Duration::from_secs(30), remove_finalizer(&client, &vmi))
            .await
            .unwrap_or_else(|_| panic!("timed out after 30 s removing the finalizer; writes {:?}", refusals.seen()));
        let now = api.get("v").await.unwrap();
        assert_eq!(now.metadata.finalizers, Some(vec!["example.com/other".to_owned()]), "only the agent's finalizer went");
        let patches: Vec<_> = refusals.seen().into_iter().filter(|w| w.path.ends_with("/v")).collect();
        assert_eq!((patches.len(), patches.iter().filter(|w| w.refused).count()), (4, 3), "3 refused, the 4th stored: {patches:?}");

        // Another VMI of the same name: the old worker's removal leaves its finalizers.
        api.delete("v", &kube::api::DeleteParams::default()).await.unwrap();
        let mut last = api.get("v").await.unwrap();
        last.metadata.finalizers = None;
        api.replace("v", &PostParams::default(), &last).await.unwrap();
        let newer = api.create(&PostParams::default(), &vmi_with_finalizer()).await.unwrap();
        assert_ne!(newer.uid(), vmi.uid());
        remove_finalizer(&client, &vmi).await;
        let kept = api.get("v").await.unwrap();
        assert_eq!(kept.metadata.finalizers, newer.metadata.finalizers, "the newer VMI's finalizers stay");
        assert_eq!(kept.metadata.resource_version, newer.metadata.resource_version, "nothing was written");
    }
}
