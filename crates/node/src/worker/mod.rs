//! One VMI on this node: its QEMU and its phase. The worker is the only owner of the VMI's QMP
//! connection; it runs the hot-plug pass ([`crate::hotplug`]) after every wake-up that needs one.
//!
//! - [`live`]: the running QEMU (launch, adoption after an agent restart, exit and events);
//! - [`phase`]: the VMI's phase, reason and `Ready` condition;
//! - [`stop`]: stopping QEMU and removing what the VM leaves;
//! - [`oneshot`]: an NMI (Redfish `ResetType: Nmi`) or a soft reboot (the `softreboot`
//!   subresource) asked for through the VMI;
//! - [`pause`]: the vCPUs stopped or running as the VMI asks (`pause`/`unpause`);
//! - [`bootorder`]: the running guest's boot order follows the VMI's (for its next reset);
//! - [`net`]: the VMI's interfaces and forwarded ports, reported after a start or adoption.
//!
//! # Phases (KubeVirt's)
//! `Scheduled` → QEMU launched, QMP connected → `Running`. The guest powering off (QEMU's
//! `SHUTDOWN` with `guest: true`, then exit) → `Succeeded`; QEMU exiting otherwise → `Failed`
//! with the reason; a guest reboot raises a `GuestReboot` Event. On deletion the guest gets
//! `system_powerdown` and the VMI's `terminationGracePeriodSeconds` (default
//! [`Config::stop_grace`](crate::config::Config)), then QEMU is stopped by force; the VMI's
//! finalizer is removed only once QEMU is gone.
//!
//! # Wake-ups
//! A new version of the VMI, QEMU's exit (pidfd), and — only while a volume waits — a
//! claim/DataVolume/mount-table change or the backoff timer; while the VMI waits for its
//! cloud-init Secret, a change of that Secret ([`crate::cloudinit::wait`]). Nothing is polled.
//!
//! Every log line of a worker is in its VMI's span ([`crate::spans::vmi`]).

mod bootorder;
mod live;
mod net;
mod oneshot;
mod pause;
mod phase;
mod stop;

/// The real API server, in process, for the worker's tests of its writes: its data dir, the
/// server, and a client whose writes pass `refusals` (`None`: every write goes through).
#[cfg(test)]
async fn test_api(refusals: Option<std::sync::Arc<apiserver::testing::Refusals>>) -> (tempfile::TempDir, apiserver::Server, kube::Client) {
    #![allow(clippy::unwrap_used)]
    let dir = tempfile::tempdir().unwrap();
    let (server, router) = apiserver::testing::open(dir.path(), refusals).await;
    (dir, server, client::in_process(router))
}

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use api::phases::VmiPhase;
use api::VirtualMachineInstance;

use crate::cloudinit::wait::{Awaited, SecretWait};
use crate::config::Shared;
use crate::hotplug::Volumes;
use crate::reasons::{EventReason, VmiReason};
use live::Live;
use phase::set_phase;

pub use stop::{stop_for_shutdown, stop_orphan, FINALIZER};

type Versions = watch::Receiver<Option<Arc<VirtualMachineInstance>>>;

