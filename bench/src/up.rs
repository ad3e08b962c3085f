//! The end-to-end harness's `virtplug up`: its own process (API server, controller and node
//! agent in one, `--accel tcg`), driven through the API over HTTPS like `kubectl`; its guests
//! are observed on their serial consoles.
//!
//! Every wait has a deadline. A guest that does not print `VP-READY` within the boot deadline
//! is restarted once (its VMI deleted: the controller starts a fresh one, with a fresh QEMU) and reported
//! with the tail of its console; if the fresh one fails too, the run fails with both reports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kube::api::{Api, Patch, PatchParams, PostParams};
use qemu::console::{Console, Line, Missed};
use serde_json::{json, Value};

use api::VirtualMachineInstance;

use crate::waits::{console_tail, secs, wait_for_line, within, TAIL_LINES};

/// How long one API call may take (loopback; seconds only under a fleet's boot load).
pub const API: Duration = Duration::from_secs(60);
/// How long `up` may take to serve.
const SERVE: Duration = Duration::from_secs(60);

pub struct Up {
    pub dir: tempfile::TempDir,
    pub child: Child,
    pub client: kube::Client,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Kill, by PID, the QEMUs of this data dir only.
        for d in std::fs::read_dir(self.dir.path().join("node/vmis")).into_iter().flatten().flatten() {
            if let Ok(p) = qemu::process::adopt(&d.path()) {
                if let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }
}

/// Starts `binary up` on a loopback port with a temp data dir (its stderr in `DIR/up.log`) and
/// connects a client from the kubeconfig it writes.
///
/// # Errors
/// When it cannot start or does not serve within a minute (with the tail of its log).
pub async fn start_up(binary: &Path) -> anyhow::Result<Up> {
    start_up_with(binary, &[]).await
}

/// [`start_up`] with `extra` arguments after `up`'s own (e.g. `--import-allow-host 127.0.0.1`).
///
/// # Errors
/// As [`start_up`].
pub async fn start_up_with(binary: &Path, extra: &[&str]) -> anyhow::Result<Up> {
    let dir = tempfile::tempdir()?;
    let log = std::fs::File::create(dir.path().join("up.log"))?;
    let mut child = Command::new(binary)
        .args(["up", "--listen", "127.0.0.1:0", "--node-name", "bench", "--accel", "tcg", "--data-dir"])
        .arg(dir.path())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let out = child.stdout.take().context("no stdout pipe")?;
    let waited = tokio::task::spawn_blocking(move || wait_for_line(out, "is serving the Kubernetes API at", SERVE, "virtplug up")).await?;
    if let Err(e) = waited {
        let _ = child.kill();
        let _ = child.wait();
        bail!("{e:#}\n{}", console_tail(&dir.path().join("up.log"), TAIL_LINES));
    }
    let client = client::connect(Some(&dir.path().join("kubeconfig"))).await?;
    Ok(Up { dir, child, client })
}

/// A guest that printed `VP-READY`: its console, and where its QEMU keeps its files.
pub struct Guest {
    pub name: String,
    pub uid: String,
    pub run: PathBuf,
    pub console: Console,
}

impl Guest {
    /// The last lines of this guest's console, for a report.
    #[must_use]
    pub fn tail(&self) -> String {
        console_tail(&self.run.join("serial.log"), TAIL_LINES)
    }

    /// The next console line matching `pred`, within `deadline`.
    ///
    /// # Errors
    /// Names `what` was awaited, the deadline, and shows the console's tail.
    pub async fn expect(&mut self, deadline: Duration, what: &str, pred: impl Fn(&str) -> bool) -> anyhow::Result<Line> {
        match self.console.next_matching(deadline, pred).await {
            Ok(l) => Ok(l),
            Err(Missed::Deadline(_)) => bail!("VM {}: its guest printed no {what} within {}\n{}", self.name, secs(deadline), self.tail()),
            Err(Missed::Closed) => bail!("VM {}: its console closed (QEMU exited) before {what}\n{}", self.name, self.tail()),
        }
    }
}

/// A guest that did not get ready: what was waited for, and what its console said.
#[derive(Debug)]
pub struct NotReady {
    pub name: String,
    pub uid: Option<String>,
    pub why: String,
    pub tail: String,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VM {}: {}\n{}", self.name, self.why, self.tail)
    }
}

