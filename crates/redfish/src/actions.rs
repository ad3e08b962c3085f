//! Parse at the edge: every write request (POST, PATCH, DELETE) is validated whole into one
//! typed [`Action`] before anything is done, so a request that is refused changed nothing
//! (firecracker's `deny_unknown_fields` discipline: an unknown property is an error naming it,
//! never ignored). [`crate::executor`] is the one place that carries actions out.

use bytes::Bytes;
use http::{HeaderMap, Method};
use serde_json::{Map, Value};

use crate::accounts::Role;
use crate::error::RfError;
use crate::power::ResetType;
use crate::sessions::{MAX_TIMEOUT, MIN_TIMEOUT};
use crate::uri::{Uri, EJECT_ACTION, INSERT_ACTION, RESET_ACTION};

/// A write, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// `POST Sessions`.
    Login { user: String, password: String },
    /// `DELETE Sessions/{id}`.
    Logout { id: String },
    /// `PATCH SessionService`.
    SetSessionTimeout { secs: u64 },
    /// `POST Accounts`.
    CreateAccount { user: String, password: String, role: Role, enabled: bool },
    /// `PATCH Accounts/{id}`.
    EditAccount { id: String, edit: AccountEdit },
    /// `DELETE Accounts/{id}`.
    DeleteAccount { id: String },
    /// `POST Systems/{id}/Actions/ComputerSystem.Reset`.
    Reset { system: String, reset: ResetType },
    /// `InsertMedia`, or a PATCH of `Image` (`target`: the URI written to).
    InsertMedia { system: String, image: String, target: Uri },
    /// `EjectMedia`, or a PATCH of `Image: null` / `Inserted: false`.
    EjectMedia { system: String, target: Uri },
    /// `PATCH Systems/{id}` of `Boot`.
    SetBoot { system: String, boot: BootPatch },
}

/// What a PATCH of `Boot` asks for (absent: unchanged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootPatch {
    /// `None` inside: `BootSourceOverrideTarget: None`.
    pub target: Option<Option<api::virtual_media::Target>>,
    /// `None` inside: `Disabled`.
    pub enabled: Option<Option<api::virtual_media::Enabled>>,
    /// `true`: UEFI.
    pub uefi: Option<bool>,
}

/// Longest image URL accepted.
pub const MAX_IMAGE_URL: usize = 2048;

/// Checks an image URL: http or https, with a host, at most [`MAX_IMAGE_URL`] long.
fn image_url(v: &Value, param: &str, action: &str) -> Result<String, RfError> {
    let s = v.as_str().ok_or_else(|| RfError::action_parameter_type(v, param, action))?;
    if s.len() > MAX_IMAGE_URL {
        return Err(RfError::string_too_long(&format!("{}...", s.chars().take(64).collect::<String>()), param, MAX_IMAGE_URL));
    }
    let shown: String = s.chars().take(200).collect();
    let why = "Image must be an http:// or https:// URL with a host (file, ftp, nfs, cifs and other schemes are refused: \
               the image is imported over HTTP)";
    let uri: http::Uri = s.parse().map_err(|_| RfError::action_parameter_format(&shown, param, action, why))?;
    let scheme_ok = matches!(uri.scheme_str().map(str::to_ascii_lowercase).as_deref(), Some("http" | "https"));
    if !scheme_ok || uri.host().is_none_or(str::is_empty) || s.chars().any(char::is_whitespace) {
        return Err(RfError::action_parameter_format(&shown, param, action, why));
    }
    Ok(s.to_owned())
}

