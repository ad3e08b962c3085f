//! The declarative hot-plug plan: pure, typed, and every rule unit-tested (see [`super`] for
//! the rules). Its output is a JSON patch, the edge where the typed model meets the wire.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation, TestOperation};
use serde_json::Value;

use api::kubevirt::{Disk, VirtualMachineInstanceSpec, Volume};
use api::VirtualMachineInstance;

/// The JSON patch that makes the VMI's hot-plug volumes and disks match `template` (the VM's
/// `spec.template.spec`), or `None` when they already do or the VMI is not `Running`.
///
/// # Errors
/// When the lists cannot be encoded as JSON.
pub fn plan(template: &VirtualMachineInstanceSpec, vmi: &VirtualMachineInstance) -> Result<Option<Patch>, serde_json::Error> {
    if !vmi.is_running() {
        return Ok(None);
    }
    match wanted(template, vmi) {
        Some((volumes, disks)) => patch(&vmi.spec, &volumes, &disks).map(Some),
        None => Ok(None),
    }
}

fn find<'a, T>(items: &'a [T], name: &str, name_of: impl Fn(&T) -> &str) -> Option<&'a T> {
    items.iter().find(|x| name_of(x) == name)
}

fn volume<'a>(items: &'a [Volume], name: &str) -> Option<&'a Volume> {
    find(items, name, |v| &v.name)
}

fn disk<'a>(items: &'a [Disk], name: &str) -> Option<&'a Disk> {
    find(items, name, |d| &d.name)
}

/// The VMI's volumes and disks as the rules want them, `None` when they already are.
fn wanted(template: &VirtualMachineInstanceSpec, vmi: &VirtualMachineInstance) -> Option<(Vec<Volume>, Vec<Disk>)> {
    let (t_volumes, t_disks) = (&template.volumes, &template.domain.devices.disks);
    let (s_volumes, s_disks) = (&vmi.spec.volumes, &vmi.spec.domain.devices.disks);
    let in_status = |n: &str| vmi.status.as_ref().is_some_and(|s| s.volume(n).is_some());

    let mut new_volumes: Vec<Volume> = Vec::new();
    for v in s_volumes {
        if !v.is_hotpluggable() {
            new_volumes.push(v.clone());
            continue;
        }
        match volume(t_volumes, &v.name) {
            None => tracing::debug!(volume = %v.name, "removing hotplug volume from VMI, no longer in VM"),
            Some(t) if t.is_hotpluggable() && t != v => {
                tracing::debug!(volume = %v.name, "removing hotplug volume from VMI, volume changed");
            }
            Some(_) => new_volumes.push(v.clone()),
        }
    }
    for t in t_volumes.iter().filter(|t| t.is_hotpluggable()) {
        if volume(s_volumes, &t.name).is_none() && !in_status(&t.name) {
            new_volumes.push(t.clone());
        }
    }

    // A kept disk's boot order follows the VM's disk of that name (rule 6).
    let kept = |d: &Disk| {
        let mut d = d.clone();
        if let Some(t) = disk(t_disks, &d.name) {
            d.boot_order = t.boot_order;
        }
        d
    };
    let mut new_disks: Vec<Disk> = Vec::new();
    for d in s_disks {
        if volume(&new_volumes, &d.name).is_some() {
            new_disks.push(kept(d));
            continue;
        }
        let Some(t_disk) = disk(t_disks, &d.name) else { continue };
        let waiting_readd = volume(t_volumes, &d.name).is_some();
        if waiting_readd && (t_disk.cdrom.is_none() || d.cdrom.is_none()) {
            continue;
        }
        new_disks.push(kept(d));
    }
    for t in t_disks {
        if volume(&new_volumes, &t.name).is_some_and(Volume::is_hotpluggable) && disk(s_disks, &t.name).is_none() {
            new_disks.push(t.clone());
        }
    }
    (*s_volumes != new_volumes || *s_disks != new_disks).then_some((new_volumes, new_disks))
}

