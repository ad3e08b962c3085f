//! virtplug's controller crate (KubeVirt's virt-controller, plus the parts of CDI and a local
//! provisioner that the embedded deployment needs):
//!
//! - [`lifecycle`]: VM → VMI by `runStrategy` and the start/stop/restart requests, scheduling
//!   onto a registered node, VM status;
//! - [`hotplug`]: declarative hot-plug of a running VMI's volumes;
//! - [`selfheal`], [`volume_requests`]: broken specs and legacy requests, reported or repaired;
//! - [`storage`]: the local PVC provisioner and DataVolume import;
//! - [`migrate`]: the move of VMI-only hot-plugged volumes into VM specs;
//! - [`run`]: the controllers wired together, reading from reflector stores ([`cache`]).

pub mod cache;
pub mod hotplug;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod migrate;
pub mod nodes;
mod reconcile;
pub mod run;
pub mod runner;
pub mod selfheal;
pub mod storage;
pub mod volume_requests;
