//! The ServiceRoot (`/redfish/v1/`): public, so a client learns the URIs, the protocol version
//! and the query features before it logs in.

use serde_json::{json, Value};

use super::{link, Ctx, SERVICE_ROOT};
use crate::protocol::MAX_EXPAND_LEVELS;
use crate::uri::Uri;

/// The DSP0266 version the service follows (Ironic's profile asks for at least 1.6.0).
pub const REDFISH_VERSION: &str = "1.20.0";

pub fn get(ctx: &Ctx<'_>) -> Value {
    json!({
        "@odata.id": Uri::ServiceRoot.path(),
        "@odata.type": SERVICE_ROOT.odata_type(),
        "Id": "RootService",
        "Name": "virtplug Redfish service",
        "RedfishVersion": REDFISH_VERSION,
        "UUID": ctx.svc.uuid(),
        "Vendor": "virtplug",
        "Product": "virtplug",
        "ProtocolFeaturesSupported": {
            "ExpandQuery": {"ExpandAll": true, "Levels": true, "Links": true, "NoLinks": true, "MaxLevels": MAX_EXPAND_LEVELS},
            "SelectQuery": true,
            "OnlyMemberQuery": true,
            "FilterQuery": false,
            "ExcerptQuery": false,
            "TopSkipQuery": false,
            "DeepOperations": {"DeepPATCH": false, "DeepPOST": false},
        },
        "Systems": link(&Uri::Systems),
        "Managers": link(&Uri::Managers),
        "Chassis": link(&Uri::ChassisCollection),
        "SessionService": link(&Uri::SessionService),
        "AccountService": link(&Uri::AccountService),
        "Tasks": link(&Uri::TaskService),
        "Registries": link(&Uri::Registries),
        "Links": {"Sessions": link(&Uri::Sessions)},
    })
}
