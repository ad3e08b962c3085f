//! `ComputerSystem.Reset` against real guests (the test guest under TCG) through a real
//! `virtplug up`: an action that outlasts its request answers 202 with a Task whose state
//! follows the real work; `Nmi` reaches the guest's kernel (it says so on its console);
//! a reset that is already satisfied is a success; `Nmi` to a powered-off System is 409.

#![allow(clippy::unwrap_used)]

mod redfish_support;

use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::json;

use redfish_support::RfUp;

/// Follows a Task (its `Location`) until it leaves `Running`; its last state.
async fn finished(up: &RfUp, location: &str) -> serde_json::Value {
    let admin = up.admin();
    let end = std::time::Instant::now() + Duration::from_secs(240);
    let mut seen = Vec::new();
    loop {
        let t = up.get(location, &admin).await;
        assert_eq!(t.status, StatusCode::OK, "{:?}", t.body);
        seen.push(t.body["PercentComplete"].as_u64().unwrap());
        if t.body["TaskState"] != "Running" {
            assert!(seen.windows(2).all(|w| w[0] <= w[1]), "progress never goes back: {seen:?}");
            return t.body;
        }
        assert!(std::time::Instant::now() < end, "task {location} still running after 240 s: {:?}", t.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The test guest ignores the ACPI power button, so GracefulShutdown would last the VM's whole
/// grace period (600 s): a 202 with a Task, the System `PoweringOff`. Ironic's hard power-off
/// after a soft one that did not finish, ForceOff, cuts it short: the guest's QEMU is stopped
/// at once (well within the Task's 240 s deadline here), and both end at `Off`.
#[tokio::test]
async fn a_graceful_shutdown_is_a_task_and_force_off_cuts_it_short() {
    let up = RfUp::start();
    let uid = up.running_vm_with_grace("graceful-0", 600).await;
    let vmi = up.guest_ready("graceful-0", None).await;
    let reset = format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset");
    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "GracefulShutdown"}))).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "a 600 s grace period outlasts the request: {:?}", r.body);
    let location = r.headers["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("/redfish/v1/TaskService/Tasks/"), "{location}");
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(r.body["TaskState"], "Running");
    assert_eq!(up.get(&format!("/redfish/v1/Systems/{uid}"), &up.admin()).await.body["PowerState"], "PoweringOff", "the stop is under way");
    assert!(up.qemu_running(&vmi), "the guest ignores the ACPI button");

    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "ForceOff"}))).await;
    match r.status {
        StatusCode::NO_CONTENT => {}
        StatusCode::ACCEPTED => assert_eq!(finished(&up, r.headers["location"].to_str().unwrap()).await["TaskState"], "Completed"),
        other => panic!("ForceOff while powering off: {other} {:?}", r.body),
    }
    let done = finished(&up, &location).await;
    assert_eq!((done["TaskState"].clone(), done["PercentComplete"].clone()), (json!("Completed"), json!(100)), "{done}");
    assert_eq!(done["Messages"][0]["MessageId"], "Base.1.22.Success");
    assert_eq!(up.get(&format!("/redfish/v1/Systems/{uid}"), &up.admin()).await.body["PowerState"], "Off");
    assert!(!up.qemu_running(&vmi), "Off because the guest's QEMU is gone");
    let tasks = up.get("/redfish/v1/TaskService/Tasks", &up.admin()).await;
    assert!(tasks.body["Members"].as_array().unwrap().iter().any(|m| m["@odata.id"] == location.as_str()), "finished tasks are kept");
}

/// ForceRestart answers once a new QEMU runs the guest: 204 when that happens within the
/// request (QEMU starts in well under a second), else a Task that completes then.
#[tokio::test]
async fn force_restart_answers_when_a_new_guest_runs() {
    let up = RfUp::start();
    let uid = up.running_vm("restart-0").await;
    let vmi_before = up.guest_ready("restart-0", None).await;
    let r = up
        .req(
            Method::POST,
            &format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset"),
            &up.admin(),
            Some(&json!({"ResetType": "ForceRestart"})),
        )
        .await;
    match r.status {
        StatusCode::NO_CONTENT => {}
        StatusCode::ACCEPTED => {
            let done = finished(&up, r.headers["location"].to_str().unwrap()).await;
            assert_eq!(done["TaskState"], "Completed", "{done}");
        }
        other => panic!("ForceRestart: {other} {:?}", r.body),
    }
    // Answered as done: a VMI other than the one before is already running.
    let vmis: kube::Api<api::VirtualMachineInstance> = kube::Api::namespaced(up.kube().await, "default");
    let now = vmis.get("restart-0").await.unwrap();
    assert!(now.is_running() && now.metadata.uid.as_deref() != Some(vmi_before.as_str()), "{:?}", now.status);
    let vmi_after = up.guest_ready("restart-0", Some(&vmi_before)).await;
    assert!(!up.qemu_running(&vmi_before) && up.qemu_running(&vmi_after), "the old QEMU is gone, a new one boots the guest");
}

