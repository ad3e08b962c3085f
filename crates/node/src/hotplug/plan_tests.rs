//! The plan's rules, one behaviour a test (what the guest tests see, decided here without QEMU).

use api::kubevirt::{VirtualMachineInstanceSpec, VirtualMachineInstanceStatus};
use qemu::{Attached, DeviceKind, Drive, Inventory};
use serde_json::{json, Value};

use super::{plan, wanted, Attach, Step, Target};
use crate::claims::Claim;

fn pvc(name: &str) -> Value {
    json!({"name": name, "persistentVolumeClaim": {"claimName": format!("{name}-pvc"), "hotpluggable": true}})
}
fn dv(name: &str, dv: &str) -> Value {
    json!({"name": name, "dataVolume": {"name": dv, "hotpluggable": true}})
}
fn disk(name: &str) -> Value {
    json!({"name": name, "disk": {"bus": "scsi"}})
}
fn cdrom(name: &str) -> Value {
    json!({"name": name, "cdrom": {"bus": "sata"}})
}
fn spec(volumes: &[Value], disks: &[Value]) -> VirtualMachineInstanceSpec {
    serde_json::from_value(json!({"domain": {"devices": {"disks": disks}}, "volumes": volumes})).expect("a spec")
}
fn status(entries: &Value) -> VirtualMachineInstanceStatus {
    serde_json::from_value(json!({"volumeStatus": entries})).expect("a status")
}
/// A hot-plug entry (`hotplugVolume` set) in `phase`.
fn entry(name: &str, phase: &str) -> Value {
    json!({"name": name, "phase": phase, "hotplugVolume": {}})
}
/// QEMU with `devices` (each with its node) plus the extra `nodes`.
fn qemu_with(devices: &[&str], nodes: &[&str]) -> Inventory {
    let attached = devices
        .iter()
        .map(|v| Attached { volume: (*v).into(), device_type: "scsi-hd".into(), node: Some(format!("n-{v}")), readonly: false })
        .collect();
    let mut nodes: Vec<String> = devices.iter().map(|v| format!("n-{v}")).chain(nodes.iter().map(|n| (*n).to_owned())).collect();
    nodes.sort();
    Inventory { attached, nodes }
}
fn drive(id: &str, medium: Option<&str>) -> Drive {
    Drive { id: id.into(), medium_node: medium.map(str::to_owned), tray_open: false }
}
fn steps(
    spec: &VirtualMachineInstanceSpec,
    inventory: &Inventory,
    drives: &[Drive],
    status: Option<&VirtualMachineInstanceStatus>,
) -> Vec<Step> {
    plan(&wanted(spec), inventory, drives, status)
}
fn disk_attach(volume: &str, kind: DeviceKind, serial: &str) -> Step {
    Step::Attach(Attach {
        volume: volume.into(),
        claim: Claim { name: format!("{volume}-pvc"), data_volume: false },
        readonly: false,
        target: Target::Device { kind, serial: serial.into() },
        attach_pod: None,
    })
}
fn medium_attach(volume: &str, dv: &str) -> Step {
    Step::Attach(Attach {
        volume: volume.into(),
        claim: Claim { name: dv.into(), data_volume: true },
        readonly: true,
        target: Target::Medium { drive: volume.into() },
        attach_pod: None,
    })
}

#[test]
fn a_wanted_disk_qemu_does_not_hold_is_plugged_as_a_scsi_disk_with_its_serial() {
    let mut with_serial = disk("a");
    with_serial["serial"] = json!("s-a");
    let s = spec(&[pvc("a"), pvc("b")], &[with_serial, json!({"name": "b", "lun": {}})]);
    assert_eq!(
        steps(&s, &Inventory::default(), &[], None),
        [disk_attach("a", DeviceKind::Disk, "s-a"), disk_attach("b", DeviceKind::Lun, "b")],
        "a disk with its serial; a LUN (passthrough) named by the volume"
    );
    let ro = spec(&[pvc("a")], &[json!({"name": "a", "disk": {"readonly": true}})]);
    let Some(Step::Attach(a)) = steps(&ro, &Inventory::default(), &[], None).into_iter().next() else { panic!("an attach") };
    assert!(a.readonly, "a read-only disk is opened read-only");
}

#[test]
fn a_device_the_spec_no_longer_wants_is_unplugged() {
    let entries = status(&json!([entry("gone", "Ready")]));
    assert_eq!(steps(&spec(&[], &[]), &qemu_with(&["gone"], &[]), &[], Some(&entries)), [Step::Detach { volume: "gone".into() }]);
}

#[test]
fn after_a_restart_what_qemu_holds_is_adopted_and_recorded_ready_not_plugged_again() {
    let s = spec(&[pvc("a"), pvc("b")], &[disk("a"), disk("b")]);
    // The last agent died after device_add, before its Ready write (a), and after it (b).
    let entries = status(&json!([entry("a", "MountedToPod"), entry("b", "Ready")]));
    assert_eq!(
        steps(&s, &qemu_with(&["a", "b"], &[]), &[], Some(&entries)),
        [Step::RecordReady { volume: "a".into() }, Step::Keep { volume: "b".into() }]
    );
    // No entry at all (the status write was lost): recorded too.
    assert_eq!(steps(&spec(&[pvc("a")], &[disk("a")]), &qemu_with(&["a"], &[]), &[], None), [Step::RecordReady { volume: "a".into() }]);
}

