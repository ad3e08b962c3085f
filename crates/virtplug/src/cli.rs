//! The virtctl-style CLI: `vm`, `volume`, `addvolume`, `removevolume`. Every command talks to the
//! API (kubeconfig from `--kubeconfig`, `$KUBECONFIG`, `~/.kube/config`, then the `up` data
//! dir's); changes go through the subresources or `client::update`.
//!
//! Exit codes: 0 done; 1 the operation failed (API refusal, import failed, `--wait` timed out);
//! 2 bad usage (clap). Errors go to stderr with what to do; `-o json|yaml` output is stable.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use api::{DataVolume, VirtualMachine, VirtualMachineInstance};

/// Options every command takes.
#[derive(Args, Clone)]
pub struct Common {
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, then the `up` data dir's].
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Namespace.
    #[arg(long, short = 'n', global = true, default_value = "default")]
    namespace: String,
    /// Output format.
    #[arg(long, short = 'o', global = true, default_value = "table", value_parser = ["table", "json", "yaml"])]
    output: String,
}

#[derive(Subcommand)]
pub enum Vm {
    /// Create a VM from flags or from a manifest (`-f`).
    Create(VmCreate),
    /// List VMs.
    List,
    /// Show a VM.
    Get { name: String },
    /// Start a VM (the `start` subresource).
    Start { name: String },
    /// Stop a VM (the `stop` subresource).
    Stop {
        name: String,
        /// Seconds the guest gets to power off before it is stopped by force.
        #[arg(long)]
        grace_period: Option<u32>,
    },
    /// Restart a VM (the `restart` subresource).
    Restart { name: String },
    /// Delete a VM (its VMI and DataVolume templates go with it).
    Delete { name: String },
    /// Attach to the serial console of a VM running on this machine (Ctrl-D or EOF to leave).
    Console {
        name: String,
        /// The node's data dir [default: the `up` default].
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Args)]
pub struct VmCreate {
    /// VM name (or take it from the manifest).
    name: Option<String>,
    /// A VirtualMachine manifest (YAML or JSON).
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    #[arg(long, default_value = "256Mi")]
    memory: String,
    #[arg(long, default_value_t = 1)]
    cpus: u32,
    /// Kernel to boot directly (host path).
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Initrd for `--kernel`.
    #[arg(long)]
    initrd: Option<PathBuf>,
    #[arg(long, default_value = "console=ttyS0")]
    kernel_args: String,
    /// A claim to boot from (attached as a virtio disk with boot order 1).
    #[arg(long)]
    boot_claim: Option<String>,
    /// Add an empty SATA CD-ROM drive of this name (for virtual media).
    #[arg(long)]
    cdrom: Option<String>,
    #[arg(long, default_value = "Always", value_parser = ["Always", "Halted", "Manual", "RerunOnFailure", "Once"])]
    run_strategy: String,
}

#[derive(Subcommand)]
pub enum Volume {
    /// Create a claim served by the local provisioner.
    Create {
        name: String,
        #[arg(long)]
        size: String,
        #[arg(long, default_value = "Filesystem", value_parser = ["Filesystem", "Block"])]
        mode: String,
        /// Wait until it is Bound.
        #[arg(long)]
        wait: bool,
    },
    /// Import an image over http(s) into a new DataVolume, showing progress.
    Import {
        name: String,
        #[arg(long)]
        url: String,
        /// Claim size [default: 1Gi].
        #[arg(long, default_value = "1Gi")]
        size: String,
        #[arg(long, default_value = "Filesystem", value_parser = ["Filesystem", "Block"])]
        mode: String,
        /// Return at once instead of following the import.
        #[arg(long)]
        no_wait: bool,
    },
    /// List claims.
    List,
    /// Delete a claim (its storage is released once no VMI uses it).
    Delete { name: String },
}

