//! Declarative hot-plug (KubeVirt's `DeclarativeHotplugVolumes`): make a running VMI's
//! hot-pluggable DataVolume/PVC volumes, and their disks, match its VM's template, by name.
//!
//! [`plan`] is the algorithm, pure and on raw JSON so every field (modelled or not) is carried
//! verbatim; [`reconcile`] sends its patch to the VMI. Port of KubeVirt v1.9's
//! `pkg/storage/hotplug` (research notes: `reference/declarative-hotplug.md` §2).
//!
//! # Rules
//! 1. Kept VMI volumes, in VMI order: every volume that is not declarative-hot-pluggable; a
//!    hot-pluggable one only while the VM has a volume of that name that is either not
//!    hot-pluggable or equal to it (a changed source is dropped now and re-added later).
//! 2. New VM volumes, in VM order: hot-pluggable VM volumes named neither in the VMI spec nor in
//!    `status.volumeStatus` (so a re-add waits until the previous unplug has finished).
//! 3. Kept VMI disks: those with a volume in the result; otherwise kept only if the VM still has
//!    the disk and it is an empty CD-ROM drive (eject, swap).
//! 4. New VM disks, in VM order: disks of new hot-plug volumes that the VMI does not have.
//! 5. Nothing changed → no patch. Reordering the VM's lists alone changes nothing.
//!
//! # Patch
//! `test` of the old volumes, `test` of the old disks, then `replace` of each (or `add` when the
//! old list was empty), so a VMI changed since the read is refused instead of overwritten.

use serde_json::{json, Value};

/// KubeVirt's `IsDeclarativeHotplugVolume`.
#[must_use]
pub fn is_declarative_hotplug(volume: &Value) -> bool {
    volume.pointer("/persistentVolumeClaim/hotpluggable") == Some(&Value::Bool(true))
        || volume.pointer("/dataVolume/hotpluggable") == Some(&Value::Bool(true))
}

fn list<'a>(v: &'a Value, ptr: &str) -> Vec<&'a Value> {
    v.pointer(ptr).and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default()
}

fn name(v: &Value) -> &str {
    v.get("name").and_then(Value::as_str).unwrap_or_default()
}

fn find<'a>(items: &[&'a Value], n: &str) -> Option<&'a Value> {
    items.iter().copied().find(|v| name(v) == n)
}

