//! Chassis: one per VM (`Id` = the VM's uid), containing its System, managed by its Manager.

use serde_json::{json, Value};

use kube::ResourceExt;

use super::{link, systems, Ctx, CHASSIS, CHASSIS_COLLECTION};
use crate::error::RfError;
use crate::power;
use crate::uri::Uri;

pub fn collection(ctx: &Ctx<'_>) -> Value {
    let members: Vec<Uri> = ctx.svc.cache.vms(&ctx.scope()).iter().filter_map(|vm| vm.uid()).map(Uri::Chassis).collect();
    super::collection(CHASSIS_COLLECTION, "Chassis", &Uri::ChassisCollection, &members)
}

pub fn get(ctx: &Ctx<'_>, id: &str) -> Result<Value, RfError> {
    let vm = ctx.svc.cache.vm(id, &ctx.scope()).ok_or_else(|| RfError::resource_not_found("Chassis", id))?;
    let vmi = ctx.svc.cache.vmi(&vm);
    let on = power::state(&vm, vmi.as_deref()).is_on();
    Ok(json!({
        "@odata.id": Uri::Chassis(id.to_owned()).path(),
        "@odata.type": CHASSIS.odata_type(),
        "Id": id,
        "Name": systems::display_name(&vm),
        "Description": format!("The virtual chassis of VirtualMachine {}", systems::display_name(&vm)),
        "ChassisType": "Other",
        "Manufacturer": systems::MANUFACTURER,
        "Model": systems::MODEL,
        "SerialNumber": id,
        "PowerState": if on { "On" } else { "Off" },
        "Status": super::status_ok(),
        "Links": {
            "ComputerSystems": [link(&Uri::System(id.to_owned()))],
            "ManagedBy": [link(&Uri::Manager(id.to_owned()))],
        },
    }))
}
