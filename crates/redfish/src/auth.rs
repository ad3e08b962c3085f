//! Who is calling: HTTP Basic or a session token (`X-Auth-Token`), resolved to a [`Caller`].
//!
//! # Flow
//! - `X-Auth-Token`: the session's account must still exist, be enabled and be the same
//!   account — same Secret, same password ([`Account::identity`]) — else 401 (and the session
//!   ends).
//! - `Authorization: Basic`: credentials already verified for this version of the account are
//!   accepted at the cost of one HMAC ([`crate::accounts::password::Verified`]); otherwise the
//!   name's turn in the [`Throttle`](crate::accounts::throttle::Throttle), then argon2 off the
//!   async threads (at most [`CONCURRENT_CHECKS`] at once). An unknown name is checked against
//!   a dummy hash (same cost: no enumeration by timing).
//! - Neither: no caller; only the public URIs answer.
//!
//! A failed login is logged (the user name, never the password) and counted in
//! `virtplug_redfish_login_failures`. It forgets nothing: the legitimate client's verified
//! credentials stay verified (a wrong password from anyone never pushes it into the throttled
//! slow path), and its cheap checks do not reset the name's failure count either.
//!
//! # Privileges of a scoped caller
//! [`Caller::has`] grants a [service-wide](Privilege::is_service_wide) privilege
//! (ConfigureManager, ConfigureUsers) only to an unscoped caller: see
//! [`crate::accounts`]' "Scoped accounts".

use base64::Engine as _;
use http::HeaderMap;

use crate::accounts::{password, Account, Privilege, Role, Scope};
use crate::error::RfError;
use crate::service::Service;
use crate::sessions::Session;

/// Password checks running at once (each holds a core for tens of milliseconds).
pub const CONCURRENT_CHECKS: usize = 2;

/// An authenticated caller.
#[derive(Clone, Debug)]
pub struct Caller {
    pub user: String,
    pub role: Role,
    pub scope: Scope,
    /// The session id, when authenticated by token.
    pub session: Option<String>,
}

impl Caller {
    fn of(a: &Account, session: Option<String>) -> Caller {
        Caller { user: a.username.clone(), role: a.role, scope: a.scope.clone(), session }
    }

    /// Whether the caller holds `p`: its role grants it, and, for a service-wide privilege, the
    /// caller is unscoped.
    #[must_use]
    pub fn has(&self, p: Privilege) -> bool {
        self.role.has(p) && (!p.is_service_wide() || self.scope.is_unrestricted())
    }

    /// Whether the caller may see (and end) session `s`: its own, or any with ConfigureManager.
    #[must_use]
    pub fn may_see_session(&self, s: &Session) -> bool {
        s.user == self.user || self.has(Privilege::ConfigureManager)
    }

    /// `Ok` when the caller's role grants `p`.
    ///
    /// # Errors
    /// 403 InsufficientPrivilege.
    pub fn require(&self, p: Privilege) -> Result<(), RfError> {
        if self.has(p) {
            Ok(())
        } else {
            Err(RfError::insufficient_privilege())
        }
    }
}

/// The credentials a request carries.
enum Credentials {
    None,
    Token(String),
    Basic(String, String),
}

fn credentials(h: &HeaderMap) -> Result<Credentials, RfError> {
    if let Some(t) = h.get("x-auth-token") {
        return Ok(Credentials::Token(t.to_str().map_err(|_| RfError::unauthorized())?.to_owned()));
    }
    let Some(a) = h.get(http::header::AUTHORIZATION) else { return Ok(Credentials::None) };
    let a = a.to_str().map_err(|_| RfError::unauthorized())?;
    let Some((scheme, rest)) = a.split_once(' ') else { return Err(RfError::unauthorized()) };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(RfError::unauthorized());
    }
    let raw = base64::engine::general_purpose::STANDARD.decode(rest.trim()).map_err(|_| RfError::unauthorized())?;
    let text = String::from_utf8(raw).map_err(|_| RfError::unauthorized())?;
    let (user, pass) = text.split_once(':').ok_or_else(RfError::unauthorized)?;
    Ok(Credentials::Basic(user.to_owned(), pass.to_owned()))
}