fn path(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

/// `test` of the old lists, then `replace` of each (`add` when the old list was empty).
fn patch(old: &VirtualMachineInstanceSpec, volumes: &[Volume], disks: &[Disk]) -> Result<Patch, serde_json::Error> {
    let (volumes_at, disks_at) = (path(&["spec", "volumes"]), path(&["spec", "domain", "devices", "disks"]));
    let mut ops = Vec::new();
    // The tests: the VMI must still have the lists this plan was computed from (an empty list
    // may be absent, which `add` below handles, so only non-empty lists are tested; the
    // resourceVersion test `client::patch_if` puts first covers the rest).
    if !old.volumes.is_empty() {
        ops.push(PatchOperation::Test(TestOperation { path: volumes_at.clone(), value: serde_json::to_value(&old.volumes)? }));
    }
    if !old.domain.devices.disks.is_empty() {
        ops.push(PatchOperation::Test(TestOperation { path: disks_at.clone(), value: serde_json::to_value(&old.domain.devices.disks)? }));
    }
    ops.push(set(volumes_at, old.volumes.is_empty(), serde_json::to_value(volumes)?));
    if old.domain.devices.disks.is_empty() {
        // `devices` itself may be absent (admission lets it default to empty) and `add` needs
        // its parent: the whole `devices` is written, its other fields as they were.
        let devices = api::kubevirt::Devices { disks: disks.to_vec(), ..old.domain.devices.clone() };
        ops.push(set(path(&["spec", "domain", "devices"]), true, serde_json::to_value(devices)?));
    } else {
        ops.push(set(disks_at, false, serde_json::to_value(disks)?));
    }
    Ok(Patch(ops))
}

fn set(path: PointerBuf, old_empty: bool, value: Value) -> PatchOperation {
    if old_empty {
        PatchOperation::Add(AddOperation { path, value })
    } else {
        PatchOperation::Replace(ReplaceOperation { path, value })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn list<'a>(v: &'a Value, ptr: &str) -> Vec<&'a Value> {
        v.pointer(ptr).and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default()
    }
    fn name(v: &Value) -> &str {
        v.get("name").and_then(Value::as_str).unwrap_or_default()
    }
    /// The plan for a template and a VMI given as JSON, as JSON.
    fn run(t: &Value, v: &Value) -> Option<Value> {
        let (t, v) = (serde_json::from_value(t.clone()).unwrap(), serde_json::from_value(v.clone()).unwrap());
        plan(&t, &v).unwrap().map(|p| serde_json::to_value(p).unwrap())
    }

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
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v"},
               "spec": {"domain": {"devices": {"disks": disks}}, "volumes": volumes}, "status": {"phase": "Running"}})
    }
    /// Applies the plan and returns the VMI's (volume names, disk names).
    fn after(t: &Value, v: &Value) -> (Vec<String>, Vec<String>) {
        let mut doc = v.clone();
        if let Some(p) = run(t, v) {
            let ops: json_patch::Patch = serde_json::from_value(p).unwrap();
            json_patch::patch(&mut doc, &ops).unwrap();
        }
        let names = |ptr| list(&doc, ptr).into_iter().map(|x| name(x).to_owned()).collect();
        (names("/spec/volumes"), names("/spec/domain/devices/disks"))
    }
    fn n(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Found by the `stored_object` fuzz target: the plan for a VMI stored without
    /// `spec.domain.devices` (admission lets it default) added `/spec/domain/devices/disks`,
    /// whose parent does not exist, so every patch was refused and the volume never plugged.
    #[test]
    fn a_vmi_without_devices_gets_them_with_its_first_hotplug_disk() {
        let t = template(&[perm("root"), dv("a")], &[disk("a")]);
        let v = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "v"},
                       "spec": {"domain": {"cpu": {"cores": 1}}, "volumes": [perm("root")]}, "status": {"phase": "Running"}});
        assert_eq!(after(&t, &v), (n(&["root", "a"]), n(&["a"])));
        // Fields of `devices` beside the disks are kept.
        let mut with = v.clone();
        with["spec"]["domain"]["devices"] = json!({"interfaces": [{"name": "default"}]});
        let mut doc = with.clone();
        let ops: json_patch::Patch = serde_json::from_value(run(&t, &with).unwrap()).unwrap();
        json_patch::patch(&mut doc, &ops).unwrap();
        assert_eq!(doc["spec"]["domain"]["devices"], json!({"interfaces": [{"name": "default"}], "disks": [disk("a")]}));
    }

    #[test]
    fn vmi_not_running_is_left_alone() {
        let mut v = vmi(&[perm("perm")], &[disk("perm")]);
        v["status"]["phase"] = json!("Scheduled");
        assert_eq!(run(&template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]), &v), None);
        v["status"] = json!({});
        assert_eq!(run(&template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]), &v), None);
    }

    #[test]
    fn a_non_hotplug_volume_added_to_the_vm_waits_for_restart() {
        let v = vmi(&[perm("perm")], &[disk("perm")]);
        assert_eq!(run(&template(&[perm("perm"), perm("other")], &[disk("perm"), disk("other")]), &v), None);
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
        assert_eq!(run(&t, &vmi(&[perm("perm")], &[disk("perm")])), None);
    }

    #[test]
    fn a_volume_still_in_volume_status_is_not_re_added() {
        let t = template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]);
        let mut v = vmi(&[perm("perm")], &[disk("perm")]);
        v["status"]["volumeStatus"] = json!([{"name": "a", "phase": "Detaching"}]);
        assert_eq!(run(&t, &v), None);
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
        assert_eq!(run(&t, &v), None);
        // Status cleared: re-added with the new source.
        v["status"]["volumeStatus"] = json!([]);
        let p = run(&t, &v).unwrap();
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
    fn a_kept_disks_boot_order_follows_the_vm_and_nothing_else_moves() {
        let ordered = |name: &str, order: Option<u32>, cd: bool| {
            let mut d = if cd { cdrom(name) } else { disk(name) };
            if let Some(o) = order {
                d["bootOrder"] = json!(o);
            }
            d
        };
        // The VMI booted the CD first; the VM went back to the disk first (a consumed Once).
        let v = vmi(&[perm("root"), dv("cd")], &[ordered("root", Some(2), false), ordered("cd", Some(1), true)]);
        let t = template(&[perm("root"), dv("cd")], &[ordered("root", Some(1), false), ordered("cd", None, true)]);
        let p = run(&t, &v).expect("a boot order change is patched");
        let disks = &p.as_array().unwrap().last().unwrap()["value"];
        assert_eq!(disks, &json!([ordered("root", Some(1), false), ordered("cd", None, true)]));
        // Already equal: no patch.
        let same = vmi(&[perm("root"), dv("cd")], &[ordered("root", Some(1), false), ordered("cd", None, true)]);
        assert_eq!(run(&t, &same), None);
    }

    #[test]
    fn a_non_hotplug_medium_on_an_empty_drive_is_ignored() {
        let t = template(&[perm("cd0")], &[cdrom("cd0")]);
        assert_eq!(run(&t, &vmi(&[], &[cdrom("cd0")])), None);
    }

    #[test]
    fn a_same_named_non_hotplug_vm_volume_keeps_the_vmi_entry() {
        let t = template(&[perm("a")], &[disk("a")]);
        assert_eq!(run(&t, &vmi(&[dv("a")], &[disk("a")])), None);
    }

    #[test]
    fn reordering_alone_writes_nothing_and_new_entries_follow_vm_order() {
        let v = vmi(&[perm("perm"), dv("a"), dv("b")], &[disk("perm"), disk("a"), disk("b")]);
        assert_eq!(run(&template(&[dv("b"), dv("a"), perm("perm")], &[disk("b"), disk("perm"), disk("a")]), &v), None);
        let t = template(&[dv("z"), dv("b"), dv("y"), dv("a"), perm("perm")], &[disk("z"), disk("b"), disk("y"), disk("a"), disk("perm")]);
        assert_eq!(after(&t, &v), (n(&["perm", "a", "b", "z", "y"]), n(&["perm", "a", "b", "z", "y"])));
    }

    #[test]
    fn the_patch_tests_both_old_lists_then_replaces_or_adds() {
        let t = template(&[perm("perm"), dv("a")], &[disk("perm"), disk("a")]);
        let v = vmi(&[perm("perm")], &[disk("perm")]);
        let p = run(&t, &v).unwrap();
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
        // An empty old list becomes `add` (and is not tested: it may be absent).
        let p = run(&template(&[dv("a")], &[disk("a")]), &vmi(&[], &[])).unwrap();
        let ops: Vec<(&str, &str)> =
            p.as_array().unwrap().iter().map(|o| (o["op"].as_str().unwrap(), o["path"].as_str().unwrap())).collect();
        assert_eq!(ops, [("add", "/spec/volumes"), ("add", "/spec/domain/devices")]);
        // A VMI that changed since the read fails the test.
        let mut changed = v.clone();
        changed["spec"]["volumes"] = json!([perm("perm"), dv("x")]);
        let ops: json_patch::Patch = serde_json::from_value(run(&t, &v).unwrap()).unwrap();
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
        let ops: json_patch::Patch = serde_json::from_value(run(&t, &v).unwrap()).unwrap();
        json_patch::patch(&mut doc, &ops).unwrap();
        let spec: api::kubevirt::VirtualMachineInstanceSpec = serde_json::from_value(doc["spec"].clone()).unwrap();
        let causes = api::invariants::check(&spec, "spec");
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec.domain.devices.disks[1].name");
    }
}
