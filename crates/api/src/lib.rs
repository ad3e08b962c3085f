//! virtplug's resource types and the rules they obey. No I/O.
//!
//! - [`kubevirt`]: kubevirt.io/v1 `VirtualMachine`, `VirtualMachineInstance`.
//! - [`cdi`]: cdi.kubevirt.io/v1beta1 `DataVolume`.
//! - [`validation`]: admission checks with field paths.
//! - [`cloud_init`]: the rules of cloud-init volumes and the decoder of their base64 data.
//! - [`invariants`]: the disk/volume rules every VM spec must hold.
//! - [`quantity`]: quantities of bytes, the one parser for every size.
//! - [`phases`]: the states KubeVirt and CDI write as strings, as enums.
//! - [`volume_edit`]: the addvolume/removevolume edits of a spec.
//! - [`crd`]: CRD manifests generated from the types (cluster mode).
//! - [`annotations`]: the annotations components use to talk through the API.
//! - [`network`]: guest interfaces and networks, their admission rules, MAC addresses.
//! - [`lifecycle_requests`], [`vmi_requests`]: what KubeVirt's VM and VMI action subresources
//!   do to the objects.
//! - [`tunnel`]: how the API server reaches a node's consoles (the node agent's tunnel).
//! - [`launcher_disks`]: where a launcher pod has its VMI's boot claims.
//!
//! core/v1 `PersistentVolumeClaim`, `Event`, `Namespace` and `Node` come from k8s-openapi, re-exported
//! under [`core`].

pub mod access_credentials;
pub mod annotations;
mod cause;
pub mod cdi;
pub mod cloud_init;
pub mod crd;
pub mod diag;
pub mod invariants;
pub mod kubevirt;
pub mod launcher_disks;
pub mod lifecycle_requests;
pub mod network;
pub mod phases;
pub mod quantity;
pub mod tunnel;
pub mod validation;
pub mod virtual_media;
pub mod vmi_requests;
pub mod volume_edit;

/// core/v1 types used by virtplug.
pub mod core {
    pub use k8s_openapi::api::core::v1::{Event, Namespace, Node, PersistentVolumeClaim};
}

pub use cdi::DataVolume;
pub use kubevirt::{VirtualMachine, VirtualMachineInstance};