/// The JSON patch that makes the VMI's hot-plug volumes and disks match `template` (the VM's
/// `spec.template.spec`), or `None` when they already do or the VMI is not `Running`.
#[must_use]
pub fn plan(template: &Value, vmi: &Value) -> Option<Value> {
    if vmi.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
        return None;
    }
    let (t_volumes, t_disks) = (list(template, "/volumes"), list(template, "/domain/devices/disks"));
    let (s_volumes, s_disks) = (list(vmi, "/spec/volumes"), list(vmi, "/spec/domain/devices/disks"));
    let in_status: Vec<&str> = list(vmi, "/status/volumeStatus").into_iter().map(name).collect();

    let mut new_volumes: Vec<Value> = Vec::new();
    for v in &s_volumes {
        if !is_declarative_hotplug(v) {
            new_volumes.push((*v).clone());
            continue;
        }
        match find(&t_volumes, name(v)) {
            None => tracing::debug!(volume = name(v), "removing hotplug volume from VMI, no longer in VM"),
            Some(t) if is_declarative_hotplug(t) && t != *v => {
                tracing::debug!(volume = name(v), "removing hotplug volume from VMI, volume changed");
            }
            Some(_) => new_volumes.push((*v).clone()),
        }
    }
    for t in t_volumes.iter().filter(|t| is_declarative_hotplug(t)) {
        let n = name(t);
        if find(&s_volumes, n).is_none() && !in_status.contains(&n) {
            new_volumes.push((*t).clone());
        }
    }
    let new_volume_refs: Vec<&Value> = new_volumes.iter().collect();

    let mut new_disks: Vec<Value> = Vec::new();
    for d in &s_disks {
        let n = name(d);
        if find(&new_volume_refs, n).is_some() {
            new_disks.push((*d).clone());
            continue;
        }
        let Some(t_disk) = find(&t_disks, n) else { continue };
        let waiting_readd = find(&t_volumes, n).is_some();
        if waiting_readd && (t_disk.get("cdrom").is_none() || d.get("cdrom").is_none()) {
            continue;
        }
        new_disks.push((*d).clone());
    }
    for t in &t_disks {
        let n = name(t);
        if find(&new_volume_refs, n).is_some_and(is_declarative_hotplug) && find(&s_disks, n).is_none() {
            new_disks.push((*t).clone());
        }
    }

    let same = |old: &[&Value], new: &[Value]| old.len() == new.len() && old.iter().zip(new).all(|(a, b)| *a == b);
    if same(&s_volumes, &new_volumes) && same(&s_disks, &new_disks) {
        return None;
    }
    let old = |ptr: &str| vmi.pointer(ptr).cloned().unwrap_or(Value::Null);
    let set = |path: &str, old_empty: bool, value: Vec<Value>| json!({"op": if old_empty { "add" } else { "replace" }, "path": path, "value": value});
    let mut ops = Vec::new();
    // The tests: the VMI must still have the lists this plan was computed from (a missing list
    // is tested as absent through `add` below, so only present lists are tested).
    if vmi.pointer("/spec/volumes").is_some() {
        ops.push(json!({"op": "test", "path": "/spec/volumes", "value": old("/spec/volumes")}));
    }
    if vmi.pointer("/spec/domain/devices/disks").is_some() {
        ops.push(json!({"op": "test", "path": "/spec/domain/devices/disks", "value": old("/spec/domain/devices/disks")}));
    }
    ops.push(set("/spec/volumes", s_volumes.is_empty(), new_volumes));
    ops.push(set("/spec/domain/devices/disks", s_disks.is_empty(), new_disks));
    Some(Value::Array(ops))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dv(n: &str) -> Value {
        json!({"name": n, "dataVolume": {"name": format!("{n}-dv"), "hotpluggable": true}})
    }
    fn pvc(n: &str) -> Value {
        json!({"name": n, "persistentVolumeClaim": {"claimName": format!("{n}-pvc"), "hotpluggable": true}})
    }
    fn perm(n: &str) -> Value {
        json!({"name": n, "persistentVolumeClaim": {"claimName": n}})
    }
    fn disk(n: &str) -> Value {
        json!({"name": n, "disk": {"bus": "scsi"}})
    }
    fn cdrom(n: &str) -> Value {
        json!({"name": n, "cdrom": {"bus": "sata"}})
    }
    fn template(volumes: &[Value], disks: &[Value]) -> Value {
        json!({"domain": {"devices": {"disks": disks}}, "volumes": volumes})
    }
    fn vmi(volumes: &[Value], disks: &[Value]) -> Value {
        json!({"spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}, "status": {"phase": "Running"}})
    }
    /// Applies the plan and returns the VMI's (volume names, disk names).
    fn after(t: &Value, v: &Value) -> (Vec<String>, Vec<String>) {
        let mut doc = v.clone();
        if let Some(p) = plan(t, v) {
            let ops: json_patch::Patch = serde_json::from_value(p).unwrap();
            json_patch::patch(&mut doc, &ops).unwrap();
        }
        let names = |ptr| list(&doc, ptr).into_iter().map(|x| name(x).to_owned()).collect();
        (names("/spec/volumes"), names("/spec/domain/devices/disks"))
    }
    fn n(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn vmi_not_running_is_left_alone() {
        let mut v = vmi(&[perm("perm")], &[disk("perm")]);
        v["status"]["phase"] = json!("Scheduled");
        assert_eq!(plan(&template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]), &v), None);
        v["status"] = json!({});
        assert_eq!(plan(&template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]), &v), None);
    }

    #[test]
    fn a_non_hotplug_volume_added_to_the_vm_waits_for_restart() {
        let v = vmi(&[perm("perm")], &[disk("perm")]);
        assert_eq!(plan(&template(&[perm("perm"), perm("other")], &[disk("perm"), disk("other")]), &v), None);
    }

    #[test]
    fn adds_one_and_five_hotplug_volumes_of_each_kind() {
        for make in [dv as fn(&str) -> Value, pvc] {
            for count in [1, 5] {
                let names: Vec<String> = (0..count).map(|i| format!("hp{i}")).collect();
                let mut vols = vec![perm("perm")];
                let mut disks = vec![disk("perm")];
                for x in &names {
                    vols.push(make(x));
                    disks.push(disk(x));
                }
                let t = template(&vols, &disks);
                let (v, d) = after(&t, &vmi(&[perm("perm")], &[disk("perm")]));
                let mut want = n(&["perm"]);
                want.extend(names.clone());
                assert_eq!((v, d), (want.clone(), want));
            }
        }
    }

    #[test]
    fn removes_hotplug_volumes_at_any_position() {
        for make in [dv as fn(&str) -> Value, pvc] {
            let all = ["a", "b", "c"];
            for removed in 0..3 {
                let vols: Vec<Value> = std::iter::once(perm("perm")).chain(all.iter().map(|x| make(x))).collect();
                let disks: Vec<Value> = std::iter::once(disk("perm")).chain(all.iter().map(|x| disk(x))).collect();
                let keep: Vec<&str> = all.iter().enumerate().filter(|(i, _)| *i != removed).map(|(_, x)| *x).collect();
                let t = template(
                    &std::iter::once(perm("perm")).chain(keep.iter().map(|x| make(x))).collect::<Vec<_>>(),
                    &std::iter::once(disk("perm")).chain(keep.iter().map(|x| disk(x))).collect::<Vec<_>>(),
                );
                let mut want = n(&["perm"]);
                want.extend(keep.iter().map(|s| (*s).to_owned()));
                assert_eq!(after(&t, &vmi(&vols, &disks)), (want.clone(), want));
            }
            // The single-volume case.
            let t = template(&[perm("perm")], &[disk("perm")]);
            assert_eq!(after(&t, &vmi(&[perm("perm"), make("x")], &[disk("perm"), disk("x")])), (n(&["perm"]), n(&["perm"])));
        }
    }

    #[test]
    fn a_permanent_volume_removed_from_the_vm_stays() {
        let t = template(&[], &[]);
        assert_eq!(plan(&t, &vmi(&[perm("perm")], &[disk("perm")])), None);
    }

    #[test]
    fn a_volume_still_in_volume_status_is_not_re_added() {
        let t = template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]);
        let mut v = vmi(&[perm("perm")], &[disk("perm")]);
        v["status"]["volumeStatus"] = json!([{"name": "a", "phase": "Detaching"}]);
        assert_eq!(plan(&t, &v), None);
    }

    #[test]
    fn a_changed_source_is_unplugged_first_and_re_plugged_after_its_status_clears() {
        let mut changed = dv("a");
        changed["dataVolume"]["name"] = json!("other-dv");
        let t = template(&[perm("perm"), changed.clone()], &[disk("perm"), disk("a")]);
        let mut v = vmi(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]);
        assert_eq!(after(&t, &v), (n(&["perm"]), n(&["perm"])), "first pass removes it");
        // While the unplug runs the status entry holds the name: no re-add.
        v = vmi(&[perm("perm")], &[disk("perm")]);
        v["status"]["volumeStatus"] = json!([{"name": "a", "phase": "Detaching"}]);
        assert_eq!(plan(&t, &v), None);
        // Status cleared: re-added with the new source.
        v["status"]["volumeStatus"] = json!([]);
        let p = plan(&t, &v).unwrap();
        assert_eq!(p[2]["value"][1], changed);
    }

    #[test]
    fn inject_swap_and_eject_cdrom_media_on_existing_drives() {
        for drives in [1, 5] {
            let names: Vec<String> = (0..drives).map(|i| format!("cd{i}")).collect();
            let disks: Vec<Value> = std::iter::once(disk("perm")).chain(names.iter().map(|x| cdrom(x))).collect();
            let empty = vmi(&[perm("perm")], &disks);
            let vols: Vec<Value> = std::iter::once(perm("perm")).chain(names.iter().map(|x| dv(x))).collect();
            let (v, d) = after(&template(&vols, &disks), &empty);
            let mut want = n(&["perm"]);
            want.extend(names.clone());
            assert_eq!(v, want, "inject: volumes added");
            assert_eq!(d, want, "inject: disks unchanged");
        }
        // Eject at any position: the volume goes, the drive stays.
        for removed in 0..3 {
            let names = ["c0", "c1", "c2"];
            let disks: Vec<Value> = names.iter().map(|x| cdrom(x)).collect();
            let full = vmi(&names.iter().map(|x| dv(x)).collect::<Vec<_>>(), &disks);
            let keep: Vec<Value> = names.iter().enumerate().filter(|(i, _)| *i != removed).map(|(_, x)| dv(x)).collect();
            let (v, d) = after(&template(&keep, &disks), &full);
            assert_eq!(v.len(), 2);
            assert_eq!(d, n(&names), "eject keeps the drive");
        }
        // Swap: a changed medium is ejected (drive kept), then inserted once its status clears.
        let mut iso2 = dv("cd0");
        iso2["dataVolume"]["name"] = json!("iso2");
        let t = template(&[iso2.clone()], &[cdrom("cd0")]);
        assert_eq!(after(&t, &vmi(&[dv("cd0")], &[cdrom("cd0")])), (n(&[]), n(&["cd0"])));
        assert_eq!(after(&t, &vmi(&[], &[cdrom("cd0")])), (n(&["cd0"]), n(&["cd0"])));
    }

    #[test]
    fn a_non_hotplug_medium_on_an_empty_drive_is_ignored() {
        let t = template(&[perm("cd0")], &[cdrom("cd0")]);
        assert_eq!(plan(&t, &vmi(&[], &[cdrom("cd0")])), None);
    }

    #[test]
    fn a_same_named_non_hotplug_vm_volume_keeps_the_vmi_entry() {
        let t = template(&[perm("a")], &[disk("a")]);
        assert_eq!(plan(&t, &vmi(&[dv("a")], &[disk("a")])), None);
    }

    #[test]
    fn reordering_alone_writes_nothing_and_new_entries_follow_vm_order() {
        let v = vmi(&[perm("perm"), dv("a"), dv("b")], &[disk("perm"), disk("a"), disk("b")]);
        assert_eq!(plan(&template(&[dv("b"), dv("a"), perm("perm")], &[disk("b"), disk("perm"), disk("a")]), &v), None);
        let t = template(&[dv("z"), dv("b"), dv("y"), dv("a"), perm("perm")], &[disk("z"), disk("b"), disk("y"), disk("a"), disk("perm")]);
        assert_eq!(after(&t, &v), (n(&["perm", "a", "b", "z", "y"]), n(&["perm", "a", "b", "z", "y"])));
    }

    #[test]
    fn the_patch_tests_both_old_lists_then_replaces_or_adds() {
        let t = template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]);
        let v = vmi(&[perm("perm")], &[disk("perm")]);
        let p = plan(&t, &v).unwrap();
        let ops: Vec<(&str, &str)> =
            p.as_array().unwrap().iter().map(|o| (o["op"].as_str().unwrap(), o["path"].as_str().unwrap())).collect();
        assert_eq!(
            ops,
            [
                ("test", "/spec/volumes"),
                ("test", "/spec/domain/devices/disks"),
                ("replace", "/spec/volumes"),
                ("replace", "/spec/domain/devices/disks")
            ]
        );
        assert_eq!(p[0]["value"], json!([perm("perm")]));
        // An empty old list becomes `add`.
        let p = plan(&template(&[dv("a")], &[disk("a")]), &vmi(&[], &[])).unwrap();
        assert_eq!(p[2]["op"], "add");
        // A VMI that changed since the read fails the test.
        let mut changed = v.clone();
        changed["spec"]["volumes"] = json!([perm("perm"), dv("x")]);
        let ops: json_patch::Patch = serde_json::from_value(plan(&t, &v).unwrap()).unwrap();
        assert!(json_patch::patch(&mut changed, &ops).is_err());
    }

    /// The tenant-d shape: a VM disk whose volume is missing. The plan drops the VMI's hot-plug
    /// volume (the VM lacks it) but keeps the disk (the VM still has it): a non-CD-ROM disk without
    /// a volume, output that admission refuses — which is why the migration must run first.
    #[test]
    fn a_vm_disk_without_volume_yields_output_admission_refuses() {
        let t = template(&[perm("root")], &[disk("root"), disk("pvc-d")]);
        let v = vmi(&[perm("root"), dv("pvc-d")], &[disk("root"), disk("pvc-d")]);
        let mut doc = v.clone();
        let ops: json_patch::Patch = serde_json::from_value(plan(&t, &v).unwrap()).unwrap();
        json_patch::patch(&mut doc, &ops).unwrap();
        let spec: api::kubevirt::VirtualMachineInstanceSpec = serde_json::from_value(doc["spec"].clone()).unwrap();
        let causes = api::invariants::check(&spec, "spec");
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec.domain.devices.disks[1].name");
    }
}

