//! `virtplug vm`: create (from flags or a manifest), list, get, start, stop, restart, pause,
//! unpause, softreboot, delete, console, vnc, port.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use api::{VirtualMachine, VirtualMachineInstance};

use super::{api_err, connect, print_objects, print_one, report, subresource, Common};

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
    /// Pause a running VM: its vCPUs stop, its memory stays (the VMI's `pause` subresource).
    Pause { name: String },
    /// Unpause a paused VM (the VMI's `unpause` subresource).
    Unpause { name: String },
    /// Reboot a running VM's guest in place: same VMI, same QEMU (the VMI's `softreboot`
    /// subresource; a reset, there being no guest agent).
    Softreboot { name: String },
    /// Delete a VM (its VMI and DataVolume templates go with it).
    Delete { name: String },
    /// Print the VM's BMC address for metal3/Ironic (its Redfish System) and the credentials hint.
    Bmc {
        name: String,
        /// The Redfish service's URL [default: the one `up` on --data-dir announced, else
        /// https://127.0.0.1:8443].
        #[arg(long)]
        redfish_url: Option<String>,
        /// The `up` data dir [default: the `up` default].
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Print where a guest port of the running VM is reached (`127.0.0.1:HOSTPORT` on its node),
    /// e.g. `ssh -p "${x##*:}" user@127.0.0.1` with x=$(virtplug vm port NAME 22). The port must be
    /// listed in the VM's interface `ports`.
    Port {
        name: String,
        /// The guest's port.
        port: u16,
        #[arg(long, default_value = "TCP", value_parser = ["TCP", "UDP", "tcp", "udp"])]
        protocol: String,
    },
    /// Attach to a running VM's serial console through the API (the `console` subresource, as
    /// `virtctl console`): works wherever the kubeconfig works. `^]` leaves (or the end of
    /// standard input when it is not a terminal).
    Console { name: String },
    /// Reach a running VM's VNC server through the API (the `vnc` subresource, as `virtctl
    /// vnc`): prints a loopback address (127.0.0.1:PORT) for a VNC viewer and proxies every
    /// connection to it until Ctrl-C.
    Vnc {
        name: String,
        /// The loopback port to listen on [default: any free one].
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Print only `{"port": PORT}` (virtctl's `--proxy-only` output) and proxy.
        #[arg(long)]
        proxy_only: bool,
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
            let printable = st.printable_status.as_ref().map_or("", api::phases::PrintableStatus::as_str).to_owned();
            vec![vm.name_any(), printable, st.ready.unwrap_or(false).to_string(), node, vols]
        })
        .collect()
}

#[derive(serde::Serialize)]
struct VmView {
    vm: VirtualMachine,
    #[serde(skip_serializing_if = "Option::is_none")]
    vmi: Option<VirtualMachineInstance>,
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
            report(&c.output, &format!("virtualmachine/{} created", created.name_any()), &serde_json::to_value(&created)?)?;
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
            let media = media_line(&client, &c.namespace, &vm).await;
            let boot = boot_line(&vm);
            match c.output.as_str() {
                "table" => {
                    let net = super::net::lines(vmi.as_ref());
                    print_objects("table", &[(vm, vmi)], vm_rows, VM_HEADER)?;
                    println!("Virtual media (Cd): {media}\nBoot: {boot}\n{net}");
                }
                o => print_one(o, &VmView { vm, vmi }, |_| Vec::new(), &[])?,
            }
        }
        Vm::Start { name } => act(&c, &client, &vms, &vmis, name, "start", json!({})).await?,
        Vm::Stop { name, grace_period } => {
            act(&c, &client, &vms, &vmis, name, "stop", grace_period.map_or_else(|| json!({}), |g| json!({"gracePeriod": g}))).await?;
        }
        Vm::Restart { name } => act(&c, &client, &vms, &vmis, name, "restart", json!({})).await?,
        Vm::Pause { name } => act(&c, &client, &vms, &vmis, name, "pause", json!({})).await?,
        Vm::Unpause { name } => act(&c, &client, &vms, &vmis, name, "unpause", json!({})).await?,
        Vm::Softreboot { name } => act(&c, &client, &vms, &vmis, name, "softreboot", json!({})).await?,
        Vm::Delete { name } => {
            let r = vms.delete(name, &DeleteParams::default()).await.map_err(api_err(&format!("delete VM {name}")))?;
            report(&c.output, &format!("virtualmachine/{name} deleted"), &r.either(serde_json::to_value, serde_json::to_value)?)?;
        }
        Vm::Bmc { name, redfish_url, data_dir } => {
            let vm = vms.get(name).await.map_err(api_err(&format!("get VM {name}")))?;
            let data_dir = data_dir.clone().unwrap_or_else(crate::default_data_dir);
            let url = redfish_url.clone().unwrap_or_else(|| crate::redfish_cmd::endpoint(&data_dir));
            let address = crate::redfish_cmd::bmc_address(url.trim_end_matches('/'), &vm.uid().unwrap_or_default());
            let password = data_dir.join("redfish").join(redfish::accounts::store::INITIAL_PASSWORD_FILE);
            let ca = data_dir.join("pki/ca.crt");
            let doc = json!({"address": address, "username": "admin", "passwordFile": password, "caCertificate": ca});
            let text = format!(
                "{address}\n  credentials: user admin, password in {} (or an account from `virtplug redfish account add`)\n  \
                 TLS: the certificate is signed by {} (trust it, or set disableCertificateVerification: true)",
                password.display(),
                ca.display()
            );
            report(&c.output, &text, &doc)?;
        }
        Vm::Port { name, port, protocol } => {
            let vmi = vmis.get(name).await.map_err(api_err(&format!("get VMI {name} (is the VM running?)")))?;
            let protocol = if protocol.eq_ignore_ascii_case("udp") { api::network::Protocol::Udp } else { api::network::Protocol::Tcp };
            let (text, doc) = super::net::report(&super::net::find(&vmi, name, *port, protocol)?);
            report(&c.output, &text, &doc)?;
        }
        Vm::Console { name } => super::console::console(&super::connect_streams(&c).await?, ns, name).await?,
        Vm::Vnc { name, port, proxy_only } => super::console::vnc(&super::connect_streams(&c).await?, ns, name, *port, *proxy_only).await?,
    }
    Ok(())
}

