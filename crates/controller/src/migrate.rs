//! `virtplug migrate hotplug-to-declarative`: copy VMI-only hot-plugged volumes into their VM's
//! spec, so that turning on declarative hot-plug (where the VM spec is the truth and the first
//! reconcile unplugs every hot-pluggable VMI volume the VM does not list) unplugs nothing.
//!
//! # Rule (KubeVirt's selection, with the UID check KubeVirt's VM controller makes)
//! For each VMI in phase `Running` whose controller owner reference is a `kubevirt.io/*`
//! `VirtualMachine`: the VM of the same namespace and name, whose UID matches the reference.
//! Its hot-pluggable DataVolume/PVC volumes absent from `VM.spec.template.spec.volumes` are
//! copied verbatim, each with its VMI disk unless the VM already has a disk of that name,
//! appended in VMI order, in one JSON patch per VM whose first op tests
//! `/metadata/resourceVersion`, written through [`client::patch_if`].
//!
//! # Reported, never copied
//! - owner UID mismatch (the VM was deleted and re-created under the same name);
//! - pending `status.volumeRequests` on the VM (never processed after the switch);
//! - a same-named volume whose source differs between VM and VMI (it would be unplugged and
//!   re-plugged with the VM's source);
//! - a VMI-only volume without a VMI disk (the reconcile output would be refused).
//!
//! # Guarantees
//! - Fail closed: the run reports failure (non-zero exit) if any VM failed or was refused.
//! - A conflict (the VM changed between read and patch) re-reads and re-plans only that VM,
//!   up to [`Options::attempts`]; nothing already in the VM is copied again.
//! - Idempotent: a second run over a migrated cluster plans and writes nothing; a re-run after a
//!   partial failure completes the rest.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use client::PatchIfError;
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use serde::Serialize;
use serde_json::{json, Value};
use tracing::Instrument;

use api::kubevirt::{Devices, Volume};
use api::{VirtualMachine, VirtualMachineInstance};

/// A hook run before each patch (tests use it to race or fail a write at the worst moment).
pub type BeforePatch = Arc<dyn Fn(&str, &str, u32) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Options of a run.
#[derive(Clone)]
pub struct Options {
    /// One namespace, or all when `None`.
    pub namespace: Option<String>,
    pub dry_run: bool,
    /// Reads and patches per VM before a conflict is a failure.
    pub attempts: u32,
    #[doc(hidden)]
    pub before_patch: Option<BeforePatch>,
}

impl Default for Options {
    fn default() -> Self {
        Options { namespace: None, dry_run: false, attempts: 5, before_patch: None }
    }
}

/// What happens to one volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Will be copied (dry run).
    Copy,
    /// Was copied.
    Copied,
    /// Not copied, needs an operator (fails the run).
    Refused,
    /// The patch failed (fails the run).
    Failed,
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub namespace: String,
    pub vm: String,
    pub volume: String,
    pub action: Action,
    pub reason: String,
}

/// The result of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// VMs patched.
    pub patched: usize,
}

impl Report {
    /// Whether anything failed or was refused (the run must exit non-zero).
    #[must_use]
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| matches!(f.action, Action::Refused | Action::Failed))
    }
}

/// Errors that stop a run before any VM is considered.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot list {what}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// The plan for one VM, from one VMI and the VM as read.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub findings: Vec<Finding>,
    /// The JSON patch, when there is something to copy.
    pub patch: Option<Value>,
}

/// A volume's source: the volume without its name, as JSON (for the report).
fn source(volume: &Volume) -> Result<Value, serde_json::Error> {
    let mut v = serde_json::to_value(volume)?;
    if let Some(o) = v.as_object_mut() {
        o.remove("name");
    }
    Ok(v)
}

/// The controller owner reference that makes a VMI a VM's, if any: (VM name, VM UID).
#[must_use]
pub fn controlling_vm(vmi: &VirtualMachineInstance) -> Option<(String, String)> {
    vmi.owner_references()
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "VirtualMachine" && r.api_version.starts_with("kubevirt.io/"))
        .map(|r| (r.name.clone(), r.uid.clone()))
}

