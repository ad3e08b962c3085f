//! Accounts: who may log in, with which role, seeing which VMs.
//!
//! - [`scope`]: which VMs an account sees (namespaces, label selector);
//! - [`password`]: salted argon2 hashes, and the keyed digest of verified credentials that keeps
//!   HTTP Basic cheap after the first request;
//! - [`store`]: accounts as Secrets in `virtplug-system` (where they survive a restart and work
//!   in cluster mode), the CLI's and AccountService's writes, the first start's `admin`;
//! - [`throttle`]: failed logins slowed per account.
//!
//! # Roles (DSP0266 §13.4, the predefined roles; not modifiable)
//! | role | privileges |
//! |---|---|
//! | Administrator | Login, ConfigureManager, ConfigureUsers, ConfigureSelf, ConfigureComponents |
//! | Operator | Login, ConfigureSelf, ConfigureComponents |
//! | ReadOnly | Login, ConfigureSelf |
//!
//! # Scoped accounts
//! An account with namespaces or a selector sees nothing outside its scope: other Systems (and
//! their Managers, Chassis and Tasks) are 404 to it, exactly like ones that do not exist.
//! ConfigureManager and ConfigureUsers act on the whole service — its settings
//! (`SessionTimeout`), every account's sessions, every account — so they are
//! [service-wide](Privilege::is_service_wide): a scoped account holds them over nothing but
//! itself, whatever its role. A scoped Administrator therefore manages its own Systems
//! (ConfigureComponents), its own sessions and its own password (ConfigureSelf), and nothing
//! else: account management, other accounts' sessions and the service's settings need an
//! unscoped Administrator. For any account but its own, a caller without ConfigureUsers gets
//! 403 whether that account exists or not (no enumeration of account names).

pub mod password;
pub mod scope;
pub mod store;
pub mod throttle;

pub use scope::{Scope, Selector};

/// A Redfish privilege (Privileges.v1 `PrivilegeType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Privilege {
    Login,
    ConfigureManager,
    ConfigureUsers,
    ConfigureSelf,
    ConfigureComponents,
}

impl Privilege {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Privilege::Login => "Login",
            Privilege::ConfigureManager => "ConfigureManager",
            Privilege::ConfigureUsers => "ConfigureUsers",
            Privilege::ConfigureSelf => "ConfigureSelf",
            Privilege::ConfigureComponents => "ConfigureComponents",
        }
    }

    /// Whether the privilege acts on the whole service rather than on Systems (held only by
    /// unscoped accounts; see the module docs).
    #[must_use]
    pub fn is_service_wide(self) -> bool {
        matches!(self, Privilege::ConfigureManager | Privilege::ConfigureUsers)
    }
}

/// A predefined role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Administrator,
    Operator,
    ReadOnly,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Administrator, Role::Operator, Role::ReadOnly];

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Administrator => "Administrator",
            Role::Operator => "Operator",
            Role::ReadOnly => "ReadOnly",
        }
    }

    /// Parses a `RoleId` (exactly as written; Redfish ids are case-sensitive).
    #[must_use]
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The privileges the role grants.
    #[must_use]
    pub fn privileges(self) -> &'static [Privilege] {
        use Privilege::{ConfigureComponents, ConfigureManager, ConfigureSelf, ConfigureUsers, Login};
        match self {
            Role::Administrator => &[Login, ConfigureManager, ConfigureUsers, ConfigureSelf, ConfigureComponents],
            Role::Operator => &[Login, ConfigureSelf, ConfigureComponents],
            Role::ReadOnly => &[Login, ConfigureSelf],
        }
    }

    #[must_use]
    pub fn has(self, p: Privilege) -> bool {
        self.privileges().contains(&p)
    }
}

