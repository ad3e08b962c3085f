//! The resources, one file each: how a [`Uri`] renders to JSON from the caches and the
//! service's state. Rendering never writes and never calls the API.
//!
//! Every `@odata.type` comes from [`TYPES`], which `$metadata` also lists: a type served is a
//! type referenced, by construction.

mod account_service;
mod chassis;
mod managers;
pub mod metadata;
mod odata;
mod registries;
mod service_root;
mod session_service;
pub mod systems;
mod task_service;
pub mod virtual_media;

use serde_json::{json, Value};

use crate::accounts::Scope;
use crate::auth::Caller;
use crate::error::RfError;
use crate::service::Service;
use crate::uri::{MediaOwner, Uri};

pub use account_service::{account_etag, account_json};

/// A schema type: namespace, version (none for collections) and type name.
#[derive(Clone, Copy, Debug)]
pub struct Ty {
    pub ns: &'static str,
    pub version: Option<&'static str>,
    pub name: &'static str,
}

impl Ty {
    const fn versioned(ns: &'static str, version: &'static str) -> Ty {
        Ty { ns, version: Some(version), name: ns }
    }
    const fn collection(ns: &'static str) -> Ty {
        Ty { ns, version: None, name: ns }
    }

    /// `#ComputerSystem.v1_27_0.ComputerSystem`.
    #[must_use]
    pub fn odata_type(&self) -> String {
        match self.version {
            Some(v) => format!("#{}.{v}.{}", self.ns, self.name),
            None => format!("#{}.{}", self.ns, self.name),
        }
    }
}

pub const SERVICE_ROOT: Ty = Ty::versioned("ServiceRoot", "v1_20_0");
pub const SYSTEM_COLLECTION: Ty = Ty::collection("ComputerSystemCollection");
pub const SYSTEM: Ty = Ty::versioned("ComputerSystem", "v1_27_0");
pub const NIC_COLLECTION: Ty = Ty::collection("EthernetInterfaceCollection");
pub const NIC: Ty = Ty::versioned("EthernetInterface", "v1_12_4");
pub const VIRTUAL_MEDIA_COLLECTION: Ty = Ty::collection("VirtualMediaCollection");
pub const VIRTUAL_MEDIA: Ty = Ty::versioned("VirtualMedia", "v1_6_5");
pub const MANAGER_COLLECTION: Ty = Ty::collection("ManagerCollection");
pub const MANAGER: Ty = Ty::versioned("Manager", "v1_24_0");
pub const CHASSIS_COLLECTION: Ty = Ty::collection("ChassisCollection");
pub const CHASSIS: Ty = Ty::versioned("Chassis", "v1_28_0");
pub const SESSION_SERVICE: Ty = Ty::versioned("SessionService", "v1_2_0");
pub const SESSION_COLLECTION: Ty = Ty::collection("SessionCollection");
pub const SESSION: Ty = Ty::versioned("Session", "v1_8_0");
pub const ACCOUNT_SERVICE: Ty = Ty::versioned("AccountService", "v1_18_1");
pub const ACCOUNT_COLLECTION: Ty = Ty::collection("ManagerAccountCollection");
pub const ACCOUNT: Ty = Ty::versioned("ManagerAccount", "v1_14_1");
pub const ROLE_COLLECTION: Ty = Ty::collection("RoleCollection");
pub const ROLE: Ty = Ty::versioned("Role", "v1_3_3");
pub const TASK_SERVICE: Ty = Ty::versioned("TaskService", "v1_3_0");
pub const TASK_COLLECTION: Ty = Ty::collection("TaskCollection");
pub const TASK: Ty = Ty::versioned("Task", "v1_7_4");
pub const REGISTRY_FILE_COLLECTION: Ty = Ty::collection("MessageRegistryFileCollection");
pub const REGISTRY_FILE: Ty = Ty::versioned("MessageRegistryFile", "v1_1_5");
/// The type of the registry document itself (its `@odata.type` in the vendored file).
pub const REGISTRY: Ty = Ty::versioned("MessageRegistry", "v1_7_0");