/// Errors of [`reconcile`].
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("cannot read {what} {object}")]
    Read {
        what: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("VMI {object}: the declarative hot-plug patch was refused")]
    Patch {
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("VMI {object} kept changing; gave up after {attempts} attempts")]
    Conflict { object: String, attempts: u32 },
}

/// A hook run before each VMI patch (tests use it to inject a conflict).
pub type BeforePatch = std::sync::Arc<dyn Fn(u32) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// Reconciles the VMI of VM `ns/name` once: reads both, plans, patches the VMI. A patch whose
/// `test` fails (the VMI changed since the read) is re-planned on a fresh read, up to
/// `attempts` times. Returns whether a patch was written.
///
/// # Errors
/// `Read`, `Patch` (e.g. admission refused the output), `Conflict` after the attempts.
pub async fn reconcile(
    client: &kube::Client,
    ns: &str,
    name: &str,
    attempts: u32,
    before_patch: Option<&BeforePatch>,
) -> Result<bool, ReconcileError> {
    use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<api::VirtualMachine>(&()));
    let vmis: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<api::VirtualMachineInstance>(&()));
    let object = format!("{ns}/{name}");
    let attempts = attempts.max(1);
    for attempt in 1..=attempts {
        let read = |what, source| ReconcileError::Read { what, object: object.clone(), source };
        let Some(vm) = vms.get_opt(name).await.map_err(|e| read("VM", e))? else { return Ok(false) };
        let Some(vmi) = vmis.get_opt(name).await.map_err(|e| read("VMI", e))? else { return Ok(false) };
        let (vm, vmi) = (serde_json::to_value(&vm).unwrap_or(Value::Null), serde_json::to_value(&vmi).unwrap_or(Value::Null));
        let template = vm.pointer("/spec/template/spec").cloned().unwrap_or(Value::Null);
        let Some(patch) = plan(&template, &vmi) else { return Ok(false) };
        if let Some(hook) = before_patch {
            hook(attempt).await;
        }
        let ops: json_patch::Patch = serde_json::from_value(patch)
            .map_err(|e| ReconcileError::Patch { object: object.clone(), source: kube::Error::SerdeError(e) })?;
        match vmis.patch(name, &PatchParams::default(), &Patch::Json::<()>(ops)).await {
            Ok(_) => return Ok(true),
            Err(source @ kube::Error::Api(_)) => {
                // A failed `test` (422) or a 409 is a conflict only if the VMI really changed
                // since the read; otherwise (admission refused the output) retrying cannot help.
                let read_rv = vmi.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_owned);
                let now_rv = vmis.get_opt(name).await.ok().flatten().and_then(|v| v.metadata.resource_version);
                if now_rv == read_rv {
                    return Err(ReconcileError::Patch { object, source });
                }
                tracing::info!(
                    "VMI {object} changed while its hot-plug patch was prepared, retrying on a fresh copy (attempt {attempt}/{attempts})"
                );
            }
            Err(source) => return Err(ReconcileError::Patch { object, source }),
        }
    }
    Err(ReconcileError::Conflict { object, attempts })
}

