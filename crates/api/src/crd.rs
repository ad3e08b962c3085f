//! CRD manifests generated from the types, for cluster mode (`deploy/crds.yaml`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{DataVolume, VirtualMachine, VirtualMachineInstance};

/// The CRDs of every custom resource virtplug serves, with the status subresource and printer
/// columns. Every schema level keeps unknown fields, as virtplug's types do.
#[must_use]
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![VirtualMachine::crd(), VirtualMachineInstance::crd(), DataVolume::crd()];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) {
                for part in ["spec", "status"] {
                    if let Some(p) = schema.properties.as_mut().and_then(|p| p.get_mut(part)) {
                        p.x_kubernetes_preserve_unknown_fields = Some(true);
                    }
                }
            }
        }
    }
    crds
}
