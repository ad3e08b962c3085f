//! Legacy `status.volumeRequests` (KubeVirt's imperative `HotplugVolumes` path).
//!
//! With the legacy path on ([`crate::run::Config::legacy_volume_requests`]), each request is
//! applied to the VM's template in order, with the same edits and refusals as the subresources
//! ([`api::volume_edit`]); a request that is already in effect (the volume is there, or gone)
//! counts as done; a refused one is dropped with a Warning Event. The requests are then cleared
//! and declarative hot-plug carries the template to the running VMI — the end state KubeVirt's
//! VM controller reaches by patching both.
//!
//! With the declarative path (the default), requests are not processed: KubeVirt 1.9 fails
//! every sync of such a VM silently; here the VM gets the [`CONDITION`] condition that says what
//! to do instead.

use api::kubevirt::{VirtualMachineInstanceSpec, VirtualMachineVolumeRequest};
use api::volume_edit;

/// The VM condition present while requests are pending under the declarative path.
pub const CONDITION: &str = "VolumeRequestsPending";

/// The message of [`CONDITION`] for `n` pending requests on VM `ns/name`.
#[must_use]
pub fn pending_message(ns: &str, name: &str, n: usize) -> String {
    format!(
        "status.volumeRequests holds {n} request(s) that declarative hot-plug does not process: run \
         `virtplug migrate hotplug-to-declarative --namespace {ns}` to move them into the VM spec, or drop them with \
         `kubectl patch vm {name} -n {ns} --subresource=status --type=json -p '[{{\"op\":\"remove\",\"path\":\"/status/volumeRequests\"}}]'`"
    )
}

/// What applying one request did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    AlreadyInEffect,
    Refused(String),
}

/// Applies `req` to `template` (the VM's `spec.template.spec`).
pub fn apply(template: &mut VirtualMachineInstanceSpec, req: &VirtualMachineVolumeRequest) -> Outcome {
    if let Some(add) = &req.add_volume_options {
        let volume = add.volume();
        if template.volumes.iter().any(|v| v.name == add.name && v.claim_name() == volume.claim_name()) {
            return Outcome::AlreadyInEffect;
        }
        return match volume_edit::add(template, add.disk(), volume) {
            Ok(()) => Outcome::Applied,
            Err(e) => Outcome::Refused(e.0),
        };
    }
    if let Some(rm) = &req.remove_volume_options {
        if !template.volumes.iter().any(|v| v.name == rm.name) {
            return Outcome::AlreadyInEffect;
        }
        return match volume_edit::remove(template, &rm.name) {
            Ok(_) => Outcome::Applied,
            Err(e) => Outcome::Refused(e.0),
        };
    }
    Outcome::Refused("a volume request needs addVolumeOptions or removeVolumeOptions".to_owned())
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn req(v: Value) -> VirtualMachineVolumeRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn add_then_remove_and_replays_are_no_ops() {
        let initial: VirtualMachineInstanceSpec =
            serde_json::from_value(json!({"domain": {"devices": {"disks": []}}, "volumes": []})).unwrap();
        let mut t = initial.clone();
        let add = req(
            json!({"addVolumeOptions": {"name": "d", "disk": {"disk": {"bus": "scsi"}}, "volumeSource": {"persistentVolumeClaim": {"claimName": "c"}}}}),
        );
        assert_eq!(apply(&mut t, &add), Outcome::Applied);
        let json = |t: &VirtualMachineInstanceSpec| serde_json::to_value(t).unwrap();
        assert_eq!(json(&t)["volumes"][0], json!({"name": "d", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}));
        assert_eq!(json(&t)["domain"]["devices"]["disks"][0], json!({"name": "d", "disk": {"bus": "scsi"}}));
        assert_eq!(apply(&mut t, &add), Outcome::AlreadyInEffect);
        let rm = req(json!({"removeVolumeOptions": {"name": "d"}}));
        assert_eq!(apply(&mut t, &rm), Outcome::Applied);
        assert_eq!(apply(&mut t, &rm), Outcome::AlreadyInEffect);
        assert_eq!(t, initial);
    }
}
