//! A read-modify-write through the typed structs keeps what they do not model: unknown values
//! of the state enums and unknown fields at every level come back out verbatim.

use serde_json::{json, Value};

use crate::phases::{DataVolumePhase, PrintableStatus, StateChangeAction, VmiPhase, VolumePhase, VolumeReason};
use crate::{DataVolume, VirtualMachine, VirtualMachineInstance};

fn vmi() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "v", "namespace": "d", "resourceVersion": "7"},
        "spec": {
            "domain": {"devices": {"disks": [{"name": "hp", "disk": {"bus": "scsi", "future": 1}, "blockSize": {"custom": {}}}],
                       "interfaces": [{"name": "default"}]},
                       "machine": {"type": "q35"},
                       "firmware": {"bootloader": {"efi": {"secureBoot": false, "persistent": true, "future": 2}, "newLoader": {}},
                                    "uuid": "u1", "kernelBoot": {"kernelArgs": "a", "newKnob": 1}}},
            "volumes": [{"name": "hp", "dataVolume": {"name": "hp-dv", "hotpluggable": true, "x": "y"}},
                        {"name": "cd", "containerDisk": {"image": "img"}},
                        {"name": "e", "emptyDisk": {"capacity": "1Gi", "newKnob": true}}],
            "evictionStrategy": "None"
        },
        "status": {
            "phase": "WaitingForSync",
            "activePods": {"abc": "node1"},
            "volumeStatus": [
                {"name": "hp", "target": "", "phase": "SomeNewPhase", "reason": "SomeNewReason", "message": "m",
                 "hotplugVolume": {"attachPodName": "p", "newField": 3},
                 "persistentVolumeClaimInfo": {"claimName": "hp-dv", "preallocated": true},
                 "memoryDumpVolume": {"claimName": "x"}},
                {"name": "other", "target": "sdb", "phase": "Bound", "reason": "PVCBound", "containerDiskVolume": {"checksum": 1}}
            ]
        }
        // No unknown top-level field: a Kubernetes object has exactly apiVersion, kind,
        // metadata, spec and status, which is all kube's `CustomResource` models.
    })
}

#[test]
fn an_unchanged_vmi_serializes_back_to_what_was_read() {
    let typed: VirtualMachineInstance = serde_json::from_value(vmi()).unwrap();
    let st = typed.status.as_ref().unwrap();
    assert_eq!(st.phase, Some(VmiPhase::Other("WaitingForSync".into())));
    assert_eq!(st.volume_status[0].phase, Some(VolumePhase::Other("SomeNewPhase".into())));
    assert_eq!(st.volume_status[0].reason, Some(VolumeReason::Other("SomeNewReason".into())));
    // Nothing changed, so a merge diff of before and after would be empty: no write at all.
    assert_eq!(serde_json::to_value(&typed).unwrap(), vmi());
}

#[test]
fn a_transition_changes_only_its_entry_and_keeps_every_unknown_field() {
    let mut typed: VirtualMachineInstance = serde_json::from_value(vmi()).unwrap();
    let st = typed.status.as_mut().unwrap();
    st.volume_entry("other").transition(VolumePhase::AttachedToNode, VolumeReason::SuccessfulCreate, "opened");
    st.volume_entry("new").transition(VolumePhase::Pending, VolumeReason::PvcNotReady, "waiting");
    let mut after = serde_json::to_value(&typed).unwrap();

    let entries = after["status"]["volumeStatus"].as_array_mut().unwrap();
    assert_eq!(entries.len(), 3, "the missing entry was created, no other");
    let new = entries.pop().unwrap();
    assert_eq!(
        (&new["name"], &new["phase"], &new["reason"], &new["hotplugVolume"]),
        (&json!("new"), &json!("Pending"), &json!("PVCNotReady"), &json!({}))
    );
    let other = entries[1].as_object_mut().unwrap();
    assert_eq!(
        (&other["phase"], &other["reason"], &other["message"]),
        (&json!("AttachedToNode"), &json!("SuccessfulCreate"), &json!("opened"))
    );
    assert_eq!(other.remove("phaseTransitionTimestamps").unwrap()[0]["phase"], "AttachedToNode");
    other.remove("message");
    other.insert("phase".into(), json!("Bound"));
    other.insert("reason".into(), json!("PVCBound"));
    assert_eq!(after, vmi(), "everything else, unknown values and fields included, is as read");
}

#[test]
fn a_vm_keeps_unknown_statuses_actions_and_fields() {
    let vm = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "v"},
        "spec": {"runStrategy": "Always", "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"domain": {"devices": {}}}, "futureTemplateField": 1},
                 "dataVolumeTemplates": [{"metadata": {"name": "x"}}]},
        "status": {"printableStatus": "Hibernating", "ready": false,
                   "conditions": [{"type": "Ready", "status": "False", "reason": "R", "observedGeneration": 3}],
                   "stateChangeRequests": [{"action": "Pause", "future": true}, {"action": "Start"}],
                   "volumeRequests": [{"addVolumeOptions": {"name": "a", "volumeSource": {"dataVolume": {"name": "a"}, "hostDisk": {}}, "extraOpt": 1}, "futureRequest": 2}],
                   "desiredGeneration": 4}
    });
    let typed: VirtualMachine = serde_json::from_value(vm.clone()).unwrap();
    let st = typed.status.as_ref().unwrap();
    assert_eq!(st.printable_status, Some(PrintableStatus::Other("Hibernating".into())));
    assert_eq!(st.state_change_requests[0].action, StateChangeAction::Other("Pause".into()));
    assert_eq!(st.state_change_requests[1].action, StateChangeAction::Start);
    assert_eq!(serde_json::to_value(&typed).unwrap(), vm);
}

#[test]
fn a_data_volume_keeps_an_unknown_phase_and_fields() {
    let dv = json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": "d"},
        "spec": {"source": {"pvc": {"namespace": "n", "name": "src", "x": 1}}, "storage": {"resources": {"requests": {"storage": "1Gi"}, "limits": {}}}},
        "status": {"phase": "Paused", "progress": "N/A", "newStatusField": {}}
    });
    let typed: DataVolume = serde_json::from_value(dv.clone()).unwrap();
    assert_eq!(typed.status.as_ref().unwrap().phase, Some(DataVolumePhase::Other("Paused".into())));
    assert_eq!(serde_json::to_value(&typed).unwrap(), dv);
}
