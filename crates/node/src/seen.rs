//! What the agent's storage watch has seen of the claims and DataVolumes: enough of each to
//! open a ready claim without a GET on the hot-plug's path ([`crate::claims`]).
//!
//! # Guarantees
//! - It only ever answers "ready": [`Seen::ready`] returns a claim only when the watch last
//!   showed it bound, not being deleted and (for a DataVolume's claim) the DataVolume imported.
//!   Anything else — not seen yet, not ready, the watch not started — is `None`, and the caller
//!   reads the API as before, which also words the reason a volume waits.
//! - A relist replaces everything at once (at the watch's `InitDone`).
//! - A watch error empties the table ([`Seen::claims_unknown`], [`Seen::data_volumes_unknown`]):
//!   while a watch fails (the server unreachable, the watch refused) nothing is answered from
//!   what it showed before; every claim is read from the API until changes or the next relist
//!   fill the table again.
//!
//! # Caveats
//! While its watch is healthy the table lags the API by the watch's delivery (well under a
//! millisecond on one host). A claim deleted and created again under the same name, and
//! hot-plugged within that lag, would be opened by its old UID; the old claim's directory is
//! gone by then unless its provisioner has not removed it yet. A GET has the same window between
//! its answer and the open, only shorter. A claim being deleted is not in the table: it is left
//! to the API read, as before.
//!
//! Only a few fields per object are kept (UID, phase, volume mode): the watch covers every
//! claim in the cluster, not only this node's.

use std::collections::HashMap;
use std::sync::RwLock;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::watcher;
use kube::ResourceExt;

use api::phases::{ClaimPhase, DataVolumePhase};
use api::DataVolume;

/// A claim the watch showed ready to be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyClaim {
    /// The claim's UID: its directory under the storage root, its device path in an attachment
    /// pod.
    pub uid: String,
    /// `volumeMode: Block` (a loop device), not a Filesystem claim's `disk.img`.
    pub block: bool,
}

impl ReadyClaim {
    /// What opening `pvc` needs, read from the claim itself (`None` without a UID). Whether it is
    /// ready is the caller's judgement.
    #[must_use]
    pub fn of(pvc: &PersistentVolumeClaim) -> Option<ReadyClaim> {
        let block = pvc.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        pvc.uid().map(|uid| ReadyClaim { uid, block })
    }
}

type Key = (String, String);

/// The claims (bound, not being deleted) and imported DataVolumes last seen on the watches.
#[derive(Default)]
pub struct Seen {
    claims: Table<ReadyClaim>,
    imported: Table<()>,
}

impl Seen {
    /// Claim `ns/name`, if the watch last showed it ready; for a DataVolume's claim
    /// (`data_volume`) its DataVolume must also have been seen imported.
    #[must_use]
    pub fn ready(&self, ns: &str, name: &str, data_volume: bool) -> Option<ReadyClaim> {
        let key = (ns.to_owned(), name.to_owned());
        if data_volume && self.imported.get(&key).is_none() {
            return None;
        }
        self.claims.get(&key)
    }

    /// Takes in one event of the claim watch.
    pub fn claim_event(&self, ev: &watcher::Event<PersistentVolumeClaim>) {
        self.claims.apply(ev, |pvc| {
            let usable = ClaimPhase::is_bound(pvc) && pvc.metadata.deletion_timestamp.is_none();
            usable.then(|| ReadyClaim::of(pvc)).flatten()
        });
    }

    /// The claim watch failed: forget what it showed (see the module docs).
    pub fn claims_unknown(&self) {
        self.claims.clear();
    }

    /// The DataVolume watch failed: forget what it showed.
    pub fn data_volumes_unknown(&self) {
        self.imported.clear();
    }

    /// Takes in one event of the DataVolume watch.
    pub fn data_volume_event(&self, ev: &watcher::Event<DataVolume>) {
        self.imported.apply(ev, |dv| {
            let phase = dv.status.as_ref().and_then(|s| s.phase.as_ref());
            (phase == Some(&DataVolumePhase::Succeeded) && dv.metadata.deletion_timestamp.is_none()).then_some(())
        });
    }
}

/// Objects by namespace and name, kept only while `keep` says so, with a watch's relist
/// semantics. One lock: a lookup never sees half of an event.
struct Table<V>(RwLock<Lists<V>>);

struct Lists<V> {
    live: HashMap<Key, V>,
    /// The relist in progress, swapped in at `InitDone`.
    next: Option<HashMap<Key, V>>,
}

impl<V> Default for Lists<V> {
    fn default() -> Self {
        Lists { live: HashMap::new(), next: None }
    }
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table(RwLock::new(Lists::default()))
    }
}

