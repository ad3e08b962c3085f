//! A VMI's running QEMU, as its worker holds it ([`Live`]): launched, or adopted after an agent
//! restart; its QMP connection, its exit (pidfd) and its events.
//!
//! Launch prepares the run dir, checks the caps and writes the VMI's record before QEMU starts;
//! adoption removes the fd sets an interrupted attach left (a takeover's leftovers, before the
//! first pass). File and cgroup work runs off the async threads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::ResourceExt;
use tokio::io::unix::AsyncFd;
use tracing::Instrument;

use api::VirtualMachineInstance;
use qemu::process::Process;
use qemu::qmp::Qmp;
use qemu::Machine;

use crate::claims::Claim;
use crate::config::Shared;
use crate::reasons::EventReason;

/// A running QEMU and what the worker knows of it.
pub(super) struct Live {
    pub process: Process,
    pub machine: Machine,
    /// Set by the event reader: the guest asked to power off.
    pub guest_shutdown: Arc<Mutex<bool>>,
    /// Ticks at every reset of the guest (QEMU's `RESET`, the guest's or the host's).
    pub resets: tokio::sync::watch::Receiver<u64>,
    pub exited: tokio::task::JoinHandle<()>,
    events: tokio::task::JoinHandle<()>,
    /// What the last hot-plug pass left in this QEMU, while it is known.
    pub known: crate::hotplug::Known,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.exited.abort();
        self.events.abort();
    }
}

/// Runs `f` on the blocking pool; a panic there becomes an error message.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| e.to_string())?
}

