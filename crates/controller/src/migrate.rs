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
//! `/metadata/resourceVersion`.
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

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde::Serialize;
use serde_json::{json, Value};

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

fn arr<'a>(v: &'a Value, ptr: &str) -> &'a [Value] {
    v.pointer(ptr).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn name_of(v: &Value) -> &str {
    v.get("name").and_then(Value::as_str).unwrap_or_default()
}

fn is_hotplug(volume: &Value) -> bool {
    volume.pointer("/dataVolume/hotpluggable") == Some(&Value::Bool(true))
        || volume.pointer("/persistentVolumeClaim/hotpluggable") == Some(&Value::Bool(true))
}

/// The source of a volume: the volume without its name.
fn source(volume: &Value) -> Value {
    let mut v = volume.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("name");
    }
    v
}

/// The controller owner reference that makes a VMI a VM's, if any.
#[must_use]
pub fn controlling_vm(vmi: &Value) -> Option<(String, String)> {
    arr(vmi, "/metadata/ownerReferences").iter().find_map(|r| {
        let ok = r.get("controller") == Some(&Value::Bool(true))
            && r.get("kind").and_then(Value::as_str) == Some("VirtualMachine")
            && r.get("apiVersion").and_then(Value::as_str).is_some_and(|a| a.starts_with("kubevirt.io/"));
        ok.then(|| {
            (
                r.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                r.get("uid").and_then(Value::as_str).unwrap_or_default().to_owned(),
            )
        })
    })
}

/// Plans one selected VMI (`Running`, controlled by a `kubevirt.io` VM) against that VM: what
/// to copy, what to report, and the patch (`None` when there is nothing to copy).
/// Pure: no I/O, so every rule is unit-tested.
#[must_use]
pub fn plan(vmi: &Value, vm: &Value, dry_run: bool) -> Plan {
    let ns = vmi.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default().to_owned();
    let vm_name = vm.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let finding = |volume: &str, action, reason: String| Finding {
        namespace: ns.clone(),
        vm: vm_name.clone(),
        volume: volume.to_owned(),
        action,
        reason,
    };
    let vm_volumes = arr(vm, "/spec/template/spec/volumes");
    let vm_disks = arr(vm, "/spec/template/spec/domain/devices/disks");
    let vmi_disks = arr(vmi, "/spec/domain/devices/disks");
    let candidates: Vec<&Value> = arr(vmi, "/spec/volumes").iter().filter(|v| is_hotplug(v)).collect();

    let mut findings = Vec::new();
    let (_, owner_uid) = controlling_vm(vmi).unwrap_or_default();
    let vm_uid = vm.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    if owner_uid != vm_uid {
        for c in candidates.iter().filter(|c| !vm_volumes.iter().any(|v| name_of(v) == name_of(c))) {
            findings.push(finding(name_of(c), Action::Refused, format!(
                "the VMI's owner reference names VM UID {owner_uid}, but VM {ns}/{vm_name} has UID {vm_uid} (deleted and re-created?); copy by hand if this VM should own it"
            )));
        }
        return Plan { findings, patch: None };
    }
    let requests = arr(vm, "/status/volumeRequests").len();
    if requests > 0 {
        for c in candidates.iter().filter(|c| !vm_volumes.iter().any(|v| name_of(v) == name_of(c))) {
            findings.push(finding(name_of(c), Action::Refused, format!(
                "the VM has {requests} pending status.volumeRequests, which declarative hot-plug never processes: let them finish with the legacy HotplugVolumes gate on, or clear them (kubectl patch vm {vm_name} -n {ns} --subresource=status --type=json -p '[{{\"op\":\"remove\",\"path\":\"/status/volumeRequests\"}}]'), then run again"
            )));
        }
        return Plan { findings, patch: None };
    }

    let mut new_volumes: Vec<Value> = vm_volumes.to_vec();
    let mut new_disks: Vec<Value> = vm_disks.to_vec();
    let mut copied_disk = false;
    for c in &candidates {
        let name = name_of(c);
        if let Some(existing) = vm_volumes.iter().find(|v| name_of(v) == name) {
            if source(existing) != source(c) {
                findings.push(finding(name, Action::Refused, format!(
                    "volume {name} has a different source in the VM ({}) than in the running VMI ({}): after the switch it would be unplugged and re-plugged from the VM's source; make them agree first",
                    source(existing), source(c)
                )));
            }
            continue;
        }
        let vm_has_disk = vm_disks.iter().any(|d| name_of(d) == name);
        let vmi_disk = vmi_disks.iter().find(|d| name_of(d) == name);
        if !vm_has_disk && vmi_disk.is_none() {
            findings.push(finding(
                name,
                Action::Refused,
                format!(
                    "volume {name} has no disk of the same name on the VMI or the VM; add a disk for it to the VM spec, then run again"
                ),
            ));
            continue;
        }
        new_volumes.push((*c).clone());
        if let (false, Some(d)) = (vm_has_disk, vmi_disk) {
            new_disks.push(d.clone());
            copied_disk = true;
        }
        let what = if vm_has_disk { "volume (the VM already has its disk)" } else { "volume and disk" };
        findings.push(finding(
            name,
            if dry_run { Action::Copy } else { Action::Copied },
            format!("hot-plugged on the VMI only: {what} copied into the VM spec"),
        ));
    }
    if new_volumes.len() == vm_volumes.len() {
        return Plan { findings, patch: None };
    }
    let rv = vm.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
    // Why `test` first: the VM must still be the one this plan was computed from.
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv})];
    // `add` replaces an existing member and creates a missing one; parents are created too.
    for (ptr, parent) in [
        ("/spec/template/spec", "/spec/template/spec"),
        ("/spec/template/spec/domain", "/spec/template/spec/domain"),
        ("/spec/template/spec/domain/devices", "/spec/template/spec/domain/devices"),
    ] {
        if vm.pointer(ptr).is_none() && (copied_disk || ptr == "/spec/template/spec") {
            ops.push(json!({"op": "add", "path": parent, "value": {}}));
        }
    }
    ops.push(json!({"op": "add", "path": "/spec/template/spec/volumes", "value": new_volumes}));
    if copied_disk {
        ops.push(json!({"op": "add", "path": "/spec/template/spec/domain/devices/disks", "value": new_disks}));
    }
    Plan { findings, patch: Some(Value::Array(ops)) }
}