/// Runs the worker of VMI `uid` until the VMI is gone (QEMU stopped) or the agent stops (QEMU
/// left running). `rx` hands it every new version of the VMI (`None`: the object is gone).
pub async fn run(shared: Arc<Shared>, uid: String, mut rx: Versions) {
    let run_dir = shared.config.state_dir.join("vmis").join(&uid);
    let mut storage = shared.storage_changed.subscribe();
    let mut w = Worker {
        shared,
        uid,
        run_dir,
        live: None,
        volumes: Volumes::default(),
        last: None,
        done_generation: None,
        force: true,
        pending_retry: None,
        nmi_done: None,
        reboot_done: None,
        vcpus_paused: None,
        boot_order: None,
        paused_for_media: false,
        once_armed: None,
        launcher_wait: None,
        cloud_init_wait: None,
        ended: false,
    };
    loop {
        let current = rx.borrow_and_update().clone();
        let Some(vmi) = current else {
            // The VMI object is gone entirely (its finalizer was removed elsewhere).
            w.gone().await;
            return;
        };
        w.last = Some(Arc::clone(&vmi));
        if vmi.metadata.deletion_timestamp.is_some() {
            w.delete(&vmi, &mut rx).await;
            return;
        }
        if w.live.is_none() && !w.ended {
            w.start(&vmi).await;
        }
        if let Some(l) = w.live.as_ref().filter(|_| vmi.is_running()) {
            oneshot::act(&w.shared.client, &oneshot::NMI, &vmi, &l.machine, &mut w.nmi_done).await;
            oneshot::act(&w.shared.client, &oneshot::SOFT_REBOOT, &vmi, &l.machine, &mut w.reboot_done).await;
            bootorder::follow(&vmi, &l.machine, &mut w.boot_order).await;
            w.once_armed = bootorder::armed(&vmi, w.boot_order.as_ref());
        }
        let mut retry = w.pass(&vmi).await;
        if let Some(l) = w.live.as_ref().filter(|_| vmi.is_running()) {
            // After the pass: a guest started paused for its media stays so when asked.
            pause::follow(&w.shared, &vmi, &l.machine, &mut w.vcpus_paused).await;
        }
        if w.live.is_none() {
            retry = retry.or(w.launcher_wait);
        }
        if !w.wait(retry, &mut rx, &mut storage).await {
            return; // the agent stops: the VM keeps running for the next agent
        }
    }
}

/// What woke the worker.
enum Wake {
    /// A new version of the VMI (or it is gone).
    Changed,
    /// The agent stops.
    AgentStopped,
    /// A claim, DataVolume or the mount table changed.
    Storage,
    /// QEMU exited.
    Exited,
    /// The guest reset.
    Reset,
    /// The retry timer fired.
    Timer,
    /// The Secret the VMI's cloud-init data waits for changed.
    Secret,
}

/// One VMI's worker state.
struct Worker {
    shared: Arc<Shared>,
    uid: String,
    run_dir: PathBuf,
    live: Option<Live>,
    volumes: Volumes,
    /// The last version of the VMI seen (for the exit's phase).
    last: Option<Arc<VirtualMachineInstance>>,
    /// The generation of the spec the last hot-plug pass ran for.
    done_generation: Option<i64>,
    /// The next pass must run anyway (first pass, storage event, retry timer, QEMU adopted or
    /// started).
    force: bool,
    pending_retry: Option<Duration>,
    /// The last NMI id injected ([`oneshot::NMI`]).
    nmi_done: Option<String>,
    /// The last soft reboot id carried out ([`oneshot::SOFT_REBOOT`]).
    reboot_done: Option<String>,
    /// Whether QEMU's vCPUs stand still ([`pause`]; `None`: unknown, after an adoption).
    vcpus_paused: Option<bool>,
    /// The boot order QEMU has ([`bootorder`]; `None`: unknown, after an adoption).
    boot_order: Option<bootorder::Order>,
    /// QEMU was started paused so that the first pass puts CD-ROM media in their drives
    /// before the firmware runs ([`live::media_at_boot`]); the pass resumes it.
    paused_for_media: bool,
    /// The VMI's one-time boot override ([`api::virtual_media::BOOT_OVERRIDE`], copied there by
    /// the controller) whose boot order QEMU has: the guest's next reset uses it, and the
    /// worker reports that ([`bootorder::report_used`]).
    once_armed: Option<String>,
    /// With launcher pods: the VMI's launcher does not listen yet (its pod is starting); the
    /// next look is after this (doubling up to [`LAUNCHER_WAIT_MAX`]; a new version of the VMI
    /// wakes the worker earlier).
    launcher_wait: Option<Duration>,
    /// The VMI's cloud-init Secret (or its key) is missing: the watch of that Secret
    /// ([`Worker::wait_for_cloud_init`]).
    cloud_init_wait: Option<CloudInitWait>,
    /// This VMI's QEMU ran and exited, or could not be started: nothing starts it again, whatever
    /// an older copy of the VMI says (the copy the worker holds right after QEMU's exit predates
    /// the exit's phase: it said `Running`, and read as "QEMU died while no agent ran" it turned
    /// a guest power-off into a failure; one saying `Scheduled` would launch QEMU again). As in
    /// KubeVirt, running again takes a new VMI.
    ended: bool,
}