/// `InsertMedia`'s parameters; every one the schema defines is accepted and checked.
fn insert_media(system: &str, target: Uri, m: &Map<String, Value>) -> Result<Action, RfError> {
    const A: &str = INSERT_ACTION;
    const PARAMS: &[&str] =
        &["Image", "Inserted", "WriteProtected", "MediaType", "TransferProtocolType", "TransferMethod", "UserName", "Password"];
    if let Some(k) = m.keys().find(|k| !PARAMS.contains(&k.as_str())) {
        return Err(RfError::action_parameter_unknown(A, k));
    }
    let image = image_url(m.get("Image").ok_or_else(|| RfError::action_parameter_missing(A, "Image"))?, "Image", A)?;
    let flag = |k: &str| -> Result<Option<bool>, RfError> {
        m.get(k).map(|v| v.as_bool().ok_or_else(|| RfError::action_parameter_type(v, k, A))).transpose()
    };
    let text = |k: &str| -> Result<Option<&str>, RfError> {
        m.get(k).map(|v| v.as_str().ok_or_else(|| RfError::action_parameter_type(v, k, A))).transpose()
    };
    if flag("Inserted")? == Some(false) {
        return Err(RfError::action_parameter_unsupported(
            "Inserted",
            A,
            "a medium is in the drive once inserted; Inserted: false is not supported (use EjectMedia to take it out)",
        ));
    }
    if flag("WriteProtected")? == Some(false) {
        return Err(RfError::action_parameter_unsupported("WriteProtected", A, "a CD/DVD medium is always write-protected"));
    }
    if let Some(t) = text("MediaType")? {
        if !matches!(t, "CD" | "DVD") {
            return Err(RfError::action_parameter_not_in_list(t, "MediaType", A));
        }
    }
    if let Some(p) = text("TransferProtocolType")? {
        if !crate::resources::virtual_media::PROTOCOLS.contains(&p) {
            return Err(RfError::action_parameter_not_in_list(p, "TransferProtocolType", A));
        }
        let scheme = image.split(':').next().unwrap_or_default().to_ascii_uppercase();
        if scheme != p {
            return Err(RfError::action_conflict("TransferProtocolType", p, &format!("the Image URL's scheme is {scheme}")));
        }
    }
    if let Some(t) = text("TransferMethod")? {
        if !crate::resources::virtual_media::METHODS.contains(&t) {
            return Err(RfError::action_parameter_not_in_list(t, "TransferMethod", A));
        }
    }
    for k in ["UserName", "Password"] {
        if text(k)?.is_some_and(|v| !v.is_empty() && v != "none") {
            return Err(RfError::action_parameter_unsupported(
                k,
                A,
                "credentials for the image server are not supported; serve the image without authentication",
            ));
        }
    }
    Ok(Action::InsertMedia { system: system.to_owned(), image, target })
}

fn eject_media(system: &str, target: Uri, m: &Map<String, Value>) -> Result<Action, RfError> {
    if let Some(k) = m.keys().next() {
        return Err(RfError::action_parameter_unknown(EJECT_ACTION, k));
    }
    Ok(Action::EjectMedia { system: system.to_owned(), target })
}

/// A PATCH of the VirtualMedia resource (what sushy falls back to without the actions).
fn patch_media(system: &str, target: Uri, m: &Map<String, Value>) -> Result<Action, RfError> {
    const READ_ONLY: &[&str] =
        &["Id", "Name", "Description", "MediaTypes", "ImageName", "ConnectedVia", "Status", "Actions", "Links", "Oem"];
    only(m, &["Image", "Inserted", "WriteProtected", "TransferProtocolType", "TransferMethod", "UserName", "Password"], READ_ONLY)?;
    let inserted = boolean(m, "Inserted")?;
    if boolean(m, "WriteProtected")? == Some(false) {
        return Err(RfError::property_not_in_list("false", "WriteProtected"));
    }
    match m.get("Image") {
        Some(Value::Null) => Ok(Action::EjectMedia { system: system.to_owned(), target }),
        Some(Value::String(s)) if s.is_empty() => Ok(Action::EjectMedia { system: system.to_owned(), target }),
        Some(_) if inserted == Some(false) => Err(RfError::property_not_in_list("false", "Inserted")),
        Some(_) => {
            let mut params = m.clone();
            params.remove("Inserted");
            params.retain(|k, _| !k.starts_with("@odata."));
            insert_media(system, target, &params)
        }
        None if inserted == Some(false) => Ok(Action::EjectMedia { system: system.to_owned(), target }),
        None => Err(RfError::no_operation()),
    }
}

