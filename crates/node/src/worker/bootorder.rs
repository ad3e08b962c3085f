//! A running guest's boot order follows its VMI: QEMU's `bootindex` of the devices that exist
//! from boot (the boot disks and the SATA CD-ROM drives, whose device ids are their disk names)
//! is set at run time with `qom-set`. QEMU reads it at the guest's next reset (the firmware's
//! `bootorder` file is rebuilt then), so a reboot inside the guest boots what the VMI now says,
//! while the boot in progress is left alone. The controller changes the VMI's `bootOrder` when
//! the VM's changes (a Redfish boot override, or a one-time override used up).
//!
//! QEMU refuses a boot index already held by another device, so every changed device is first
//! taken out of the order (-1), then given its new index.

use std::collections::BTreeMap;

use api::kubevirt::DiskKind;
use api::VirtualMachineInstance;
use qemu::Machine;

/// Device id → boot index (-1: none).
pub(super) type Order = BTreeMap<String, i32>;

/// The boot order `vmi` asks for, for the devices that exist from boot.
#[must_use]
pub(super) fn wanted(vmi: &VirtualMachineInstance) -> Order {
    let spec = &vmi.spec;
    spec.domain
        .devices
        .disks
        .iter()
        .filter(|d| {
            let volume = spec.volumes.iter().find(|v| v.name == d.name);
            match d.kind() {
                DiskKind::Cdrom => d.bus().unwrap_or("sata") == "sata",
                _ => volume.is_some_and(|v| !v.is_hotpluggable()),
            }
        })
        .map(|d| (d.name.clone(), d.boot_order.and_then(|o| i32::try_from(o).ok()).unwrap_or(-1)))
        .collect()
}

/// Brings QEMU's boot order to `vmi`'s. `applied`: what QEMU has (`None` after an adoption:
/// unknown, so everything is set). A failure is logged and retried at the next call.
pub(super) async fn follow(vmi: &VirtualMachineInstance, machine: &Machine, applied: &mut Option<Order>) {
    let want = wanted(vmi);
    let changed: Vec<(&String, i32)> =
        want.iter().filter(|(id, i)| applied.as_ref().is_none_or(|a| a.get(*id) != Some(*i))).map(|(id, i)| (id, *i)).collect();
    if changed.is_empty() {
        return;
    }
    let mut ok = true;
    for (id, _) in &changed {
        if applied.as_ref().is_none_or(|a| a.get(*id).is_some_and(|i| *i != -1)) {
            if let Err(e) = machine.set_bootindex(id, -1).await {
                tracing::warn!(device = %id, "cannot clear the boot index: {e}");
                ok = false;
            }
        }
    }
    for (id, i) in changed.iter().filter(|(_, i)| *i != -1) {
        if let Err(e) = machine.set_bootindex(id, *i).await {
            tracing::warn!(device = %id, "cannot set the boot index {i}: {e}");
            ok = false;
        }
    }
    tracing::info!(order = ?want, "boot order set for the next reset of the guest");
    *applied = ok.then_some(want);
}

/// The VMI's one-time boot override whose order QEMU has now (`applied` equals what the VMI
/// asks for), if any: the guest's next reset boots with it.
#[must_use]
pub(super) fn armed(vmi: &VirtualMachineInstance, applied: Option<&Order>) -> Option<String> {
    use kube::ResourceExt;
    let value = vmi.annotations().get(api::virtual_media::BOOT_OVERRIDE)?;
    (applied == Some(&wanted(vmi)) && vmi.annotations().get(api::virtual_media::BOOT_ONCE_USED) != Some(value)).then(|| value.clone())
}

/// The guest reset with the one-time override `used` in effect: the VMI says so (one
/// annotation key, written without a resourceVersion like the NMI answer: it touches no
/// array), and the controller consumes the override.
pub(super) async fn report_used(client: &kube::Client, vmi: &VirtualMachineInstance, used: &str) {
    use kube::ResourceExt;
    let api: kube::Api<VirtualMachineInstance> = kube::Api::namespaced(client.clone(), &vmi.namespace().unwrap_or_default());
    match client::blind_patch(&api, &vmi.name_any(), client::MetaKey::Annotation, api::virtual_media::BOOT_ONCE_USED, Some(used)).await {
        Ok(_) => tracing::info!("the guest reset with its one-time boot override: reported used"),
        Err(e) => tracing::warn!("cannot report the one-time boot override used: {}", client::error_chain(&e)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_devices_that_exist_from_boot_are_ordered() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v"}, "spec": {"domain": {"devices": {"disks": [
                {"name": "root", "bootOrder": 2}, {"name": "cd", "cdrom": {"bus": "sata"}, "bootOrder": 1},
                {"name": "hot", "disk": {"bus": "scsi"}}, {"name": "empty", "cdrom": {}}]}},
            "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "r"}},
                        {"name": "cd", "dataVolume": {"name": "iso", "hotpluggable": true}},
                        {"name": "hot", "dataVolume": {"name": "d", "hotpluggable": true}}]}}))
        .unwrap();
        let w = wanted(&vmi);
        assert_eq!(w, Order::from([("cd".into(), 1), ("empty".into(), -1), ("root".into(), 2)]));
    }

    #[test]
    fn a_one_time_override_is_armed_only_with_its_order_in_qemu_and_until_reported() {
        let vmi = |ann: serde_json::Value| -> VirtualMachineInstance {
            serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "v", "annotations": ann},
                "spec": {"domain": {"devices": {"disks": [{"name": "cd", "cdrom": {"bus": "sata"}, "bootOrder": 1}]}}, "volumes": []}}))
            .unwrap()
        };
        let once = r#"{"target":"Cd","enabled":"Once","since":5}"#;
        let v = vmi(json!({"virtplug.io/boot-override": once}));
        assert_eq!(armed(&v, Some(&wanted(&v))).as_deref(), Some(once));
        assert_eq!(armed(&v, Some(&Order::from([("cd".into(), -1)]))), None, "QEMU does not have its order yet");
        assert_eq!(armed(&v, None), None);
        let used = vmi(json!({"virtplug.io/boot-override": once, "virtplug.io/boot-once-used": once}));
        assert_eq!(armed(&used, Some(&wanted(&used))), None, "reported already");
        assert_eq!(armed(&vmi(json!({})), Some(&wanted(&v))), None);
    }
}