#[test]
fn a_volume_waiting_for_its_claim_is_attempted_again_in_its_attachment_pod() {
    // Waiting (PVCNotReady): every pass tries again (what it writes is the waiting rules').
    let s = spec(&[pvc("a")], &[disk("a")]);
    let waiting = status(&json!([{"name": "a", "phase": "Pending", "reason": "PVCNotReady", "hotplugVolume": {"attachPodUID": "pod-1"}}]));
    let Some(Step::Attach(a)) = steps(&s, &Inventory::default(), &[], Some(&waiting)).into_iter().next() else { panic!("an attach") };
    assert_eq!(a.attach_pod.as_deref(), Some("pod-1"), "cluster mode: opened inside the pod the entry names");
}

#[test]
fn a_wanted_medium_goes_into_its_empty_drive() {
    let s = spec(&[dv("cd0", "iso")], &[cdrom("cd0")]);
    assert_eq!(steps(&s, &Inventory::default(), &[drive("cd0", None)], None), [medium_attach("cd0", "iso")]);
    // In its drive already: kept.
    let ready = status(&json!([entry("cd0", "Ready")]));
    assert_eq!(steps(&s, &Inventory::default(), &[drive("cd0", Some("n-cd0"))], Some(&ready)), [Step::Keep { volume: "cd0".into() }]);
}

#[test]
fn a_drive_holding_another_medium_gets_the_wanted_one_and_is_not_ejected() {
    let s = spec(&[dv("cd0", "iso2")], &[cdrom("cd0")]);
    let entries = status(&json!([entry("old", "Ready")]));
    // The insert swaps the old medium out (and deletes its node): no eject of the drive after it.
    assert_eq!(steps(&s, &Inventory::default(), &[drive("cd0", Some("n-old"))], Some(&entries)), [medium_attach("cd0", "iso2")]);
}

#[test]
fn a_medium_no_wanted_volume_names_is_ejected_with_its_entry_and_the_vms_own_is_left() {
    let long = "a-volume-name-far-longer-than-qemu-allows";
    let node = qemu::node_name(long);
    let s = spec(&[], &[cdrom("cd0"), cdrom("cd1"), cdrom("cd2")]);
    let entries = status(&json!([entry("cd0", "Ready"), entry(long, "Ready")]));
    let drives = [drive("cd0", Some("n-cd0")), drive("cd1", Some("cd1-medium")), drive("cd2", Some(&node))];
    assert_eq!(
        steps(&s, &Inventory { attached: vec![], nodes: vec!["n-cd0".into(), node.clone()] }, &drives, Some(&entries)),
        [
            Step::Eject { drive: "cd0".into(), node: "n-cd0".into(), volume: Some("cd0".into()) },
            Step::Eject { drive: "cd2".into(), node, volume: Some(long.into()) },
        ],
        "the VM's own medium (cd1) is not the agent's; a hashed node name still finds its entry"
    );
}

#[test]
fn a_node_whose_device_is_gone_and_that_nothing_wants_is_removed() {
    // An unplug interrupted after device_del left n-old; n-staged is a wanted volume's whose
    // attach was interrupted before device_add (it is attached, reusing the node).
    let s = spec(&[pvc("plugged"), pvc("staged")], &[disk("plugged"), disk("staged")]);
    let ready = status(&json!([entry("plugged", "Ready")]));
    let inventory = qemu_with(&["plugged"], &["n-medium", "n-old", "n-staged"]);
    assert_eq!(
        steps(&s, &inventory, &[drive("cd0", Some("n-medium"))], Some(&ready)),
        [
            Step::Keep { volume: "plugged".into() },
            disk_attach("staged", DeviceKind::Disk, "staged"),
            Step::Eject { drive: "cd0".into(), node: "n-medium".into(), volume: None },
            Step::RemoveNode { node: "n-old".into() }
        ],
        "one remover for each: the stray medium is ejected, not deleted under its drive"
    );
}

#[test]
fn the_entry_of_a_volume_removed_while_it_waited_is_dropped() {
    let entries = status(&json!([entry("gone", "Pending"), entry("leaving", "Detaching"), {"name": "boot", "phase": "Ready"}]));
    assert_eq!(
        steps(&spec(&[], &[]), &qemu_with(&["leaving"], &[]), &[], Some(&entries)),
        [Step::Detach { volume: "leaving".into() }, Step::DropEntry { volume: "gone".into() }],
        "an entry in QEMU goes with its unplug; one that is no hot-plug entry is not the agent's"
    );
}

#[test]
fn volumes_that_are_not_hot_pluggable_or_have_no_disk_are_not_the_agents() {
    let boot = json!({"name": "boot", "persistentVolumeClaim": {"claimName": "boot"}});
    let s = spec(&[boot, pvc("nodisk")], &[disk("boot")]);
    assert_eq!(steps(&s, &Inventory::default(), &[], None), []);
}
