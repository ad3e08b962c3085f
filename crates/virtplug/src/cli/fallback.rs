//! The CLI without KubeVirt's subresources API: on a cluster where `subresources.kubevirt.io` is
//! not served (no virt-api; virtplug's controller against a plain kube-apiserver), `addvolume`,
//! `removevolume`, `vm start|stop|restart` make the same change to the VM — and `vm pause|
//! unpause|softreboot` to its VMI — that the API server's subresource would, through
//! [`client::update`] (a write conditional on the resourceVersion read, retried on conflict):
//! the same decisions ([`api::volume_edit`], [`api::lifecycle_requests`],
//! [`api::vmi_requests`]), the same refusals, no lost concurrent edit.
//!
//! # Caveats
//! `--dry-run` is checked here on the VM as read, not by the server's admission. A stop's grace
//! period is written to the VMI's `terminationGracePeriodSeconds`, as the subresource does.

use anyhow::{bail, Context};
use kube::api::Api;
use serde_json::{json, Value};

use api::kubevirt::{Disk, Volume};
use api::lifecycle_requests::{decide, set_requests, set_strategy, Action, Change};
use api::{VirtualMachine, VirtualMachineInstance};

/// Whether the API server serves KubeVirt's subresources API.
pub async fn subresources_served(client: &kube::Client) -> bool {
    let Ok(req) = http::Request::get("/apis/subresources.kubevirt.io/v1").body(Vec::new()) else { return false };
    client.request_text(req).await.is_ok()
}

/// Carries out subresource `sub` with `body` (what the CLI would have sent) on VM `ns/name`.
///
/// # Errors
/// The refusal (KubeVirt's wording) or the API error.
pub async fn apply(client: &kube::Client, ns: &str, name: &str, sub: &str, body: &Value) -> anyhow::Result<()> {
    let dry = body.get("dryRun").is_some();
    match sub {
        "addvolume" | "removevolume" => volume_edit(client, ns, name, sub, body, dry).await,
        "start" => lifecycle(client, ns, name, Action::Start, None).await,
        "stop" => lifecycle(client, ns, name, Action::Stop, body.get("gracePeriod").and_then(Value::as_i64)).await,
        "restart" => lifecycle(client, ns, name, Action::Restart, None).await,
        "pause" | "unpause" | "softreboot" => vmi_action(client, ns, name, sub, dry).await,
        other => bail!("{other} needs the subresources.kubevirt.io API, which this API server does not serve"),
    }
}

fn hotplug_volume(body: &Value) -> anyhow::Result<(Disk, Volume)> {
    let name = body.get("name").and_then(Value::as_str).unwrap_or_default();
    let disk: Disk = serde_json::from_value(body.get("disk").cloned().unwrap_or_default()).context("the disk")?;
    // As KubeVirt's addvolume: the source is marked hot-pluggable.
    let mut volume = json!({"name": name});
    let src = body.get("volumeSource").cloned().unwrap_or_default();
    for key in ["persistentVolumeClaim", "dataVolume"] {
        if let Some(s) = src.get(key) {
            volume[key] = s.clone();
            volume[key]["hotpluggable"] = json!(true);
        }
    }
    Ok((disk, serde_json::from_value(volume).context("the volume")?))
}

async fn volume_edit(client: &kube::Client, ns: &str, name: &str, sub: &str, body: &Value, dry: bool) -> anyhow::Result<()> {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let add = if sub == "addvolume" { Some(hotplug_volume(body)?) } else { None };
    let volume = body.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let edit = |vm: &mut VirtualMachine| -> Result<(), api::volume_edit::EditRefused> {
        let Some(spec) = vm.spec.template.spec.as_mut() else {
            return Err(api::volume_edit::EditRefused(format!("VM {ns}/{name} has no spec.template.spec")));
        };
        match &add {
            Some((d, v)) => api::volume_edit::add(spec, d.clone(), v.clone()),
            None => api::volume_edit::remove(spec, &volume).map(|_| ()),
        }
    };
    if dry {
        let mut vm = vms.get(name).await.with_context(|| format!("{sub} {ns}/{name}"))?;
        return edit(&mut vm).with_context(|| format!("{sub} {ns}/{name}"));
    }
    client::try_update(&vms, name, &client::UpdateOptions::default(), edit).await.with_context(|| format!("{sub} {ns}/{name}"))?;
    Ok(())
}

