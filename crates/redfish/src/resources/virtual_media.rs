//! VirtualMedia: the `Cd` device of a System, under the System (where sushy looks first) and
//! under its Manager — one device, two addresses, the same state ([`crate::media`]).

use serde_json::{json, Value};

use super::{Ctx, VIRTUAL_MEDIA, VIRTUAL_MEDIA_COLLECTION};
use crate::error::RfError;
use crate::media::{self, DEVICE};
use crate::uri::{MediaOwner, Uri};

/// Transfer protocols an image may be fetched with.
pub const PROTOCOLS: &[&str] = &["HTTP", "HTTPS"];
/// Transfer methods accepted: the image is imported whole before it is in the drive
/// (`Upload`); `Stream` is accepted and served the same way.
pub const METHODS: &[&str] = &["Stream", "Upload"];

fn collection_uri(owner: MediaOwner, id: &str) -> Uri {
    match owner {
        MediaOwner::System => Uri::SystemVirtualMedia(id.to_owned()),
        MediaOwner::Manager => Uri::ManagerVirtualMedia(id.to_owned()),
    }
}

fn not_found(owner: MediaOwner, id: &str) -> RfError {
    RfError::resource_not_found(if owner == MediaOwner::System { "ComputerSystem" } else { "Manager" }, id)
}

/// `{Systems,Managers}/{id}/VirtualMedia`.
pub fn collection(ctx: &Ctx<'_>, owner: MediaOwner, id: &str) -> Result<Value, RfError> {
    ctx.svc.cache.vm(id, &ctx.scope()).ok_or_else(|| not_found(owner, id))?;
    Ok(super::collection(VIRTUAL_MEDIA_COLLECTION, "Virtual Media", &collection_uri(owner, id), &[media::member(owner, id)]))
}

fn image_name(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or(path).to_owned()
}

/// `.../VirtualMedia/Cd`.
pub fn get(ctx: &Ctx<'_>, owner: MediaOwner, id: &str, dev: &str) -> Result<Value, RfError> {
    let vm = ctx.svc.cache.vm(id, &ctx.scope()).ok_or_else(|| not_found(owner, id))?;
    if dev != DEVICE {
        return Err(RfError::resource_not_found("VirtualMedia", dev));
    }
    let vmi = ctx.svc.cache.vmi(&vm);
    let s = media::state(ctx.svc, &vm, vmi.as_deref());
    let protocol = s.image.as_deref().map(|u| if u.starts_with("https:") { "HTTPS" } else { "HTTP" });
    let actions = |action: &Uri| json!({"target": action.path()});
    let mut insert = actions(&Uri::InsertMedia(owner, id.to_owned(), dev.to_owned()));
    insert["TransferProtocolType@Redfish.AllowableValues"] = json!(PROTOCOLS);
    insert["TransferMethod@Redfish.AllowableValues"] = json!(METHODS);
    Ok(json!({
        "@odata.id": media::member(owner, id).path(),
        "@odata.type": VIRTUAL_MEDIA.odata_type(),
        "Id": DEVICE,
        "Name": "Virtual CD",
        "Description": "A CD/DVD drive of the VM; the image is imported into a DataVolume and inserted in the drive",
        "MediaTypes": ["CD", "DVD"],
        "Image": s.image,
        "ImageName": s.image.as_deref().map(image_name),
        "Inserted": s.inserted,
        "WriteProtected": true,
        "ConnectedVia": if s.image.is_some() { "URI" } else { "NotConnected" },
        "TransferProtocolType": protocol,
        "TransferProtocolType@Redfish.AllowableValues": PROTOCOLS,
        "TransferMethod": "Upload",
        "TransferMethod@Redfish.AllowableValues": METHODS,
        "Status": {"State": "Enabled", "Health": if s.failed.is_some() { "Critical" } else { "OK" }},
        "Actions": {
            "#VirtualMedia.InsertMedia": insert,
            "#VirtualMedia.EjectMedia": actions(&Uri::EjectMedia(owner, id.to_owned(), dev.to_owned())),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_name_is_the_last_path_segment() {
        assert_eq!(image_name("http://10.0.0.1:8080/images/ipa.iso?x=1"), "ipa.iso");
        assert_eq!(image_name("https://h/a/boot.iso/"), "boot.iso");
    }
}