/// `virtplug addvolume` (virtctl's flags where virtctl has them).
#[derive(Args)]
pub struct AddVolume {
    /// The VM.
    vm: String,
    #[arg(long)]
    volume_name: String,
    /// The claim to plug.
    #[arg(long, conflicts_with = "datavolume", required_unless_present = "datavolume")]
    claim: Option<String>,
    /// The DataVolume to plug.
    #[arg(long)]
    datavolume: Option<String>,
    #[arg(long, default_value = "disk", value_parser = ["disk", "lun", "cdrom"])]
    disk_type: String,
    #[arg(long, default_value = "scsi", value_parser = ["scsi", "sata"])]
    bus: String,
    #[arg(long)]
    serial: Option<String>,
    /// Accepted for virtctl compatibility: declarative hot-plug always persists in the VM spec.
    #[arg(long)]
    persist: bool,
    #[arg(long)]
    dry_run: bool,
    /// Wait until the volume is Ready and print its phase timeline.
    #[arg(long)]
    wait: bool,
    /// How long `--wait` waits.
    #[arg(long, default_value = "120s", value_parser = humantime)]
    timeout: Duration,
}

/// `virtplug removevolume`.
#[derive(Args)]
pub struct RemoveVolume {
    vm: String,
    #[arg(long)]
    volume_name: String,
    #[arg(long)]
    dry_run: bool,
    /// Wait until the volume is gone from the VMI.
    #[arg(long)]
    wait: bool,
    #[arg(long, default_value = "120s", value_parser = humantime)]
    timeout: Duration,
}

fn humantime(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 5m)"))?;
    match unit {
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "ms" => Ok(Duration::from_millis(n)),
        _ => Err(format!("{s:?}: use s, m or ms")),
    }
}

async fn connect(c: &Common) -> anyhow::Result<kube::Client> {
    crate::migrate::connect(c.kubeconfig.clone()).await
}

fn print_objects<T: serde::Serialize>(
    output: &str,
    items: &[T],
    table: impl Fn(&[T]) -> Vec<Vec<String>>,
    header: &[&str],
) -> anyhow::Result<()> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(&json!({"items": items}))?),
        "yaml" => print!("{}", serde_yaml::to_string(&json!({"items": items}))?),
        _ => {
            let mut rows = vec![header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()];
            rows.extend(table(items));
            let widths: Vec<usize> =
                (0..header.len()).map(|i| rows.iter().map(|r| r.get(i).map_or(0, String::len)).max().unwrap_or(0)).collect();
            for r in rows {
                let line: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
                println!("{}", line.join("   ").trim_end());
            }
        }
    }
    Ok(())
}

fn print_one<T: serde::Serialize>(output: &str, item: &T, table: impl Fn(&[T]) -> Vec<Vec<String>>, header: &[&str]) -> anyhow::Result<()> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(item)?),
        "yaml" => print!("{}", serde_yaml::to_string(item)?),
        _ => print_objects(output, std::slice::from_ref(item), table, header)?,
    }
    Ok(())
}

/// An action's outcome: `text` in table mode, `doc` (a JSON value) with `-o json|yaml`, so a
/// script never has to parse prose.
fn report(output: &str, text: &str, doc: &Value) -> anyhow::Result<()> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(doc)?),
        "yaml" => print!("{}", serde_yaml::to_string(doc)?),
        _ => println!("{text}"),
    }
    Ok(())
}

const VM_HEADER: &[&str] = &["NAME", "STATUS", "READY", "NODE", "VOLUMES"];

