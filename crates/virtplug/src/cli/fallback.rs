//! The CLI without KubeVirt's subresources API: on a cluster where `subresources.kubevirt.io` is
//! not served (no virt-api, and no `virtplug subresources-api`), `addvolume`, `removevolume`,
//! `vm start|stop|restart` make the same change to the VM — and `vm pause|unpause|softreboot` to
//! its VMI — that the subresource would: the API server's own handlers
//! ([`apiserver::subresources`]) run here, reading and writing through the client
//! ([`virtapi::objects::KubeObjects`]: each write conditional on the resourceVersion read,
//! recomputed on conflict), so the decisions, refusals and wording are the subresource's and no
//! concurrent edit is lost.
//!
//! # Caveats
//! `--dry-run` is a server-side dry run of the edit (`dryRun=All` on the write), as the
//! subresource's.

use anyhow::bail;
use serde_json::Value;

use apiserver::subresources::{self, vmi_actions};
use virtapi::objects::KubeObjects;

/// Whether the API server serves KubeVirt's subresources API.
pub async fn subresources_served(client: &kube::Client) -> bool {
    let Ok(req) = http::Request::get("/apis/subresources.kubevirt.io/v1").body(Vec::new()) else { return false };
    client.request_text(req).await.is_ok()
}

/// Carries out subresource `sub` with `body` (what the CLI would have sent) on VM `ns/name` (on
/// its VMI for `pause`, `unpause`, `softreboot`).
///
/// # Errors
/// The refusal (KubeVirt's wording, with its code) or the API error.
pub async fn apply(client: &kube::Client, ns: &str, name: &str, sub: &str, body: &Value) -> anyhow::Result<()> {
    let objects = KubeObjects(client.clone());
    let body = serde_json::to_vec(body)?;
    let plural = if vmi_actions::SUBRESOURCES.contains(&sub) { "virtualmachineinstances" } else { "virtualmachines" };
    let put = subresources::Put { plural, ns, name, sub, body: &body, query_dry_run: false };
    let done = subresources::put(&objects, &put).await;
    match done {
        Ok(_) => Ok(()),
        Err(e) => bail!("{sub} {ns}/{name}: {} ({})", e.message, e.code),
    }
}
