//! What the subresource handlers need of the objects they read and edit, so the same handlers
//! serve in two places: the embedded API server (its [`Objects`], below) and the aggregated
//! subresources API (`virtplug subresources-api`, KubeVirt's virt-api), which reads and writes
//! through a kube-apiserver with a client.
//!
//! # Guarantees an implementation gives
//! - [`ObjectAccess::update_with`] is a compare-and-swap: `compute` runs on the object as read,
//!   the write is conditional on that read's resourceVersion, and a write that lost a race is
//!   recomputed on a fresh read (so a refusal `compute` returns is decided on the latest object).
//! - Errors are Kubernetes `Status` errors ([`ApiError`]) with the API server's code and wording
//!   (404 for a missing object, 422 when admission refuses the result).

use std::future::Future;

use serde_json::Value;

use crate::objects::{Objects, Part};
use crate::registry::ResourceDef;
use crate::status::ApiError;

/// Reading and conditionally editing objects.
pub trait ObjectAccess: Sync {
    /// The object `name` of `def` in `ns` (`None` for a cluster-scoped kind).
    fn get(&self, def: &ResourceDef, ns: Option<&str>, name: &str) -> impl Future<Output = Result<Value, ApiError>> + Send;

    /// Replaces `part` of the object with what `compute` makes of it (see the module docs);
    /// with `dry_run`, checked by the server and not stored.
    fn update_with<F>(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        part: Part,
        dry_run: bool,
        compute: F,
    ) -> impl Future<Output = Result<(), ApiError>> + Send
    where
        F: Fn(&Value) -> Result<Value, ApiError> + Send + Sync;
}

impl ObjectAccess for Objects {
    async fn get(&self, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        Objects::get(self, def, ns, name).map(|s| s.object.value())
    }

    async fn update_with<F>(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
        part: Part,
        dry_run: bool,
        compute: F,
    ) -> Result<(), ApiError>
    where
        F: Fn(&Value) -> Result<Value, ApiError> + Send + Sync,
    {
        Objects::update_with(self, def, ns, name, part, dry_run, compute).await.map(drop)
    }
}
