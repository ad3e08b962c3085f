//! Systems: one ComputerSystem per VirtualMachine, `Id` = the VM's `metadata.uid`, `Name` =
//! `namespace/name`, from the VM and its VMI in the caches; its EthernetInterfaces; its boot
//! override ([`api::virtual_media`]); its VirtualMedia are [`super::virtual_media`].

use std::collections::BTreeMap;

use api::network::{derived_mac, Mac};
use serde_json::{json, Value};

use api::phases::PrintableStatus;
use api::{VirtualMachine, VirtualMachineInstance};
use kube::ResourceExt;

use super::{link, Ctx, NIC, NIC_COLLECTION, SYSTEM, SYSTEM_COLLECTION};
use crate::error::RfError;
use crate::power::{self, PowerState, ResetType};
use crate::uri::Uri;

/// `Manufacturer`: never a hardware vendor's name (Ironic keys vendor quirks off it).
pub const MANUFACTURER: &str = "virtplug";
pub const MODEL: &str = "virtplug VirtualMachine";

pub fn collection(ctx: &Ctx<'_>) -> Value {
    let members: Vec<Uri> = ctx.svc.cache.vms(&ctx.scope()).iter().filter_map(|vm| vm.uid()).map(Uri::System).collect();
    super::collection(SYSTEM_COLLECTION, "Computer Systems", &Uri::Systems, &members)
}

/// The VM behind System `id`, if the caller sees it.
fn find(ctx: &Ctx<'_>, id: &str) -> Result<(std::sync::Arc<VirtualMachine>, Option<std::sync::Arc<VirtualMachineInstance>>), RfError> {
    let vm = ctx.svc.cache.vm(id, &ctx.scope()).ok_or_else(|| RfError::resource_not_found("ComputerSystem", id))?;
    let vmi = ctx.svc.cache.vmi(&vm);
    Ok((vm, vmi))
}

pub fn get(ctx: &Ctx<'_>, id: &str) -> Result<Value, RfError> {
    let (vm, vmi) = find(ctx, id)?;
    Ok(render(&vm, vmi.as_deref()))
}

/// `namespace/name`.
#[must_use]
pub fn display_name(vm: &VirtualMachine) -> String {
    format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any())
}

/// The System's UUID: the VM's firmware UUID (`spec.template.spec.domain.firmware.uuid`), else
/// its uid (a UUID too, stable for the VM's life), else a UUID derived from it.
#[must_use]
pub fn system_uuid(vm: &VirtualMachine) -> String {
    let firmware =
        vm.spec.template.spec.as_ref().and_then(|s| s.domain.firmware.as_ref()).and_then(|f| f.extra.get("uuid")).and_then(Value::as_str);
    if let Some(u) = firmware.and_then(|u| uuid::Uuid::parse_str(u).ok()) {
        return u.to_string();
    }
    let uid = vm.uid().unwrap_or_default();
    uuid::Uuid::parse_str(&uid)
        .map_or_else(|_| uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, uid.as_bytes()).to_string(), |u| u.to_string())
}

/// The VM's interfaces and their MAC addresses: those its guest gets
/// ([`api::network::pod_interfaces`]: `macAddress`, or the address derived from the VM's
/// namespace, name and interface name, KubeVirt's auto-attached `default` interface included),
/// so the BMC and the guest agree. A spec virtplug would not run (a KubeVirt cluster's bridge
/// binding, say) still lists its interfaces, with the same derivation where no valid
/// `macAddress` is set.
#[must_use]
pub fn interfaces(vm: &VirtualMachine) -> BTreeMap<String, String> {
    let (ns, name) = (vm.namespace().unwrap_or_default(), vm.name_any());
    let spec = vm.spec.template.spec.as_ref();
    let listed: Vec<(String, Mac)> = match spec.map(|s| api::network::pod_interfaces(s, &ns, &name)) {
        Some(Ok(p)) => p.into_iter().map(|i| (i.name, i.mac)).collect(),
        Some(Err(_)) => spec
            .and_then(|s| api::network::decode(s, "spec").ok())
            .map(|(ifaces, _)| {
                ifaces
                    .into_iter()
                    .map(|i| {
                        let mac = i.mac_address.as_deref().and_then(Mac::parse).unwrap_or_else(|| derived_mac(&ns, &name, &i.name));
                        (i.name, mac)
                    })
                    .collect()
            })
            .unwrap_or_default(),
        None => vec![(api::network::DEFAULT_INTERFACE.to_owned(), derived_mac(&ns, &name, api::network::DEFAULT_INTERFACE))],
    };
    let uid = vm.uid().unwrap_or_default();
    listed
        .into_iter()
        .filter(|(n, _)| Uri::parse(&Uri::EthernetInterface(uid.clone(), n.clone()).path()).is_some())
        .map(|(n, mac)| (n, mac.to_string()))
        .collect()
}