/// A PATCH of a System: only `Boot` is writable.
fn patch_system(system: &str, m: &Map<String, Value>) -> Result<Action, RfError> {
    const READ_ONLY: &[&str] = &[
        "Id",
        "Name",
        "Description",
        "SystemType",
        "Manufacturer",
        "Model",
        "SerialNumber",
        "UUID",
        "PowerState",
        "Status",
        "ProcessorSummary",
        "MemorySummary",
        "EthernetInterfaces",
        "VirtualMedia",
        "Links",
        "Actions",
        "Oem",
    ];
    only(m, &["Boot"], READ_ONLY)?;
    let Some(boot) = m.get("Boot") else { return Err(RfError::no_operation()) };
    let b = boot.as_object().ok_or_else(|| RfError::property_type(boot, "Boot"))?;
    const BOOT_RO: &[&str] = &[
        "BootSourceOverrideTarget@Redfish.AllowableValues",
        "BootSourceOverrideEnabled@Redfish.AllowableValues",
        "BootSourceOverrideMode@Redfish.AllowableValues",
        "BootOrder",
        "BootOptions",
    ];
    let known =
        ["BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode", "HttpBootUri", "UefiTargetBootSourceOverride"];
    for k in b.keys().filter(|k| !k.starts_with("@odata.")) {
        if BOOT_RO.contains(&k.as_str()) {
            return Err(RfError::property_not_writable(&format!("Boot/{k}")));
        }
        if !known.contains(&k.as_str()) {
            return Err(RfError::property_unknown(&format!("Boot/{k}")));
        }
    }
    let text = |k: &str| -> Result<Option<String>, RfError> {
        match b.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(RfError::property_type(v, &format!("Boot/{k}"))),
        }
    };
    use api::virtual_media::{Enabled, Target};
    // Each property's values and what they mean; anything else is PropertyValueNotInList.
    fn one_of<T: Copy>(v: Option<String>, k: &str, table: &[(&str, T)]) -> Result<Option<T>, RfError> {
        v.map(|v| {
            table
                .iter()
                .find(|(name, _)| *name == v)
                .map(|(_, x)| *x)
                .ok_or_else(|| RfError::property_not_in_list(&v, &format!("Boot/{k}")))
        })
        .transpose()
    }
    let target = one_of(
        text("BootSourceOverrideTarget")?,
        "BootSourceOverrideTarget",
        &[("None", None), ("Pxe", Some(Target::Pxe)), ("Cd", Some(Target::Cd)), ("Hdd", Some(Target::Hdd))],
    )?;
    let enabled = one_of(
        text("BootSourceOverrideEnabled")?,
        "BootSourceOverrideEnabled",
        &[("Disabled", None), ("Once", Some(Enabled::Once)), ("Continuous", Some(Enabled::Continuous))],
    )?;
    let uefi = one_of(text("BootSourceOverrideMode")?, "BootSourceOverrideMode", &[("UEFI", true), ("Legacy", false)])?;
    for k in ["HttpBootUri", "UefiTargetBootSourceOverride"] {
        match b.get(k) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(v) => return Err(RfError::property_not_in_list(&v.to_string(), &format!("Boot/{k}"))),
        }
    }
    Ok(Action::SetBoot { system: system.to_owned(), boot: BootPatch { target, enabled, uefi } })
}

/// What a PATCH of an account changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountEdit {
    pub password: Option<String>,
    pub role: Option<Role>,
    pub enabled: Option<bool>,
}

impl AccountEdit {
    /// Whether only the password changes (what `ConfigureSelf` allows on one's own account).
    #[must_use]
    pub fn password_only(&self) -> bool {
        self.role.is_none() && self.enabled.is_none()
    }
}

/// The JSON object of a request body (an empty body is `{}`).
///
/// # Errors
/// 415 for a body that is not JSON; 400 MalformedJSON.
pub fn object(h: &HeaderMap, body: &Bytes) -> Result<Map<String, Value>, RfError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    if let Some(ct) = h.get(http::header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("?");
        let media = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if media != "application/json" && !media.is_empty() {
            return Err(RfError::unsupported_media_type(ct));
        }
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(RfError::malformed_json()),
    }
}

/// A string property, typed.
fn string(m: &Map<String, Value>, key: &str) -> Result<Option<String>, RfError> {
    match m.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(RfError::property_type(v, key)),
    }
}