/// The virtual medium in the VM's Cd drive: its image, and where its import stands.
async fn media_line(client: &kube::Client, ns: &str, vm: &VirtualMachine) -> String {
    let drive = api::virtual_media::cd_drive(vm);
    let Some(dv) = api::virtual_media::medium(vm) else { return format!("empty (drive {drive})") };
    let dvs: Api<api::DataVolume> = Api::namespaced(client.clone(), ns);
    match dvs.get_opt(&dv).await {
        Ok(Some(d)) => {
            let url = d.spec.source.as_ref().and_then(|s| s.http.as_ref()).map_or("?", |h| h.url.as_str()).to_owned();
            let st = d.status.unwrap_or_default();
            let phase = st.phase.as_ref().map_or("Pending", |p| p.as_str());
            let why = st.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone()).filter(|_| phase == "Failed");
            let progress = st.progress.filter(|_| phase != "Succeeded" && phase != "Failed").map(|p| format!(" {p}")).unwrap_or_default();
            format!("{url} (drive {drive}, DataVolume {dv}: {phase}{progress}{})", why.map(|w| format!(": {w}")).unwrap_or_default())
        }
        Ok(None) => format!("DataVolume {dv} (drive {drive}) does not exist"),
        Err(e) => format!("DataVolume {dv} (drive {drive}): cannot read it: {e}"),
    }
}

/// The VM's boot override and firmware.
fn boot_line(vm: &VirtualMachine) -> String {
    let firmware = if api::virtual_media::uefi(vm) { "UEFI" } else { "BIOS" };
    match api::virtual_media::boot_override(vm) {
        None => format!("no override; firmware {firmware}"),
        Some(o) => format!("override {:?} {:?}; firmware {firmware}", o.target, o.enabled),
    }
}

/// `start`, `stop`, `restart`, `pause`, `unpause`, `softreboot`: the subresource, then
/// (`-o json|yaml`) the VM and its VMI as the action left them (the runStrategy or
/// stateChangeRequests, the VMI's request annotation).
async fn act(
    c: &Common,
    client: &kube::Client,
    vms: &Api<VirtualMachine>,
    vmis: &Api<VirtualMachineInstance>,
    name: &str,
    action: &str,
    body: Value,
) -> anyhow::Result<()> {
    subresource(client, &c.namespace, name, action, &body).await?;
    let doc = if c.output == "table" {
        Value::Null
    } else {
        let vm = vms.get(name).await.map_err(api_err(&format!("get VM {name}")))?;
        let vmi = vmis.get_opt(name).await.ok().flatten();
        serde_json::to_value(VmView { vm, vmi })?
    };
    // virtctl's words: the VMI actions name the VMI.
    let kind = if api::vmi_requests::VmiAction::parse(action).is_some() { "VMI" } else { "VM" };
    report(&c.output, &format!("{kind} {name} was scheduled to {action}"), &doc)
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
