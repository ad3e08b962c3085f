//! The service: its state ([`Service`]), how it starts ([`Service::start`]) and its router
//! ([`router`]; the binary serves it over TLS with the API server's listener, `tlsserve`).
//!
//! # Start
//! 1. Load (or create) `DIR/service.json`: the service UUID and the session timeout.
//! 2. Start the watches of VMs, VMIs and account Secrets; wait for their first lists.
//! 3. On first start, create `admin` with its password in `DIR/initial-admin-password`.
//!
//! # Contract
//! - Nothing is served before the caches are whole (step 2).
//! - The service holds no VM state of its own: VMs, VMIs and accounts are read from the API
//!   (through the caches) and written through it. Its own state is the sessions and tasks (in
//!   memory) and `DIR/service.json`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use tokio::sync::Semaphore;

use crate::accounts::password::Verified;
use crate::accounts::store as accounts_store;
use crate::accounts::throttle::Throttle;
use crate::cache::Cache;
use crate::error::RfError;
use crate::sessions::Sessions;
use crate::settings::{self, Settings, SettingsError};
use crate::tasks::Tasks;

/// How long the start waits for the caches' first lists.
pub const READY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Largest request body (a Redfish request is a few hundred bytes; InsertMedia's URL included).
pub const BODY_LIMIT: usize = 64 * 1024;

/// Errors starting the service.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("the Redfish service's watches stopped before their first list (is the API reachable?)")]
    Watches,
    #[error("the Redfish service's watches of VMs, VMIs and Secrets in {ns} did not complete their first list within {secs} s: is the API reachable, and may this kubeconfig list them? (the service logs each watch error)", ns = accounts_store::NAMESPACE, secs = READY_DEADLINE.as_secs())]
    NotReady,
    #[error("cannot create the first Redfish account")]
    Bootstrap(#[source] accounts_store::StoreError),
    #[error("cannot create the Redfish data dir")]
    Dir(#[source] accounts_store::StoreError),
}

/// The turn of System `uid`: its inserts, ejects, boot overrides and resets run one at a time
/// (each on a fresh read of the VM, written with a precondition), and a sweep of its unused
/// media never runs between an insert's DataVolume and the VM write that names it.
pub(crate) async fn system_turn(uid: &str) -> client::locks::ObjectLock {
    client::locks::lock(&format!("redfish/system/{uid}")).await
}

/// The running service's state.
pub struct Service {
    pub(crate) client: kube::Client,
    pub(crate) cache: Cache,
    pub(crate) sessions: Sessions,
    pub(crate) verified: Verified,
    pub(crate) throttle: Throttle,
    /// Password checks running at once.
    pub(crate) checks: Semaphore,
    pub(crate) tasks: Tasks,
    settings: Mutex<Settings>,
    dir: PathBuf,
}

/// A started service: its state, the task running its watches, and the first start's password
/// file (if this start created `admin`).
pub struct Started {
    pub service: Arc<Service>,
    pub watches: tokio::task::JoinHandle<()>,
    pub initial_password: Option<PathBuf>,
}

/// Creates the accounts' namespace when the API lacks it (a cluster without virtplug's
/// manifests; the embedded API server has it). A refusal is left to the account writes, which
/// name it.
async fn ensure_namespace(client: &kube::Client) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    if matches!(api.get_opt(accounts_store::NAMESPACE).await, Ok(Some(_))) {
        return;
    }
    let mut ns = Namespace::default();
    ns.metadata.name = Some(accounts_store::NAMESPACE.to_owned());
    match api.create(&kube::api::PostParams::default(), &ns).await {
        Ok(_) => tracing::info!("created the namespace {} for the Redfish accounts", accounts_store::NAMESPACE),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => tracing::warn!("cannot create the namespace {} for the Redfish accounts: {e}", accounts_store::NAMESPACE),
    }
}

impl Service {
    /// Starts the service over `dir` (see the module docs).
    ///
    /// # Errors
    /// When the settings cannot be read, the caches never fill, or the first account cannot
    /// be created.
    pub async fn start(client: kube::Client, dir: &Path) -> Result<Started, StartError> {
        accounts_store::private_dir(dir).map_err(StartError::Dir)?;
        let settings = settings::load(dir)?;
        let (cache, run) = Cache::start(&client);
        let watches = tokio::spawn(run);
        match tokio::time::timeout(READY_DEADLINE, cache.ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(StartError::Watches),
            Err(_) => {
                watches.abort();
                return Err(StartError::NotReady);
            }
        }
        ensure_namespace(&client).await;
        let initial_password = accounts_store::bootstrap_admin(&client, dir).await.map_err(StartError::Bootstrap)?;
        let service = Arc::new(Service {
            client,
            cache,
            sessions: Sessions::new(settings.session_timeout),
            verified: Verified::default(),
            throttle: Throttle::default(),
            checks: Semaphore::new(crate::auth::CONCURRENT_CHECKS),
            tasks: Tasks::default(),
            settings: Mutex::new(settings),
            dir: dir.to_owned(),
        });
        if let Some(file) = &initial_password {
            service.await_account(accounts_store::ADMIN, "").await;
            tracing::info!("Redfish: the first account is {:?}, its password is in {}", accounts_store::ADMIN, file.display());
        }
        Ok(Started { service, watches, initial_password })
    }

    /// The service UUID (ServiceRoot `UUID`).
    #[must_use]
    pub fn uuid(&self) -> String {
        self.settings_lock().uuid.clone()
    }

    pub(crate) fn settings_lock(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the persisted settings: `f` runs under the settings lock (a check in it sees the
    /// state the write replaces), then the file is written and the session timeout applied.
    pub(crate) fn update_settings(&self, f: impl FnOnce(&mut Settings) -> Result<(), RfError>) -> Result<(), RfError> {
        let mut guard = self.settings_lock();
        let mut s = guard.clone();
        f(&mut s)?;
        settings::save(&self.dir, &s).map_err(|e| RfError::internal(&client::error_chain(&e)))?;
        self.sessions.set_timeout(s.session_timeout);
        *guard = s;
        Ok(())
    }

    /// Waits (briefly) until the cache holds `user`'s account at `version` (any version when
    /// empty), so a GET right after a write shows it.
    pub(crate) async fn await_account(&self, user: &str, version: &str) {
        self.await_cache(|c| c.account(user).is_some_and(|a| version.is_empty() || a.version == version)).await;
    }

    /// Waits (briefly) until the cache no longer holds `user`'s account.
    pub(crate) async fn await_account_gone(&self, user: &str) {
        self.await_cache(|c| c.account(user).is_none()).await;
    }

    async fn await_cache(&self, done: impl Fn(&Cache) -> bool) {
        let mut changed = self.cache.changed();
        let wait = async {
            loop {
                changed.borrow_and_update();
                if done(&self.cache) || changed.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), wait).await.is_err() {
            tracing::warn!("the Redfish cache did not show a write within 5 s");
        }
    }
}

/// The service's router: every request goes through [`crate::handler::handle`].
pub fn router(service: Arc<Service>) -> Router {
    Router::new().fallback(crate::handler::handle).with_state(service)
}