fn boolean(m: &Map<String, Value>, key: &str) -> Result<Option<bool>, RfError> {
    match m.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(RfError::property_type(v, key)),
    }
}

/// Refuses every property not in `writable`: read-only ones (`known`) as PropertyNotWritable,
/// the rest as PropertyUnknown, all of them in one error.
fn only(m: &Map<String, Value>, writable: &[&str], known: &[&str]) -> Result<(), RfError> {
    let mut err: Option<RfError> = None;
    for k in m.keys().filter(|k| !k.starts_with("@odata.") && !writable.contains(&k.as_str())) {
        let e = if known.contains(&k.as_str()) { RfError::property_not_writable(k) } else { RfError::property_unknown(k) };
        err = Some(match err {
            None => e,
            Some(prev) => e.messages.into_iter().fold(prev, RfError::and),
        });
    }
    err.map_or(Ok(()), Err)
}

fn role(m: &Map<String, Value>) -> Result<Option<Role>, RfError> {
    match string(m, "RoleId")? {
        None => Ok(None),
        Some(r) => Role::parse(&r).map(Some).ok_or_else(|| RfError::property_not_in_list(&r, "RoleId")),
    }
}

const ACCOUNT_READ_ONLY: &[&str] = &["Id", "Name", "Description", "Links", "Actions", "Oem", "AccountTypes", "Locked", "UserName"];

fn create_account(m: &Map<String, Value>) -> Result<Action, RfError> {
    only(m, &["UserName", "Password", "RoleId", "Enabled", "Locked", "AccountTypes"], &["Id", "Name", "Description", "Links"])?;
    let user = string(m, "UserName")?.ok_or_else(|| RfError::property_missing("UserName"))?;
    let password = string(m, "Password")?.ok_or_else(|| RfError::property_missing("Password"))?;
    let role = role(m)?.ok_or_else(|| RfError::property_missing("RoleId"))?;
    let enabled = boolean(m, "Enabled")?.unwrap_or(true);
    if boolean(m, "Locked")? == Some(true) {
        return Err(RfError::property_not_in_list("true", "Locked"));
    }
    if let Some(t) = m.get("AccountTypes") {
        if t != &Value::Array(vec![Value::String("Redfish".to_owned())]) {
            return Err(RfError::property_not_in_list(&t.to_string(), "AccountTypes"));
        }
    }
    crate::accounts::check_username(&user).map_err(|_| RfError::property_format(&user, "UserName"))?;
    check_password(&password)?;
    Ok(Action::CreateAccount { user, password, role, enabled })
}

fn check_password(p: &str) -> Result<(), RfError> {
    use crate::accounts::{MAX_PASSWORD, MIN_PASSWORD};
    let n = p.chars().count();
    if n < MIN_PASSWORD {
        return Err(RfError::string_too_short("Password", MIN_PASSWORD));
    }
    if n > MAX_PASSWORD {
        return Err(RfError::string_too_long("(hidden)", "Password", MAX_PASSWORD));
    }
    Ok(())
}

fn edit_account(id: &str, m: &Map<String, Value>) -> Result<Action, RfError> {
    // `UserName` and `Locked` are accepted when they change nothing (clients echo them).
    let writable = ["Password", "RoleId", "Enabled", "UserName", "Locked"];
    only(m, &writable, ACCOUNT_READ_ONLY)?;
    if let Some(u) = string(m, "UserName")? {
        if u != id {
            return Err(RfError::property_not_writable("UserName"));
        }
    }
    if boolean(m, "Locked")? == Some(true) {
        return Err(RfError::property_not_in_list("true", "Locked"));
    }
    let password = string(m, "Password")?;
    if let Some(p) = &password {
        check_password(p)?;
    }
    let edit = AccountEdit { password, role: role(m)?, enabled: boolean(m, "Enabled")? };
    if m.keys().all(|k| k.starts_with("@odata.")) {
        return Err(RfError::no_operation());
    }
    Ok(Action::EditAccount { id: id.to_owned(), edit })
}

