//! What a pass does outside QEMU — open a volume's source, write the VMI's `volumeStatus`, raise
//! Events — behind one trait ([`Effects`]), so the executor runs in unit tests against the
//! scripted QEMU and a recording fake, as bind-mount mode's [`crate::bindmount::Privileged`].
//! [`ApiEffects`] is the real one: the claims through the API, the status write through
//! `client::update_status`.

use std::future::Future;

use kube::api::Api;
use kube::ResourceExt;

use api::VirtualMachineInstance;

use super::plan::Attach;
use super::status::{self, Change};
use crate::config::Shared;
use crate::reasons::EventReason;
use crate::source::{Opened, SourceError};

/// A pass's effects outside QEMU, on one VMI.
pub trait Effects: Sync {
    /// Opens the source of `a`'s volume, its claim checked ready.
    fn open(&self, a: &Attach) -> impl Future<Output = Result<Opened, SourceError>> + Send;

    /// Writes `batches` — each a step's changes and when the pass reached them, in order — to
    /// the VMI's `volumeStatus` in one status write; whether it was written (a failure is
    /// logged, and the pass asks for another soon, which writes what is still missing).
    fn write(&self, batches: Vec<(Vec<Change>, jiff::Timestamp)>) -> impl Future<Output = bool> + Send;

    /// Raises an Event on the VMI.
    fn event(&self, reason: EventReason, message: String) -> impl Future<Output = ()> + Send;
}

/// The effects through the API.
pub struct ApiEffects<'a> {
    pub shared: &'a Shared,
    pub vmi: &'a VirtualMachineInstance,
}

impl Effects for ApiEffects<'_> {
    async fn open(&self, a: &Attach) -> Result<Opened, SourceError> {
        let ns = self.vmi.namespace().unwrap_or_default();
        crate::claims::open(self.shared, &ns, &a.volume, &a.claim, a.readonly, a.attach_pod.clone()).await
    }

    async fn write(&self, batches: Vec<(Vec<Change>, jiff::Timestamp)>) -> bool {
        let api: Api<VirtualMachineInstance> = Api::namespaced(self.shared.client.clone(), &self.vmi.namespace().unwrap_or_default());
        let r = client::update_status(&api, &self.vmi.name_any(), |v: &mut VirtualMachineInstance| {
            let s = v.status.get_or_insert_with(Default::default);
            for (changes, at) in &batches {
                status::apply(s, changes, *at);
            }
        })
        .await;
        match r {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("cannot write volumeStatus (the next pass writes it again): {}", client::error_chain(&e));
                false
            }
        }
    }

    async fn event(&self, reason: EventReason, message: String) {
        crate::reasons::publish(&self.shared.client, self.vmi, reason, &message).await;
    }
}