/// Plans one selected VMI (`Running`, controlled by a `kubevirt.io` VM) against that VM: what
/// to copy, what to report, and the patch (`None` when there is nothing to copy).
/// Pure: no I/O, so every rule is unit-tested.
///
/// # Errors
/// When a volume or disk cannot be encoded as JSON.
pub fn plan(vmi: &VirtualMachineInstance, vm: &VirtualMachine, dry_run: bool) -> Result<Plan, serde_json::Error> {
    let (ns, vm_name) = (vmi.namespace().unwrap_or_default(), vm.name_any());
    let finding = |volume: &str, action, reason: String| Finding {
        namespace: ns.clone(),
        vm: vm_name.clone(),
        volume: volume.to_owned(),
        action,
        reason,
    };
    let template = vm.spec.template.spec.clone().unwrap_or_default();
    let (vm_volumes, vm_disks) = (&template.volumes, &template.domain.devices.disks);
    let candidates: Vec<&Volume> = vmi.spec.volumes.iter().filter(|v| v.is_hotpluggable()).collect();
    let new_to_vm = || candidates.iter().filter(|c| !vm_volumes.iter().any(|v| v.name == c.name));

    let mut findings = Vec::new();
    let (_, owner_uid) = controlling_vm(vmi).unwrap_or_default();
    let vm_uid = vm.uid().unwrap_or_default();
    if owner_uid != vm_uid {
        for c in new_to_vm() {
            findings.push(finding(&c.name, Action::Refused, format!(
                "the VMI's owner reference names VM UID {owner_uid}, but VM {ns}/{vm_name} has UID {vm_uid} (deleted and re-created?); copy by hand if this VM should own it"
            )));
        }
        return Ok(Plan { findings, patch: None });
    }
    let requests = vm.status.as_ref().map_or(0, |s| s.volume_requests.len());
    if requests > 0 {
        for c in new_to_vm() {
            findings.push(finding(&c.name, Action::Refused, format!(
                "the VM has {requests} pending status.volumeRequests, which declarative hot-plug never processes: let them finish with the legacy HotplugVolumes gate on, or clear them (kubectl patch vm {vm_name} -n {ns} --subresource=status --type=json -p '[{{\"op\":\"remove\",\"path\":\"/status/volumeRequests\"}}]'), then run again"
            )));
        }
        return Ok(Plan { findings, patch: None });
    }

    let mut new_volumes = vm_volumes.clone();
    let mut new_disks = vm_disks.clone();
    for c in &candidates {
        let name = c.name.as_str();
        if let Some(existing) = vm_volumes.iter().find(|v| v.name == name) {
            let (theirs, ours) = (source(existing)?, source(c)?);
            if theirs != ours {
                findings.push(finding(name, Action::Refused, format!(
                    "volume {name} has a different source in the VM ({theirs}) than in the running VMI ({ours}): after the switch it would be unplugged and re-plugged from the VM's source; make them agree first"
                )));
            }
            continue;
        }
        let vm_has_disk = vm_disks.iter().any(|d| d.name == name);
        let vmi_disk = vmi.spec.domain.devices.disks.iter().find(|d| d.name == name);
        if !vm_has_disk && vmi_disk.is_none() {
            let why = format!(
                "volume {name} has no disk of the same name on the VMI or the VM; add a disk for it to the VM spec, then run again"
            );
            findings.push(finding(name, Action::Refused, why));
            continue;
        }
        new_volumes.push((*c).clone());
        if let (false, Some(d)) = (vm_has_disk, vmi_disk) {
            new_disks.push(d.clone());
        }
        let what = if vm_has_disk { "volume (the VM already has its disk)" } else { "volume and disk" };
        findings.push(finding(
            name,
            if dry_run { Action::Copy } else { Action::Copied },
            format!("hot-plugged on the VMI only: {what} copied into the VM spec"),
        ));
    }
    if new_volumes.len() == vm_volumes.len() {
        return Ok(Plan { findings, patch: None });
    }
    let copied_disk = new_disks.len() != vm_disks.len();
    let rv = vm.resource_version().map_or(Value::Null, Value::String);
    // Why `test` first: the VM must still be the one this plan was computed from.
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv})];
    // `add` replaces an existing member and creates a missing one; missing parents are added
    // first (an absent template spec has no domain either).
    if vm.spec.template.spec.is_none() {
        ops.push(json!({"op": "add", "path": "/spec/template/spec", "value": {}}));
        if copied_disk {
            ops.push(json!({"op": "add", "path": "/spec/template/spec/domain", "value": {}}));
        }
    }
    ops.push(json!({"op": "add", "path": "/spec/template/spec/volumes", "value": serde_json::to_value(&new_volumes)?}));
    if copied_disk {
        // The whole `devices` (its other lists kept through the typed `extra`): it may be absent.
        let devices = Devices { disks: new_disks, ..template.domain.devices.clone() };
        ops.push(json!({"op": "add", "path": "/spec/template/spec/domain/devices", "value": serde_json::to_value(&devices)?}));
    }
    Ok(Plan { findings, patch: Some(Value::Array(ops)) })
}

