//! Execute in one owner: the only place where [`Action`]s are carried out. Privileges are
//! checked here, against the typed action (what it changes), not against the URL.
//!
//! Actions on one System run one at a time, in arrival order (a per-System lock held while the
//! action is planned and issued, until the caches show it took effect); actions on different
//! Systems run in parallel. Accounts are written through [`crate::accounts::store`], which reads
//! fresh and writes with a resourceVersion precondition, and checks `If-Match` on that same
//! fresh copy — so an ETag cannot go stale between the check and the write.
//!
//! # Who may do what beyond Systems
//! ConfigureManager and ConfigureUsers are service-wide ([`crate::accounts`], "Scoped
//! accounts"): changing `SessionTimeout`, ending another account's session, and creating,
//! changing or deleting any account but one's own (password only, with ConfigureSelf) need an
//! unscoped Administrator. Another account's session is 404 to a caller that may not see it; a
//! write to another account is 403 InsufficientPrivilege to a caller without ConfigureUsers,
//! whether that account exists or not (no enumeration of account names).
//!
//! # Errors of account writes
//! A refusal is the client's to fix where it can (412 for a stale `If-Match`, 409 for the last
//! Administrator or an account whose Secret is malformed, 503 with `Retry-After` when the
//! account kept changing under the write); 500 is left for the service's own faults (the API
//! unreachable, a password that cannot be hashed).

use std::sync::Arc;

use axum::body::Body;
use http::{header, HeaderMap, HeaderValue, StatusCode};

use crate::accounts::store::{self as accounts_store, NewAccount, Refused, StoreError};
use crate::accounts::{Privilege, Role};
use crate::actions::{AccountEdit, Action};
use crate::auth::{self, Caller};
use crate::error::{Message, RfError};
use crate::protocol;
use crate::registry::MessageId;
use crate::resources::{self, Ctx};
use crate::service::Service;
use crate::uri::Uri;

/// Carries out `action` for `caller` (`None` only for a login).
///
/// # Errors
/// The Redfish error to answer.
pub async fn execute(
    svc: &Arc<Service>,
    caller: Option<&Caller>,
    action: Action,
    h: &HeaderMap,
    body: &str,
) -> Result<http::Response<Body>, RfError> {
    let Some(caller) = caller else {
        return match action {
            Action::Login { user, password } => login(svc, &user, &password).await,
            _ => Err(RfError::unauthorized()),
        };
    };
    match action {
        Action::Login { user, password } => login(svc, &user, &password).await,
        Action::Logout { id } => logout(svc, caller, &id),
        Action::SetSessionTimeout { secs } => set_timeout(svc, caller, secs, h),
        Action::CreateAccount { user, password, role, enabled } => create_account(svc, caller, user, password, role, enabled).await,
        Action::EditAccount { id, edit } => edit_account(svc, caller, &id, edit, h).await,
        Action::DeleteAccount { id } => delete_account(svc, caller, &id).await,
        Action::Reset { system, reset } => {
            caller.require(Privilege::ConfigureComponents)?;
            crate::reset::reset(svc, caller, &system, reset, body).await
        }
        Action::InsertMedia { system, image, target } => {
            caller.require(Privilege::ConfigureComponents)?;
            media_device(svc, caller, &target, h)?;
            crate::media::insert(svc, caller, &system, &image, &target, body).await
        }
        Action::EjectMedia { system, target } => {
            caller.require(Privilege::ConfigureComponents)?;
            media_device(svc, caller, &target, h)?;
            crate::media::eject(svc, caller, &system, &target, body).await
        }
        Action::SetBoot { system, boot } => {
            caller.require(Privilege::ConfigureComponents)?;
            crate::boot::set(svc, caller, &system, boot, h).await
        }
    }
}

/// The virtual-media device `target` exists for `caller` (404 otherwise); a PATCH of it
/// carries `If-Match` against its ETag (an action's POST carries none).
fn media_device(svc: &Service, caller: &Caller, target: &Uri, h: &HeaderMap) -> Result<(), RfError> {
    let shown = resources::get(&Ctx { svc, caller: Some(caller) }, target)?;
    protocol::check_if_match(h, &protocol::etag(&shown))
}

