//! Registries: the Base message registry, whose MessageIds every error body and Task message
//! uses, served from the vendored file (`registries/Base.1.22.1.json`, DMTF, BSD-3-Clause).

use serde_json::{json, Value};

use super::{REGISTRY_FILE, REGISTRY_FILE_COLLECTION};
use crate::error::RfError;
use crate::registry::{self, BASE_ID};
use crate::uri::Uri;

pub fn collection() -> Value {
    super::collection(REGISTRY_FILE_COLLECTION, "Message Registries", &Uri::Registries, &[Uri::Registry(BASE_ID.to_owned())])
}

pub fn file(id: &str) -> Result<Value, RfError> {
    if id != BASE_ID {
        return Err(RfError::resource_not_found("MessageRegistryFile", id));
    }
    Ok(json!({
        "@odata.id": Uri::Registry(id.to_owned()).path(),
        "@odata.type": REGISTRY_FILE.odata_type(),
        "Id": id,
        "Name": "Base Message Registry File",
        "Description": "The DMTF Base message registry",
        "Languages": ["en"],
        "Registry": registry::PREFIX,
        "Location": [{"Language": "en", "Uri": Uri::RegistryDocument(id.to_owned()).path()}],
    }))
}

/// The registry itself.
pub fn document(id: &str) -> Result<Value, RfError> {
    if id != BASE_ID {
        return Err(RfError::resource_not_found("MessageRegistry", id));
    }
    Ok(registry::base().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_registry_is_served_from_the_vendored_file() {
        assert_eq!(document(BASE_ID).unwrap()["RegistryPrefix"], "Base");
        assert_eq!(document(BASE_ID).unwrap()["@odata.type"], crate::resources::REGISTRY.odata_type(), "$metadata references its type");
        assert_eq!(file(BASE_ID).unwrap()["Location"][0]["Uri"], "/redfish/v1/Registries/Base.1.22.1/Base.1.22.1.json");
        assert!(file("Other.1.0.0").is_err());
        assert_eq!(collection()["Members@odata.count"], 1);
    }
}
