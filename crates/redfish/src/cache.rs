//! What the service reads instead of the API: kube-runtime reflector stores of the VMs, the
//! VMIs, the virtual-media DataVolumes and the account Secrets, filled by watches. A GET is answered from memory (sushy
//! re-reads the System and every VirtualMedia member on each poll: no API round trip per
//! request); only writes go to the API.
//!
//! # Guarantees
//! - The service answers only once every store has its first full list ([`Cache::ready`]).
//! - [`Cache::changed`] ticks after every event applied to a store, so a waiter (a Task
//!   following a power change) re-reads the stores exactly when something changed, without
//!   polling.
//!
//! # Caveats
//! A store lags the API by one watch event: a GET right after a write may show the state before
//! it (as any Kubernetes informer does). Writes never rely on the cache: they go through
//! [`client::update`], which reads fresh.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use api::{DataVolume, VirtualMachine, VirtualMachineInstance};

use crate::accounts::{store as accounts_store, Account, Scope};

/// The service's stores.
#[derive(Clone)]
pub struct Cache {
    vms: Store<VirtualMachine>,
    vmis: Store<VirtualMachineInstance>,
    media: Store<DataVolume>,
    secrets: Store<Secret>,
    changed: watch::Receiver<u64>,
}

/// A watch filling a store; every applied event bumps `tick`.
fn follow<K>(api: Api<K>, config: watcher::Config, tick: watch::Sender<u64>) -> (Store<K>, impl std::future::Future<Output = ()> + Send)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    let run = async move {
        stream
            .for_each(|event| {
                if let Err(e) = &event {
                    tracing::warn!("a Redfish cache watch failed (retried with backoff): {e}");
                }
                tick.send_modify(|n| *n = n.wrapping_add(1));
                async {}
            })
            .await;
    };
    (store, run)
}

impl Cache {
    /// Starts the watches; the returned future runs them (until dropped).
    pub fn start(client: &kube::Client) -> (Cache, impl std::future::Future<Output = ()> + Send) {
        let (tick, changed) = watch::channel(0u64);
        let (vms, a) = follow(Api::<VirtualMachine>::all(client.clone()), watcher::Config::default(), tick.clone());
        let (vmis, b) = follow(Api::<VirtualMachineInstance>::all(client.clone()), watcher::Config::default(), tick.clone());
        let media_config = watcher::Config::default().labels(api::virtual_media::MEDIUM_OF);
        let (media, d) = follow(Api::<DataVolume>::all(client.clone()), media_config, tick.clone());
        let secrets_api = Api::<Secret>::namespaced(client.clone(), accounts_store::NAMESPACE);
        let (secrets, c) = follow(secrets_api, watcher::Config::default().labels(accounts_store::LABEL), tick);
        let run = async move {
            tokio::join!(a, b, c, d);
        };
        (Cache { vms, vmis, media, secrets, changed }, run)
    }

    /// Waits until every store has its first list.
    ///
    /// # Errors
    /// When a watch ended before that (the service is stopping).
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.vms.wait_until_ready().await?;
        self.vmis.wait_until_ready().await?;
        self.media.wait_until_ready().await?;
        self.secrets.wait_until_ready().await
    }

    /// A receiver that changes after every applied event.
    #[must_use]
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.changed.clone()
    }

    /// The VMs `scope` sees, ordered by uid (a stable member order).
    #[must_use]
    pub fn vms(&self, scope: &Scope) -> Vec<Arc<VirtualMachine>> {
        let mut vms: Vec<_> = self.vms.state().into_iter().filter(|vm| sees(scope, vm)).filter(|vm| vm.uid().is_some()).collect();
        vms.sort_by_key(|vm| vm.uid());
        vms
    }

    /// The VM with `uid`, if `scope` sees it.
    #[must_use]
    pub fn vm(&self, uid: &str, scope: &Scope) -> Option<Arc<VirtualMachine>> {
        self.vms.find(|vm| vm.metadata.uid.as_deref() == Some(uid)).filter(|vm| sees(scope, vm))
    }

    /// The VMI of `vm` (same namespace and name, owned by it).
    #[must_use]
    pub fn vmi(&self, vm: &VirtualMachine) -> Option<Arc<VirtualMachineInstance>> {
        self.vmis.get(&ObjectRef::new(&vm.name_any()).within(&vm.namespace().unwrap_or_default()))
    }

    /// The virtual-media DataVolume `name` in `ns`.
    #[must_use]
    pub fn medium(&self, ns: &str, name: &str) -> Option<Arc<DataVolume>> {
        self.media.get(&ObjectRef::new(name).within(ns))
    }

    /// The virtual-media DataVolumes of VM `vm` in `ns`.
    #[must_use]
    pub fn media_of(&self, ns: &str, vm: &str) -> Vec<Arc<DataVolume>> {
        self.media
            .state()
            .into_iter()
            .filter(|d| {
                d.namespace().as_deref() == Some(ns) && d.labels().get(api::virtual_media::MEDIUM_OF).map(String::as_str) == Some(vm)
            })
            .collect()
    }

    /// The account `user`, if it exists (and its Secret is well-formed).
    #[must_use]
    pub fn account(&self, user: &str) -> Option<Account> {
        let s = self.secrets.get(&ObjectRef::new(&accounts_store::secret_name(user)).within(accounts_store::NAMESPACE))?;
        parse(&s).filter(|a| a.username == user)
    }

    /// Every account, ordered by user name.
    #[must_use]
    pub fn accounts(&self) -> Vec<Account> {
        let mut out: Vec<Account> = self.secrets.state().iter().filter_map(|s| parse(s)).collect();
        out.sort_by(|a, b| a.username.cmp(&b.username));
        out
    }
}

fn sees(scope: &Scope, vm: &VirtualMachine) -> bool {
    scope.sees(&vm.namespace().unwrap_or_default(), vm.labels())
}

fn parse(s: &Secret) -> Option<Account> {
    if s.type_.as_deref() != Some(accounts_store::SECRET_TYPE) {
        return None;
    }
    accounts_store::from_secret(s).map_err(|e| tracing::warn!("ignoring an account: {e}")).ok()
}
