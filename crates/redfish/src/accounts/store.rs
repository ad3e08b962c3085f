//! Accounts as Secrets: namespace [`NAMESPACE`], one Secret per account named
//! `redfish-account-USER`, type [`SECRET_TYPE`], label [`LABEL`]`=USER`, with `data` keys
//! `username`, `role`, `password-hash` (argon2 PHC string), `enabled`, `namespaces`
//! (comma-separated, empty: all) and `selector`.
//!
//! They live in the API, not in a local file, so they survive a restart of the service and of
//! `up`, and the same accounts serve every replica in cluster mode. Every change to an existing
//! account goes through [`client::try_update`] (resourceVersion precondition).
//!
//! # First start
//! [`bootstrap_admin`]: when no account exists, an `admin` (Administrator, unrestricted) gets a
//! random password, written once in clear to `DIR/initial-admin-password` (0600) before its
//! Secret is created; the file is removed again when another replica won the race.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use super::{password, Account, Role, Scope, Selector};

pub const NAMESPACE: &str = "virtplug-system";
pub const SECRET_TYPE: &str = "virtplug.io/redfish-account";
pub const LABEL: &str = "virtplug.io/redfish-account";
/// The account created on first start.
pub const ADMIN: &str = "admin";
/// Its password file, in the service's data dir.
pub const INITIAL_PASSWORD_FILE: &str = "initial-admin-password";

/// Errors of the account store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("account {0:?} does not exist")]
    NotFound(String),
    #[error("account {0:?} already exists")]
    Exists(String),
    #[error("account {user:?}: the API request failed")]
    Api {
        user: String,
        #[source]
        source: kube::Error,
    },
    #[error("account {user:?}: {source}")]
    Update {
        user: String,
        #[source]
        source: Box<client::UpdateError<Refused>>,
    },
    #[error(transparent)]
    Hash(#[from] password::HashError),
    #[error("cannot write {}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Write(#[from] durable::WriteError),
}

/// Why an update refused the change (for the caller to report).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    /// The request's `If-Match` does not match the account as read.
    #[error("the account changed since the client read it (If-Match does not match)")]
    Precondition,
    /// The change would leave no enabled, unscoped Administrator.
    #[error("the last enabled, unscoped Administrator cannot be demoted or disabled")]
    LastAdmin,
    /// The Secret as read is not a well-formed account (what is wrong with it).
    #[error("{0}")]
    Malformed(String),
}

impl StoreError {
    /// The refusal carried by an update, if that is what this is.
    #[must_use]
    pub fn refused(&self) -> Option<&Refused> {
        match self {
            StoreError::Update { source, .. } => match source.as_ref() {
                client::UpdateError::Mutate { source, .. } => Some(source),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The Secret name of `user`'s account.
#[must_use]
pub fn secret_name(user: &str) -> String {
    format!("redfish-account-{user}")
}

fn text(s: &Secret, key: &str) -> Option<String> {
    s.data.as_ref()?.get(key).map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

/// Reads an account from its Secret.
///
/// # Errors
/// What is missing or malformed (the Secret is then ignored, with a warning, by the caller).
pub fn from_secret(s: &Secret) -> Result<Account, String> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let username = text(s, "username").ok_or_else(|| format!("Secret {name} has no data.username"))?;
    let role = text(s, "role").ok_or_else(|| format!("Secret {name} has no data.role"))?;
    let role = Role::parse(&role).ok_or_else(|| format!("Secret {name}: data.role {role:?} is not Administrator, Operator or ReadOnly"))?;
    let password_hash = text(s, "password-hash").ok_or_else(|| format!("Secret {name} has no data.password-hash"))?;
    let namespaces =
        text(s, "namespaces").unwrap_or_default().split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect();
    let selector = Selector::parse(&text(s, "selector").unwrap_or_default()).map_err(|e| format!("Secret {name}: {e}"))?;
    Ok(Account {
        username,
        role,
        enabled: text(s, "enabled").as_deref() != Some("false"),
        scope: Scope { namespaces, selector },
        password_hash,
        version: s.metadata.resource_version.clone().unwrap_or_default(),
        uid: s.metadata.uid.clone().unwrap_or_default(),
    })
}

/// Writes `a` into `s.data` (the Secret's other fields are kept).
fn fill(s: &mut Secret, a: &Account) {
    let mut data = BTreeMap::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_owned(), ByteString(v.as_bytes().to_vec()));
    };
    put("username", &a.username);
    put("role", a.role.as_str());
    put("password-hash", &a.password_hash);
    put("enabled", if a.enabled { "true" } else { "false" });
    put("namespaces", &a.scope.namespaces.join(","));
    put("selector", a.scope.selector.as_str());
    s.data = Some(data);
}

/// A new account's Secret.
#[must_use]
pub fn to_secret(a: &Account) -> Secret {
    let mut s = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&a.username)),
            namespace: Some(NAMESPACE.to_owned()),
            labels: Some(BTreeMap::from([(LABEL.to_owned(), a.username.clone())])),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.to_owned()),
        ..Secret::default()
    };
    fill(&mut s, a);
    s
}

