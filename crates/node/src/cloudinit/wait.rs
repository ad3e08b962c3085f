//! Waiting for a Secret a VMI's cloud-init data names: a watch of that one Secret (field selector
//! `metadata.name=NAME` in the VMI's namespace), not a timer. KubeVirt's launcher pod waits for
//! its Secret volume the same way (the kubelet mounts it once it exists); a node agent that
//! re-reads the Secret every few seconds for a VMI that may wait for days is what this replaces.
//!
//! # Flow
//! The worker's read of the Secret fails with a [`CloudInitError`] that
//! [`waits`](CloudInitError::waits_for) ([`Awaited`]: the Secret missing, or a key missing from
//! the version it read). [`SecretWait::start`] opens the watch (one list, then one watch request);
//! [`SecretWait::changed`] resolves once the Secret differs from that read — created, changed,
//! deleted — and the worker reads it again.
//!
//! # Guarantees
//! - No request while nothing changes: the worker is woken only by the watch (or a new version
//!   of its VMI that changes its spec).
//! - No lost change: the watch's first list is compared with the failed read (by
//!   `resourceVersion`), so a Secret created between the read and the watch wakes the worker.
//!
//! # Caveats
//! A watch error (the API server away, RBAC refusing `list`/`watch` of Secrets) is logged once
//! and the watch retried with kube-runtime's default backoff; the VMI keeps waiting meanwhile.

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};

use super::CloudInitError;

/// The Secret a VMI waits for, and what the failed read saw of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Awaited {
    pub namespace: String,
    pub name: String,
    /// The `resourceVersion` the read saw (`None`: the Secret did not exist).
    pub seen: Option<String>,
}

impl std::fmt::Display for Awaited {
    /// `NAMESPACE/NAME`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl CloudInitError {
    /// The Secret to wait for, when the VMI should wait (something it names may still be
    /// created or filled in) rather than fail.
    #[must_use]
    pub fn waits_for(&self) -> Option<Awaited> {
        match self {
            CloudInitError::SecretMissing { secret, .. } | CloudInitError::KeyMissing { secret, .. } => Some(secret.as_ref().clone()),
            _ => None,
        }
    }
}

/// A watch of one Secret while a VMI waits for it.
pub struct SecretWait {
    awaited: Awaited,
    changes: BoxStream<'static, Result<Option<Secret>, watcher::Error>>,
    /// A watch error was logged (once per outage).
    failing: bool,
}

impl SecretWait {
    /// Starts watching `awaited`'s Secret through `client`.
    #[must_use]
    pub fn start(client: &kube::Client, awaited: Awaited) -> SecretWait {
        let api: Api<Secret> = Api::namespaced(client.clone(), &awaited.namespace);
        let changes = watcher::watch_object(api, &awaited.name).default_backoff().boxed();
        SecretWait { awaited, changes, failing: false }
    }

    /// Whether this watch is for the Secret `other` names.
    #[must_use]
    pub fn watches(&self, other: &Awaited) -> bool {
        self.awaited.namespace == other.namespace && self.awaited.name == other.name
    }

    /// A new failed read of the same Secret (`other.seen` is what it saw now).
    pub fn saw(&mut self, other: Awaited) {
        self.awaited = other;
    }

    /// Resolves when the Secret is no longer what the failed read saw. Cancel-safe: dropping the
    /// future loses no change (the stream keeps it).
    pub async fn changed(&mut self) {
        while let Some(event) = self.changes.next().await {
            match event {
                Ok(secret) => {
                    self.failing = false;
                    let now = secret.and_then(|s| s.metadata.resource_version);
                    if now != self.awaited.seen {
                        tracing::info!(
                            "Secret {}/{} changed: reading the cloud-init data again",
                            self.awaited.namespace,
                            self.awaited.name
                        );
                        self.awaited.seen = now;
                        return;
                    }
                }
                Err(e) if !self.failing => {
                    tracing::warn!(
                        "cannot watch Secret {}/{} (retrying with backoff; the VMI keeps waiting): {}",
                        self.awaited.namespace,
                        self.awaited.name,
                        client::error_chain(&e)
                    );
                    self.failing = true;
                }
                Err(_) => {}
            }
        }
        // The watch stream never ends (kube-runtime restarts it); should it, nothing wakes.
        std::future::pending::<()>().await;
    }
}