/// The caller of a request (`None`: no credentials at all).
///
/// # Errors
/// 401 for credentials that do not authenticate.
pub async fn authenticate(svc: &Service, h: &HeaderMap) -> Result<Option<Caller>, RfError> {
    match credentials(h)? {
        Credentials::None => Ok(None),
        Credentials::Token(token) => {
            let session = svc.sessions.authenticate(&token).ok_or_else(RfError::unauthorized)?;
            match svc.cache.account(&session.user).filter(|a| a.enabled && a.identity() == session.account) {
                Some(a) => Ok(Some(Caller::of(&a, Some(session.id)))),
                None => {
                    svc.sessions.end_token(&token);
                    Err(RfError::unauthorized())
                }
            }
        }
        Credentials::Basic(user, pass) => match login(svc, &user, &pass).await {
            Some(a) => Ok(Some(Caller::of(&a, None))),
            None => Err(RfError::unauthorized()),
        },
    }
}

/// Checks a user name and password (Basic auth and session login): the account when they
/// match and it is enabled.
pub async fn login(svc: &Service, user: &str, pass: &str) -> Option<Account> {
    let account = svc.cache.account(user);
    if let Some(a) = account.as_ref().filter(|a| a.enabled) {
        if svc.verified.known(user, &a.version, pass) {
            return Some(a.clone());
        }
    }
    let turn = svc.throttle.turn(user).await;
    let hash = account.as_ref().map_or_else(|| password::DUMMY.clone(), |a| a.password_hash.clone());
    let pass_owned = pass.to_owned();
    let ok = {
        let _permit = svc.checks.acquire().await.ok()?;
        tokio::task::spawn_blocking(move || password::verify(&hash, &pass_owned)).await.unwrap_or(false)
    };
    let ok = ok && account.as_ref().is_some_and(|a| a.enabled);
    let failures = turn.record(ok);
    if ok {
        let a = account?;
        svc.verified.remember(user, &a.version, pass);
        Some(a)
    } else {
        crate::metrics::get().login_failures.inc();
        tracing::warn!(user, consecutive_failures = failures, "Redfish login failed");
        None
    }
}

/// Whether session `s` still belongs to a live account: it exists, is enabled and is the
/// account the session was opened for.
#[must_use]
pub fn session_live(svc: &Service, s: &Session) -> bool {
    svc.cache.account(&s.user).is_some_and(|a| a.enabled && a.identity() == s.account)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::Selector;

    fn caller(role: Role, scope: Scope) -> Caller {
        Caller { user: "u".into(), role, scope, session: None }
    }

    #[test]
    fn a_scoped_caller_holds_no_service_wide_privilege() {
        let scoped = Scope { namespaces: vec!["tenant-a".into()], selector: Selector::default() };
        let by_label = Scope { namespaces: Vec::new(), selector: Selector::parse("bmc=yes").unwrap() };
        for scope in [scoped, by_label] {
            let admin = caller(Role::Administrator, scope);
            assert!(admin.has(Privilege::ConfigureComponents) && admin.has(Privilege::ConfigureSelf));
            assert!(!admin.has(Privilege::ConfigureManager) && !admin.has(Privilege::ConfigureUsers));
            assert_eq!(admin.require(Privilege::ConfigureUsers).unwrap_err().status, http::StatusCode::FORBIDDEN);
            let other = Session { id: "s".into(), user: "someone-else".into(), account: [0; 32], created: String::new() };
            assert!(!admin.may_see_session(&other));
            assert!(admin.may_see_session(&Session { user: "u".into(), ..other }));
        }
        let admin = caller(Role::Administrator, Scope::default());
        assert!(admin.has(Privilege::ConfigureManager) && admin.has(Privilege::ConfigureUsers));
        assert!(!caller(Role::Operator, Scope::default()).has(Privilege::ConfigureManager));
    }
}