impl Up {
    fn vmis(&self) -> Api<VirtualMachineInstance> {
        Api::namespaced(self.client.clone(), "default")
    }

    fn vms(&self) -> Api<api::VirtualMachine> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// The run dir of the VMI with `uid`.
    #[must_use]
    pub fn run_dir(&self, uid: &str) -> PathBuf {
        self.dir.path().join("node/vmis").join(uid)
    }

    pub async fn claim(&self, name: &str, size: &str) -> anyhow::Result<()> {
        let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(self.client.clone(), "default");
        let pvc = serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}))?;
        within(API, format!("the API to create claim {name}"), async { Ok(pvcs.create(&PostParams::default(), &pvc).await?) }).await?;
        Ok(())
    }

    /// Creates VM `name` (`runStrategy: Always`) booting the test guest with `memory_mib` MiB.
    pub async fn vm(&self, name: &str, guest: &Path, kernel_args: &str, memory_mib: u64) -> anyhow::Result<()> {
        let g = guest.canonicalize().with_context(|| format!("no test guest at {}", guest.display()))?;
        let vm = serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
            "spec": {"runStrategy": "Always", "template": {"spec": {"terminationGracePeriodSeconds": 1,
                "domain": {"resources": {"requests": {"memory": format!("{memory_mib}Mi")}}, "devices": {"disks": [{"name": "cd0", "cdrom": {"bus": "sata"}}]},
                           "firmware": {"kernelBoot": {"kernelArgs": kernel_args,
                               "container": {"kernelPath": g.join("vmlinuz"), "initrdPath": g.join("initramfs.cpio.gz")}}}}}}}}))?;
        within(API, format!("the API to create VM {name}"), async { Ok(self.vms().create(&PostParams::default(), &vm).await?) }).await?;
        Ok(())
    }

    pub async fn set_volumes(&self, vm: &str, claims: &[String]) -> anyhow::Result<()> {
        let mut disks = vec![json!({"name": "cd0", "cdrom": {"bus": "sata"}})];
        disks.extend(claims.iter().map(|c| json!({"name": c, "disk": {"bus": "scsi"}, "serial": c})));
        let volumes: Vec<Value> =
            claims.iter().map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c, "hotpluggable": true}})).collect();
        let p = json!({"spec": {"template": {"spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}}}});
        let vms = self.vms();
        within(API, format!("the API to patch VM {vm}'s volumes"), async {
            Ok(vms.patch(vm, &PatchParams::default(), &Patch::Merge(p)).await?)
        })
        .await?;
        Ok(())
    }

    /// A fresh VMI for VM `name`: its VMI is deleted, and the controller starts a new one
    /// (`runStrategy: Always`), with a new UID and a new QEMU.
    async fn restart(&self, name: &str) -> anyhow::Result<()> {
        let vmis = self.vmis();
        within(API, format!("the API to delete VMI {name}"), async {
            match vmis.delete(name, &kube::api::DeleteParams::default()).await {
                // None yet: the controller creates one anyway.
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Waits until VM `name` has a running VMI (other than `not_uid`) whose guest printed
    /// `VP-READY`, by `start + deadline`.
    ///
    /// # Errors
    /// What was missing at the deadline, with the guest's console tail when it has one.
    pub async fn ready(&self, name: &str, not_uid: Option<&str>, start: Instant, deadline: Duration) -> Result<Guest, NotReady> {
        let end = start + deadline;
        let fail = |uid: Option<&str>, why: String| NotReady {
            name: name.to_owned(),
            uid: uid.map(str::to_owned),
            tail: uid.map_or_else(
                || "    (no VMI, so no console)".to_owned(),
                |u| console_tail(&self.run_dir(u).join("serial.log"), TAIL_LINES),
            ),
            why,
        };
        let vmis = self.vmis();
        let uid = loop {
            let got = within(API, format!("the API to get VMI {name}"), async { Ok(vmis.get_opt(name).await?) }).await;
            let vmi = got.map_err(|e| fail(None, format!("{e:#}")))?;
            let uid = vmi.as_ref().and_then(|v| v.metadata.uid.clone()).filter(|u| Some(u.as_str()) != not_uid);
            let phase = vmi.as_ref().filter(|_| uid.is_some()).and_then(|v| v.phase().cloned());
            if let (Some(uid), Some(api::phases::VmiPhase::Running)) = (&uid, &phase) {
                break uid.clone();
            }
            if Instant::now() >= end {
                let what = if not_uid.is_some() { "a fresh VMI" } else { "its VMI" };
                return Err(fail(
                    uid.as_deref(),
                    format!("{what} was not Running {} after the VM was started (phase {phase:?})", secs(deadline)),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let run = self.run_dir(&uid);
        let left = end.saturating_duration_since(Instant::now());
        let connect = Console::connect(&run.join("serial.sock"), left.max(Duration::from_secs(5))).await;
        let mut console = connect.map_err(|e| fail(Some(&uid), format!("cannot connect to its serial console: {e}")))?;
        // The ready line may have been printed before we connected: the log has it then.
        let logged = std::fs::read_to_string(run.join("serial.log")).unwrap_or_default().contains("VP-READY");
        if !logged {
            let why = match console.next_matching(left, |l| l.starts_with("VP-READY")).await {
                Ok(_) => None,
                Err(Missed::Deadline(_)) => Some(format!("its guest printed no VP-READY within {} of the VM's start", secs(deadline))),
                Err(Missed::Closed) => Some("its console closed (QEMU exited) before VP-READY".to_owned()),
            };
            if let Some(why) = why {
                return Err(fail(Some(&uid), why));
            }
        }
        Ok(Guest { name: name.to_owned(), uid, run, console })
    }

    /// Waits for every VM of `names` (all started at `start`) to be ready within `deadline`;
    /// each one that is not is restarted once and given `deadline` again. Returns the guests in
    /// the order of `names` and a report of each failed first attempt.
    ///
    /// # Errors
    /// Every guest whose fresh VM failed too, with both attempts' console tails.
    pub async fn boot_all(&self, names: &[String], start: Instant, deadline: Duration) -> anyhow::Result<(Vec<Guest>, Vec<NotReady>)> {
        let mut guests: Vec<Option<Guest>> = Vec::new();
        let mut failed = Vec::new();
        // One at a time (one API poller): they boot concurrently, so one absolute deadline.
        for n in names {
            match self.ready(n, None, start, deadline).await {
                Ok(g) => guests.push(Some(g)),
                Err(e) => {
                    println!("retry: {e}\n  → restarting VM {n} once (a fresh VMI and QEMU)");
                    self.restart(n).await?;
                    guests.push(None);
                    failed.push(e);
                }
            }
        }
        let again = Instant::now();
        let mut still = Vec::new();
        for first in &failed {
            match self.ready(&first.name, first.uid.as_deref(), again, deadline).await {
                Ok(g) => {
                    let i = names.iter().position(|n| *n == g.name).context("a retried VM that was not asked for")?;
                    guests[i] = Some(g);
                }
                Err(e) => still.push(format!("first attempt: {first}\nfresh VM: {e}")),
            }
        }
        if !still.is_empty() {
            bail!("{} of {} VMs did not boot to VP-READY, twice:\n{}", still.len(), names.len(), still.join("\n\n"));
        }
        let guests = guests.into_iter().collect::<Option<Vec<_>>>().context("a VM without a guest")?;
        Ok((guests, failed))
    }
}
