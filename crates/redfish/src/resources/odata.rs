//! The OData service document (`/redfish/v1/odata`): the service root's top-level resources.

use serde_json::{json, Value};

use crate::uri::Uri;

pub fn get() -> Value {
    let entry = |name: &str, uri: Uri| json!({"name": name, "kind": "Singleton", "url": uri.path()});
    json!({
        "@odata.context": "/redfish/v1/$metadata",
        "value": [
            entry("Service", Uri::ServiceRoot),
            entry("Systems", Uri::Systems),
            entry("Managers", Uri::Managers),
            entry("Chassis", Uri::ChassisCollection),
            entry("SessionService", Uri::SessionService),
            entry("AccountService", Uri::AccountService),
            entry("TaskService", Uri::TaskService),
            entry("Registries", Uri::Registries),
            entry("Sessions", Uri::Sessions),
        ],
    })
}