fn api(client: &kube::Client) -> Api<Secret> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// What a new account is made of.
pub struct NewAccount {
    pub username: String,
    pub password: String,
    pub role: Role,
    pub enabled: bool,
    pub scope: Scope,
}

/// Creates an account (the password hashed off the async threads).
///
/// # Errors
/// `Exists` when the user name is taken; `Api` otherwise.
pub async fn create(client: &kube::Client, new: NewAccount) -> Result<Account, StoreError> {
    let pw = new.password;
    let password_hash =
        tokio::task::spawn_blocking(move || password::hash(&pw)).await.map_err(|e| password::HashError::from_join(&e))??;
    let account = Account {
        username: new.username,
        role: new.role,
        enabled: new.enabled,
        scope: new.scope,
        password_hash,
        version: String::new(),
        uid: String::new(),
    };
    match api(client).create(&PostParams::default(), &to_secret(&account)).await {
        Ok(s) => from_secret(&s).map_err(|_| StoreError::NotFound(account.username.clone())),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(StoreError::Exists(account.username)),
        Err(source) => Err(StoreError::Api { user: account.username, source }),
    }
}

/// Changes an existing account: `mutate` runs on a fresh copy (re-run on a conflict) and may
/// refuse. A password it sets in `new_password` is hashed once, before the read-modify-write.
///
/// # Errors
/// `NotFound`, the refusal (see [`StoreError::refused`]), or the API's error.
pub async fn update(
    client: &kube::Client,
    user: &str,
    new_password: Option<&str>,
    mut mutate: impl FnMut(&mut Account) -> Result<(), Refused>,
) -> Result<Account, StoreError> {
    let hashed = match new_password {
        Some(pw) => {
            let pw = pw.to_owned();
            Some(tokio::task::spawn_blocking(move || password::hash(&pw)).await.map_err(|e| password::HashError::from_join(&e))??)
        }
        None => None,
    };
    let r = client::try_update(&api(client), &secret_name(user), &client::UpdateOptions::default(), |s: &mut Secret| {
        let mut a = from_secret(s).map_err(Refused::Malformed)?;
        mutate(&mut a)?;
        if let Some(h) = &hashed {
            a.password_hash.clone_from(h);
        }
        fill(s, &a);
        Ok(())
    })
    .await;
    match r {
        Ok(u) => from_secret(&u.object).map_err(|_| StoreError::NotFound(user.to_owned())),
        Err(e) if e.is_not_found() => Err(StoreError::NotFound(user.to_owned())),
        Err(source) => Err(StoreError::Update { user: user.to_owned(), source: Box::new(source) }),
    }
}