/// One account, as read from its Secret.
#[derive(Clone, Debug, PartialEq)]
pub struct Account {
    /// The user name, also the account's Redfish `Id`.
    pub username: String,
    pub role: Role,
    pub enabled: bool,
    pub scope: Scope,
    /// The argon2 PHC string (salt and parameters included).
    pub password_hash: String,
    /// The Secret's resourceVersion: a changed password or role invalidates verified
    /// credentials and is visible in the account's ETag.
    pub version: String,
    /// The Secret's uid: a deleted and recreated account is another account.
    pub uid: String,
}

impl Account {
    /// What a session remembers of the account it was opened for: a digest of the Secret's uid
    /// and the password hash (salted, so every password change gives a new one). A session
    /// whose account no longer has this identity — its password changed, or it was deleted and
    /// recreated — has ended.
    #[must_use]
    pub fn identity(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.uid.as_bytes());
        h.update([0]);
        h.update(self.password_hash.as_bytes());
        h.finalize().into()
    }
}

/// The rules for user names: a DNS label (lower case letters, digits, `-` and `.`), because the
/// name is also the Secret's name and a label value, and ids are case-sensitive while people
/// are not.
///
/// # Errors
/// A sentence saying what is wrong and what is allowed.
pub fn check_username(name: &str) -> Result<(), String> {
    const MAX: usize = 63;
    if name.is_empty() || name.len() > MAX {
        return Err(format!("a user name has 1 to {MAX} characters"));
    }
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ok_ends =
        name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric()) && name.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok_chars && ok_ends {
        Ok(())
    } else {
        Err(format!("user name {name:?}: use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"))
    }
}

/// Shortest and longest password accepted (AccountService `MinPasswordLength`/`MaxPasswordLength`).
pub const MIN_PASSWORD: usize = 8;
pub const MAX_PASSWORD: usize = 128;

/// Checks a new password's length.
///
/// # Errors
/// A sentence with the limits.
pub fn check_password(p: &str) -> Result<(), String> {
    let n = p.chars().count();
    if (MIN_PASSWORD..=MAX_PASSWORD).contains(&n) {
        Ok(())
    } else {
        Err(format!("a password has {MIN_PASSWORD} to {MAX_PASSWORD} characters (this one has {n})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_grant_the_predefined_privileges() {
        assert!(Role::Administrator.has(Privilege::ConfigureUsers));
        assert!(Role::Operator.has(Privilege::ConfigureComponents));
        assert!(!Role::Operator.has(Privilege::ConfigureUsers));
        assert!(!Role::ReadOnly.has(Privilege::ConfigureComponents));
        assert!(Role::ReadOnly.has(Privilege::ConfigureSelf));
        assert_eq!(Role::parse("readonly"), None);
        assert!(Privilege::ConfigureUsers.is_service_wide() && Privilege::ConfigureManager.is_service_wide());
        assert!(!Privilege::ConfigureComponents.is_service_wide() && !Privilege::ConfigureSelf.is_service_wide());
    }

    #[test]
    fn a_new_password_or_a_recreated_secret_is_a_new_identity() {
        let a = Account {
            username: "ironic".into(),
            role: Role::Operator,
            enabled: true,
            scope: Scope::default(),
            password_hash: "$argon2id$one".into(),
            version: "1".into(),
            uid: "u1".into(),
        };
        let same = Account { version: "2".into(), role: Role::ReadOnly, enabled: false, ..a.clone() };
        assert_eq!(a.identity(), same.identity(), "a role or version change keeps the identity");
        assert_ne!(a.identity(), Account { password_hash: "$argon2id$two".into(), ..a.clone() }.identity());
        assert_ne!(a.identity(), Account { uid: "u2".into(), ..a.clone() }.identity());
    }

    #[test]
    fn user_names_are_dns_labels() {
        for ok in ["admin", "ironic.conductor-1", "rfpv0a1b", "a"] {
            assert!(check_username(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Admin", "-x", "x-", "a_b", "a b", &"a".repeat(64)] {
            assert!(check_username(bad).is_err(), "{bad}");
        }
        assert!(check_password("short").is_err());
        assert!(check_password("long enough").is_ok());
    }
}
