//! `virtplug volume`: claims from the local provisioner and DataVolume imports.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

use api::phases::DataVolumePhase;
use api::DataVolume;

use super::{api_err, connect, follow, print_objects, print_one, report, Common};

#[derive(Subcommand)]
pub enum Volume {
    /// Create a claim served by the local provisioner.
    Create {
        name: String,
        #[arg(long)]
        size: String,
        #[arg(long, default_value = "Filesystem", value_parser = ["Filesystem", "Block"])]
        mode: String,
        /// Wait until it is Bound.
        #[arg(long)]
        wait: bool,
    },
    /// Import an image over http(s) into a new DataVolume, showing progress.
    Import {
        name: String,
        #[arg(long)]
        url: String,
        /// Claim size [default: 1Gi].
        #[arg(long, default_value = "1Gi")]
        size: String,
        #[arg(long, default_value = "Filesystem", value_parser = ["Filesystem", "Block"])]
        mode: String,
        /// Return at once instead of following the import.
        #[arg(long)]
        no_wait: bool,
    },
    /// List claims.
    List,
    /// Delete a claim (its storage is released once no VMI uses it).
    Delete { name: String },
}

pub async fn volume(cmd: Volume, c: Common) -> anyhow::Result<()> {
    let client = connect(&c).await?;
    let ns = &c.namespace;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    match cmd {
        Volume::Create { name, size, mode, wait } => {
            controller::storage::parse_bytes(&size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
            let pvc: PersistentVolumeClaim = serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode, "resources": {"requests": {"storage": size}}}}),
            )?;
            pvcs.create(&PostParams::default(), &pvc).await.map_err(api_err("create the claim"))?;
            if wait {
                let bound = follow(&pvcs, &name, Some(Duration::from_secs(60)), |p| {
                    Ok(p.is_some_and(api::phases::ClaimPhase::is_bound).then_some(()))
                })
                .await
                .context("watch the claim")?;
                if bound.is_none() {
                    bail!("claim {name} is not Bound after 60 s: see `kubectl describe pvc {name}` for its events");
                }
            }
            let p = pvcs.get(&name).await.map_err(api_err("read the claim"))?;
            print_one(&c.output, &p, pvc_rows, PVC_HEADER)?;
        }
        Volume::Import { name, url, size, mode, no_wait } => {
            let dvs: Api<DataVolume> = Api::namespaced(client.clone(), ns);
            let dv: DataVolume = serde_json::from_value(
                json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": name, "namespace": ns},
                "spec": {"source": {"http": {"url": url}}, "storage": {"volumeMode": mode, "resources": {"requests": {"storage": size}}}}}),
            )?;
            let created = dvs.create(&PostParams::default(), &dv).await.map_err(api_err("create the DataVolume"))?;
            if no_wait {
                report(&c.output, &format!("datavolume/{name} created"), &serde_json::to_value(created)?)?;
                return Ok(());
            }
            let done = follow_import(&dvs, &name, c.output == "table").await?;
            report(&c.output, &format!("datavolume/{name} imported"), &serde_json::to_value(done)?)?;
        }
        Volume::List => {
            let list = pvcs.list(&ListParams::default()).await.map_err(api_err("list claims"))?.items;
            print_objects(&c.output, &list, pvc_rows, PVC_HEADER)?;
        }
        Volume::Delete { name } => {
            let r = pvcs.delete(&name, &DeleteParams::default()).await.map_err(api_err(&format!("delete claim {name}")))?;
            report(
                &c.output,
                &format!("persistentvolumeclaim/{name} deleted (storage released once no VMI uses it)"),
                &r.either(serde_json::to_value, serde_json::to_value)?,
            )?;
        }
    }
    Ok(())
}

const PVC_HEADER: &[&str] = &["NAME", "STATUS", "CAPACITY", "MODE", "DEVICE"];

fn pvc_rows(items: &[PersistentVolumeClaim]) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|p| {
            let st = p.status.clone().unwrap_or_default();
            let cap = st.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone()).unwrap_or_default();
            let mode = p.spec.as_ref().and_then(|s| s.volume_mode.clone()).unwrap_or_else(|| "Filesystem".into());
            let dev = p
                .annotations()
                .get(controller::storage::ANN_DEVICE)
                .or_else(|| p.annotations().get(controller::storage::ANN_PATH))
                .cloned()
                .unwrap_or_default();
            vec![p.name_any(), st.phase.unwrap_or_default(), cap, mode, dev]
        })
        .collect()
}

/// Follows an import until it ends, with a progress bar on stderr in table mode; the
/// DataVolume as it succeeded.
async fn follow_import(dvs: &Api<DataVolume>, name: &str, bar: bool) -> anyhow::Result<DataVolume> {
    let mut last = String::new();
    let outcome = follow(dvs, name, None, |dv| {
        let Some(dv) = dv else { bail!("DataVolume {name} was deleted during its import") };
        let st = dv.status.clone().unwrap_or_default();
        let phase = st.phase.clone().unwrap_or(DataVolumePhase::Pending);
        let progress = st.progress.clone().unwrap_or_else(|| "N/A".into());
        let line = format!("{name}: {phase} {progress}");
        if bar && line != last {
            let pct: f64 = progress.trim_end_matches('%').parse().unwrap_or(0.0);
            // The bar is 30 cells; `pct` is 0..=100.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let filled = ((pct / 100.0) * 30.0).round().clamp(0.0, 30.0) as usize;
            eprint!("\r[{}{}] {line:<50}", "#".repeat(filled), " ".repeat(30 - filled));
            last = line;
        }
        Ok(match phase {
            DataVolumePhase::Succeeded => Some(Ok(dv.clone())),
            DataVolumePhase::Failed => {
                let why = st.conditions.iter().find(|c| c.type_ == "Running").and_then(|c| c.message.clone()).unwrap_or_default();
                Some(Err(anyhow::anyhow!("import of {name} failed: {why}")))
            }
            _ => None,
        })
    })
    .await
    .context("watch the DataVolume");
    if bar {
        eprintln!();
    }
    match outcome? {
        Some(r) => r,
        None => bail!("the watch of DataVolume {name} ended"),
    }
}
