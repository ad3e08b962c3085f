//! `virtplug controller` and `virtplug node` refuse to run where KubeVirt itself runs: both
//! would act on the same VMIs (two schedulers, two QEMUs per VMI, finalizers removed by the
//! wrong agent). On a KubeVirt cluster virtplug's Redfish service and `migrate` are the parts to
//! use.
//!
//! KubeVirt is deployed when a `kubevirts.kubevirt.io` object (virt-operator's KubeVirt CR)
//! exists: the CRD alone (virt-operator installed, nothing deployed) is not enough.

use anyhow::bail;
use serde_json::Value;

/// The KubeVirt CRs on the cluster, as `namespace/name`.
async fn kubevirt_deployments(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let req = http::Request::get("/apis/kubevirt.io/v1/kubevirts").body(Vec::new())?;
    match client.request::<Value>(req).await {
        Ok(list) => Ok(list
            .get("items")
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .map(|i| {
                        let m = |k: &str| i.pointer(&format!("/metadata/{k}")).and_then(Value::as_str).unwrap_or_default().to_owned();
                        format!("{}/{}", m("namespace"), m("name"))
                    })
                    .collect()
            })
            .unwrap_or_default()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(anyhow::Error::new(e).context("cannot tell whether KubeVirt is deployed (GET /apis/kubevirt.io/v1/kubevirts)")),
    }
}

/// Fails when KubeVirt is deployed on the cluster `client` reaches.
///
/// # Errors
/// KubeVirt runs there (the message names its KubeVirt CR and what to use instead), or the check
/// itself failed.
pub async fn refuse_beside_kubevirt(client: &kube::Client, component: &str) -> anyhow::Result<()> {
    let found = kubevirt_deployments(client).await?;
    if let Some(kv) = found.first() {
        bail!(
            "KubeVirt is deployed on this cluster (KubeVirt {kv}): virtplug's {component} would act on the same VMIs as KubeVirt's \
             virt-controller and virt-handler. On a KubeVirt cluster run only `virtplug redfish` and `virtplug migrate`; \
             to use virtplug's {component}, remove KubeVirt first"
        );
    }
    Ok(())
}