/// Runs the migration. Errors only when the VMIs cannot be listed; every per-VM problem is in the
/// report (check [`Report::failed`]).
///
/// # Errors
/// `List` when VMIs cannot be listed.
pub async fn run(client: &kube::Client, opts: &Options) -> Result<Report, MigrateError> {
    let vmis: Api<VirtualMachineInstance> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = vmis.list(&ListParams::default()).await.map_err(|source| MigrateError::List { what: "VirtualMachineInstances", source })?;
    let mut report = Report::default();
    for vmi in list.items.iter().filter(|v| v.is_running()) {
        let Some((vm_name, _)) = controlling_vm(vmi) else { continue };
        let ns = vmi.namespace().unwrap_or_default();
        let span = tracing::info_span!("vm", vm = %format!("{ns}/{vm_name}"));
        migrate_one(client, vmi, &ns, &vm_name, opts, &mut report).instrument(span).await;
    }
    Ok(report)
}

/// Plans and patches one VM through [`client::patch_if`] (a conflict re-plans on a fresh read).
async fn migrate_one(client: &kube::Client, vmi: &VirtualMachineInstance, ns: &str, vm_name: &str, opts: &Options, report: &mut Report) {
    let failed = |volume: &str, reason: String| Finding {
        namespace: ns.to_owned(),
        vm: vm_name.to_owned(),
        volume: volume.to_owned(),
        action: Action::Failed,
        reason,
    };
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let hook = opts.before_patch.clone().map(|hook| {
        let (ns, vm_name) = (ns.to_owned(), vm_name.to_owned());
        let w: client::BeforeWrite = Arc::new(move |attempt| hook(&ns, &vm_name, attempt));
        w
    });
    let patch_opts = client::PatchIfOptions { attempts: opts.attempts, before_write: hook, ..client::PatchIfOptions::default() };
    let mut last: Option<Plan> = None;
    let result = client::patch_if(&vms, vm_name, &patch_opts, |vm| {
        let p = plan(vmi, vm, opts.dry_run)?;
        let patch = p.patch.clone().filter(|_| !opts.dry_run);
        last = Some(p);
        patch.map(serde_json::from_value).transpose()
    })
    .await;
    let findings = last.map(|p| p.findings).unwrap_or_default();
    match result {
        Ok(p) if p.wrote => {
            let names: Vec<&str> = findings.iter().filter(|f| f.action == Action::Copied).map(|f| f.volume.as_str()).collect();
            tracing::info!("added hot-plugged volumes {} to the VM spec", names.join(","));
            report.patched += 1;
            report.findings.extend(findings);
        }
        // The controlling VM is gone (nothing reconciles this VMI), or nothing to write.
        Ok(_) => report.findings.extend(findings),
        Err(PatchIfError::Api { source, .. }) => report.findings.push(failed("-", format!("cannot read the VM: {source}"))),
        Err(PatchIfError::Plan { source, .. }) => report.findings.push(failed("-", format!("internal error building the patch: {source}"))),
        Err(e @ (PatchIfError::Conflict { .. } | PatchIfError::Refused { .. })) => {
            let why = match &e {
                PatchIfError::Conflict { attempts, source, .. } => format!(" after {attempts} attempts (the VM kept changing): {source}"),
                PatchIfError::Refused { source, .. } => format!(": {source}"),
                _ => String::new(),
            };
            for f in findings.into_iter().filter(|f| f.action == Action::Copied) {
                report.findings.push(failed(&f.volume, format!("the patch failed{why}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
        serde_json::from_value(v.clone()).unwrap()
    }

    fn vmi(ns: &str, name: &str, uid: &str, volumes: &Value, disks: &Value) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"namespace": ns, "name": name, "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name, "uid": uid, "controller": true}]},
            "spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}, "status": {"phase": "Running"}})
    }

    /// The upstream fixture `tenant-d/worker-disk`: the VM names the disk, only the volume is missing.
    #[test]
    fn disk_already_on_the_vm_copies_only_the_volume() {
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"namespace": "tenant-d", "name": "worker-disk", "uid": "d", "resourceVersion": "400"},
            "spec": {"template": {"spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}, {"name": "pvc-d", "disk": {"bus": "scsi"}, "serial": "d"}]}},
                "volumes": [{"name": "root", "dataVolume": {"name": "worker-disk-root"}}]}}}});
        let v = vmi(
            "tenant-d",
            "worker-disk",
            "d",
            &json!([{"name": "root", "dataVolume": {"name": "worker-disk-root"}}, {"name": "pvc-d", "dataVolume": {"name": "pvc-d", "hotpluggable": true}}]),
            &json!([{"name": "root", "disk": {"bus": "virtio"}}, {"name": "pvc-d", "disk": {"bus": "scsi"}, "serial": "d"}]),
        );
        let p = plan(&typed(&v), &typed(&vm), false).unwrap();
        assert_eq!(
            p.patch.unwrap(),
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "400"},
                {"op": "add", "path": "/spec/template/spec/volumes", "value": [{"name": "root", "dataVolume": {"name": "worker-disk-root"}}, {"name": "pvc-d", "dataVolume": {"name": "pvc-d", "hotpluggable": true}}]}
            ])
        );
    }

    #[test]
    fn a_volume_without_any_disk_is_reported_not_copied() {
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"namespace": "n", "name": "v", "uid": "u", "resourceVersion": "1"}, "spec": {"template": {"spec": {"domain": {"devices": {}}}}}});
        let v =
            vmi("n", "v", "u", &json!([{"name": "lonely", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]), &json!([]));
        let p = plan(&typed(&v), &typed(&vm), false).unwrap();
        assert_eq!(p.patch, None);
        assert_eq!(p.findings[0].action, Action::Refused);
        assert!(p.findings[0].reason.contains("no disk of the same name"), "{}", p.findings[0].reason);
    }

    #[test]
    fn a_vm_without_template_spec_keys_gets_them_created() {
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"namespace": "n", "name": "v", "uid": "u", "resourceVersion": "7"}, "spec": {"template": {}}});
        let v = vmi(
            "n",
            "v",
            "u",
            &json!([{"name": "d1", "dataVolume": {"name": "d1", "hotpluggable": true}}]),
            &json!([{"name": "d1", "disk": {"bus": "scsi"}}]),
        );
        let mut doc = vm.clone();
        let ops: json_patch::Patch = serde_json::from_value(plan(&typed(&v), &typed(&vm), false).unwrap().patch.unwrap()).unwrap();
        json_patch::patch(&mut doc, &ops).unwrap();
        assert_eq!(doc.pointer("/spec/template/spec/volumes/0/name"), Some(&json!("d1")));
        assert_eq!(doc.pointer("/spec/template/spec/domain/devices/disks/0/name"), Some(&json!("d1")));
    }

    #[test]
    fn only_a_kubevirt_controller_reference_selects_a_vm() {
        let mut v = vmi("n", "v", "u", &json!([]), &json!([]));
        assert_eq!(controlling_vm(&typed(&v)), Some(("v".into(), "u".into())));
        v["metadata"]["ownerReferences"][0]["controller"] = json!(false);
        assert_eq!(controlling_vm(&typed(&v)), None);
        v["metadata"]["ownerReferences"][0]["controller"] = json!(true);
        v["metadata"]["ownerReferences"][0]["apiVersion"] = json!("example.com/v1");
        assert_eq!(controlling_vm(&typed(&v)), None);
    }
}