/// A VMI waiting for the Secret of its cloud-init data.
struct CloudInitWait {
    watch: SecretWait,
    /// What the VMI's status and Event say it waits for.
    message: String,
    /// The VMI's generation at the failed read: a spec change is read again at once.
    generation: Option<i64>,
    /// The Secret changed since the failed read.
    changed: bool,
}

impl CloudInitWait {
    /// Whether reading the data again could succeed for this version of the VMI: the Secret or
    /// the VMI's spec changed since the failed read. Other new versions of the VMI (status
    /// writes, the agent's own among them) cost no read of the Secret.
    fn worth_reading(&self, vmi: &VirtualMachineInstance) -> bool {
        self.changed || self.generation != vmi.metadata.generation
    }
}

/// The longest wait between two looks for a launcher's socket.
const LAUNCHER_WAIT_MAX: Duration = Duration::from_secs(2);

/// `spec.terminationGracePeriodSeconds` of `vmi`.
fn grace_of(vmi: &VirtualMachineInstance) -> Option<u64> {
    vmi.spec.extra.get("terminationGracePeriodSeconds").and_then(serde_json::Value::as_u64)
}

impl Worker {
    /// The VMI object is gone: its QEMU is stopped and its run dir removed.
    async fn gone(&mut self) {
        if let Some(l) = self.live.take() {
            stop::stop(l, Duration::from_secs(1), std::future::pending()).await;
        }
        stop::forget(&self.run_dir).await;
    }

    /// The VMI is deleted: QEMU gets its grace to stop (cut short when a newer version of the
    /// VMI lowers it to 0, or the object goes), then the run dir and the finalizer go.
    async fn delete(&mut self, vmi: &VirtualMachineInstance, rx: &mut Versions) {
        let grace = grace_of(vmi).map_or(self.shared.config.stop_grace, Duration::from_secs);
        let forced = async {
            loop {
                if rx.changed().await.is_err() {
                    // The agent stops: the stop runs its course.
                    std::future::pending::<()>().await;
                }
                match rx.borrow_and_update().as_deref() {
                    None => return,
                    Some(v) if grace_of(v) == Some(0) => return,
                    Some(_) => {}
                }
            }
        };
        if let Some(l) = self.live.take() {
            tracing::info!("the VMI is deleted: stopping its QEMU (grace {grace:?})");
            stop::stop(l, grace, forced).await;
        } else if let Some(p) = live::running_qemu(&self.run_dir).await {
            p.kill().await;
        }
        stop::forget(&self.run_dir).await;
        stop::remove_finalizer(&self.shared.client, vmi).await;
    }

