//! `virtplug addvolume` / `removevolume`: KubeVirt's subresources, then (`--wait`) the volume
//! followed on a watch of its VMI until it is Ready or gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use kube::api::Api;
use serde_json::{json, Value};

use api::phases::{VolumePhase, VolumeReason};
use api::VirtualMachineInstance;

use super::{connect, follow, humantime, report, subresource, Common};

/// `virtplug addvolume` (virtctl's flags where virtctl has them).
#[derive(Args)]
pub struct AddVolume {
    /// The VM.
    vm: String,
    #[arg(long)]
    volume_name: String,
    /// The claim to plug.
    #[arg(long, conflicts_with = "datavolume", required_unless_present = "datavolume")]
    claim: Option<String>,
    /// The DataVolume to plug.
    #[arg(long)]
    datavolume: Option<String>,
    #[arg(long, default_value = "disk", value_parser = ["disk", "lun", "cdrom"])]
    disk_type: String,
    #[arg(long, default_value = "scsi", value_parser = ["scsi", "sata"])]
    bus: String,
    #[arg(long)]
    serial: Option<String>,
    /// Accepted for virtctl compatibility: declarative hot-plug always persists in the VM spec.
    #[arg(long)]
    persist: bool,
    #[arg(long)]
    dry_run: bool,
    /// Wait until the volume is Ready and print its phase timeline.
    #[arg(long)]
    wait: bool,
    /// How long `--wait` waits.
    #[arg(long, default_value = "120s", value_parser = humantime)]
    timeout: Duration,
}

/// `virtplug removevolume`.
#[derive(Args)]
pub struct RemoveVolume {
    vm: String,
    #[arg(long)]
    volume_name: String,
    #[arg(long)]
    dry_run: bool,
    /// Wait until the volume is gone from the VMI.
    #[arg(long)]
    wait: bool,
    #[arg(long, default_value = "120s", value_parser = humantime)]
    timeout: Duration,
}

/// Prints a volume's phase timeline from its `phaseTransitionTimestamps`.
fn timeline(st: &api::kubevirt::VolumeStatus, since: jiff::Timestamp) -> String {
    let stamps = st.extra.get("phaseTransitionTimestamps").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = String::new();
    for s in stamps {
        let phase = s["phase"].as_str().unwrap_or_default();
        let Some(t) = s["phaseTransitionTimestamp"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()) else { continue };
        let ms = (t - since).as_secs_f64() * 1000.0;
        out.push_str(&format!("  {phase:<16} +{ms:>7.0} ms\n"));
    }
    out
}

pub async fn addvolume(a: AddVolume, c: Common) -> anyhow::Result<()> {
    let client = connect(&c).await?;
    let ns = &c.namespace;
    let target = json!({"bus": a.bus});
    let mut disk = json!({"name": a.volume_name});
    disk[a.disk_type.as_str()] = target;
    if let Some(s) = &a.serial {
        disk["serial"] = json!(s);
    }
    let source = match (&a.claim, &a.datavolume) {
        (Some(cl), _) => json!({"persistentVolumeClaim": {"claimName": cl}}),
        (None, Some(d)) => json!({"dataVolume": {"name": d}}),
        (None, None) => bail!("give --claim or --datavolume"),
    };
    let mut body = json!({"name": a.volume_name, "disk": disk, "volumeSource": source});
    if a.dry_run {
        body["dryRun"] = json!(["All"]);
    }
    let since = jiff::Timestamp::now();
    subresource(&client, ns, &a.vm, "addvolume", &body).await?;
    let table = c.output == "table";
    let mut doc = json!({"vm": a.vm, "namespace": ns, "volume": a.volume_name, "dryRun": a.dry_run, "submitted": true});
    if a.dry_run {
        return report(&c.output, &format!("addvolume {} to VM {}: accepted (dry run, nothing written)", a.volume_name, a.vm), &doc);
    }
    if table {
        println!("Successfully submitted add volume request to VM {} for volume {}", a.vm, a.volume_name);
    }
    if a.wait {
        let st = wait_volume(&client, ns, &a.vm, &a.volume_name, a.timeout, true).await?;
        let total = (jiff::Timestamp::now() - since).as_secs_f64() * 1000.0;
        if table {
            if let Some(st) = &st {
                println!("volume {} is Ready in VM {}:", a.volume_name, a.vm);
                print!("{}", timeline(st, since));
                println!("  total            {total:>8.0} ms");
            }
        }
        doc["volumeStatus"] = serde_json::to_value(st)?;
        doc["elapsedMs"] = json!(total.round());
    }
    if table {
        return Ok(());
    }
    report(&c.output, "", &doc)
}

