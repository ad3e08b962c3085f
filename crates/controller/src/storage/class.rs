//! Which claims the local provisioner serves, decided from their StorageClass, as Kubernetes'
//! PV controller and a CSI external-provisioner decide it.
//!
//! # Flow
//! [`resolve`] lists the StorageClasses and [`decide`] answers for one claim:
//! - no `storageClassName`: the default class (annotated [`DEFAULT_ANNOTATION`]` = "true"`, the
//!   newest when several are, as kube-apiserver picks it) is the claim's; it is served when its
//!   provisioner is [`PROVISIONER`], and the claim is told to take the class's name
//!   ([`Decision::Serve::assign`]: the PV controller's retroactive default-class assignment).
//!   With no default class at all (an API server that predates StorageClasses, or one whose
//!   `local` class was deleted) the claim is served as before, with `Delete` and no class.
//! - a named class: served when it exists with provisioner [`PROVISIONER`]; another
//!   provisioner's class is left alone; a class that does not exist is [`Decision::Missing`],
//!   except the old name [`LEGACY_CLASS`], which earlier versions served without any
//!   StorageClass object and which keeps being served with `Delete`.
//! - `storageClassName: ""` asks for no dynamic provisioning in Kubernetes: left alone.
//!
//! [`waits_for_consumer`] answers another question, for any provisioner's claim: whether it is
//! bound only once a pod that uses it is scheduled (`volumeBindingMode: WaitForFirstConsumer`).
//!
//! # Errors
//! [`resolve`] fails only when the list fails for another reason than the API server not
//! serving StorageClasses (404), which counts as no class.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::Store;
use kube::ResourceExt;

use api::phases::ClaimPhase;

use crate::cache::Lookup;

/// The binding mode that delays a claim's binding until a pod using it is scheduled.
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";
/// The claim annotation the scheduler sets to the node it chose for a pod using the claim
/// (Kubernetes' `volume.kubernetes.io/selected-node`): the provisioner makes the volume there.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Whether `pvc` is unbound and waits for its first consumer: its StorageClass (looked up in
/// `lookup`) has `volumeBindingMode: WaitForFirstConsumer`. Kubernetes binds such a claim only
/// after the scheduler places a pod using it (it sets [`ANN_SELECTED_NODE`]; the provisioner
/// makes the volume reachable from that node): until then only a pod can make it bind.
///
/// A claim without a class name, or whose class `lookup` does not know, counts as `Immediate`
/// (bound without a consumer): that is what a lookup without classes says of every claim.
#[must_use]
pub fn waits_for_consumer(pvc: &PersistentVolumeClaim, lookup: &impl Lookup) -> bool {
    if ClaimPhase::is_bound(pvc) {
        return false;
    }
    let Some(class) = pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).filter(|c| !c.is_empty()) else {
        return false;
    };
    lookup.storage_class(class).is_some_and(|sc| sc.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER))
}

/// The default class the API server creates, served by this provisioner.
pub const LOCAL_CLASS: &str = "local";
/// The class name earlier versions served (no StorageClass object needed).
pub const LEGACY_CLASS: &str = "virtplug-local";
/// This provisioner's name, as StorageClasses and `pv.kubernetes.io/provisioned-by` give it.
pub const PROVISIONER: &str = "virtplug.io/local";
/// The annotation that makes a class the default one.
pub const DEFAULT_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// What happens to a volume when its claim is deleted (a class's `reclaimPolicy`, a PV's
/// `persistentVolumeReclaimPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimPolicy {
    /// The PV and the data are removed.
    Delete,
    /// The PV goes to `Released` and the data stays.
    Retain,
}

impl ReclaimPolicy {
    /// The policy a class or PV names: `Retain` only when it says so (`Delete` is the class
    /// default; `Recycle` is deprecated in Kubernetes and not offered here).
    #[must_use]
    pub fn parse(value: Option<&str>) -> ReclaimPolicy {
        match value {
            Some("Retain") => ReclaimPolicy::Retain,
            _ => ReclaimPolicy::Delete,
        }
    }

    /// The wire value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimPolicy::Delete => "Delete",
            ReclaimPolicy::Retain => "Retain",
        }
    }
}

/// The answer for one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// This provisioner's claim.
    Serve {
        /// The PV's `storageClassName` (`None`: no class, the behaviour of earlier versions).
        class: Option<String>,
        reclaim: ReclaimPolicy,
        /// The claim has no class and should take `class` (the default class's name).
        assign: bool,
    },
    /// Another provisioner's class, or no dynamic provisioning asked.
    Other,
    /// The claim names a class that does not exist.
    Missing(String),
}

/// The decision for a claim whose `storageClassName` is `claim_class`, given every class.
#[must_use]
pub fn decide(claim_class: Option<&str>, classes: &[StorageClass]) -> Decision {
    let serve = |sc: &StorageClass, assign| {
        if sc.provisioner == PROVISIONER {
            Decision::Serve { class: Some(sc.name_any()), reclaim: ReclaimPolicy::parse(sc.reclaim_policy.as_deref()), assign }
        } else {
            Decision::Other
        }
    };
    match claim_class {
        None => {
            let default = classes
                .iter()
                .filter(|sc| sc.annotations().get(DEFAULT_ANNOTATION).map(String::as_str) == Some("true"))
                // The newest default wins (kube-apiserver's DefaultStorageClass admission), ties by name.
                .max_by(|a, b| (a.creation_timestamp(), a.name_any()).cmp(&(b.creation_timestamp(), b.name_any())));
            match default {
                Some(sc) => serve(sc, true),
                None => Decision::Serve { class: None, reclaim: ReclaimPolicy::Delete, assign: false },
            }
        }
        Some("") => Decision::Other,
        Some(name) => match classes.iter().find(|sc| sc.name_any() == name) {
            Some(sc) => serve(sc, false),
            None if name == LEGACY_CLASS => {
                Decision::Serve { class: Some(LEGACY_CLASS.to_owned()), reclaim: ReclaimPolicy::Delete, assign: false }
            }
            None => Decision::Missing(name.to_owned()),
        },
    }
}