#[tokio::test]
async fn nmi_reaches_the_guest_kernel_and_needs_a_running_system() {
    let up = RfUp::start();
    let uid = up.running_vm("nmi-0").await;
    let vmi = up.guest_ready("nmi-0", None).await;
    let reset = format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset");
    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "Nmi"}))).await;
    assert!(matches!(r.status, StatusCode::NO_CONTENT | StatusCode::ACCEPTED), "{:?}", r.body);
    if r.status == StatusCode::ACCEPTED {
        let done = finished(&up, r.headers["location"].to_str().unwrap()).await;
        assert_eq!(done["TaskState"], "Completed", "{done}");
    }
    // Linux reports an NMI nothing claimed: the interrupt really arrived in the guest.
    // (Its report is two lines; the second may still be on its way when the first is read.)
    redfish_support::common_wait("the guest kernel to report the NMI", || async {
        up.console(&vmi).contains("Dazed and confused").then_some(())
    })
    .await;
    assert!(up.console(&vmi).contains("NMI received"), "{}", up.console(&vmi));

    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "ForceOff"}))).await;
    assert!(matches!(r.status, StatusCode::NO_CONTENT | StatusCode::ACCEPTED), "{:?}", r.body);
    if r.status == StatusCode::ACCEPTED {
        finished(&up, r.headers["location"].to_str().unwrap()).await;
    }
    assert_eq!(up.get(&format!("/redfish/v1/Systems/{uid}"), &up.admin()).await.body["PowerState"], "Off");
    // Satisfied already: a success that asks nothing of the VM. (Its resourceVersion may still
    // move: the controller settles the stopped VM's status on its own time.) A reset that acted
    // would change the spec (generation) or queue a state change request.
    let vms: kube::Api<api::VirtualMachine> = kube::Api::namespaced(up.kube().await, "default");
    let asked = |vm: api::VirtualMachine| {
        let status = serde_json::to_value(&vm.status).unwrap();
        (vm.metadata.generation, serde_json::to_value(&vm.spec).unwrap(), status["stateChangeRequests"].clone())
    };
    let before = asked(vms.get("nmi-0").await.unwrap());
    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "GracefulShutdown"}))).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(asked(vms.get("nmi-0").await.unwrap()), before);
    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "Nmi"}))).await;
    assert_eq!((r.status, r.message_id().as_str()), (StatusCode::CONFLICT, "ActionParameterValueConflict"), "{:?}", r.body);
    assert_eq!(asked(vms.get("nmi-0").await.unwrap()), before);
}

/// A VM with the legacy `spec.running: true` (no runStrategy) powers off and on through the same
/// resets: the `stop`/`start` subresources flip `spec.running`, and no `runStrategy` appears.
#[tokio::test]
async fn a_legacy_running_vm_powers_off_and_on() {
    let up = RfUp::start();
    let uid = up.running_legacy_vm("legacy-0").await;
    let first = up.guest_ready("legacy-0", None).await;
    let reset = format!("/redfish/v1/Systems/{uid}/Actions/ComputerSystem.Reset");
    let vms: kube::Api<api::VirtualMachine> = kube::Api::namespaced(up.kube().await, "default");
    let spec = |vm: &api::VirtualMachine| serde_json::to_value(&vm.spec).unwrap();

    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "ForceOff"}))).await;
    if r.status == StatusCode::ACCEPTED {
        assert_eq!(finished(&up, r.headers["location"].to_str().unwrap()).await["TaskState"], "Completed");
    } else {
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    }
    let off = vms.get("legacy-0").await.unwrap();
    assert_eq!((spec(&off)["running"].clone(), spec(&off).get("runStrategy").cloned()), (json!(false), None), "{:?}", spec(&off));
    assert_eq!(up.get(&format!("/redfish/v1/Systems/{uid}"), &up.admin()).await.body["PowerState"], "Off");
    assert!(!up.qemu_running(&first));

    let r = up.req(Method::POST, &reset, &up.admin(), Some(&json!({"ResetType": "On"}))).await;
    if r.status == StatusCode::ACCEPTED {
        assert_eq!(finished(&up, r.headers["location"].to_str().unwrap()).await["TaskState"], "Completed");
    } else {
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{:?}", r.body);
    }
    let on = vms.get("legacy-0").await.unwrap();
    assert_eq!((spec(&on)["running"].clone(), spec(&on).get("runStrategy").cloned()), (json!(true), None), "{:?}", spec(&on));
    let second = up.guest_ready("legacy-0", Some(&first)).await;
    assert!(up.qemu_running(&second), "a new QEMU boots the guest");
}
