//! AccountService, its `Accounts` (ManagerAccount, from the account Secrets) and `Roles` (the
//! predefined roles, read-only).
//!
//! An unscoped account with ConfigureUsers sees every account; any other account — a scoped
//! Administrator included — sees only its own (others are 404 to a GET; a write to one is 403
//! whether it exists or not, see [`crate::executor`]). The rule for scoped accounts is in
//! [`crate::accounts`].

use serde_json::{json, Value};

use super::{collection, link, Ctx, ACCOUNT, ACCOUNT_COLLECTION, ACCOUNT_SERVICE, ROLE, ROLE_COLLECTION};
use crate::accounts::{Account, Privilege, Role, MAX_PASSWORD, MIN_PASSWORD};
use crate::error::RfError;
use crate::protocol;
use crate::uri::Uri;

pub fn service() -> Value {
    json!({
        "@odata.id": Uri::AccountService.path(),
        "@odata.type": ACCOUNT_SERVICE.odata_type(),
        "Id": "AccountService",
        "Name": "Account Service",
        "Description": "The accounts of this Redfish service (Secrets in the virtplug-system namespace)",
        "ServiceEnabled": true,
        "Status": super::status_ok(),
        "MinPasswordLength": MIN_PASSWORD,
        "MaxPasswordLength": MAX_PASSWORD,
        // Failed logins are slowed per account, never locked out.
        "AccountLockoutThreshold": 0,
        "AuthFailureLoggingThreshold": 1,
        "LocalAccountAuth": "Enabled",
        "HTTPBasicAuth": "Enabled",
        "Accounts": link(&Uri::Accounts),
        "Roles": link(&Uri::Roles),
    })
}

/// The accounts `ctx`'s caller may see.
fn visible(ctx: &Ctx<'_>) -> Vec<Account> {
    let Some(c) = ctx.caller else { return Vec::new() };
    ctx.svc.cache.accounts().into_iter().filter(|a| a.username == c.user || c.has(Privilege::ConfigureUsers)).collect()
}

pub fn accounts(ctx: &Ctx<'_>) -> Value {
    let members: Vec<Uri> = visible(ctx).into_iter().map(|a| Uri::Account(a.username)).collect();
    collection(ACCOUNT_COLLECTION, "Accounts", &Uri::Accounts, &members)
}

/// An account's representation (no secret in it).
#[must_use]
pub fn account_json(a: &Account) -> Value {
    json!({
        "@odata.id": Uri::Account(a.username.clone()).path(),
        "@odata.type": ACCOUNT.odata_type(),
        "Id": a.username,
        "Name": "User Account",
        "Description": if a.scope.is_unrestricted() {
            "Sees every VirtualMachine".to_owned()
        } else {
            format!("Sees the VirtualMachines of namespaces [{}] matching selector '{}'", a.scope.namespaces.join(", "), a.scope.selector.as_str())
        },
        "UserName": a.username,
        "RoleId": a.role.as_str(),
        "Enabled": a.enabled,
        "Locked": false,
        "AccountTypes": ["Redfish"],
        "Password": null,
        "Links": {"Role": link(&Uri::Role(a.role.as_str().to_owned()))},
    })
}

/// An account's ETag: its representation and its Secret's version (a new password changes no
/// property shown, but it changes the account).
#[must_use]
pub fn account_etag(a: &Account) -> String {
    protocol::etag(&json!([account_json(a), a.version]))
}

pub fn account(ctx: &Ctx<'_>, id: &str) -> Result<Value, RfError> {
    visible(ctx)
        .into_iter()
        .find(|a| a.username == id)
        .map(|a| account_json(&a))
        .ok_or_else(|| RfError::resource_not_found("ManagerAccount", id))
}

pub fn roles() -> Value {
    let members: Vec<Uri> = Role::ALL.iter().map(|r| Uri::Role(r.as_str().to_owned())).collect();
    collection(ROLE_COLLECTION, "Roles", &Uri::Roles, &members)
}

pub fn role(id: &str) -> Result<Value, RfError> {
    let r = Role::parse(id).ok_or_else(|| RfError::resource_not_found("Role", id))?;
    Ok(json!({
        "@odata.id": Uri::Role(id.to_owned()).path(),
        "@odata.type": ROLE.odata_type(),
        "Id": id,
        "Name": format!("{id} role"),
        "RoleId": id,
        "IsPredefined": true,
        "AssignedPrivileges": r.privileges().iter().map(|p| p.as_str()).collect::<Vec<_>>(),
    }))
}