/// The controller's part of a running VMI's `status.volumeStatus` (DESIGN "Hot-plug volume
/// status"): a hot-plug volume in the VMI spec without an entry gets one, `Pending`
/// (`PVCNotReady`) until its claim is bound and, for a DataVolume, its import has succeeded,
/// then `Bound` (`PVCBound`) with the claim's info. It only ever creates an entry or moves it
/// `Pending` → `Bound`: an entry already in the phase it would write is left as it is (the node
/// agent writes its own reason and message there — two writers rewriting each other's message
/// would wake each other forever), and entries past `Bound` belong to the node agent — except
/// `persistentVolumeClaimInfo`, the controller's field, which it fills in once wherever it is
/// missing (the agent may create an entry first when it reacts to the spec faster than this
/// status write).
///
/// # Errors
/// When a read or the status write fails.
pub async fn report_claims(client: &kube::Client, vmi: &api::VirtualMachineInstance) -> Result<(), client::UpdateError<client::Never>> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::api::Api;
    use kube::ResourceExt;
    if vmi.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") || vmi.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let ns = vmi.namespace().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let dvs: Api<api::DataVolume> = Api::namespaced(client.clone(), &ns);
    let api_err = |e: kube::Error| client::UpdateError::Api {
        kind: "VirtualMachineInstance".into(),
        object: format!("{ns}/{}", vmi.name_any()),
        source: e,
    };
    let mut wanted = Vec::new();
    for v in vmi.spec.volumes.iter().filter(|v| v.is_hotpluggable()) {
        let entry = vmi.status.as_ref().and_then(|s| s.volume_status.iter().find(|e| e.name == v.name));
        let past_pending = entry.is_some_and(|e| !matches!(e.phase.as_deref(), None | Some("" | "Pending")));
        if past_pending && entry.is_some_and(|e| e.persistent_volume_claim_info.is_some()) {
            continue;
        }
        let claim = v
            .persistent_volume_claim
            .as_ref()
            .map(|p| p.claim_name.clone())
            .or_else(|| v.data_volume.as_ref().map(|d| d.name.clone()))
            .unwrap_or_default();
        let pvc = pvcs.get_opt(&claim).await.map_err(api_err)?;
        let bound = pvc.as_ref().is_some_and(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"));
        let imported = match &v.data_volume {
            Some(d) => {
                dvs.get_opt(&d.name).await.map_err(api_err)?.and_then(|dv| dv.status).and_then(|s| s.phase).as_deref() == Some("Succeeded")
            }
            None => true,
        };
        let info = pvc.as_ref().map(|p| api::kubevirt::PersistentVolumeClaimInfo {
            claim_name: Some(claim.clone()),
            access_modes: p.spec.as_ref().and_then(|s| s.access_modes.clone()).unwrap_or_default(),
            volume_mode: Some(p.spec.as_ref().and_then(|s| s.volume_mode.clone()).unwrap_or_else(|| "Filesystem".into())),
            capacity: p.status.as_ref().and_then(|s| s.capacity.clone()).unwrap_or_default().into_iter().collect(),
            requests: p
                .spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.clone())
                .unwrap_or_default()
                .into_iter()
                .collect(),
            ..Default::default()
        });
        let (phase, reason, message) = if bound && imported {
            ("Bound", "PVCBound", format!("PVC {claim} is in phase Bound"))
        } else if pvc.is_none() {
            ("Pending", "PVCNotReady", format!("PVC {claim} does not exist yet"))
        } else {
            ("Pending", "PVCNotReady", format!("PVC {claim} is not ready (not bound or still importing)"))
        };
        // Past Pending the phase is the agent's: only the missing claim info is written.
        let phase = if past_pending { None } else { Some((phase, reason, message)) };
        wanted.push((v.name.clone(), phase, info));
    }
    if wanted.is_empty() {
        return Ok(());
    }
    let vmis: Api<api::VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    client::update_status(&vmis, &vmi.name_any(), |cur: &mut api::VirtualMachineInstance| {
        let names: Vec<String> = cur.spec.volumes.iter().map(|v| v.name.clone()).collect();
        let st = cur.status.get_or_insert_with(Default::default);
        for (name, phase, info) in &wanted {
            if !names.contains(name) {
                continue; // unplugged meanwhile
            }
            let Some((phase, reason, message)) = phase else {
                if let Some(e) = st.volume_status.iter_mut().find(|e| &e.name == name && e.persistent_volume_claim_info.is_none()) {
                    e.persistent_volume_claim_info.clone_from(info);
                }
                continue;
            };
            let idx = match st.volume_status.iter().position(|e| &e.name == name) {
                Some(i) => i,
                None => {
                    st.volume_status.push(api::kubevirt::VolumeStatus {
                        name: name.clone(),
                        hotplug_volume: Some(api::kubevirt::HotplugVolumeStatus::default()),
                        ..Default::default()
                    });
                    st.volume_status.len() - 1
                }
            };
            let e = &mut st.volume_status[idx];
            let from = e.phase.clone().unwrap_or_default();
            // Create, or Pending → Bound; nothing else (see the doc comment).
            let moves = from.is_empty() || (from == "Pending" && *phase == "Bound");
            if !moves {
                continue;
            }
            e.transition(phase, reason, message);
            if info.is_some() {
                e.persistent_volume_claim_info.clone_from(info);
            }
        }
    })
    .await
    .map(|_| ())
}