fn session_service(m: &Map<String, Value>) -> Result<Action, RfError> {
    only(m, &["SessionTimeout"], &["Id", "Name", "Description", "ServiceEnabled", "Sessions", "Status", "Oem"])?;
    match m.get("SessionTimeout") {
        None => Err(RfError::no_operation()),
        Some(v) => {
            let secs = v.as_u64().ok_or_else(|| RfError::property_type(v, "SessionTimeout"))?;
            if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&secs) {
                return Err(RfError::property_out_of_range(v, "SessionTimeout"));
            }
            Ok(Action::SetSessionTimeout { secs })
        }
    }
}

fn login(m: &Map<String, Value>) -> Result<Action, RfError> {
    only(m, &["UserName", "Password", "Context"], &["Id", "Name", "Description", "SessionType", "CreatedTime"])?;
    let user = string(m, "UserName")?.ok_or_else(|| RfError::property_missing("UserName"))?;
    let password = string(m, "Password")?.ok_or_else(|| RfError::property_missing("Password"))?;
    string(m, "Context")?;
    Ok(Action::Login { user, password })
}

fn reset(system: &str, m: &Map<String, Value>) -> Result<Action, RfError> {
    if let Some(k) = m.keys().find(|k| *k != "ResetType") {
        return Err(RfError::action_parameter_unknown(RESET_ACTION, k));
    }
    let v = m.get("ResetType").ok_or_else(|| RfError::action_parameter_missing(RESET_ACTION, "ResetType"))?;
    let s = v.as_str().ok_or_else(|| RfError::action_parameter_type(v, "ResetType", RESET_ACTION))?;
    let reset = ResetType::parse(s).ok_or_else(|| RfError::action_parameter_not_in_list(s, "ResetType", RESET_ACTION))?;
    Ok(Action::Reset { system: system.to_owned(), reset })
}

