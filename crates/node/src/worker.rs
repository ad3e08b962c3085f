//! One VMI on this node: its QEMU and its phase. The worker is the only owner of the VMI's QMP
//! connection; it runs the hot-plug reconcile ([`crate::hotplug`]) after every wake-up.
//!
//! # Phases (KubeVirt's)
//! `Scheduled` → QEMU launched, QMP connected → `Running`. The guest powering off (QEMU's
//! `SHUTDOWN` with `guest: true`, then exit) → `Succeeded`; QEMU exiting otherwise → `Failed`
//! with the reason; a guest reboot raises a `GuestReboot` Event. On deletion the guest gets
//! `system_powerdown` and the VMI's `terminationGracePeriodSeconds` (default
//! [`Config::stop_grace`](crate::agent::Config)), then QEMU is stopped by force; the VMI's
//! finalizer is removed only once QEMU is gone.
//!
//! # Wake-ups
//! A new version of the VMI, QEMU's exit (pidfd), and — only while a volume waits — a
//! claim/DataVolume/mount-table change or the backoff timer. Nothing is polled.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::Api;
use kube::ResourceExt;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use api::kubevirt::{Condition, VirtualMachineInstanceStatus};
use api::VirtualMachineInstance;
use client::events::{self, EventType};
use qemu::ops::Machine;
use qemu::process::Process;
use qemu::qmp::Qmp;

use crate::agent::Shared;
use crate::hotplug::Volumes;

/// VMI finalizer the agent removes once QEMU is gone.
pub const FINALIZER: &str = "kubevirt.io/foregroundDeleteVirtualMachine";
const COMPONENT: &str = "virtplug-node";

/// A running QEMU and what the worker knows of it.
struct Live {
    process: Process,
    machine: Machine,
    /// Set by the event reader: the guest asked to power off.
    guest_shutdown: Arc<Mutex<bool>>,
    exited: tokio::task::JoinHandle<()>,
    events: tokio::task::JoinHandle<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.exited.abort();
        self.events.abort();
    }
}

fn phase(vmi: &VirtualMachineInstance) -> &str {
    vmi.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

/// Sets the VMI's phase, reason and `Ready` condition (KubeVirt's: `True` only when `Running`).
fn apply_phase(v: &mut VirtualMachineInstance, phase: &str, reason: Option<&str>, message: &str) {
    let s = v.status.get_or_insert_with(VirtualMachineInstanceStatus::default);
    s.phase = Some(phase.to_owned());
    s.reason = reason.map(str::to_owned);
    let ready = phase == "Running";
    let c = Condition {
        type_: "Ready".into(),
        status: if ready { "True" } else { "False" }.into(),
        reason: if ready { None } else { Some(reason.unwrap_or(phase).to_owned()) },
        message: Some(message.to_owned()),
        last_transition_time: Some(jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        ..Condition::default()
    };
    match s.conditions.iter_mut().find(|x| x.type_ == "Ready") {
        Some(x) if x.status == c.status => x.message = c.message.clone(),
        Some(x) => *x = c,
        None => s.conditions.push(c),
    }
}

async fn set_phase(shared: &Shared, vmi: &VirtualMachineInstance, phase: &str, reason: Option<&str>, message: &str) {
    let api: Api<VirtualMachineInstance> = Api::namespaced(shared.client.clone(), &vmi.namespace().unwrap_or_default());
    let r = client::update_status(&api, &vmi.name_any(), |v: &mut VirtualMachineInstance| apply_phase(v, phase, reason, message)).await;
    if let Err(e) = r {
        tracing::warn!("VMI {}/{}: cannot set phase {phase}: {e}", vmi.namespace().unwrap_or_default(), vmi.name_any());
    }
}

/// Waits until the process exits (readability of its pidfd).
fn watch_exit(pid: i32) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Some(pid) = rustix::process::Pid::from_raw(pid) else { return };
        let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK) else { return };
        // `new` is deprecated for fds the AsyncFd does not own (they could be closed while
        // registered); this one owns its OwnedFd, which closes only when it is dropped.
        #[allow(deprecated)]
        let Ok(afd) = AsyncFd::new(fd) else {
            return;
        };
        let _ = afd.readable().await;
    })
}

