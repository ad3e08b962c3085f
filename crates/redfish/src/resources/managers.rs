//! Managers: one BMC per VM (`Id` = the VM's uid), managing its System and Chassis, with the
//! VirtualMedia collection ([`super::virtual_media`]).

use serde_json::{json, Value};

use kube::ResourceExt;

use super::{link, systems, Ctx, MANAGER, MANAGER_COLLECTION};
use crate::error::RfError;
use crate::uri::Uri;

pub fn collection(ctx: &Ctx<'_>) -> Value {
    let members: Vec<Uri> = ctx.svc.cache.vms(&ctx.scope()).iter().filter_map(|vm| vm.uid()).map(Uri::Manager).collect();
    super::collection(MANAGER_COLLECTION, "Managers", &Uri::Managers, &members)
}

pub fn get(ctx: &Ctx<'_>, id: &str) -> Result<Value, RfError> {
    let vm = ctx.svc.cache.vm(id, &ctx.scope()).ok_or_else(|| RfError::resource_not_found("Manager", id))?;
    let manager_uuid = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("virtplug-bmc/{id}").as_bytes());
    Ok(json!({
        "@odata.id": Uri::Manager(id.to_owned()).path(),
        "@odata.type": MANAGER.odata_type(),
        "Id": id,
        "Name": format!("BMC of {}", systems::display_name(&vm)),
        "Description": "The Redfish BMC virtplug gives this VirtualMachine",
        "ManagerType": "BMC",
        "Manufacturer": systems::MANUFACTURER,
        "Model": "virtplug Redfish BMC",
        "FirmwareVersion": env!("CARGO_PKG_VERSION"),
        "UUID": manager_uuid.to_string(),
        "ServiceEntryPointUUID": ctx.svc.uuid(),
        "PowerState": "On",
        "Status": super::status_ok(),
        "VirtualMedia": link(&Uri::ManagerVirtualMedia(id.to_owned())),
        "Links": {
            "ManagerForServers": [link(&Uri::System(id.to_owned()))],
            "ManagerForChassis": [link(&Uri::Chassis(id.to_owned()))],
        },
    }))
}