    /// Takes over the VMI's running QEMU, or launches it for a `Scheduled` VMI; a `Running` VMI
    /// without QEMU failed while no agent ran. `Running` once QEMU runs.
    async fn start(&mut self, vmi: &Arc<VirtualMachineInstance>) {
        match live::adopt(&self.shared, vmi, &self.run_dir).await {
            Some(Ok(l)) => {
                // An agent stopped between the paused start and the first pass: this one resumes.
                self.paused_for_media = live::prelaunch(&l.machine).await;
                self.live = Some(l);
                self.boot_order = None;
                self.vcpus_paused = None;
            }
            Some(Err(e)) => tracing::warn!("{e}"),
            None => match vmi.phase() {
                Some(VmiPhase::Scheduled) if !live::starter_ready(&self.shared, &self.run_dir).await => {
                    let next = self.launcher_wait.map_or(Duration::from_millis(50), |d| (d * 2).min(LAUNCHER_WAIT_MAX));
                    if self.launcher_wait.is_none() {
                        tracing::info!("waiting for the launcher pod's socket in {}", self.run_dir.display());
                    }
                    self.launcher_wait = Some(next);
                }
                Some(VmiPhase::Scheduled) if self.cloud_init_wait.as_ref().is_some_and(|w| !w.worth_reading(vmi)) => {}
                Some(VmiPhase::Scheduled) => {
                    let launched = match crate::cloudinit::resolve(&self.shared.client, vmi).await {
                        Ok(seed) => {
                            self.cloud_init_wait = None;
                            live::launch(&self.shared, vmi, &self.run_dir, seed).await
                        }
                        Err(e) => match e.waits_for() {
                            Some(awaited) => {
                                self.wait_for_cloud_init(vmi, &e.to_string(), awaited).await;
                                return;
                            }
                            None => {
                                self.cloud_init_wait = None;
                                Err(client::error_chain(&e))
                            }
                        },
                    };
                    match launched {
                        Ok(l) => {
                            self.live = Some(l);
                            self.boot_order = Some(bootorder::wanted(vmi));
                            self.paused_for_media = live::media_at_boot(vmi);
                            self.vcpus_paused = Some(self.paused_for_media);
                        }
                        Err(e) => {
                            self.ended = true;
                            set_phase(&self.shared.client, vmi, VmiPhase::Failed, Some(VmiReason::LaunchFailed), &e).await;
                            crate::reasons::publish(&self.shared.client, vmi.as_ref(), EventReason::LaunchFailed, &e).await;
                        }
                    }
                }
                Some(VmiPhase::Running) => {
                    self.ended = true;
                    let msg = "QEMU exited while the node agent was not running";
                    set_phase(&self.shared.client, vmi, VmiPhase::Failed, Some(VmiReason::QemuGone), msg).await;
                }
                _ => {}
            },
        }
        if let Some(l) = &self.live {
            net::report(&self.shared, vmi, &l.machine).await;
            self.launcher_wait = None;
            self.force = true;
            if !vmi.is_running() {
                set_phase(&self.shared.client, vmi, VmiPhase::Running, None, "QEMU is running").await;
            }
        }
    }

    /// The VMI's cloud-init Secret (or its key) is missing: the VMI stays `Scheduled` with
    /// `message` in its `Ready` condition (reason `CloudInitSecretMissing`) and a Warning Event,
    /// both once per message; the worker watches that Secret ([`SecretWait`]) and reads the
    /// data again when it changes, or when the VMI's spec does. No timer.
    async fn wait_for_cloud_init(&mut self, vmi: &Arc<VirtualMachineInstance>, message: &str, awaited: Awaited) {
        let generation = vmi.metadata.generation;
        let wait = match self.cloud_init_wait.take() {
            Some(mut w) if w.watch.watches(&awaited) => {
                w.watch.saw(awaited);
                CloudInitWait { generation, changed: false, ..w }
            }
            _ => {
                let watch = SecretWait::start(&self.shared.client, awaited);
                CloudInitWait { watch, message: String::new(), generation, changed: false }
            }
        };
        if wait.message != message {
            tracing::info!("waiting for cloud-init data (watching the Secret): {message}");
            let reason = Some(VmiReason::CloudInitSecretMissing);
            set_phase(&self.shared.client, vmi, VmiPhase::Scheduled, reason, message).await;
            crate::reasons::publish(&self.shared.client, vmi.as_ref(), EventReason::CloudInitSecretMissing, message).await;
        }
        self.cloud_init_wait = Some(CloudInitWait { message: message.to_owned(), ..wait });
    }