/// Deletes an account.
///
/// # Errors
/// `NotFound`, or the API's error.
pub async fn delete(client: &kube::Client, user: &str) -> Result<(), StoreError> {
    match api(client).delete(&secret_name(user), &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Err(StoreError::NotFound(user.to_owned())),
        Err(source) => Err(StoreError::Api { user: user.to_owned(), source }),
    }
}

/// Every account, read from the API (the CLI's `list`; the service reads its cache).
///
/// # Errors
/// The API's error.
pub async fn list(client: &kube::Client) -> Result<Vec<Account>, StoreError> {
    let secrets =
        api(client).list(&ListParams::default().labels(LABEL)).await.map_err(|source| StoreError::Api { user: String::new(), source })?;
    let mut out: Vec<Account> = secrets
        .items
        .iter()
        .filter(|s| s.type_.as_deref() == Some(SECRET_TYPE))
        .filter_map(|s| from_secret(s).map_err(|e| tracing::warn!("ignoring an account: {e}")).ok())
        .collect();
    out.sort_by(|a, b| a.username.cmp(&b.username));
    Ok(out)
}

/// Creates the first `admin` when no account exists (see the module docs). Returns the
/// password file when it created one.
///
/// # Errors
/// The API's error, or the file's.
pub async fn bootstrap_admin(client: &kube::Client, dir: &Path) -> Result<Option<PathBuf>, StoreError> {
    if !list(client).await?.is_empty() {
        return Ok(None);
    }
    let password = password::random_password();
    let file = dir.join(INITIAL_PASSWORD_FILE);
    private_dir(dir)?;
    durable::write_atomic(&file, format!("{password}\n").as_bytes(), 0o600)?;
    let new = NewAccount { username: ADMIN.to_owned(), password, role: Role::Administrator, enabled: true, scope: Scope::default() };
    match create(client, new).await {
        Ok(_) => {
            tracing::info!("created the Redfish account {ADMIN:?}; its password is in {}", file.display());
            Ok(Some(file))
        }
        Err(e) => {
            // Another replica created it first (or the create failed): this password is not
            // the account's.
            let _ = std::fs::remove_file(&file);
            match e {
                StoreError::Exists(_) => Ok(None),
                other => Err(other),
            }
        }
    }
}

/// Creates `dir` (0700) if missing.
///
/// # Errors
/// The I/O error.
pub fn private_dir(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let file = |source| StoreError::File { path: dir.to_owned(), source };
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(file)?;
    }
    let meta = std::fs::metadata(dir).map_err(file)?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(file)?;
    }
    Ok(())
}

impl password::HashError {
    fn from_join(e: &tokio::task::JoinError) -> password::HashError {
        password::HashError::new(format!("the hashing task failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_round_trips_through_its_secret() {
        let a = Account {
            username: "ironic".into(),
            role: Role::Operator,
            enabled: true,
            scope: Scope { namespaces: vec!["a".into(), "b".into()], selector: Selector::parse("bmc=yes").unwrap() },
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$x$y".into(),
            version: String::new(),
            uid: String::new(),
        };
        let s = to_secret(&a);
        assert_eq!(s.metadata.name.as_deref(), Some("redfish-account-ironic"));
        assert_eq!(s.type_.as_deref(), Some(SECRET_TYPE));
        assert_eq!(from_secret(&s).unwrap(), a);
        let json = serde_json::to_value(&s).unwrap();
        assert!(json["data"]["password-hash"].is_string(), "base64 in data");
        assert!(!json.to_string().contains("stringData"));
    }

    #[test]
    fn a_secret_without_a_role_is_not_an_account() {
        let mut s = to_secret(&Account {
            username: "x".into(),
            role: Role::ReadOnly,
            enabled: true,
            scope: Scope::default(),
            password_hash: "h".into(),
            version: String::new(),
            uid: String::new(),
        });
        s.data.as_mut().unwrap().remove("role");
        assert!(from_secret(&s).unwrap_err().contains("data.role"));
    }
}
