//! The service's URIs, typed: every path the service answers parses into a [`Uri`], and every
//! link it writes is formatted from one, so the two cannot drift apart. The paths are exactly
//! those of the schemas' `Redfish.Uris` (DSP8010): `/redfish/v1/Systems/{ComputerSystemId}`,
//! never a vendor path, and no redirects.
//!
//! A trailing slash is accepted on every path (and is canonical only for `/redfish/v1/`).

use http::Method;

/// One addressable resource (or action target) of the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Uri {
    /// `/redfish`: the version document.
    Versions,
    ServiceRoot,
    Metadata,
    Odata,
    Systems,
    System(String),
    SystemReset(String),
    EthernetInterfaces(String),
    EthernetInterface(String, String),
    /// `/redfish/v1/Systems/{id}/VirtualMedia` (sushy looks here first).
    SystemVirtualMedia(String),
    Managers,
    Manager(String),
    ManagerVirtualMedia(String),
    /// One virtual-media device (`Cd`), under the System or its Manager.
    VirtualMedia(MediaOwner, String, String),
    /// `.../VirtualMedia/{dev}/Actions/VirtualMedia.InsertMedia`.
    InsertMedia(MediaOwner, String, String),
    /// `.../VirtualMedia/{dev}/Actions/VirtualMedia.EjectMedia`.
    EjectMedia(MediaOwner, String, String),
    ChassisCollection,
    Chassis(String),
    SessionService,
    Sessions,
    Session(String),
    AccountService,
    Accounts,
    Account(String),
    Roles,
    Role(String),
    TaskService,
    Tasks,
    Task(String),
    Registries,
    Registry(String),
    /// The registry document itself (`MessageRegistryFile.Location[].Uri`).
    RegistryDocument(String),
}

/// Which collection a virtual-media device is reached through (the same device either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaOwner {
    System,
    Manager,
}

impl MediaOwner {
    fn segment(self) -> &'static str {
        match self {
            MediaOwner::System => "Systems",
            MediaOwner::Manager => "Managers",
        }
    }
}

/// The action names served, for messages.
pub const RESET_ACTION: &str = "ComputerSystem.Reset";
pub const INSERT_ACTION: &str = "VirtualMedia.InsertMedia";
pub const EJECT_ACTION: &str = "VirtualMedia.EjectMedia";

impl Uri {
    /// Parses a request path (percent-decoding nothing: no id contains a character that needs
    /// it). `None` for any path the service does not serve. `/Members` after a collection that
    /// accepts POST (DSP0266: "POST to the Members property") parses as the collection.
    #[must_use]
    pub fn parse(path: &str) -> Option<Uri> {
        if path == "/redfish" || path == "/redfish/" {
            return Some(Uri::Versions);
        }
        let rest = path.strip_prefix("/redfish/v1")?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let segs: Vec<&str> = if rest.is_empty() { Vec::new() } else { rest.strip_prefix('/')?.split('/').collect() };
        if segs.iter().any(|s| !valid_segment(s)) {
            return None;
        }
        let own = |s: &str| s.to_owned();
        let uri = match segs.as_slice() {
            [] => Uri::ServiceRoot,
            ["$metadata"] => Uri::Metadata,
            ["odata"] => Uri::Odata,
            ["Systems"] => Uri::Systems,
            ["Systems", id] => Uri::System(own(id)),
            ["Systems", id, "Actions", "ComputerSystem.Reset"] => Uri::SystemReset(own(id)),
            ["Systems", id, "EthernetInterfaces"] => Uri::EthernetInterfaces(own(id)),
            ["Systems", id, "EthernetInterfaces", nic] => Uri::EthernetInterface(own(id), own(nic)),
            ["Systems", id, "VirtualMedia"] => Uri::SystemVirtualMedia(own(id)),
            ["Managers"] => Uri::Managers,
            ["Managers", id] => Uri::Manager(own(id)),
            ["Managers", id, "VirtualMedia"] => Uri::ManagerVirtualMedia(own(id)),
            [owner @ ("Systems" | "Managers"), id, "VirtualMedia", dev, rest @ ..] => {
                let o = if *owner == "Systems" { MediaOwner::System } else { MediaOwner::Manager };
                match rest {
                    [] => Uri::VirtualMedia(o, own(id), own(dev)),
                    ["Actions", "VirtualMedia.InsertMedia"] => Uri::InsertMedia(o, own(id), own(dev)),
                    ["Actions", "VirtualMedia.EjectMedia"] => Uri::EjectMedia(o, own(id), own(dev)),
                    _ => return None,
                }
            }
            ["Chassis"] => Uri::ChassisCollection,
            ["Chassis", id] => Uri::Chassis(own(id)),
            ["SessionService"] => Uri::SessionService,
            ["SessionService", "Sessions"] | ["SessionService", "Sessions", "Members"] => Uri::Sessions,
            ["SessionService", "Sessions", id] => Uri::Session(own(id)),
            ["AccountService"] => Uri::AccountService,
            ["AccountService", "Accounts"] | ["AccountService", "Accounts", "Members"] => Uri::Accounts,
            ["AccountService", "Accounts", id] => Uri::Account(own(id)),
            ["AccountService", "Roles"] => Uri::Roles,
            ["AccountService", "Roles", id] => Uri::Role(own(id)),
            ["TaskService"] => Uri::TaskService,
            ["TaskService", "Tasks"] => Uri::Tasks,
            ["TaskService", "Tasks", id] => Uri::Task(own(id)),
            ["Registries"] => Uri::Registries,
            ["Registries", id] => Uri::Registry(own(id)),
            ["Registries", id, doc] if doc.strip_suffix(".json") == Some(id) => Uri::RegistryDocument(own(id)),
            _ => return None,
        };
        Some(uri)
    }