fn vm_rows(vms: &[(VirtualMachine, Option<VirtualMachineInstance>)]) -> Vec<Vec<String>> {
    vms.iter()
        .map(|(vm, vmi)| {
            let st = vm.status.clone().unwrap_or_default();
            let node = vmi.as_ref().and_then(|v| v.status.as_ref()).and_then(|s| s.node_name.clone()).unwrap_or_default();
            let vols = vm
                .spec
                .template
                .spec
                .as_ref()
                .map(|s| s.volumes.iter().map(|v| v.name.clone()).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            vec![vm.name_any(), st.printable_status.unwrap_or_default(), st.ready.unwrap_or(false).to_string(), node, vols]
        })
        .collect()
}

#[derive(serde::Serialize)]
struct VmView {
    vm: VirtualMachine,
    #[serde(skip_serializing_if = "Option::is_none")]
    vmi: Option<VirtualMachineInstance>,
}

async fn subresource(client: &kube::Client, ns: &str, name: &str, sub: &str, body: &Value) -> anyhow::Result<()> {
    let path = format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/{sub}");
    let req = http::Request::put(&path).header("content-type", "application/json").body(serde_json::to_vec(body)?).context("request")?;
    match client.request_text(req).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => bail!("{sub} {ns}/{name}: {} ({})", s.message, s.code),
        Err(e) => Err(e).with_context(|| format!("{sub} {ns}/{name}")),
    }
}

pub async fn vm(cmd: Vm, c: Common) -> anyhow::Result<()> {
    let client = connect(&c).await?;
    let ns = &c.namespace;
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    match &cmd {
        Vm::Create(a) => {
            let vm = build_vm(a, ns)?;
            let created = vms.create(&PostParams::default(), &vm).await.map_err(api_err("create the VM"))?;
            if c.output == "table" {
                println!("virtualmachine/{} created", created.name_any());
            } else {
                print_one(&c.output, &created, |_| Vec::new(), &[])?;
            }
        }
        Vm::List => {
            let list = vms.list(&ListParams::default()).await.map_err(api_err("list VMs"))?.items;
            let mut rows = Vec::new();
            for vm in list {
                let vmi = vmis.get_opt(&vm.name_any()).await.ok().flatten();
                rows.push((vm, vmi));
            }
            match c.output.as_str() {
                "table" => print_objects("table", &rows, vm_rows, VM_HEADER)?,
                o => print_objects(o, &rows.into_iter().map(|(vm, vmi)| VmView { vm, vmi }).collect::<Vec<_>>(), |_| Vec::new(), &[])?,
            }
        }
        Vm::Get { name } => {
            let vm = vms.get(name).await.map_err(api_err(&format!("get VM {name}")))?;
            let vmi = vmis.get_opt(name).await.ok().flatten();
            match c.output.as_str() {
                "table" => print_objects("table", &[(vm, vmi)], vm_rows, VM_HEADER)?,
                o => print_one(o, &VmView { vm, vmi }, |_| Vec::new(), &[])?,
            }
        }
        Vm::Start { name } | Vm::Stop { name, .. } | Vm::Restart { name } => {
            let (action, body) = match &cmd {
                Vm::Stop { grace_period: Some(g), .. } => ("stop", json!({"gracePeriod": g})),
                Vm::Stop { .. } => ("stop", json!({})),
                Vm::Start { .. } => ("start", json!({})),
                _ => ("restart", json!({})),
            };
            subresource(&client, ns, name, action, &body).await?;
            let doc = if c.output == "table" {
                Value::Null
            } else {
                // The VM as the action left it (its runStrategy or stateChangeRequests).
                let vm = vms.get(name).await.map_err(api_err(&format!("get VM {name}")))?;
                let vmi = vmis.get_opt(name).await.ok().flatten();
                serde_json::to_value(VmView { vm, vmi })?
            };
            report(&c.output, &format!("VM {name} was scheduled to {action}"), &doc)?;
        }
        Vm::Delete { name } => {
            let r = vms.delete(name, &DeleteParams::default()).await.map_err(api_err(&format!("delete VM {name}")))?;
            report(&c.output, &format!("virtualmachine/{name} deleted"), &r.either(serde_json::to_value, serde_json::to_value)?)?;
        }
        Vm::Console { name, data_dir } => {
            let vmi = vmis.get(name).await.map_err(api_err(&format!("get VMI {name} (is the VM running?)")))?;
            let uid = vmi.uid().unwrap_or_default();
            let dir = data_dir.clone().unwrap_or_else(crate::default_data_dir).join("node/vmis").join(&uid);
            console(&dir.join("serial.sock")).await?;
        }
    }
    Ok(())
}