async fn lifecycle(client: &kube::Client, ns: &str, name: &str, action: Action, grace: Option<i64>) -> anyhow::Result<()> {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    let vm = vms.get(name).await.with_context(|| format!("VM {ns}/{name}"))?;
    let vmi = vmis.get_opt(name).await.with_context(|| format!("VMI {ns}/{name}"))?;
    let vmi_value = vmi.as_ref().map(serde_json::to_value).transpose()?;
    let change = decide(action, vm.spec.effective_run_strategy(), vmi_value.as_ref()).map_err(|e| anyhow::anyhow!("{}", e.0))?;
    if let (Some(g), Some(_), false) = (grace, &vmi, action == Action::Start) {
        client::update(&vmis, name, |v: &mut VirtualMachineInstance| {
            v.spec.extra.insert("terminationGracePeriodSeconds".to_owned(), json!(g));
        })
        .await
        .with_context(|| format!("VMI {ns}/{name}: the grace period"))?;
    }
    // Both edits work on the VM as JSON (one decision for the server and the CLI), read fresh by
    // `client::update` on every attempt.
    let through_json = |vm: &mut VirtualMachine, f: &dyn Fn(&mut Value) -> Result<(), api::lifecycle_requests::Refused>| {
        let mut v = serde_json::to_value(&*vm).map_err(|e| api::lifecycle_requests::Refused(e.to_string()))?;
        f(&mut v)?;
        *vm = serde_json::from_value(v).map_err(|e| api::lifecycle_requests::Refused(e.to_string()))?;
        Ok::<(), api::lifecycle_requests::Refused>(())
    };
    match change {
        Change::AlreadyStopping => {}
        Change::Strategy(s) => {
            client::try_update(&vms, name, &client::UpdateOptions::default(), |vm| {
                through_json(vm, &|v| {
                    set_strategy(v, s);
                    Ok(())
                })
            })
            .await
            .with_context(|| format!("VM {ns}/{name}"))?;
        }
        Change::Requests(reqs) => {
            client::try_update_status(&vms, name, &client::UpdateOptions::default(), |vm| through_json(vm, &|v| set_requests(v, &reqs)))
                .await
                .with_context(|| format!("VM {ns}/{name}"))?;
        }
    }
    Ok(())
}

/// `pause`, `unpause`, `softreboot`: the annotation on the VMI ([`api::vmi_requests`]).
async fn vmi_action(client: &kube::Client, ns: &str, name: &str, sub: &str, dry: bool) -> anyhow::Result<()> {
    use api::vmi_requests::{decide, Refused, VmiAction};
    let action = VmiAction::parse(sub).with_context(|| format!("{sub} is not a VMI action"))?;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    let id = format!("{:016x}", rand::random::<u64>());
    let edit = |vmi: &mut VirtualMachineInstance| -> Result<(), Refused> {
        let mut v = serde_json::to_value(&*vmi).map_err(|e| Refused(e.to_string()))?;
        decide(action, &v, &id)?.apply(&mut v);
        *vmi = serde_json::from_value(v).map_err(|e| Refused(e.to_string()))?;
        Ok(())
    };
    if dry {
        let mut vmi = vmis.get(name).await.with_context(|| format!("{sub} {ns}/{name}"))?;
        return edit(&mut vmi).with_context(|| format!("{sub} {ns}/{name}"));
    }
    client::try_update(&vmis, name, &client::UpdateOptions::default(), edit).await.with_context(|| format!("{sub} {ns}/{name}"))?;
    Ok(())
}