fn created(uri: &Uri, body: &serde_json::Value) -> http::Response<Body> {
    let mut r = protocol::json(StatusCode::CREATED, body);
    if let Ok(v) = HeaderValue::from_str(&uri.path()) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

async fn login(svc: &Arc<Service>, user: &str, password: &str) -> Result<http::Response<Body>, RfError> {
    let Some(account) = auth::login(svc, user, password).await else { return Err(RfError::unauthorized()) };
    let Some((token, session)) = svc.sessions.create(&account.username, account.identity()) else {
        tracing::warn!(user = account.username, "Redfish login refused: the session limit is reached");
        return Err(RfError::session_limit());
    };
    let uri = Uri::Session(session.id.clone());
    let caller = Caller { user: account.username, role: account.role, scope: account.scope, session: Some(session.id) };
    let body = resources::get(&Ctx { svc, caller: Some(&caller) }, &uri)?;
    let mut r = created(&uri, &body);
    let t = HeaderValue::from_str(&token).map_err(|_| RfError::internal("a session token is not a header value"))?;
    r.headers_mut().insert("x-auth-token", t);
    Ok(r)
}

fn logout(svc: &Service, caller: &Caller, id: &str) -> Result<http::Response<Body>, RfError> {
    // Another account's session does not exist for a caller that may not see it.
    if !svc.sessions.get(id).is_some_and(|s| caller.may_see_session(&s)) {
        return Err(RfError::resource_not_found("Session", id));
    }
    svc.sessions.delete(id);
    Ok(protocol::empty(StatusCode::NO_CONTENT))
}

fn set_timeout(svc: &Service, caller: &Caller, secs: u64, h: &HeaderMap) -> Result<http::Response<Body>, RfError> {
    caller.require(Privilege::ConfigureManager)?;
    let ctx = Ctx { svc, caller: Some(caller) };
    svc.update_settings(|s| {
        protocol::check_if_match(h, &protocol::etag(&resources::get(&ctx, &Uri::SessionService)?))?;
        s.session_timeout = secs;
        Ok(())
    })?;
    Ok(protocol::json(StatusCode::OK, &resources::get(&ctx, &Uri::SessionService)?))
}

fn store_error(e: &StoreError, id: &str) -> RfError {
    match e {
        StoreError::NotFound(_) => RfError::resource_not_found("ManagerAccount", id),
        StoreError::Exists(u) => RfError::already_exists("ManagerAccount", "UserName", u),
        StoreError::Update { source, .. } => match source.as_ref() {
            client::UpdateError::Mutate { source: r, .. } => refused(r, id),
            // Others kept writing the account: the client may simply try again.
            client::UpdateError::Conflict { .. } => RfError::unavailable(1),
            _ => RfError::internal(&client::error_chain(e)),
        },
        _ => RfError::internal(&client::error_chain(e)),
    }
}

/// The answer to an update's refusal.
fn refused(r: &Refused, id: &str) -> RfError {
    match r {
        Refused::Precondition => RfError::precondition_failed(),
        Refused::LastAdmin => RfError::in_use(),
        Refused::Malformed(why) => RfError::new(
            StatusCode::CONFLICT,
            Message::new(MessageId::GeneralError, &[]).explained(&format!(
                "account {id:?} cannot be changed: {why}; fix its Secret in {} or delete and re-add the account \
                 (`virtplug redfish account add`)",
                accounts_store::NAMESPACE
            )),
        ),
    }
}

async fn create_account(
    svc: &Service,
    caller: &Caller,
    user: String,
    password: String,
    role: Role,
    enabled: bool,
) -> Result<http::Response<Body>, RfError> {
    caller.require(Privilege::ConfigureUsers)?;
    // A new account sees no more than its creator (who, holding ConfigureUsers, is unscoped).
    let new = NewAccount { username: user.clone(), password, role, enabled, scope: caller.scope.clone() };
    let account = accounts_store::create(&svc.client, new).await.map_err(|e| store_error(&e, &user))?;
    svc.await_account(&account.username, &account.version).await;
    let uri = Uri::Account(account.username.clone());
    Ok(created(&uri, &resources::account_json(&account)))
}

/// Whether another enabled, unrestricted Administrator than `except` exists (the last one may
/// not be removed, disabled or demoted: nobody could manage accounts any more).
fn other_admin(svc: &Service, except: &str) -> bool {
    svc.cache.accounts().iter().any(|a| a.username != except && a.enabled && a.role == Role::Administrator && a.scope.is_unrestricted())
}

/// The account `id` as `caller` may write it: its own, or (with ConfigureUsers) any. Any other
/// is 403 whether it exists or not (no enumeration of account names).
fn visible(svc: &Service, caller: &Caller, id: &str) -> Result<crate::accounts::Account, RfError> {
    if id != caller.user && !caller.has(Privilege::ConfigureUsers) {
        return Err(RfError::insufficient_privilege());
    }
    svc.cache.account(id).ok_or_else(|| RfError::resource_not_found("ManagerAccount", id))
}

async fn edit_account(svc: &Service, caller: &Caller, id: &str, edit: AccountEdit, h: &HeaderMap) -> Result<http::Response<Body>, RfError> {
    let current = visible(svc, caller, id)?;
    if current.username == caller.user && edit.password_only() {
        caller.require(Privilege::ConfigureSelf)?;
    } else {
        caller.require(Privilege::ConfigureUsers)?;
    }
    let demotes = edit.role.is_some_and(|r| r != Role::Administrator) || edit.enabled == Some(false);
    let if_match = h.clone();
    let lone_admin = !other_admin(svc, id);
    let r = accounts_store::update(&svc.client, id, edit.password.as_deref(), |a| {
        if protocol::check_if_match(&if_match, &resources::account_etag(a)).is_err() {
            return Err(Refused::Precondition);
        }
        if demotes && a.role == Role::Administrator && a.enabled && a.scope.is_unrestricted() && lone_admin {
            return Err(Refused::LastAdmin);
        }
        if let Some(r) = edit.role {
            a.role = r;
        }
        if let Some(e) = edit.enabled {
            a.enabled = e;
        }
        Ok(())
    })
    .await;
    let account = r.map_err(|e| store_error(&e, id))?;
    svc.verified.forget(id);
    svc.await_account(&account.username, &account.version).await;
    Ok(protocol::json(StatusCode::OK, &resources::account_json(&account)))
}

async fn delete_account(svc: &Service, caller: &Caller, id: &str) -> Result<http::Response<Body>, RfError> {
    let a = visible(svc, caller, id)?;
    caller.require(Privilege::ConfigureUsers)?;
    if a.role == Role::Administrator && a.enabled && a.scope.is_unrestricted() && !other_admin(svc, id) {
        return Err(RfError::cannot_delete());
    }
    accounts_store::delete(&svc.client, id).await.map_err(|e| store_error(&e, id))?;
    svc.verified.forget(id);
    svc.await_account_gone(id).await;
    Ok(protocol::empty(StatusCode::NO_CONTENT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update_error(e: client::UpdateError<Refused>) -> StoreError {
        StoreError::Update { user: "ironic".into(), source: Box::new(e) }
    }

    fn mutate(r: Refused) -> StoreError {
        update_error(client::UpdateError::Mutate { kind: "Secret".into(), object: "x".into(), source: r })
    }

    #[test]
    fn refusals_are_client_errors_and_only_server_faults_are_500() {
        assert_eq!(store_error(&mutate(Refused::Precondition), "ironic").status, StatusCode::PRECONDITION_FAILED);
        assert_eq!(store_error(&mutate(Refused::LastAdmin), "ironic").status, StatusCode::CONFLICT);
        let e = store_error(&mutate(Refused::Malformed("Secret redfish-account-ironic has no data.role".into())), "ironic");
        assert_eq!(e.status, StatusCode::CONFLICT);
        let text = e.body().to_string();
        assert!(text.contains("no data.role") && text.contains("virtplug-system"), "names the cause and the fix: {text}");
        let gone = kube::Error::Api(kube::core::Status::failure("the object changed", "Conflict").with_code(409).boxed());
        let busy = update_error(client::UpdateError::Conflict { kind: "Secret".into(), object: "x".into(), attempts: 5, source: gone });
        let e = store_error(&busy, "ironic");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.headers.iter().any(|(k, _)| k == header::RETRY_AFTER));
        assert_eq!(store_error(&StoreError::NotFound("ironic".into()), "ironic").status, StatusCode::NOT_FOUND);
        let hash = StoreError::Hash(crate::accounts::password::HashError::new("no RNG".into()));
        assert_eq!(store_error(&hash, "ironic").status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