impl<V: Clone> Table<V> {
    fn get(&self, key: &Key) -> Option<V> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).live.get(key).cloned()
    }

    fn clear(&self) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Lists::default();
    }

    fn apply<K: kube::Resource>(&self, ev: &watcher::Event<K>, keep: impl Fn(&K) -> Option<V>) {
        let key = |o: &K| (o.meta().namespace.clone().unwrap_or_default(), o.meta().name.clone().unwrap_or_default());
        let mut lists = self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Lists { live, next } = &mut *lists;
        match ev {
            watcher::Event::Init => *next = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                if let (Some(n), Some(v)) = (next.as_mut(), keep(o)) {
                    n.insert(key(o), v);
                }
            }
            watcher::Event::InitDone => {
                if let Some(n) = next.take() {
                    *live = n;
                }
            }
            watcher::Event::Apply(o) => match keep(o) {
                Some(v) => {
                    live.insert(key(o), v);
                }
                None => {
                    live.remove(&key(o));
                }
            },
            watcher::Event::Delete(o) => {
                live.remove(&key(o));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pvc(name: &str, uid: &str, phase: &str, mode: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"volumeMode": mode}, "status": {"phase": phase}}))
        .expect("claim")
    }

    fn dv(name: &str, phase: &str) -> DataVolume {
        serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "namespace": "ns"}, "spec": {}, "status": {"phase": phase}}))
        .expect("DataVolume")
    }

    #[test]
    fn only_a_bound_claim_is_ready_and_it_stops_being_so_when_it_changes_or_goes() {
        let seen = Seen::default();
        assert_eq!(seen.ready("ns", "a", false), None, "nothing seen yet");
        seen.claim_event(&watcher::Event::Apply(pvc("a", "u1", "Pending", None)));
        assert_eq!(seen.ready("ns", "a", false), None, "pending");
        seen.claim_event(&watcher::Event::Apply(pvc("a", "u1", "Bound", Some("Block"))));
        assert_eq!(seen.ready("ns", "a", false), Some(ReadyClaim { uid: "u1".into(), block: true }));
        assert_eq!(seen.ready("other", "a", false), None, "another namespace");
        let deleting = serde_json::from_value(json!({"metadata": {"name": "a", "namespace": "ns", "uid": "u1",
            "deletionTimestamp": "2026-12-04T20:00:00Z", "finalizers": ["kubernetes.io/pvc-protection"]},
            "spec": {"volumeMode": "Block"}, "status": {"phase": "Bound"}}))
        .expect("claim");
        seen.claim_event(&watcher::Event::Apply(deleting));
        assert_eq!(seen.ready("ns", "a", false), None, "being deleted");
        seen.claim_event(&watcher::Event::Apply(pvc("a", "u2", "Bound", None)));
        assert_eq!(seen.ready("ns", "a", false), Some(ReadyClaim { uid: "u2".into(), block: false }), "created again");
        seen.claim_event(&watcher::Event::Delete(pvc("a", "u2", "Bound", None)));
        assert_eq!(seen.ready("ns", "a", false), None, "deleted");
    }

    #[test]
    fn a_data_volumes_claim_is_ready_only_once_its_import_succeeded() {
        let seen = Seen::default();
        seen.claim_event(&watcher::Event::Apply(pvc("d", "u", "Bound", None)));
        assert_eq!(seen.ready("ns", "d", true), None, "no DataVolume seen");
        seen.data_volume_event(&watcher::Event::Apply(dv("d", "ImportInProgress")));
        assert_eq!(seen.ready("ns", "d", true), None, "importing");
        seen.data_volume_event(&watcher::Event::Apply(dv("d", "Succeeded")));
        assert_eq!(seen.ready("ns", "d", true), Some(ReadyClaim { uid: "u".into(), block: false }));
        seen.data_volume_event(&watcher::Event::Delete(dv("d", "Succeeded")));
        assert_eq!(seen.ready("ns", "d", true), None, "DataVolume deleted");
    }

    #[test]
    fn a_relist_replaces_what_was_seen_only_when_it_is_complete() {
        let seen = Seen::default();
        seen.claim_event(&watcher::Event::Apply(pvc("gone", "u1", "Bound", None)));
        seen.claim_event(&watcher::Event::Init);
        seen.claim_event(&watcher::Event::InitApply(pvc("new", "u2", "Bound", None)));
        assert!(seen.ready("ns", "gone", false).is_some(), "the old list serves until the new one is complete");
        assert!(seen.ready("ns", "new", false).is_none());
        seen.claim_event(&watcher::Event::InitDone);
        assert!(seen.ready("ns", "gone", false).is_none(), "deleted while the watch was down");
        assert!(seen.ready("ns", "new", false).is_some());
    }

    #[test]
    fn a_failed_watch_forgets_what_it_showed_until_it_shows_it_again() {
        let seen = Seen::default();
        seen.claim_event(&watcher::Event::Apply(pvc("a", "u1", "Bound", None)));
        seen.data_volume_event(&watcher::Event::Apply(dv("a", "Succeeded")));
        seen.claim_event(&watcher::Event::Init);
        seen.claims_unknown();
        assert_eq!(seen.ready("ns", "a", false), None, "the claim watch failed");
        seen.claim_event(&watcher::Event::InitDone);
        assert_eq!(seen.ready("ns", "a", false), None, "a relist cut short by the failure fills nothing");
        seen.claim_event(&watcher::Event::Apply(pvc("a", "u1", "Bound", None)));
        assert!(seen.ready("ns", "a", true).is_some(), "shown again; the DataVolume watch did not fail");
        seen.data_volumes_unknown();
        assert_eq!(seen.ready("ns", "a", true), None, "the DataVolume watch failed");
        assert!(seen.ready("ns", "a", false).is_some());
    }
}