    /// The hot-plug pass, when one is needed. A new version of the VMI whose spec did not change
    /// (its status: most often this agent's own volumeStatus writes) needs none: every pass costs
    /// QMP round trips, which wait for QEMU's big lock behind a busy TCG vCPU. Storage events,
    /// the retry timer, a spec change (generation) and adoption force one. Returns when to
    /// retry.
    async fn pass(&mut self, vmi: &VirtualMachineInstance) -> Option<Duration> {
        let running = vmi.is_running();
        let needed = self.force || vmi.metadata.generation != self.done_generation;
        let retry = match &mut self.live {
            Some(l) if running && needed => {
                let bind = self.shared.bind_vm(&self.uid, l.process.pid, &self.run_dir);
                let r = crate::hotplug::reconcile(&self.shared, vmi, &l.machine, &mut l.known, bind.as_ref(), &mut self.volumes).await;
                self.done_generation = vmi.metadata.generation;
                self.force = false;
                if self.paused_for_media && !pause::wanted(vmi) {
                    // The media that could be plugged are in; one still waiting is plugged later
                    // like any hot-plug (the controller starts a VM only once its virtual media
                    // are imported), the guest is not held for it.
                    match l.machine.resume().await {
                        Ok(()) => {
                            tracing::info!("media in their drives: the guest runs");
                            self.vcpus_paused = Some(false);
                        }
                        Err(e) => tracing::warn!("cannot resume QEMU after plugging the media: {e}"),
                    }
                }
                // A guest asked to be paused stays so; `cont` at its unpause starts it.
                self.paused_for_media = false;
                r
            }
            Some(_) if running => self.pending_retry,
            _ => None,
        };
        self.pending_retry = retry;
        retry
    }

    /// Sleeps until the next wake-up; `false` when the agent stops.
    async fn wait(&mut self, retry: Option<Duration>, rx: &mut Versions, storage: &mut watch::Receiver<u64>) -> bool {
        // A clone sees what the original saw; it is put back after the wait (what it saw then).
        let mut resets = self.live.as_ref().map(|l| l.resets.clone());
        let (live, cloud_init) = (&mut self.live, &mut self.cloud_init_wait);
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
        let secret = async {
            match cloud_init.as_mut() {
                Some(w) => w.watch.changed().await,
                None => std::future::pending::<()>().await,
            }
        };
        let reset = async {
            match resets.as_mut() {
                Some(r) => {
                    if r.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        let wake = tokio::select! {
            changed = rx.changed() => if changed.is_ok() { Wake::Changed } else { Wake::AgentStopped },
            Ok(()) = storage.changed() => Wake::Storage,
            () = exited => Wake::Exited,
            () = timer => Wake::Timer,
            () = reset => Wake::Reset,
            () = secret => Wake::Secret,
        };
        if let (Some(l), Some(r)) = (self.live.as_mut(), resets) {
            l.resets = r;
        }
        match wake {
            Wake::Changed => {}
            Wake::AgentStopped => return false,
            // Storage and mount changes matter only to a VMI with volumes waiting for them: the
            // others stay asleep (a pass costs QMP round trips).
            Wake::Storage => self.force = self.force || self.volumes.waits(),
            Wake::Exited => self.exited().await,
            Wake::Reset => {
                if let (Some(used), Some(vmi)) = (self.once_armed.take(), self.last.clone()) {
                    bootorder::report_used(&self.shared.client, &vmi, &used).await;
                }
            }
            Wake::Timer => self.force = true,
            Wake::Secret => {
                if let Some(w) = self.cloud_init_wait.as_mut() {
                    w.changed = true;
                }
            }
        }
        true
    }

    /// QEMU exited: `Succeeded` after a guest power-off, else `Failed` with a `VMICrashed` Event.
    async fn exited(&mut self) {
        let Some(l) = self.live.take() else { return };
        self.ended = true;
        let by_guest = *l.guest_shutdown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(v) = &self.last {
            net::forget(&self.shared, v).await;
            if by_guest {
                set_phase(&self.shared.client, v, VmiPhase::Succeeded, Some(VmiReason::GuestShutdown), "the guest powered off").await;
            } else {
                let msg = "QEMU exited without a guest shutdown (crash or killed); see serial.log in the VMI's run dir";
                set_phase(&self.shared.client, v, VmiPhase::Failed, Some(VmiReason::QemuExited), msg).await;
                crate::reasons::publish(&self.shared.client, v.as_ref(), EventReason::VmiCrashed, msg).await;
            }
        }
        self.volumes = Volumes::default();
    }
}