    /// The canonical path (the resource's `@odata.id`).
    #[must_use]
    pub fn path(&self) -> String {
        const V1: &str = "/redfish/v1";
        match self {
            Uri::Versions => "/redfish".to_owned(),
            Uri::ServiceRoot => format!("{V1}/"),
            Uri::Metadata => format!("{V1}/$metadata"),
            Uri::Odata => format!("{V1}/odata"),
            Uri::Systems => format!("{V1}/Systems"),
            Uri::System(id) => format!("{V1}/Systems/{id}"),
            Uri::SystemReset(id) => format!("{V1}/Systems/{id}/Actions/ComputerSystem.Reset"),
            Uri::EthernetInterfaces(id) => format!("{V1}/Systems/{id}/EthernetInterfaces"),
            Uri::EthernetInterface(id, nic) => format!("{V1}/Systems/{id}/EthernetInterfaces/{nic}"),
            Uri::SystemVirtualMedia(id) => format!("{V1}/Systems/{id}/VirtualMedia"),
            Uri::Managers => format!("{V1}/Managers"),
            Uri::Manager(id) => format!("{V1}/Managers/{id}"),
            Uri::ManagerVirtualMedia(id) => format!("{V1}/Managers/{id}/VirtualMedia"),
            Uri::VirtualMedia(o, id, dev) => format!("{V1}/{}/{id}/VirtualMedia/{dev}", o.segment()),
            Uri::InsertMedia(o, id, dev) => format!("{V1}/{}/{id}/VirtualMedia/{dev}/Actions/{INSERT_ACTION}", o.segment()),
            Uri::EjectMedia(o, id, dev) => format!("{V1}/{}/{id}/VirtualMedia/{dev}/Actions/{EJECT_ACTION}", o.segment()),
            Uri::ChassisCollection => format!("{V1}/Chassis"),
            Uri::Chassis(id) => format!("{V1}/Chassis/{id}"),
            Uri::SessionService => format!("{V1}/SessionService"),
            Uri::Sessions => format!("{V1}/SessionService/Sessions"),
            Uri::Session(id) => format!("{V1}/SessionService/Sessions/{id}"),
            Uri::AccountService => format!("{V1}/AccountService"),
            Uri::Accounts => format!("{V1}/AccountService/Accounts"),
            Uri::Account(id) => format!("{V1}/AccountService/Accounts/{id}"),
            Uri::Roles => format!("{V1}/AccountService/Roles"),
            Uri::Role(id) => format!("{V1}/AccountService/Roles/{id}"),
            Uri::TaskService => format!("{V1}/TaskService"),
            Uri::Tasks => format!("{V1}/TaskService/Tasks"),
            Uri::Task(id) => format!("{V1}/TaskService/Tasks/{id}"),
            Uri::Registries => format!("{V1}/Registries"),
            Uri::Registry(id) => format!("{V1}/Registries/{id}"),
            Uri::RegistryDocument(id) => format!("{V1}/Registries/{id}/{id}.json"),
        }
    }