/// Runs the migration. Errors only when the VMIs cannot be listed; every per-VM problem is in the
/// report (check [`Report::failed`]).
///
/// # Errors
/// `List` when VMIs cannot be listed.
pub async fn run(client: &kube::Client, opts: &Options) -> Result<Report, MigrateError> {
    let (vmi_res, vm_res) = (ApiResource::erase::<api::VirtualMachineInstance>(&()), ApiResource::erase::<api::VirtualMachine>(&()));
    let vmis: Api<DynamicObject> = match &opts.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &vmi_res),
        None => Api::all_with(client.clone(), &vmi_res),
    };
    let list = vmis.list(&ListParams::default()).await.map_err(|source| MigrateError::List { what: "VirtualMachineInstances", source })?;
    let mut report = Report::default();
    for item in list.items {
        let vmi = serde_json::to_value(&item).unwrap_or(Value::Null);
        if vmi.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
            continue;
        }
        let Some((vm_name, _)) = controlling_vm(&vmi) else { continue };
        let ns = item.metadata.namespace.clone().unwrap_or_default();
        let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &vm_res);
        migrate_one(&vms, &vmi, &ns, &vm_name, opts, &mut report).await;
    }
    Ok(report)
}

async fn migrate_one(vms: &Api<DynamicObject>, vmi: &Value, ns: &str, vm_name: &str, opts: &Options, report: &mut Report) {
    let failed = |volume: &str, reason: String| Finding {
        namespace: ns.to_owned(),
        vm: vm_name.to_owned(),
        volume: volume.to_owned(),
        action: Action::Failed,
        reason,
    };
    let attempts = opts.attempts.max(1);
    for attempt in 1..=attempts {
        let vm = match vms.get_opt(vm_name).await {
            Ok(Some(vm)) => serde_json::to_value(&vm).unwrap_or(Value::Null),
            Ok(None) => return, // the controlling VM is gone: nothing reconciles this VMI
            Err(e) => {
                report.findings.push(failed("-", format!("cannot read the VM: {e}")));
                return;
            }
        };
        let plan = plan(vmi, &vm, opts.dry_run);
        let Some(patch) = plan.patch.clone() else {
            report.findings.extend(plan.findings);
            return;
        };
        if opts.dry_run {
            report.findings.extend(plan.findings);
            return;
        }
        if let Some(hook) = &opts.before_patch {
            hook(ns, vm_name, attempt).await;
        }
        let ops: json_patch::Patch = match serde_json::from_value(patch) {
            Ok(p) => p,
            Err(e) => {
                report.findings.push(failed("-", format!("internal error building the patch: {e}")));
                return;
            }
        };
        match vms.patch(vm_name, &PatchParams::default(), &Patch::Json::<()>(ops)).await {
            Ok(_) => {
                let names: Vec<&str> = plan.findings.iter().filter(|f| f.action == Action::Copied).map(|f| f.volume.as_str()).collect();
                tracing::info!("VM {ns}/{vm_name}: added hot-plugged volumes {} to the VM spec", names.join(","));
                report.patched += 1;
                report.findings.extend(plan.findings);
                return;
            }
            Err(e) => {
                // A failed `test` (422) or a 409 means the VM changed since the read: re-plan
                // that VM on a fresh read. Anything else fails it.
                let changed = matches!(&e, kube::Error::Api(s) if s.code == 409 || s.code == 422)
                    && vms.get_opt(vm_name).await.ok().flatten().and_then(|v| v.metadata.resource_version)
                        != vm.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_owned);
                if changed && attempt < attempts {
                    tracing::info!("VM {ns}/{vm_name} changed while its patch was prepared, re-planning on a fresh copy (attempt {attempt}/{attempts})");
                    continue;
                }
                for f in plan.findings.into_iter().filter(|f| f.action == Action::Copied) {
                    report.findings.push(failed(
                        &f.volume,
                        format!(
                            "the patch failed{}: {e}",
                            if changed { format!(" after {attempt} attempts (the VM kept changing)") } else { String::new() }
                        ),
                    ));
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(ns: &str, name: &str, uid: &str, volumes: &Value, disks: &Value) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"namespace": ns, "name": name, "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name, "uid": uid, "controller": true}]},
            "spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}, "status": {"phase": "Running"}})
    }

    /// The upstream fixture `tenant-d/worker-disk`: the VM names the disk, only the volume is missing.
    #[test]
    fn disk_already_on_the_vm_copies_only_the_volume() {
        let vm = json!({"metadata": {"namespace": "tenant-d", "name": "worker-disk", "uid": "d", "resourceVersion": "400"},
            "spec": {"template": {"spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}, {"name": "pvc-d", "disk": {"bus": "scsi"}, "serial": "d"}]}},
                "volumes": [{"name": "root", "dataVolume": {"name": "worker-disk-root"}}]}}}});
        let v = vmi(
            "tenant-d",
            "worker-disk",
            "d",
            &json!([{"name": "root", "dataVolume": {"name": "worker-disk-root"}}, {"name": "pvc-d", "dataVolume": {"name": "pvc-d", "hotpluggable": true}}]),
            &json!([{"name": "root", "disk": {"bus": "virtio"}}, {"name": "pvc-d", "disk": {"bus": "scsi"}, "serial": "d"}]),
        );
        let p = plan(&v, &vm, false);
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
        let vm = json!({"metadata": {"namespace": "n", "name": "v", "uid": "u", "resourceVersion": "1"}, "spec": {"template": {"spec": {"domain": {"devices": {}}}}}});
        let v =
            vmi("n", "v", "u", &json!([{"name": "lonely", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]), &json!([]));
        let p = plan(&v, &vm, false);
        assert_eq!(p.patch, None);
        assert_eq!(p.findings[0].action, Action::Refused);
        assert!(p.findings[0].reason.contains("no disk of the same name"), "{}", p.findings[0].reason);
    }

    #[test]
    fn a_vm_without_template_spec_keys_gets_them_created() {
        let vm = json!({"metadata": {"namespace": "n", "name": "v", "uid": "u", "resourceVersion": "7"}, "spec": {"template": {}}});
        let v = vmi(
            "n",
            "v",
            "u",
            &json!([{"name": "d1", "dataVolume": {"name": "d1", "hotpluggable": true}}]),
            &json!([{"name": "d1", "disk": {"bus": "scsi"}}]),
        );
        let mut doc = vm.clone();
        let ops: json_patch::Patch = serde_json::from_value(plan(&v, &vm, false).patch.unwrap()).unwrap();
        json_patch::patch(&mut doc, &ops).unwrap();
        assert_eq!(doc.pointer("/spec/template/spec/volumes/0/name"), Some(&json!("d1")));
        assert_eq!(doc.pointer("/spec/template/spec/domain/devices/disks/0/name"), Some(&json!("d1")));
    }

    #[test]
    fn only_a_kubevirt_controller_reference_selects_a_vm() {
        let mut v = vmi("n", "v", "u", &json!([]), &json!([]));
        assert_eq!(controlling_vm(&v), Some(("v".into(), "u".into())));
        v["metadata"]["ownerReferences"][0]["controller"] = json!(false);
        assert_eq!(controlling_vm(&v), None);
        v["metadata"]["ownerReferences"][0]["controller"] = json!(true);
        v["metadata"]["ownerReferences"][0]["apiVersion"] = json!("example.com/v1");
        assert_eq!(controlling_vm(&v), None);
    }
}
