//! What the VM controller reads instead of GETs: kube-runtime reflector stores of the VMs,
//! VMIs, claims, DataVolumes and (with launcher pods) StorageClasses, filled by the same
//! watches that wake its reconciles.
//!
//! # Guarantees
//! - A store is updated before the watch event that changed it triggers a reconcile, so a
//!   reconcile never sees an object older than the event that woke it.
//! - The controller GETs an object only right before a conditional write
//!   ([`client::update_from`]), or not at all ([`client::patch_if_seen`] sends its patch behind
//!   the cached copy's resourceVersion): a stale copy can at worst cause one GET and a plan
//!   that finds nothing to do, or a refused write and a re-read; the next event corrects it.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};

use api::{DataVolume, VirtualMachine, VirtualMachineInstance};

/// Where claims, DataVolumes and StorageClasses are looked up.
pub trait Lookup {
    /// The claim `ns/name`, if it exists.
    fn pvc(&self, ns: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>>;
    /// The DataVolume `ns/name`, if it exists.
    fn dv(&self, ns: &str, name: &str) -> Option<Arc<DataVolume>>;
    /// The StorageClass `name`, if it is known. `None` by default: a lookup without classes
    /// treats every claim as bound at once (`volumeBindingMode: Immediate`), which is what
    /// direct placement and `virtplug up` have (their provisioner binds at once).
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        let _ = name;
        None
    }
}

/// The controller's reflector stores.
#[derive(Clone)]
pub struct Cache {
    pub vms: Store<VirtualMachine>,
    pub vmis: Store<VirtualMachineInstance>,
    pub pvcs: Store<PersistentVolumeClaim>,
    pub dvs: Store<DataVolume>,
    /// Every Node (scheduling, and whether a VMI's node still exists).
    pub nodes: Store<Node>,
    /// Launcher and attachment pods (label `kubevirt.io`); empty with direct placement.
    pub pods: Store<Pod>,
    /// Every StorageClass (whether a claim waits for its first consumer, the attachment pod);
    /// empty with direct placement, where no pod consumes a claim.
    pub classes: Store<StorageClass>,
}

impl Cache {
    /// The VMI `ns/name`, if it exists.
    #[must_use]
    pub fn vmi(&self, ns: &str, name: &str) -> Option<Arc<VirtualMachineInstance>> {
        self.vmis.get(&ObjectRef::new(name).within(ns))
    }

    /// The Node `name`, if it exists.
    #[must_use]
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }
}

impl Lookup for Cache {
    fn pvc(&self, ns: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.pvcs.get(&ObjectRef::new(name).within(ns))
    }

    fn dv(&self, ns: &str, name: &str) -> Option<Arc<DataVolume>> {
        self.dvs.get(&ObjectRef::new(name).within(ns))
    }

    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }
}

/// Claims and DataVolumes read once with GETs, for a caller that has no stores.
#[derive(Default)]
pub struct Fetched {
    pvcs: HashMap<String, Arc<PersistentVolumeClaim>>,
    dvs: HashMap<String, Arc<DataVolume>>,
}

impl Fetched {
    /// Reads the claims and DataVolumes named by the volumes of `vmi`.
    ///
    /// # Errors
    /// When a read fails.
    pub async fn for_vmi(client: &kube::Client, vmi: &VirtualMachineInstance) -> Result<Fetched, kube::Error> {
        let ns = vmi.metadata.namespace.clone().unwrap_or_default();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let dvs: Api<DataVolume> = Api::namespaced(client.clone(), &ns);
        let mut out = Fetched::default();
        for v in &vmi.spec.volumes {
            let Some(claim) = v.claim_name() else { continue };
            if let Some(p) = pvcs.get_opt(claim).await? {
                out.pvcs.insert(claim.to_owned(), Arc::new(p));
            }
            if v.data_volume.is_some() {
                if let Some(d) = dvs.get_opt(claim).await? {
                    out.dvs.insert(claim.to_owned(), Arc::new(d));
                }
            }
        }
        Ok(out)
    }
}

impl Lookup for Fetched {
    fn pvc(&self, _: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.pvcs.get(name).cloned()
    }

    fn dv(&self, _: &str, name: &str) -> Option<Arc<DataVolume>> {
        self.dvs.get(name).cloned()
    }
}