    /// The methods the resource answers (what `Allow` lists). GET implies HEAD.
    #[must_use]
    pub fn allowed(&self) -> &'static [Method] {
        const READ: &[Method] = &[Method::GET, Method::HEAD];
        const PATCH: &[Method] = &[Method::GET, Method::HEAD, Method::PATCH];
        const CREATE: &[Method] = &[Method::GET, Method::HEAD, Method::POST];
        const EDIT: &[Method] = &[Method::GET, Method::HEAD, Method::PATCH, Method::DELETE];
        const DELETE: &[Method] = &[Method::GET, Method::HEAD, Method::DELETE];
        const ACTION: &[Method] = &[Method::POST];
        match self {
            Uri::SystemReset(_) | Uri::InsertMedia(..) | Uri::EjectMedia(..) => ACTION,
            Uri::SessionService | Uri::System(_) | Uri::VirtualMedia(..) => PATCH,
            Uri::Sessions | Uri::Accounts => CREATE,
            Uri::Session(_) => DELETE,
            Uri::Account(_) => EDIT,
            _ => READ,
        }
    }

    /// Whether the URI answers without credentials (DSP0266 §13.3.2: the version document, the
    /// service root, `$metadata` and the OData service document).
    #[must_use]
    pub fn is_public(&self) -> bool {
        matches!(self, Uri::Versions | Uri::ServiceRoot | Uri::Metadata | Uri::Odata)
    }
}

/// What an id may look like: a Kubernetes UID, a user name, a registry id. Anything else (an
/// empty segment, `..`, percent escapes) is not a URI of this service.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'$'))
        && s != "."
        && s != ".."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_uri_parses_back_from_its_path() {
        let id = "2f1b3c1e-0000-4000-8000-000000000001".to_owned();
        for u in [
            Uri::Versions,
            Uri::ServiceRoot,
            Uri::Metadata,
            Uri::Odata,
            Uri::Systems,
            Uri::System(id.clone()),
            Uri::SystemReset(id.clone()),
            Uri::EthernetInterfaces(id.clone()),
            Uri::EthernetInterface(id.clone(), "default".into()),
            Uri::SystemVirtualMedia(id.clone()),
            Uri::Managers,
            Uri::Manager(id.clone()),
            Uri::ManagerVirtualMedia(id.clone()),
            Uri::VirtualMedia(MediaOwner::System, id.clone(), "Cd".into()),
            Uri::VirtualMedia(MediaOwner::Manager, id.clone(), "Cd".into()),
            Uri::InsertMedia(MediaOwner::System, id.clone(), "Cd".into()),
            Uri::EjectMedia(MediaOwner::Manager, id.clone(), "Cd".into()),
            Uri::ChassisCollection,
            Uri::Chassis(id.clone()),
            Uri::SessionService,
            Uri::Sessions,
            Uri::Session("a1".into()),
            Uri::AccountService,
            Uri::Accounts,
            Uri::Account("admin".into()),
            Uri::Roles,
            Uri::Role("ReadOnly".into()),
            Uri::TaskService,
            Uri::Tasks,
            Uri::Task("7".into()),
            Uri::Registries,
            Uri::Registry("Base.1.22.1".into()),
            Uri::RegistryDocument("Base.1.22.1".into()),
        ] {
            assert_eq!(Uri::parse(&u.path()), Some(u.clone()), "{}", u.path());
        }
    }

    #[test]
    fn trailing_slashes_and_members_are_accepted_and_nothing_else() {
        assert_eq!(Uri::parse("/redfish/v1"), Some(Uri::ServiceRoot));
        assert_eq!(Uri::parse("/redfish/v1/Systems/"), Some(Uri::Systems));
        assert_eq!(Uri::parse("/redfish/v1/SessionService/Sessions/Members"), Some(Uri::Sessions));
        for bad in [
            "/redfish/v2/",
            "/redfish/v1//Systems",
            "/redfish/v1/Systems/../Managers",
            "/redfish/v1/Systems/a%2Fb",
            "/redfish/v1/RPVfoobar",
            "/redfish/v1/Chassis/c/Systems/s",
        ] {
            assert_eq!(Uri::parse(bad), None, "{bad}");
        }
    }
}