fn memory_gib(vm: &VirtualMachine) -> f64 {
    let Some(spec) = vm.spec.template.spec.as_ref() else { return 0.0 };
    let dom = &spec.domain;
    let q = dom.memory.as_ref().and_then(|m| m.guest.as_ref()).or_else(|| dom.resources.as_ref().and_then(|r| r.requests.get("memory")));
    let bytes = q.and_then(|q| api::quantity::bytes(&q.0).ok()).unwrap_or(128 << 20);
    // Whole MiB, in GiB with three decimals (the schema's Decimal).
    #[allow(clippy::cast_precision_loss)]
    let gib = (bytes >> 20) as f64 / 1024.0;
    (gib * 1000.0).round() / 1000.0
}

fn status(vm: &VirtualMachine, state: PowerState) -> Value {
    let printable = vm.status.as_ref().and_then(|s| s.printable_status.clone());
    let critical = matches!(
        printable,
        Some(
            PrintableStatus::CrashLoopBackOff
                | PrintableStatus::ErrorUnschedulable
                | PrintableStatus::ErrImagePull
                | PrintableStatus::ImagePullBackOff
                | PrintableStatus::ErrorPvcNotFound
                | PrintableStatus::DataVolumeError
        )
    );
    let state = match state {
        PowerState::On | PowerState::PoweringOff => "Enabled",
        PowerState::PoweringOn => "Starting",
        PowerState::Paused => "Quiesced",
        PowerState::Off => "StandbyOffline",
    };
    json!({"State": state, "Health": if critical { "Critical" } else { "OK" }})
}

/// The ComputerSystem of `vm`.
#[must_use]
pub fn render(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> Value {
    let uid = vm.uid().unwrap_or_default();
    let state = power::state(vm, vmi);
    let dom = vm.spec.template.spec.as_ref().map(|s| s.domain.clone()).unwrap_or_default();
    let cpu = dom.cpu.clone().unwrap_or_default();
    let sockets = cpu.sockets.unwrap_or(1).max(1);
    let cores = u64::from(cpu.cores.unwrap_or(1).max(1)) * u64::from(sockets);
    json!({
        "@odata.id": Uri::System(uid.clone()).path(),
        "@odata.type": SYSTEM.odata_type(),
        "Id": uid,
        "Name": display_name(vm),
        "Description": format!("VirtualMachine {}", display_name(vm)),
        "SystemType": "Virtual",
        "Manufacturer": MANUFACTURER,
        "Model": MODEL,
        "SerialNumber": uid,
        "UUID": system_uuid(vm),
        "PowerState": state.as_str(),
        "Status": status(vm, state),
        "ProcessorSummary": {"Count": sockets, "CoreCount": cores, "LogicalProcessorCount": dom.vcpus()},
        "MemorySummary": {"TotalSystemMemoryGiB": memory_gib(vm)},
        "Boot": crate::boot::render(vm),
        "EthernetInterfaces": link(&Uri::EthernetInterfaces(uid.clone())),
        "VirtualMedia": link(&Uri::SystemVirtualMedia(uid.clone())),
        "Links": {
            "ManagedBy": [link(&Uri::Manager(uid.clone()))],
            "Chassis": [link(&Uri::Chassis(uid.clone()))],
        },
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": Uri::SystemReset(uid).path(),
                "ResetType@Redfish.AllowableValues": ResetType::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
            },
        },
    })
}