/// Every type the service serves (what `$metadata` references).
pub const TYPES: &[Ty] = &[
    SERVICE_ROOT,
    SYSTEM_COLLECTION,
    SYSTEM,
    NIC_COLLECTION,
    NIC,
    VIRTUAL_MEDIA_COLLECTION,
    VIRTUAL_MEDIA,
    MANAGER_COLLECTION,
    MANAGER,
    CHASSIS_COLLECTION,
    CHASSIS,
    SESSION_SERVICE,
    SESSION_COLLECTION,
    SESSION,
    ACCOUNT_SERVICE,
    ACCOUNT_COLLECTION,
    ACCOUNT,
    ROLE_COLLECTION,
    ROLE,
    TASK_SERVICE,
    TASK_COLLECTION,
    TASK,
    REGISTRY_FILE_COLLECTION,
    REGISTRY_FILE,
    REGISTRY,
];

/// What a rendering knows about the request.
pub struct Ctx<'a> {
    pub svc: &'a Service,
    /// `None` only for the public resources.
    pub caller: Option<&'a Caller>,
}

impl Ctx<'_> {
    /// The caller's scope; without a caller, one that sees nothing.
    #[must_use]
    pub fn scope(&self) -> Scope {
        match self.caller {
            Some(c) => c.scope.clone(),
            None => Scope { namespaces: vec![String::new()], ..Scope::default() },
        }
    }
}

/// `{"@odata.id": path}`.
#[must_use]
pub fn link(uri: &Uri) -> Value {
    json!({"@odata.id": uri.path()})
}

/// A resource collection.
#[must_use]
pub fn collection(ty: Ty, name: &str, uri: &Uri, members: &[Uri]) -> Value {
    json!({
        "@odata.id": uri.path(),
        "@odata.type": ty.odata_type(),
        "Name": name,
        "Members@odata.count": members.len(),
        "Members": members.iter().map(link).collect::<Vec<_>>(),
    })
}

/// `Status` of a resource that is simply there and working.
#[must_use]
pub fn status_ok() -> Value {
    json!({"State": "Enabled", "Health": "OK"})
}

/// Renders `uri` for `ctx` (GET).
///
/// # Errors
/// 404 for a resource that does not exist or that the caller's scope does not see.
pub fn get(ctx: &Ctx<'_>, uri: &Uri) -> Result<Value, RfError> {
    match uri {
        Uri::Versions => Ok(json!({"v1": "/redfish/v1/"})),
        Uri::ServiceRoot => Ok(service_root::get(ctx)),
        Uri::Metadata => Err(RfError::internal("$metadata is XML and rendered by metadata::document")),
        Uri::Odata => Ok(odata::get()),
        Uri::Systems => Ok(systems::collection(ctx)),
        Uri::System(id) => systems::get(ctx, id),
        Uri::SystemReset(_) => Err(RfError::method_not_allowed(uri.allowed())),
        Uri::EthernetInterfaces(id) => systems::nics(ctx, id),
        Uri::EthernetInterface(id, nic) => systems::nic(ctx, id, nic),
        Uri::SystemVirtualMedia(id) => virtual_media::collection(ctx, MediaOwner::System, id),
        Uri::Managers => Ok(managers::collection(ctx)),
        Uri::Manager(id) => managers::get(ctx, id),
        Uri::ManagerVirtualMedia(id) => virtual_media::collection(ctx, MediaOwner::Manager, id),
        Uri::VirtualMedia(o, id, dev) => virtual_media::get(ctx, *o, id, dev),
        Uri::InsertMedia(..) | Uri::EjectMedia(..) => Err(RfError::method_not_allowed(uri.allowed())),
        Uri::ChassisCollection => Ok(chassis::collection(ctx)),
        Uri::Chassis(id) => chassis::get(ctx, id),
        Uri::SessionService => Ok(session_service::service(ctx)),
        Uri::Sessions => Ok(session_service::collection(ctx)),
        Uri::Session(id) => session_service::get(ctx, id),
        Uri::AccountService => Ok(account_service::service()),
        Uri::Accounts => Ok(account_service::accounts(ctx)),
        Uri::Account(id) => account_service::account(ctx, id),
        Uri::Roles => Ok(account_service::roles()),
        Uri::Role(id) => account_service::role(id),
        Uri::TaskService => Ok(task_service::service()),
        Uri::Tasks => Ok(task_service::collection(ctx)),
        Uri::Task(id) => task_service::get(ctx, id),
        Uri::Registries => Ok(registries::collection()),
        Uri::Registry(id) => registries::file(id),
        Uri::RegistryDocument(id) => registries::document(id),
    }
}
