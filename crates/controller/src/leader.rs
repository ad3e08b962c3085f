//! Leader election for the controller: one of several replicas reconciles, the others wait, on a
//! `coordination.k8s.io/v1` Lease (client-go's `leaderelection` protocol, KubeVirt's timings).
//!
//! # Flow
//! 1. A candidate reads the Lease. None: it creates one naming itself. Held by another: it
//!    remembers the holder's record (holder, renew time, transitions) and *when it saw that record
//!    change*, by its own monotonic clock — never by comparing the holder's timestamps with its
//!    own clock, so clock skew between machines cannot end a healthy lease early.
//! 2. A record unchanged for `lease_duration` is expired: the candidate takes the Lease with
//!    [`client::update`] — a write conditional on the resourceVersion it read, and a mutation
//!    that re-checks on the fresh copy that the record is still the expired one. Of two
//!    candidates, exactly one write lands.
//! 3. The leader renews every `retry_period`. A renewal that finds another holder, or no
//!    successful renewal for `renew_deadline`, is a lost lease: [`run_while_leading`] drops the
//!    work future at once (no reconcile runs past that point) and the candidate starts over.
//! 4. A leader that stops on purpose ([`Elector::release`]) clears the holder, so the next one
//!    takes over without waiting for the lease to expire.
//!
//! # Guarantees
//! - `renew_deadline < lease_duration`: a leader that cannot renew stops working before anyone
//!   else may take the lease (a gap of `lease_duration - renew_deadline`, 5 s by default, with no
//!   leader, never two).
//!
//! # Defaults (KubeVirt's virt-controller)
//! Lease 15 s, renew deadline 10 s, retry period 2 s.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

/// The Lease the controller replicas compete for.
pub const LEASE_NAME: &str = "virtplug-controller";

/// Timings of an election.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings { lease_duration: Duration::from_secs(15), renew_deadline: Duration::from_secs(10), retry_period: Duration::from_secs(2) }
    }
}

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: Timings,
}

/// The holder's record as a candidate last saw it.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    holder: Option<String>,
    renew: Option<String>,
    transitions: i32,
}

impl Record {
    fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renew: spec.renew_time.map(|t| t.0.to_string()),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Seconds of a duration, for `leaseDurationSeconds` (whole seconds, at least 1).
fn whole_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl Elector {
    /// A candidate named `identity` for the Lease `namespace/name`.
    #[must_use]
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str, timings: Timings) -> Elector {
        Elector { api: Api::namespaced(client, namespace), name: name.to_owned(), identity: identity.to_owned(), timings }
    }

    /// This candidate's identity (the Lease's `holderIdentity` while it leads).
    #[must_use]
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) {
        let mut seen: Option<(Record, Instant)> = None;
        loop {
            match self.try_acquire(&mut seen).await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!("leader election: cannot read or write Lease {}: {}", self.name, client::error_chain(e.as_ref())),
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
    }

    /// One attempt: `Ok(true)` when this candidate now holds the Lease.
    async fn try_acquire(&self, seen: &mut Option<(Record, Instant)>) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease =
                Lease { metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() }, spec: Some(self.held_spec(0)) };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false), // another candidate created it first
                Err(e) => Err(e.into()),
            };
        };
        let record = Record::of(&lease);
        if record.holder.as_deref() == Some(self.identity.as_str()) {
            return Ok(true); // ours already (this process restarted within the lease)
        }
        let observed_at = match seen {
            Some((r, at)) if *r == record => *at,
            _ => {
                *seen = Some((record.clone(), Instant::now()));
                Instant::now()
            }
        };
        let duration = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .map_or(self.timings.lease_duration, |s| Duration::from_secs(u64::try_from(s).unwrap_or(0)));
        if record.holder.is_some() && observed_at.elapsed() < duration {
            return Ok(false);
        }
        // Expired or released: take it, unless the record moved since it was read.
        let transitions = record.transitions + 1;
        let spec = self.held_spec(transitions);
        let taken = client::update(&self.api, &self.name, |l: &mut Lease| {
            if Record::of(l) == record {
                l.spec = Some(spec.clone());
            }
        })
        .await?;
        Ok(taken.wrote)
    }

    fn held_spec(&self, transitions: i32) -> LeaseSpec {
        let t = now();
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(whole_seconds(self.timings.lease_duration)),
            acquire_time: Some(t.clone()),
            renew_time: Some(t),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Renews the Lease every `retry_period` while this candidate holds it; returns when the
    /// lease is lost (another holder, or no renewal for `renew_deadline`).
    pub async fn keep(&self) {
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(self.timings.retry_period).await;
            let me = self.identity.clone();
            let mut ours = true;
            let renewed = client::update(&self.api, &self.name, |l: &mut Lease| {
                let spec = l.spec.get_or_insert_with(LeaseSpec::default);
                ours = spec.holder_identity.as_deref() == Some(me.as_str());
                if ours {
                    spec.renew_time = Some(now());
                }
            })
            .await;
            match renewed {
                Ok(_) if !ours => {
                    tracing::error!("leader election: Lease {} is held by another controller now; stopping reconciles", self.name);
                    return;
                }
                Ok(_) => last_renewed = Instant::now(),
                Err(e) => tracing::warn!("leader election: cannot renew Lease {}: {}", self.name, client::error_chain(&e)),
            }
            if last_renewed.elapsed() >= self.timings.renew_deadline {
                tracing::error!(
                    "leader election: Lease {} not renewed for {:?}; stopping reconciles before another controller may take it",
                    self.name,
                    self.timings.renew_deadline
                );
                return;
            }
        }
    }

    /// Gives the Lease up (a leader stopping on purpose): the holder is cleared, so another
    /// candidate takes over at its next attempt instead of after the lease expires.
    pub async fn release(&self) {
        let me = self.identity.clone();
        let released = client::update(&self.api, &self.name, |l: &mut Lease| {
            if let Some(spec) = l.spec.as_mut().filter(|s| s.holder_identity.as_deref() == Some(me.as_str())) {
                spec.holder_identity = None;
            }
        })
        .await;
        if let Err(e) = released {
            tracing::warn!("leader election: cannot release Lease {}: {}", self.name, client::error_chain(&e));
        }
    }
}

/// Runs `work` only while `elector` leads: acquire, run `work` beside the renewals, and on a
/// lost lease drop `work` at once and campaign again. `leading` and the
/// `virtplug_controller_leader` gauge are told each change.
pub async fn run_while_leading<F, Fut>(elector: &Elector, leading: &tokio::sync::watch::Sender<bool>, mut work: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        elector.acquire().await;
        tracing::info!("leader election: {} leads (Lease {})", elector.identity, elector.name);
        leading.send_replace(true);
        crate::metrics::leader().set(1);
        tokio::select! {
            () = elector.keep() => {}
            () = work() => {
                tracing::error!("the controller stopped while leading");
            }
        }
        leading.send_replace(false);
        crate::metrics::leader().set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_deadline_is_shorter_than_the_lease() {
        let t = Timings::default();
        assert!(t.renew_deadline < t.lease_duration && t.retry_period < t.renew_deadline);
    }

    #[test]
    fn record_ignores_an_empty_holder() {
        let lease: Lease = serde_json::from_value(serde_json::json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": ""}})).unwrap();
        assert_eq!(Record::of(&lease).holder, None);
    }
}