fn build_vm(a: &VmCreate, ns: &str) -> anyhow::Result<VirtualMachine> {
    if let Some(f) = &a.file {
        let text = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        let mut v: Value = serde_yaml::from_str(&text).with_context(|| format!("{} is not a YAML or JSON manifest", f.display()))?;
        if let Some(n) = &a.name {
            v["metadata"]["name"] = json!(n);
        }
        v["metadata"]["namespace"] = json!(ns);
        return serde_json::from_value(v).with_context(|| format!("{} is not a VirtualMachine", f.display()));
    }
    let Some(name) = &a.name else { bail!("give the VM a name: virtplug vm create NAME [flags], or -f MANIFEST") };
    let mut disks = Vec::new();
    let mut volumes = Vec::new();
    if let Some(c) = &a.boot_claim {
        disks.push(json!({"name": "boot", "bootOrder": 1, "disk": {"bus": "virtio"}}));
        volumes.push(json!({"name": "boot", "persistentVolumeClaim": {"claimName": c}}));
    }
    if let Some(cd) = &a.cdrom {
        disks.push(json!({"name": cd, "cdrom": {"bus": "sata"}}));
    }
    let mut domain = json!({"resources": {"requests": {"memory": a.memory}}, "cpu": {"cores": a.cpus}, "devices": {"disks": disks}});
    match (&a.kernel, &a.boot_claim) {
        (Some(k), _) => {
            let k = k.canonicalize().with_context(|| format!("--kernel {}: no such file", k.display()))?;
            let mut container = json!({"kernelPath": k});
            if let Some(i) = &a.initrd {
                container["initrdPath"] = json!(i.canonicalize().with_context(|| format!("--initrd {}: no such file", i.display()))?);
            }
            domain["firmware"] = json!({"kernelBoot": {"kernelArgs": a.kernel_args, "container": container}});
        }
        (None, None) => bail!("a VM needs something to boot: --kernel (and --initrd), --boot-claim, or -f MANIFEST"),
        (None, Some(_)) => {}
    }
    let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": ns},
        "spec": {"runStrategy": a.run_strategy, "template": {"metadata": {"labels": {"kubevirt.io/vm": name}}, "spec": {"domain": domain, "volumes": volumes}}}});
    Ok(serde_json::from_value(vm)?)
}

fn api_err(what: &str) -> impl FnOnce(kube::Error) -> anyhow::Error + '_ {
    move |e| match e {
        kube::Error::Api(s) => anyhow::anyhow!("cannot {what}: {} ({})", s.message, s.code),
        other => anyhow::Error::new(other).context(format!("cannot {what}")),
    }
}

async fn console(socket: &std::path::Path) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("cannot connect to {} (the console works on the machine that runs the VM)", socket.display()))?;
    eprintln!("connected to {} (Ctrl-D leaves)", socket.display());
    let (mut rd, mut wr) = stream.into_split();
    let out = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        let _ = tokio::io::copy(&mut rd, &mut stdout).await;
        let _ = stdout.flush().await;
    });
    let mut stdin = tokio::io::stdin();
    let _ = tokio::io::copy(&mut stdin, &mut wr).await;
    let _ = wr.shutdown().await;
    out.abort();
    Ok(())
}