/// Reads QEMU's events: remembers a guest-initiated shutdown, reports reboots.
fn read_events(shared: Arc<Shared>, vmi: Arc<VirtualMachineInstance>, qmp: &Qmp, flag: Arc<Mutex<bool>>) -> tokio::task::JoinHandle<()> {
    let mut rx = qmp.events();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(e) if e.name == "SHUTDOWN" => {
                    if e.data.get("guest").and_then(serde_json::Value::as_bool) == Some(true) {
                        *flag.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
                    }
                }
                Ok(e) if e.name == "RESET" && e.data.get("guest").and_then(serde_json::Value::as_bool) == Some(true) => {
                    events::publish(&shared.client, COMPONENT, vmi.as_ref(), EventType::Normal, "GuestReboot", "the guest rebooted").await;
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

async fn connect(shared: &Arc<Shared>, vmi: &Arc<VirtualMachineInstance>, process: Process) -> Result<Live, String> {
    let qmp = Qmp::connect_within(&process.run_dir.join("qmp.sock"), Duration::from_secs(10))
        .await
        .map_err(|e| format!("cannot reach QEMU's QMP socket: {e}"))?;
    let flag = Arc::new(Mutex::new(false));
    let events = read_events(Arc::clone(shared), Arc::clone(vmi), &qmp, Arc::clone(&flag));
    Ok(Live { exited: watch_exit(process.pid), process, machine: Machine::new(qmp), guest_shutdown: flag, events })
}

/// The host paths of the volumes present from boot (not hot-pluggable).
async fn boot_sources(shared: &Shared, vmi: &VirtualMachineInstance, run_dir: &Path) -> Result<HashMap<String, PathBuf>, String> {
    let mut out = HashMap::new();
    let ns = vmi.namespace().unwrap_or_default();
    for v in vmi.spec.volumes.iter().filter(|v| !v.is_hotpluggable()) {
        if let Some(e) = &v.empty_disk {
            let mib = qemu::cmdline::quantity_mib(&e.capacity.0, "emptyDisk.capacity").map_err(|e| e.to_string())?;
            let path = run_dir.join(format!("empty-{}.img", v.name));
            crate::source::check_name("volume name", &v.name).map_err(|e| e.to_string())?;
            if !path.exists() {
                let f = crate::checkpoint::create_private_file(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                f.set_len(mib << 20).map_err(|e| format!("cannot size {}: {e}", path.display()))?;
            }
            out.insert(v.name.clone(), path);
            continue;
        }
        let claim =
            v.persistent_volume_claim.as_ref().map(|p| p.claim_name.clone()).or_else(|| v.data_volume.as_ref().map(|d| d.name.clone()));
        if let Some(claim) = claim {
            let path = crate::claims::claim_path(shared, &ns, &claim, v.data_volume.is_some()).await.map_err(|e| e.to_string())?;
            out.insert(v.name.clone(), path);
        }
    }
    Ok(out)
}

async fn launch(shared: &Arc<Shared>, vmi: &Arc<VirtualMachineInstance>, run_dir: &Path) -> Result<Live, String> {
    crate::checkpoint::create_private_dir(run_dir).map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
    // Before anything is created for the VMI: a guest beyond what this host can hold never starts.
    let host = crate::caps::Host::read(run_dir)?;
    crate::caps::check(&vmi.spec, shared.config.caps, &host)?;
    let uid = vmi.uid().unwrap_or_default();
    let bind = shared.config.mode == crate::bindmount::AttachMode::BindMount;
    let record = crate::checkpoint::VmiRecord {
        namespace: vmi.namespace().unwrap_or_default(),
        name: vmi.name_any(),
        cgroup: bind.then(|| shared.config.devices_cgroup.join(&uid)),
        uid,
    };
    crate::checkpoint::write_record(run_dir, &record).map_err(|e| e.to_string())?;
    let sources = boot_sources(shared, vmi, run_dir).await?;
    let name = format!("{}_{}", record.namespace, record.name);
    let mut spec =
        qemu::cmdline::from_vmi(&vmi.spec, &name, run_dir, shared.accel, &shared.config.boot_files, |v| sources.get(&v.name).cloned())
            .map_err(|e| e.to_string())?;
    spec.own_mount_namespace = bind;
    spec.sandbox = shared.config.qemu_sandbox;
    spec.run_as.clone_from(&shared.config.qemu_user);
    let process = qemu::process::launch(&spec).await.map_err(|e| client::error_chain(&e))?;
    if let Some(cgroup) = &record.cgroup {
        let join = crate::bindmount::Request::JoinCgroup { cgroup: cgroup.clone(), pid: process.pid };
        if let Err(e) = shared.host.apply(&join, None) {
            process.kill().await;
            return Err(format!("bind-mount mode: {e}"));
        }
    }
    if shared.config.vm_nice != 0 {
        if let Err(e) = process.renice(shared.config.vm_nice) {
            tracing::warn!("VMI {}/{}: cannot set QEMU's nice value: {e}", record.namespace, record.name);
        }
    }
    tracing::info!("VMI {}/{}: QEMU {} started", record.namespace, record.name, process.pid);
    connect(shared, vmi, process).await
}

/// Stops the QEMU of `run_dir` (a VMI that is gone, or `up --stop-vms-on-exit`) and removes
/// the dir: SIGTERM (QEMU quits cleanly), then SIGKILL after 5 s; by PID, checked to still be
/// that QEMU. No QMP: a live worker may hold the one QMP connection.
pub async fn stop_orphan(run_dir: &Path) {
    if let Ok(p) = qemu::process::adopt(run_dir) {
        if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if !p.wait_gone(Duration::from_secs(5)).await {
            p.kill().await;
        }
    }
    forget(run_dir);
}

/// `up --stop-vms-on-exit`: stops the QEMU of `run_dir` ([`stop_orphan`]) and records why on
/// its VMI — `Failed`, reason `NodeShutdown` — so the next `up` treats it like a VM whose node
/// went down (`Always` and `RerunOnFailure` start it again) instead of finding a `Running` VMI
/// without QEMU. Call it after the agent has stopped (no worker may report the exit as a crash)
/// and while the API still serves.
pub async fn stop_for_shutdown(client: &kube::Client, run_dir: &Path, record: &crate::checkpoint::VmiRecord) {
    stop_orphan(run_dir).await;
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &record.namespace);
    let r = client::update_status(&api, &record.name, |v: &mut VirtualMachineInstance| {
        // A newer VMI of the same name is not the one stopped.
        if v.metadata.uid.as_deref() == Some(record.uid.as_str()) {
            apply_phase(v, "Failed", Some("NodeShutdown"), "stopped with `virtplug up --stop-vms-on-exit`");
        }
    })
    .await;
    match r {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => tracing::warn!("VMI {}/{}: cannot record that it was stopped: {e}", record.namespace, record.name),
    }
}

/// Removes what a VM whose QEMU is gone leaves on the node: its devices cgroup (bind-mount
/// mode; its bind mounts went with QEMU's namespace) and its run dir.
fn forget(run_dir: &Path) {
    if let Some(cgroup) = crate::checkpoint::read_record(run_dir).and_then(|r| r.cgroup) {
        if let Err(e) = crate::bindmount::remove_cgroup(&cgroup) {
            tracing::warn!("{e}");
        }
    }
    let _ = std::fs::remove_dir_all(run_dir);
}

async fn stop(live: Live, grace: Duration) {
    let gone = match live.machine.powerdown(grace).await {
        Ok(true) => live.process.wait_gone(Duration::from_secs(5)).await,
        _ => false,
    };
    if !gone {
        live.machine.quit().await;
        if !live.process.wait_gone(Duration::from_secs(5)).await {
            live.process.kill().await;
        }
    }
}

async fn remove_finalizer(shared: &Shared, vmi: &VirtualMachineInstance) {
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
        Err(e) => tracing::warn!("VMI {}/{}: cannot remove its finalizer: {e}", vmi.namespace().unwrap_or_default(), vmi.name_any()),
    }
}

/// Runs the worker of VMI `uid` until the VMI is gone (QEMU stopped) or the agent stops (QEMU
/// left running).
pub async fn run(shared: Arc<Shared>, uid: String, mut rx: watch::Receiver<Option<Arc<VirtualMachineInstance>>>) {
    let run_dir = shared.config.state_dir.join("vmis").join(&uid);
    let mut live: Option<Live> = None;
    let mut volumes = Volumes::default();
    let mut last: Option<Arc<VirtualMachineInstance>>;
    // The generation of the spec the last hot-plug pass ran for, and whether the next pass must
    // run anyway (first pass, storage event, retry timer, QEMU adopted or started).
    let mut done_generation: Option<i64> = None;
    let mut force = true;
    let mut pending_retry: Option<Duration> = None;
    let mut storage = shared.storage_changed.subscribe();
    loop {
        let current = rx.borrow_and_update().clone();
        let Some(vmi) = current else {
            // The VMI object is gone entirely (its finalizer was removed elsewhere).
            if let Some(l) = live.take() {
                stop(l, Duration::from_secs(1)).await;
            }
            forget(&run_dir);
            return;
        };
        last = Some(Arc::clone(&vmi));
        if vmi.metadata.deletion_timestamp.is_some() {
            let grace = vmi
                .spec
                .extra
                .get("terminationGracePeriodSeconds")
                .and_then(serde_json::Value::as_u64)
                .map_or(shared.config.stop_grace, Duration::from_secs);
            if let Some(l) = live.take() {
                tracing::info!(
                    "VMI {}/{} is deleted: stopping its QEMU (grace {grace:?})",
                    vmi.namespace().unwrap_or_default(),
                    vmi.name_any()
                );
                stop(l, grace).await;
            } else if let Ok(p) = qemu::process::adopt(&run_dir) {
                p.kill().await;
            }
            forget(&run_dir);
            remove_finalizer(&shared, &vmi).await;
            return;
        }

        if live.is_none() {
            match qemu::process::adopt(&run_dir) {
                Ok(p) => match connect(&shared, &vmi, p).await {
                    Ok(l) => {
                        let object = format!("{}/{}", vmi.namespace().unwrap_or_default(), vmi.name_any());
                        tracing::info!("VMI {object}: adopted QEMU {}", l.process.pid);
                        // An agent killed between `add-fd` and `remove-fd` left an fd set that
                        // holds an image open and that nothing lists: it goes before the first pass
                        // (which also removes nodes left without their device, and re-attaches
                        // what is wanted).
                        match l.machine.remove_stale_fdsets().await {
                            Ok(sets) if !sets.is_empty() => tracing::info!("VMI {object}: removed stale fd sets {sets:?}"),
                            Ok(_) => {}
                            Err(e) => tracing::warn!("VMI {object}: cannot look for stale fd sets: {e}"),
                        }
                        live = Some(l);
                        force = true;
                    }
                    Err(e) => tracing::warn!("VMI {}/{}: {e}", vmi.namespace().unwrap_or_default(), vmi.name_any()),
                },
                Err(_) => match phase(&vmi) {
                    "Scheduled" => match launch(&shared, &vmi, &run_dir).await {
                        Ok(l) => {
                            live = Some(l);
                            force = true;
                        }
                        Err(e) => {
                            set_phase(&shared, &vmi, "Failed", Some("LaunchFailed"), &e).await;
                            events::publish(&shared.client, COMPONENT, vmi.as_ref(), EventType::Warning, "LaunchFailed", &e).await;
                        }
                    },
                    "Running" => {
                        set_phase(&shared, &vmi, "Failed", Some("QEMUGone"), "QEMU exited while the node agent was not running").await;
                    }
                    _ => {}
                },
            }
            if live.is_some() && phase(&vmi) != "Running" {
                set_phase(&shared, &vmi, "Running", None, "QEMU is running").await;
            }
        }

        // A new version of the VMI whose spec did not change (its status: most often this
        // agent's own volumeStatus writes) needs no pass: every pass costs QMP round trips,
        // which wait for QEMU's big lock behind a busy TCG vCPU. Storage events, the retry
        // timer, a spec change (generation) and adoption force one.
        let generation = vmi.metadata.generation;
        let needed = force || generation != done_generation;
        let retry = match &live {
            Some(l) if phase(&vmi) == "Running" && needed => {
                let bind = shared.bind_vm(&uid, l.process.pid, &run_dir);
                let r = crate::hotplug::reconcile(&shared, &vmi, &l.machine, bind.as_ref(), &mut volumes).await;
                done_generation = generation;
                force = false;
                r
            }
            Some(_) if phase(&vmi) == "Running" => pending_retry,
            _ => None,
        };
        pending_retry = retry;

        let exited = async {
            match live.as_mut() {
                Some(l) => {
                    let _ = (&mut l.exited).await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let timer = async {
            match retry {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return; // the agent stops: the VM keeps running for the next agent
                }
            }
            // Storage and mount changes matter only to a VMI with volumes waiting for them:
            // the others stay asleep (a pass costs QMP round trips).
            Ok(()) = storage.changed() => force = force || volumes.waits(),
            () = exited => {
                if let Some(l) = live.take() {
                    let by_guest = *l.guest_shutdown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(v) = &last {
                        if by_guest {
                            set_phase(&shared, v, "Succeeded", Some("GuestShutdown"), "the guest powered off").await;
                        } else {
                            let msg = "QEMU exited without a guest shutdown (crash or killed); see serial.log in the VMI's run dir";
                            set_phase(&shared, v, "Failed", Some("QEMUExited"), msg).await;
                            events::publish(&shared.client, COMPONENT, v.as_ref(), EventType::Warning, "VMICrashed", msg).await;
                        }
                    }
                    volumes = Volumes::default();
                }
            }
            () = timer => force = true,
        }
    }
}