/// Parses a write to `uri` (its method already checked against [`Uri::allowed`]).
///
/// # Errors
/// The first problem with the request, as a Redfish error naming the property.
pub fn parse(uri: &Uri, method: &Method, h: &HeaderMap, body: &Bytes) -> Result<Action, RfError> {
    let m = object(h, body)?;
    match (uri, method) {
        (Uri::Sessions, &Method::POST) => login(&m),
        (Uri::Session(id), &Method::DELETE) => Ok(Action::Logout { id: id.clone() }),
        (Uri::SessionService, &Method::PATCH) => session_service(&m),
        (Uri::Accounts, &Method::POST) => create_account(&m),
        (Uri::Account(id), &Method::PATCH) => edit_account(id, &m),
        (Uri::Account(id), &Method::DELETE) => Ok(Action::DeleteAccount { id: id.clone() }),
        (Uri::SystemReset(id), &Method::POST) => reset(id, &m),
        (Uri::InsertMedia(o, id, dev), &Method::POST) => insert_media(id, Uri::VirtualMedia(*o, id.clone(), dev.clone()), &m),
        (Uri::EjectMedia(o, id, dev), &Method::POST) => eject_media(id, Uri::VirtualMedia(*o, id.clone(), dev.clone()), &m),
        (Uri::VirtualMedia(_, id, _), &Method::PATCH) => patch_media(id, uri.clone(), &m),
        (Uri::System(id), &Method::PATCH) => patch_system(id, &m),
        _ => Err(RfError::method_not_allowed(uri.allowed())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use serde_json::json;

    fn p(uri: &Uri, method: &Method, body: &Value) -> Result<Action, RfError> {
        parse(uri, method, &HeaderMap::new(), &Bytes::from(body.to_string()))
    }

    fn first_id(e: &RfError) -> String {
        e.body()["error"]["@Message.ExtendedInfo"][0]["MessageId"].as_str().unwrap_or_default().to_owned()
    }

    #[test]
    fn a_reset_is_parsed_or_refused_naming_the_parameter() {
        let u = Uri::SystemReset("s".into());
        assert_eq!(
            p(&u, &Method::POST, &json!({"ResetType": "ForceOff"})).unwrap(),
            Action::Reset { system: "s".into(), reset: ResetType::ForceOff }
        );
        let e = p(&u, &Method::POST, &json!({"ResetType": "Explode"})).unwrap_err();
        assert_eq!(first_id(&e), "Base.1.22.ActionParameterValueNotInList");
        assert_eq!(e.body()["error"]["@Message.ExtendedInfo"][0]["RelatedProperties"], json!(["#/ResetType"]));
        assert_eq!(first_id(&p(&u, &Method::POST, &json!({})).unwrap_err()), "Base.1.22.ActionParameterMissing");
        assert_eq!(first_id(&p(&u, &Method::POST, &json!({"ResetType": 1})).unwrap_err()), "Base.1.22.ActionParameterValueTypeError");
        assert_eq!(
            first_id(&p(&u, &Method::POST, &json!({"ResetType": "On", "Force": true})).unwrap_err()),
            "Base.1.22.ActionParameterUnknown"
        );
        let e = parse(&u, &Method::POST, &HeaderMap::new(), &Bytes::from_static(b"{\"ResetType\": ")).unwrap_err();
        assert_eq!(first_id(&e), "Base.1.22.MalformedJSON");
    }

    #[test]
    fn account_patches_refuse_unknown_and_read_only_properties() {
        let u = Uri::Account("ironic".into());
        let e = p(&u, &Method::PATCH, &json!({"Password": "new password", "BogusProp": "foo"})).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(first_id(&e), "Base.1.22.PropertyUnknown");
        assert!(e.body().to_string().contains("BogusProp"));
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"Id": "x"})).unwrap_err()), "Base.1.22.PropertyNotWritable");
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"@odata.id": "/x/"})).unwrap_err()), "Base.1.22.NoOperation");
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"RoleId": "Root"})).unwrap_err()), "Base.1.22.PropertyValueNotInList");
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"Enabled": "yes"})).unwrap_err()), "Base.1.22.PropertyValueTypeError");
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"Password": "short"})).unwrap_err()), "Base.1.22.StringValueTooShort");
        let ok = p(&u, &Method::PATCH, &json!({"Password": "long enough", "UserName": "ironic"})).unwrap();
        assert!(matches!(ok, Action::EditAccount { edit, .. } if edit.password_only()));
    }

    #[test]
    fn an_account_needs_a_name_a_password_and_a_role() {
        let u = Uri::Accounts;
        let ok = p(&u, &Method::POST, &json!({"UserName": "rfpv0a1b", "Password": "Abc-1234xyz", "RoleId": "ReadOnly"})).unwrap();
        assert!(matches!(ok, Action::CreateAccount { role: Role::ReadOnly, enabled: true, .. }));
        assert_eq!(
            first_id(&p(&u, &Method::POST, &json!({"UserName": "x", "Password": "Abc-1234xyz"})).unwrap_err()),
            "Base.1.22.PropertyMissing"
        );
        assert_eq!(
            first_id(&p(&u, &Method::POST, &json!({"UserName": "Bad Name", "Password": "Abc-1234xyz", "RoleId": "ReadOnly"})).unwrap_err()),
            "Base.1.22.PropertyValueFormatError"
        );
    }

    #[test]
    fn insert_media_takes_an_http_image_and_checks_every_other_parameter() {
        use crate::uri::MediaOwner;
        let u = Uri::InsertMedia(MediaOwner::System, "s".into(), "Cd".into());
        let ok = p(&u, &Method::POST, &json!({"Image": "https://images.example/ipa.iso"})).unwrap();
        assert!(matches!(ok, Action::InsertMedia { ref image, .. } if image == "https://images.example/ipa.iso"));
        // sushy's full form and its retries' additions.
        let full = json!({"Image": "http://10.0.0.1/x.iso", "Inserted": true, "WriteProtected": true, "TransferProtocolType": "HTTP",
                          "TransferMethod": "Stream", "UserName": "none", "Password": "none", "MediaType": "CD"});
        assert!(p(&u, &Method::POST, &full).is_ok());
        for (body, id) in [
            (json!({}), "Base.1.22.ActionParameterMissing"),
            (json!({"Image": "file:///etc/passwd"}), "Base.1.22.ActionParameterValueFormatError"),
            (json!({"Image": "gopher://h/x"}), "Base.1.22.ActionParameterValueFormatError"),
            (json!({"Image": "http:///no-host"}), "Base.1.22.ActionParameterValueFormatError"),
            (json!({"Image": 7}), "Base.1.22.ActionParameterValueTypeError"),
            (json!({"Image": "http://h/x.iso", "TransferProtocolType": "NFS"}), "Base.1.22.ActionParameterValueNotInList"),
            (json!({"Image": "http://h/x.iso", "TransferProtocolType": "HTTPS"}), "Base.1.22.ActionParameterValueConflict"),
            (json!({"Image": "http://h/x.iso", "WriteProtected": false}), "Base.1.22.ActionParameterNotSupported"),
            (json!({"Image": "http://h/x.iso", "UserName": "bob", "Password": "pw"}), "Base.1.22.ActionParameterNotSupported"),
            (json!({"Image": "http://h/x.iso", "Force": true}), "Base.1.22.ActionParameterUnknown"),
        ] {
            assert_eq!(first_id(&p(&u, &Method::POST, &body).unwrap_err()), id, "{body}");
        }
        let long = format!("http://h/{}", "a".repeat(MAX_IMAGE_URL));
        assert_eq!(first_id(&p(&u, &Method::POST, &json!({"Image": long})).unwrap_err()), "Base.1.22.StringValueTooLong");
    }

    #[test]
    fn a_virtual_media_patch_inserts_or_ejects() {
        use crate::uri::MediaOwner;
        let u = Uri::VirtualMedia(MediaOwner::Manager, "s".into(), "Cd".into());
        assert!(matches!(
            p(&u, &Method::PATCH, &json!({"Image": "http://h/x.iso", "Inserted": true})).unwrap(),
            Action::InsertMedia { .. }
        ));
        assert!(matches!(p(&u, &Method::PATCH, &json!({"Image": null})).unwrap(), Action::EjectMedia { .. }));
        assert!(matches!(p(&u, &Method::PATCH, &json!({"Inserted": false})).unwrap(), Action::EjectMedia { .. }));
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"MediaTypes": ["USBStick"]})).unwrap_err()), "Base.1.22.PropertyNotWritable");
    }

    #[test]
    fn a_system_patch_accepts_boot_and_names_what_it_refuses() {
        use api::virtual_media::{Enabled, Target};
        let u = Uri::System("s".into());
        let body = json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once", "HttpBootUri": null}});
        let Action::SetBoot { boot, .. } = p(&u, &Method::PATCH, &body).unwrap() else { panic!("a boot patch") };
        assert_eq!(boot, BootPatch { target: Some(Some(Target::Cd)), enabled: Some(Some(Enabled::Once)), uefi: None });
        let Action::SetBoot { boot, .. } = p(&u, &Method::PATCH, &json!({"Boot": {"BootSourceOverrideMode": "UEFI"}})).unwrap() else {
            panic!()
        };
        assert_eq!(boot.uefi, Some(true));
        let e = p(&u, &Method::PATCH, &json!({"Boot": {"BootSourceOverrideTarget": "Floppy"}})).unwrap_err();
        assert_eq!(first_id(&e), "Base.1.22.PropertyValueNotInList");
        assert_eq!(e.body()["error"]["@Message.ExtendedInfo"][0]["RelatedProperties"], json!(["#/Boot/BootSourceOverrideTarget"]));
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"PowerState": "Off"})).unwrap_err()), "Base.1.22.PropertyNotWritable");
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({"Boot": {"Bogus": 1}})).unwrap_err()), "Base.1.22.PropertyUnknown");
        assert_eq!(first_id(&p(&u, &Method::PATCH, &json!({})).unwrap_err()), "Base.1.22.NoOperation");
    }

    #[test]
    fn a_body_that_is_not_json_is_refused() {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
        let e = parse(&Uri::Sessions, &Method::POST, &h, &Bytes::from_static(b"x")).unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let e = parse(&Uri::Sessions, &Method::POST, &HeaderMap::new(), &Bytes::from_static(b"[1]")).unwrap_err();
        assert_eq!(first_id(&e), "Base.1.22.MalformedJSON");
        let e = p(&Uri::SessionService, &Method::PATCH, &json!({"SessionTimeout": 5})).unwrap_err();
        assert_eq!(first_id(&e), "Base.1.22.PropertyValueOutOfRange");
    }
}