/// The QEMU of `run_dir`, if it runs ([`qemu::process::adopt`]: the pidfile and `/proc`, off the
/// async threads).
pub(super) async fn running_qemu(run_dir: &Path) -> Option<Process> {
    let run_dir = run_dir.to_owned();
    tokio::task::spawn_blocking(move || qemu::process::adopt(&run_dir).ok()).await.ok().flatten()
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

/// Reads QEMU's events: remembers a guest-initiated shutdown, counts resets, reports reboots.
fn read_events(
    shared: Arc<Shared>,
    vmi: Arc<VirtualMachineInstance>,
    machine: &Machine,
    flag: Arc<Mutex<bool>>,
    resets: tokio::sync::watch::Sender<u64>,
) -> tokio::task::JoinHandle<()> {
    let mut rx = machine.events();
    let by_guest = |e: &qemu::qmp::Event| e.data.get("guest").and_then(serde_json::Value::as_bool) == Some(true);
    let read = async move {
        loop {
            match rx.recv().await {
                Ok(e) if e.name == "SHUTDOWN" && by_guest(&e) => *flag.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true,
                Ok(e) if e.name == "RESET" => {
                    resets.send_modify(|n| *n = n.wrapping_add(1));
                    if by_guest(&e) {
                        crate::reasons::publish(&shared.client, vmi.as_ref(), EventReason::GuestReboot, "the guest rebooted").await;
                    }
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    };
    tokio::spawn(read.in_current_span())
}

/// Connects to the QEMU of `process` and follows its exit and events.
async fn connect(shared: &Arc<Shared>, vmi: &Arc<VirtualMachineInstance>, process: Process) -> Result<Live, String> {
    let qmp = Qmp::connect_within(&process.run_dir.join("qmp.sock"), Duration::from_secs(10))
        .await
        .map_err(|e| format!("cannot reach QEMU's QMP socket: {e}"))?;
    let machine = Machine::new(qmp);
    let flag = Arc::new(Mutex::new(false));
    let (resets_tx, resets) = tokio::sync::watch::channel(0u64);
    let events = read_events(Arc::clone(shared), Arc::clone(vmi), &machine, Arc::clone(&flag), resets_tx);
    let known = Default::default();
    Ok(Live { exited: watch_exit(process.pid), process, machine, guest_shutdown: flag, resets, events, known })
}

/// Takes over the QEMU of `run_dir` left by an earlier agent, if one runs: `None` when none does.
pub(super) async fn adopt(shared: &Arc<Shared>, vmi: &Arc<VirtualMachineInstance>, run_dir: &Path) -> Option<Result<Live, String>> {
    let process = running_qemu(run_dir).await?;
    let live = match connect(shared, vmi, process).await {
        Ok(l) => l,
        Err(e) => return Some(Err(e)),
    };
    tracing::info!("adopted QEMU {}", live.process.pid);
    // An agent killed between `add-fd` and `remove-fd` left an fd set that holds an image open
    // and that nothing lists: it goes before the first pass (which also removes nodes left
    // without their device, and re-attaches what is wanted).
    match live.machine.remove_stale_fdsets().await {
        Ok(sets) if !sets.is_empty() => tracing::info!("removed stale fd sets {sets:?}"),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot look for stale fd sets: {e}"),
    }
    Some(Ok(live))
}

/// Creates `run_dir`/`empty-NAME.img` of `mib` MiB unless it exists (sparse, 0600).
fn empty_disk(path: &Path, mib: u64) -> Result<(), String> {
    if !path.exists() {
        let f = crate::checkpoint::create_private_file(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        f.set_len(mib << 20).map_err(|e| format!("cannot size {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Where a volume present from boot is, before QEMU starts.
enum BootSource {
    /// A host path QEMU opens: empty disks and the cloud-init seed (in the run dir, which a
    /// launcher pod has at the same path), claims when the agent starts QEMU itself.
    Path(PathBuf),
    /// With launcher pods, a claim: mounted only in the launcher pod, opened there by the agent
    /// and inherited by QEMU as an fd ([`launcher_starter`]).
    InPod(Claim),
}

/// The volumes present from boot (not hot-pluggable): claims, empty disks, and the cloud-init
/// seed image, written here from `seed`.
async fn boot_sources(
    shared: &Shared,
    vmi: &VirtualMachineInstance,
    run_dir: &Path,
    seed: Option<crate::cloudinit::Seed>,
) -> Result<HashMap<String, BootSource>, String> {
    let mut out = HashMap::new();
    if let Some(seed) = seed {
        let (volume, dir) = (seed.volume.clone(), run_dir.to_owned());
        let path = blocking(move || crate::cloudinit::write(&seed, &dir).map_err(|e| client::error_chain(&e))).await?;
        out.insert(volume, BootSource::Path(path));
    }
    let ns = vmi.namespace().unwrap_or_default();
    for v in vmi.spec.volumes.iter().filter(|v| !v.is_hotpluggable()) {
        if let Some(e) = &v.empty_disk {
            let mib = qemu::cmdline::quantity_mib(&e.capacity.0, "emptyDisk.capacity").map_err(|e| e.to_string())?;
            crate::source::check_name("volume name", &v.name).map_err(|e| e.to_string())?;
            let path = run_dir.join(format!("empty-{}.img", v.name));
            let p = path.clone();
            blocking(move || empty_disk(&p, mib)).await?;
            out.insert(v.name.clone(), BootSource::Path(path));
        } else if let Some(claim) = Claim::of(v) {
            if shared.config.launcher_pods {
                out.insert(v.name.clone(), BootSource::InPod(claim));
                continue;
            }
            let path = crate::claims::claim_path(shared, &ns, &claim).await.map_err(|e| e.to_string())?;
            out.insert(v.name.clone(), BootSource::Path(path));
        }
    }
    Ok(out)
}

/// The run dir made private, the caps checked and the VMI's record written (fsync'd): before
/// anything else is created for the VMI, so a guest beyond what this host can hold never starts.
async fn prepare(shared: &Shared, vmi: &Arc<VirtualMachineInstance>, run_dir: &Path) -> Result<crate::checkpoint::VmiRecord, String> {
    let bind = shared.config.mode == crate::bindmount::AttachMode::BindMount;
    let uid = vmi.uid().unwrap_or_default();
    let record = crate::checkpoint::VmiRecord {
        namespace: vmi.namespace().unwrap_or_default(),
        name: vmi.name_any(),
        cgroup: bind.then(|| shared.config.devices_cgroup.join(&uid)),
        uid,
    };
    let (vmi, run_dir, caps, r) = (Arc::clone(vmi), run_dir.to_owned(), shared.config.caps, record.clone());
    blocking(move || {
        crate::checkpoint::create_private_dir(&run_dir).map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
        let host = crate::caps::Host::read(&run_dir)?;
        crate::caps::check(&vmi.spec, caps, &host)?;
        crate::checkpoint::write_record(&run_dir, &r).map_err(|e| e.to_string())
    })
    .await?;
    Ok(record)
}

/// Whether the VMI has CD-ROM media that are plugged by the hot-plug pass (hot-pluggable
/// volumes in SATA drives: virtual media): QEMU then starts paused, and the worker resumes it
/// after its first pass, so the firmware finds the media in their drives.
#[must_use]
pub(super) fn media_at_boot(vmi: &VirtualMachineInstance) -> bool {
    let spec = &vmi.spec;
    spec.domain.devices.disks.iter().any(|d| {
        d.kind() == api::kubevirt::DiskKind::Cdrom
            && d.bus().unwrap_or("sata") == "sata"
            && spec.volumes.iter().any(|v| v.name == d.name && v.is_hotpluggable())
    })
}

/// Whether QEMU waits for `cont` since its start (`-S`: status `prelaunch`).
pub(super) async fn prelaunch(machine: &Machine) -> bool {
    machine
        .execute("query-status", serde_json::json!({}))
        .await
        .is_ok_and(|s| s.get("status").and_then(|v| v.as_str()) == Some("prelaunch"))
}

/// Whether QEMU can be started now: always when the agent starts it; with launcher pods, once
/// the VMI's launcher listens on `RUN_DIR/launcher.sock` (its pod runs on this node).
pub(super) async fn starter_ready(shared: &Shared, run_dir: &Path) -> bool {
    if !shared.config.launcher_pods {
        return true;
    }
    let socket = run_dir.join(qemu::launcher::SOCKET);
    tokio::task::spawn_blocking(move || socket.exists()).await.unwrap_or(false)
}

/// Whether QEMU opens volume `volume` read-only: as its disk says, and always for the medium of
/// a `sata` CD-ROM drive (the command line's rule, [`qemu::cmdline::from_vmi`]). An fd handed
/// to QEMU must have the mode QEMU opens the drive with.
fn opened_readonly(vmi: &VirtualMachineInstance, volume: &str) -> bool {
    vmi.spec
        .domain
        .devices
        .disks
        .iter()
        .find(|d| d.name == volume)
        .is_some_and(|d| d.readonly() || (d.kind() == api::kubevirt::DiskKind::Cdrom && d.bus().unwrap_or("sata") == "sata"))
}

/// Launcher pods: connects to the VMI's launcher and opens each boot claim of `sources` that a
/// disk uses inside its pod (by the launcher's PID, the socket's peer), in volume-name order;
/// the starter that hands those fds to QEMU, and the fd index of each volume with whether it
/// is a block device ([`qemu::cmdline::DiskSource::Inherited`]). A claim no disk uses is not opened: QEMU would
/// get an fd its command line never names.
async fn launcher_starter(
    shared: &Shared,
    vmi: &VirtualMachineInstance,
    run_dir: &Path,
    sources: &HashMap<String, BootSource>,
) -> Result<(qemu::process::Starter, HashMap<String, (u32, bool)>), String> {
    let socket = run_dir.join(qemu::launcher::SOCKET);
    let connection = qemu::launcher::Connection::open(&socket).await.map_err(|e| client::error_chain(&e))?;
    let pid = connection.launcher_pid();
    let ns = vmi.namespace().unwrap_or_default();
    let mut claims: Vec<(&String, &Claim)> = sources
        .iter()
        .filter_map(|(v, s)| match s {
            BootSource::InPod(c) => Some((v, c)),
            BootSource::Path(_) => None,
        })
        .filter(|(v, _)| vmi.spec.domain.devices.disks.iter().any(|d| d.name == **v))
        .collect();
    claims.sort_by_key(|(v, _)| *v);
    let (mut inherited, mut index) = (Vec::new(), HashMap::new());
    for (volume, claim) in claims {
        let opened = crate::claims::open_in_launcher(shared, &ns, volume, claim, pid, opened_readonly(vmi, volume))
            .await
            .map_err(|e| format!("boot volume {volume} (claim {}) in the launcher pod: {e}", claim.name))?;
        tracing::debug!(volume, path = %opened.path.display(), "opened the boot claim in the launcher pod");
        index.insert(volume.clone(), (u32::try_from(inherited.len()).map_err(|e| e.to_string())?, opened.block));
        inherited.push(opened.fd);
    }
    Ok((qemu::process::Starter::Launcher { connection, inherited }, index))
}

/// Starts QEMU for the VMI (with its cloud-init `seed`, resolved by the caller) and connects to
/// it.
pub(super) async fn launch(
    shared: &Arc<Shared>,
    vmi: &Arc<VirtualMachineInstance>,
    run_dir: &Path,
    seed: Option<crate::cloudinit::Seed>,
) -> Result<Live, String> {
    let record = prepare(shared, vmi, run_dir).await?;
    let sources = boot_sources(shared, vmi, run_dir, seed).await?;
    let (starter, fd_index) = if shared.config.launcher_pods {
        launcher_starter(shared, vmi, run_dir, &sources).await?
    } else {
        (qemu::process::Starter::Own, HashMap::new())
    };
    let name = format!("{}_{}", record.namespace, record.name);
    let source = |v: &api::kubevirt::Volume| match sources.get(&v.name)? {
        BootSource::Path(p) => Some(qemu::cmdline::DiskSource::Path(p.clone())),
        BootSource::InPod(_) => fd_index.get(&v.name).map(|&(index, block)| qemu::cmdline::DiskSource::Inherited { index, block }),
    };
    let mut spec =
        qemu::cmdline::from_vmi(&vmi.spec, &name, run_dir, shared.accel, &shared.config.boot_files, source).map_err(|e| e.to_string())?;
    spec.nics = qemu::nic::from_vmi(&vmi.spec, &record.namespace, &record.name, !shared.config.guest_egress).map_err(|e| e.to_string())?;
    spec.own_mount_namespace = record.cgroup.is_some();
    spec.sandbox = shared.config.qemu_sandbox;
    spec.run_as.clone_from(&shared.config.qemu_user);
    spec.start_paused = media_at_boot(vmi);
    let process = qemu::process::launch_with(&spec, starter).await.map_err(|e| client::error_chain(&e))?;
    if let Some(cgroup) = record.cgroup {
        let (host, pid) = (Arc::clone(&shared.host), process.pid);
        let join = crate::bindmount::Request::JoinCgroup { cgroup, pid };
        if let Err(e) = blocking(move || host.apply(&join, None).map_err(|e| e.to_string())).await {
            process.kill().await;
            return Err(format!("bind-mount mode: {e}"));
        }
    }
    if shared.config.vm_nice != 0 {
        let (p, nice) = (process.clone(), shared.config.vm_nice);
        if let Err(e) = blocking(move || p.renice(nice).map_err(|e| e.to_string())).await {
            tracing::warn!("cannot set QEMU's nice value: {e}");
        }
    }
    tracing::info!("QEMU {} started", process.pid);
    connect(shared, vmi, process).await
}