pub async fn volume(cmd: Volume, c: Common) -> anyhow::Result<()> {
    let client = connect(&c).await?;
    let ns = &c.namespace;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    match cmd {
        Volume::Create { name, size, mode, wait } => {
            controller::storage::parse_bytes(&size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
            let pvc: PersistentVolumeClaim = serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode, "resources": {"requests": {"storage": size}}}}),
            )?;
            pvcs.create(&PostParams::default(), &pvc).await.map_err(api_err("create the claim"))?;
            if wait {
                let bound = follow(&pvcs, &name, Some(Duration::from_secs(60)), |p| {
                    Ok(p.is_some_and(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).then_some(()))
                })
                .await
                .context("watch the claim")?;
                if bound.is_none() {
                    bail!("claim {name} is not Bound after 60 s: see `kubectl describe pvc {name}` for its events");
                }
            }
            let p = pvcs.get(&name).await.map_err(api_err("read the claim"))?;
            print_one(&c.output, &p, pvc_rows, PVC_HEADER)?;
        }
        Volume::Import { name, url, size, mode, no_wait } => {
            let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
            let dv: DataVolume = serde_json::from_value(
                json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name, "namespace": ns},
                "spec": {"source": {"http": {"url": url}}, "storage": {"volumeMode": mode, "resources": {"requests": {"storage": size}}}}}),
            )?;
            let created = dvs.create(&PostParams::default(), &dv).await.map_err(api_err("create the DataVolume"))?;
            if no_wait {
                report(&c.output, &format!("datavolume/{name} created"), &serde_json::to_value(created)?)?;
                return Ok(());
            }
            let done = follow_import(&dvs, &name, c.output == "table").await?;
            report(&c.output, &format!("datavolume/{name} imported"), &serde_json::to_value(done)?)?;
        }
        Volume::List => {
            let list = pvcs.list(&ListParams::default()).await.map_err(api_err("list claims"))?.items;
            print_objects(&c.output, &list, pvc_rows, PVC_HEADER)?;
        }
        Volume::Delete { name } => {
            let r = pvcs.delete(&name, &DeleteParams::default()).await.map_err(api_err(&format!("delete claim {name}")))?;
            report(
                &c.output,
                &format!("persistentvolumeclaim/{name} deleted (storage released once no VMI uses it)"),
                &r.either(serde_json::to_value, serde_json::to_value)?,
            )?;
        }
    }
    Ok(())
}

const PVC_HEADER: &[&str] = &["NAME", "STATUS", "CAPACITY", "MODE", "DEVICE"];

fn pvc_rows(items: &[PersistentVolumeClaim]) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|p| {
            let st = p.status.clone().unwrap_or_default();
            let cap = st.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone()).unwrap_or_default();
            let mode = p.spec.as_ref().and_then(|s| s.volume_mode.clone()).unwrap_or_else(|| "Filesystem".into());
            let dev = p
                .annotations()
                .get(controller::storage::ANN_DEVICE)
                .or_else(|| p.annotations().get(controller::storage::ANN_PATH))
                .cloned()
                .unwrap_or_default();
            vec![p.name_any(), st.phase.unwrap_or_default(), cap, mode, dev]
        })
        .collect()
}

/// Follows an import until it ends, with a progress bar on stderr in table mode; the
/// DataVolume as it succeeded.
async fn follow_import(dvs: &Api<DataVolume>, name: &str, bar: bool) -> anyhow::Result<DataVolume> {
    let mut last = String::new();
    let outcome = follow(dvs, name, None, |dv| {
        let Some(dv) = dv else { bail!("DataVolume {name} was deleted during its import") };
        let st = dv.status.clone().unwrap_or_default();
        let phase = st.phase.clone().unwrap_or_else(|| "Pending".into());
        let progress = st.progress.clone().unwrap_or_else(|| "N/A".into());
        let line = format!("{name}: {phase} {progress}");
        if bar && line != last {
            let pct: f64 = progress.trim_end_matches('%').parse().unwrap_or(0.0);
            // The bar is 30 cells; `pct` is 0..=100.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let filled = ((pct / 100.0) * 30.0).round().clamp(0.0, 30.0) as usize;
            eprint!("\r[{}{}] {line:<50}", "#".repeat(filled), " ".repeat(30 - filled));
            last = line;
        }
        Ok(match phase.as_str() {
            "Succeeded" => Some(Ok(dv.clone())),
            "Failed" => {
                let why = st.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone()).unwrap_or_default();
                Some(Err(anyhow::anyhow!("import of {name} failed: {why}")))
            }
            _ => None,
        })
    })
    .await
    .context("watch the DataVolume");
    if bar {
        eprintln!();
    }
    match outcome? {
        Some(r) => r,
        None => bail!("the watch of DataVolume {name} ended"),
    }
}