pub fn nics(ctx: &Ctx<'_>, id: &str) -> Result<Value, RfError> {
    let (vm, _) = find(ctx, id)?;
    let members: Vec<Uri> = interfaces(&vm).into_keys().map(|n| Uri::EthernetInterface(id.to_owned(), n)).collect();
    Ok(super::collection(NIC_COLLECTION, "Ethernet Interfaces", &Uri::EthernetInterfaces(id.to_owned()), &members))
}

pub fn nic(ctx: &Ctx<'_>, id: &str, name: &str) -> Result<Value, RfError> {
    let (vm, vmi) = find(ctx, id)?;
    let mac = interfaces(&vm).remove(name).ok_or_else(|| RfError::resource_not_found("EthernetInterface", name))?;
    let up = power::state(&vm, vmi.as_deref()) == PowerState::On;
    Ok(json!({
        "@odata.id": Uri::EthernetInterface(id.to_owned(), name.to_owned()).path(),
        "@odata.type": NIC.odata_type(),
        "Id": name,
        "Name": format!("Interface {name}"),
        "MACAddress": mac,
        "PermanentMACAddress": mac,
        "InterfaceEnabled": true,
        "LinkStatus": if up { "LinkUp" } else { "LinkDown" },
        "Status": super::status_ok(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::needless_pass_by_value)]
    fn vm(spec: Value) -> VirtualMachine {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "bm-0", "namespace": "metal", "uid": "5b0e6a0e-7f7c-4d5c-9a57-2d3b1c2d3e4f"},
            "spec": {"runStrategy": "Halted", "template": {"spec": spec}}}))
        .unwrap()
    }

    #[test]
    fn a_system_renders_from_its_vm() {
        let v = vm(json!({"domain": {"memory": {"guest": "1536Mi"}, "cpu": {"cores": 2, "sockets": 2},
            "firmware": {"uuid": "11111111-2222-3333-4444-555555555555"},
            "devices": {"interfaces": [{"name": "eth0", "macAddress": "52:54:00:AA:BB:CC"}, {"name": "eth1"}]}}}));
        let s = render(&v, None);
        assert_eq!(s["Id"], "5b0e6a0e-7f7c-4d5c-9a57-2d3b1c2d3e4f");
        assert_eq!(s["Name"], "metal/bm-0");
        assert_eq!(s["UUID"], "11111111-2222-3333-4444-555555555555");
        assert_eq!(s["PowerState"], "Off");
        assert_eq!(s["Manufacturer"], "virtplug");
        assert_eq!(s["MemorySummary"]["TotalSystemMemoryGiB"], 1.5);
        assert_eq!(s["ProcessorSummary"]["LogicalProcessorCount"], 4);
        assert_eq!(s["Links"]["ManagedBy"][0]["@odata.id"], "/redfish/v1/Managers/5b0e6a0e-7f7c-4d5c-9a57-2d3b1c2d3e4f");
        assert_eq!(s["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"].as_array().unwrap().len(), 8);
        let nics = interfaces(&v);
        assert_eq!(nics["eth0"], "52:54:00:aa:bb:cc");
        assert!(nics["eth1"].starts_with("02:"));
        assert_eq!(nics["eth1"], interfaces(&v)["eth1"], "stable");
    }

    #[test]
    fn without_a_firmware_uuid_the_uid_is_the_uuid_and_there_is_a_default_interface() {
        let v = vm(json!({"domain": {"devices": {}}}));
        assert_eq!(system_uuid(&v), "5b0e6a0e-7f7c-4d5c-9a57-2d3b1c2d3e4f");
        assert_eq!(interfaces(&v).keys().collect::<Vec<_>>(), ["default"]);
        assert_eq!(interfaces(&v)["default"], derived_mac("metal", "bm-0", "default").to_string());
        // The address the guest's NIC gets (the node agent builds it from the same resolution).
        let v = vm(
            json!({"domain": {"devices": {"interfaces": [{"name": "pxe", "masquerade": {}}]}}, "networks": [{"name": "pxe", "pod": {}}]}),
        );
        let guest = api::network::pod_interfaces(v.spec.template.spec.as_ref().unwrap(), "metal", "bm-0").unwrap();
        assert_eq!(interfaces(&v)["pxe"], guest[0].mac.to_string());
        let v = vm(json!({"domain": {"devices": {"autoattachPodInterface": false}}}));
        assert!(interfaces(&v).is_empty(), "no interface, none reported");
    }
}