/// The decision for `pvc`, from the classes the provisioner's watch holds (no request: a
/// claim's reconcile on the hot-plug path reads nothing from the API server). An API server
/// that does not serve StorageClasses leaves the store empty: no class.
#[must_use]
pub fn resolve(classes: &Store<StorageClass>, pvc: &PersistentVolumeClaim) -> Decision {
    let classes: Vec<StorageClass> = classes.state().iter().map(|c| c.as_ref().clone()).collect();
    decide(pvc.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()), &classes)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use serde_json::json;

    /// Classes only: claims and DataVolumes are not asked for.
    struct Classes(Vec<StorageClass>);
    impl Lookup for Classes {
        fn pvc(&self, _: &str, _: &str) -> Option<Arc<PersistentVolumeClaim>> {
            None
        }
        fn dv(&self, _: &str, _: &str) -> Option<Arc<api::DataVolume>> {
            None
        }
        fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
            self.0.iter().find(|sc| sc.name_any() == name).cloned().map(Arc::new)
        }
    }

    fn claim(class: Option<&str>, phase: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"storageClassName": class}, "status": {"phase": phase}})).unwrap()
    }

    fn mode(name: &str, binding: &str) -> StorageClass {
        serde_json::from_value(json!({"metadata": {"name": name}, "provisioner": "csi.example.com", "volumeBindingMode": binding})).unwrap()
    }

    #[test]
    fn only_an_unbound_claim_of_a_wait_for_first_consumer_class_waits_for_its_consumer() {
        let classes = Classes(vec![mode("wffc", WAIT_FOR_FIRST_CONSUMER), mode("now", "Immediate")]);
        assert!(waits_for_consumer(&claim(Some("wffc"), "Pending"), &classes));
        assert!(!waits_for_consumer(&claim(Some("wffc"), "Bound"), &classes), "bound: it waits for nothing");
        assert!(!waits_for_consumer(&claim(Some("now"), "Pending"), &classes), "Immediate: the provisioner binds it alone");
        assert!(!waits_for_consumer(&claim(None, "Pending"), &classes), "no class name counts as Immediate");
        assert!(!waits_for_consumer(&claim(Some(""), "Pending"), &classes), "no dynamic provisioning");
        assert!(!waits_for_consumer(&claim(Some("unknown"), "Pending"), &classes), "a class not (yet) known counts as Immediate");
        let no_classes = Classes(Vec::new());
        assert!(!waits_for_consumer(&claim(Some("wffc"), "Pending"), &no_classes), "a lookup without classes: Immediate");
    }

    fn sc(name: &str, provisioner: &str, reclaim: &str, default: bool, created: &str) -> StorageClass {
        let mut v = json!({"metadata": {"name": name, "creationTimestamp": created}, "provisioner": provisioner, "reclaimPolicy": reclaim});
        if default {
            v["metadata"]["annotations"] = json!({DEFAULT_ANNOTATION: "true"});
        }
        serde_json::from_value(v).unwrap()
    }

    fn serve(class: Option<&str>, reclaim: ReclaimPolicy, assign: bool) -> Decision {
        Decision::Serve { class: class.map(str::to_owned), reclaim, assign }
    }

    #[test]
    fn a_claim_without_class_takes_the_newest_default_or_is_served_as_before_without_one() {
        let local = sc("local", PROVISIONER, "Delete", true, "2024-01-01T00:00:00Z");
        assert_eq!(decide(None, std::slice::from_ref(&local)), serve(Some("local"), ReclaimPolicy::Delete, true));
        // No StorageClass at all (an older API server): the old behaviour.
        assert_eq!(decide(None, &[]), serve(None, ReclaimPolicy::Delete, false));
        // A newer default of another provisioner makes the claim someone else's.
        let nfs = sc("nfs", "example.com/nfs", "Delete", true, "2025-01-01T00:00:00Z");
        assert_eq!(decide(None, &[local.clone(), nfs.clone()]), Decision::Other);
        let kept = sc("kept", PROVISIONER, "Retain", true, "2026-01-01T00:00:00Z");
        assert_eq!(decide(None, &[local, nfs, kept]), serve(Some("kept"), ReclaimPolicy::Retain, true));
    }

    #[test]
    fn a_named_class_is_served_by_its_provisioner_and_the_legacy_name_without_an_object() {
        let classes = [
            sc("local", PROVISIONER, "Delete", true, "2024-01-01T00:00:00Z"),
            sc("nfs", "example.com/nfs", "Retain", false, "2024-01-01T00:00:00Z"),
        ];
        assert_eq!(decide(Some("local"), &classes), serve(Some("local"), ReclaimPolicy::Delete, false));
        assert_eq!(decide(Some("nfs"), &classes), Decision::Other);
        assert_eq!(decide(Some(LEGACY_CLASS), &classes), serve(Some(LEGACY_CLASS), ReclaimPolicy::Delete, false));
        assert_eq!(decide(Some("gone"), &classes), Decision::Missing("gone".into()));
        // `""` asks for no dynamic provisioning.
        assert_eq!(decide(Some(""), &classes), Decision::Other);
    }
}