/// Follows one object on a watch (a field selector on its name; no polling), calling `step` with
/// its current state on every change (`None`: it does not exist, or no longer) until `step`
/// returns a value. `Ok(None)` when `timeout` passed first; `step`'s error ends the wait.
///
/// # Errors
/// When the watch fails (the API's error: unreachable, forbidden) or `step` fails.
async fn follow<K, T>(
    api: &Api<K>,
    name: &str,
    timeout: Option<Duration>,
    mut step: impl FnMut(Option<&K>) -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api.clone(), config).boxed();
    // The initial list arrives as Init, InitApply…, InitDone: judge the object once it is whole.
    let mut listed: Option<K> = None;
    let run = async {
        while let Some(event) = events.next().await {
            let current = match event? {
                Event::Init => {
                    listed = None;
                    continue;
                }
                Event::InitApply(o) => {
                    listed = Some(o);
                    continue;
                }
                Event::InitDone => listed.take(),
                Event::Apply(o) => Some(o),
                Event::Delete(_) => None,
            };
            if let Some(t) = step(current.as_ref())? {
                return Ok(Some(t));
            }
        }
        bail!("the watch ended")
    };
    match timeout {
        Some(d) => tokio::time::timeout(d, run).await.unwrap_or(Ok(None)),
        None => run.await,
    }
}

/// Prints a volume's phase timeline from its `phaseTransitionTimestamps`.
fn timeline(st: &api::kubevirt::VolumeStatus, since: jiff::Timestamp) -> String {
    let stamps = st.extra.get("phaseTransitionTimestamps").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = String::new();
    for s in stamps {
        let phase = s["phase"].as_str().unwrap_or_default();
        let Some(t) = s["phaseTransitionTimestamp"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()) else { continue };
        let ms = (t - since).as_secs_f64() * 1000.0;
        out.push_str(&format!("  {phase:<16} +{ms:>7.0} ms\n"));
    }
    out
}

pub async fn addvolume(a: AddVolume, c: Common) -> anyhow::Result<()> {
    let client = connect(&c).await?;
    let ns = &c.namespace;
    let target = json!({"bus": a.bus});
    let mut disk = json!({"name": a.volume_name});
    disk[a.disk_type.as_str()] = target;
    if let Some(s) = &a.serial {
        disk["serial"] = json!(s);
    }
    let source = match (&a.claim, &a.datavolume) {
        (Some(cl), _) => json!({"persistentVolumeClaim": {"claimName": cl}}),
        (None, Some(d)) => json!({"dataVolume": {"name": d}}),
        (None, None) => bail!("give --claim or --datavolume"),
    };
    let mut body = json!({"name": a.volume_name, "disk": disk, "volumeSource": source});
    if a.dry_run {
        body["dryRun"] = json!(["All"]);
    }
    let since = jiff::Timestamp::now();
    subresource(&client, ns, &a.vm, "addvolume", &body).await?;
    let table = c.output == "table";
    let mut doc = json!({"vm": a.vm, "namespace": ns, "volume": a.volume_name, "dryRun": a.dry_run, "submitted": true});
    if a.dry_run {
        return report(&c.output, &format!("addvolume {} to VM {}: accepted (dry run, nothing written)", a.volume_name, a.vm), &doc);
    }
    if table {
        println!("Successfully submitted add volume request to VM {} for volume {}", a.vm, a.volume_name);
    }
    if a.wait {
        let st = wait_volume(&client, ns, &a.vm, &a.volume_name, a.timeout, true).await?;
        let total = (jiff::Timestamp::now() - since).as_secs_f64() * 1000.0;
        if table {
            if let Some(st) = &st {
                println!("volume {} is Ready in VM {}:", a.volume_name, a.vm);
                print!("{}", timeline(st, since));
                println!("  total            {total:>8.0} ms");
            }
        }
        doc["volumeStatus"] = serde_json::to_value(st)?;
        doc["elapsedMs"] = json!(total.round());
    }
    if table {
        return Ok(());
    }
    report(&c.output, "", &doc)
}