pub async fn removevolume(a: RemoveVolume, c: Common) -> anyhow::Result<()> {
    let client = connect(&c).await?;
    let ns = &c.namespace;
    let mut body = json!({"name": a.volume_name});
    if a.dry_run {
        body["dryRun"] = json!(["All"]);
    }
    let since = Instant::now();
    subresource(&client, ns, &a.vm, "removevolume", &body).await?;
    let mut doc = json!({"vm": a.vm, "namespace": ns, "volume": a.volume_name, "dryRun": a.dry_run, "submitted": true});
    if a.dry_run {
        return report(&c.output, &format!("removevolume {} from VM {}: accepted (dry run, nothing written)", a.volume_name, a.vm), &doc);
    }
    let mut text = format!("Successfully submitted remove volume request to VM {} for volume {}", a.vm, a.volume_name);
    if a.wait {
        wait_volume(&client, ns, &a.vm, &a.volume_name, a.timeout, false).await?;
        let ms = since.elapsed().as_millis();
        text.push_str(&format!("\nvolume {} is unplugged from VM {} ({ms} ms)", a.volume_name, a.vm));
        doc["unplugged"] = json!(true);
        doc["elapsedMs"] = json!(ms);
    }
    report(&c.output, &text, &doc)
}

/// Waits until the volume is `Ready` (`plugged`) or gone from the VMI (on a watch of the VMI);
/// reports a `HotplugFailed` reason on stderr once per phase.
async fn wait_volume(
    client: &kube::Client,
    ns: &str,
    vm: &str,
    volume: &str,
    timeout: Duration,
    plugged: bool,
) -> anyhow::Result<Option<api::kubevirt::VolumeStatus>> {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    let mut last: Option<api::kubevirt::VolumeStatus> = None;
    let done = follow(&vmis, vm, Some(timeout), |vmi| {
        let Some(vmi) = vmi else {
            if plugged {
                bail!("VM {vm} is not running: the volume is in its spec and is plugged when it starts");
            }
            return Ok(Some(None));
        };
        let entry = vmi.status.as_ref().and_then(|s| s.volume_status.iter().find(|e| e.name == volume)).cloned();
        let in_spec = vmi.spec.volumes.iter().any(|v| v.name == volume);
        last.clone_from(&entry);
        let Some(e) = entry else {
            return Ok((!plugged && !in_spec).then_some(None));
        };
        let key = format!("{}/{}", e.phase.as_ref().map_or("", VolumePhase::as_str), e.reason.as_ref().map_or("", VolumeReason::as_str));
        if seen.insert(key.clone(), ()).is_none() && e.reason == Some(VolumeReason::HotplugFailed) {
            eprintln!("volume {volume}: {} ({})", key, e.message.clone().unwrap_or_default());
        }
        Ok((plugged && e.phase == Some(VolumePhase::Ready)).then_some(Some(e)))
    })
    .await
    .context("watch the VMI")?;
    match done {
        Some(entry) => Ok(entry),
        None => {
            let state = last.map_or_else(
                || "no status yet".to_owned(),
                |e| {
                    let (phase, reason) =
                        (e.phase.as_ref().map_or("", VolumePhase::as_str), e.reason.as_ref().map_or("", VolumeReason::as_str));
                    format!("{phase} {reason}: {}", e.message.unwrap_or_default())
                },
            );
            bail!("volume {volume} of VM {vm}: not {} after {timeout:?} ({state})", if plugged { "Ready" } else { "unplugged" });
        }
    }
}