pub async fn removevolume(a: RemoveVolume, c: Common) -> anyhow::Result<()> {
    let client = connect(&c).await?;
    let ns = &c.namespace;
    let mut body = json!({"name": a.volume_name});
    if a.dry_run {
        body["dryRun"] = json!(["All"]);
    }
    let since = Instant::now();
    subresource(&client, ns, &a.vm, "removevolume", &body).await?;
    let mut doc = json!({"vm": a.vm, "namespace": ns, "volume": a.volume_name, "dryRun": a.dry_run, "submitted": true});
    if a.dry_run {
        return report(&c.output, &format!("removevolume {} from VM {}: accepted (dry run, nothing written)", a.volume_name, a.vm), &doc);
    }
    let mut text = format!("Successfully submitted remove volume request to VM {} for volume {}", a.vm, a.volume_name);
    if a.wait {
        wait_volume(&client, ns, &a.vm, &a.volume_name, a.timeout, false).await?;
        let ms = since.elapsed().as_millis();
        text.push_str(&format!("\nvolume {} is unplugged from VM {} ({ms} ms)", a.volume_name, a.vm));
        doc["unplugged"] = json!(true);
        doc["elapsedMs"] = json!(ms);
    }
    report(&c.output, &text, &doc)
}

/// Waits until the volume is `Ready` (`plugged`) or gone from the VMI (on a watch of the VMI);
/// reports a `HotplugFailed` reason on stderr once per phase.
async fn wait_volume(
    client: &kube::Client,
    ns: &str,
    vm: &str,
    volume: &str,
    timeout: Duration,
    plugged: bool,
) -> anyhow::Result<Option<api::kubevirt::VolumeStatus>> {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    let mut last: Option<api::kubevirt::VolumeStatus> = None;
    let done = follow(&vmis, vm, Some(timeout), |vmi| {
        let Some(vmi) = vmi else {
            if plugged {
                bail!("VM {vm} is not running: the volume is in its spec and is plugged when it starts");
            }
            return Ok(Some(None));
        };
        let entry = vmi.status.as_ref().and_then(|s| s.volume_status.iter().find(|e| e.name == volume)).cloned();
        let in_spec = vmi.spec.volumes.iter().any(|v| v.name == volume);
        last.clone_from(&entry);
        let Some(e) = entry else {
            return Ok((!plugged && !in_spec).then_some(None));
        };
        let key = format!("{}/{}", e.phase.clone().unwrap_or_default(), e.reason.clone().unwrap_or_default());
        if seen.insert(key.clone(), ()).is_none() && e.reason.as_deref() == Some("HotplugFailed") {
            eprintln!("volume {volume}: {} ({})", key, e.message.clone().unwrap_or_default());
        }
        Ok((plugged && e.phase.as_deref() == Some("Ready")).then_some(Some(e)))
    })
    .await
    .context("watch the VMI")?;
    match done {
        Some(entry) => Ok(entry),
        None => {
            let state = last.map_or_else(
                || "no status yet".to_owned(),
                |e| format!("{} {}: {}", e.phase.unwrap_or_default(), e.reason.unwrap_or_default(), e.message.unwrap_or_default()),
            );
            bail!("volume {volume} of VM {vm}: not {} after {timeout:?} ({state})", if plugged { "Ready" } else { "unplugged" });
        }
    }
}
