//! The virtctl-style CLI: `vm`, `volume`, `addvolume`, `removevolume`. Every command talks to the
//! API (kubeconfig from `--kubeconfig`, `$KUBECONFIG`, `~/.kube/config`, then the `up` data
//! dir's); changes go through the subresources or `client::update`.
//!
//! Exit codes: 0 done; 1 the operation failed (API refusal, import failed, `--wait` timed out);
//! 2 bad usage (clap). Errors go to stderr with what to do; `-o json|yaml` output is stable.

mod console;
mod fallback;
mod hotplug;
mod net;
mod vm;
mod volume;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use kube::api::Api;
use serde_json::{json, Value};

pub use hotplug::{addvolume, removevolume, AddVolume, RemoveVolume};
pub use vm::{vm, Vm};
pub use volume::{volume, Volume};

/// Options every command takes.
#[derive(Args, Clone)]
pub struct Common {
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, then the `up` data dir's].
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Namespace.
    #[arg(long, short = 'n', global = true, default_value = "default")]
    namespace: String,
    /// Output format.
    #[arg(long, short = 'o', global = true, default_value = "table", value_parser = ["table", "json", "yaml"])]
    output: String,
}

pub(crate) fn humantime(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 5m)"))?;
    match unit {
        "s" => Ok(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs).ok_or_else(|| format!("{s:?} is too long a duration")),
        "ms" => Ok(Duration::from_millis(n)),
        _ => Err(format!("{s:?}: use s, m or ms")),
    }
}

async fn connect(c: &Common) -> anyhow::Result<kube::Client> {
    crate::migrate::connect(c.kubeconfig.clone(), "cli").await
}

/// A client for upgraded connections (console, VNC): a refusal is reported at once, not retried.
async fn connect_streams(c: &Common) -> anyhow::Result<kube::Client> {
    crate::migrate::connect_with(c.kubeconfig.clone(), "cli", client::Retries::None).await
}

fn print_objects<T: serde::Serialize>(
    output: &str,
    items: &[T],
    table: impl Fn(&[T]) -> Vec<Vec<String>>,
    header: &[&str],
) -> anyhow::Result<()> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(&json!({"items": items}))?),
        "yaml" => print!("{}", serde_yaml::to_string(&json!({"items": items}))?),
        _ => {
            let mut rows = vec![header.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>()];
            rows.extend(table(items));
            let widths: Vec<usize> =
                (0..header.len()).map(|i| rows.iter().map(|r| r.get(i).map_or(0, String::len)).max().unwrap_or(0)).collect();
            for r in rows {
                let line: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
                println!("{}", line.join("   ").trim_end());
            }
        }
    }
    Ok(())
}

fn print_one<T: serde::Serialize>(output: &str, item: &T, table: impl Fn(&[T]) -> Vec<Vec<String>>, header: &[&str]) -> anyhow::Result<()> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(item)?),
        "yaml" => print!("{}", serde_yaml::to_string(item)?),
        _ => print_objects(output, std::slice::from_ref(item), table, header)?,
    }
    Ok(())
}

/// An action's outcome: `text` in table mode, `doc` (a JSON value) with `-o json|yaml`, so a
/// script never has to parse prose.
fn report(output: &str, text: &str, doc: &Value) -> anyhow::Result<()> {
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(doc)?),
        "yaml" => print!("{}", serde_yaml::to_string(doc)?),
        _ => println!("{text}"),
    }
    Ok(())
}

/// PUTs KubeVirt's subresource `sub` of VM `name` — of its VMI (same name) for the VMI
/// actions (`pause`, `unpause`, `softreboot`), as `virtctl pause vm` does.
async fn subresource(client: &kube::Client, ns: &str, name: &str, sub: &str, body: &Value) -> anyhow::Result<()> {
    let plural = if api::vmi_requests::VmiAction::parse(sub).is_some() { "virtualmachineinstances" } else { "virtualmachines" };
    let path = format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/{plural}/{name}/{sub}");
    let req = http::Request::put(&path).header("content-type", "application/json").body(serde_json::to_vec(body)?).context("request")?;
    match client.request_text(req).await {
        Ok(_) => Ok(()),
        // No KubeVirt subresources API on this server (a cluster without virt-api): the same
        // change, made on the VM itself.
        Err(kube::Error::Api(s)) if s.code == 404 && !fallback::subresources_served(client).await => {
            fallback::apply(client, ns, name, sub, body).await
        }
        Err(kube::Error::Api(s)) => bail!("{sub} {ns}/{name}: {} ({})", s.message, s.code),
        Err(e) => Err(e).with_context(|| format!("{sub} {ns}/{name}")),
    }
}

fn api_err(what: &str) -> impl FnOnce(kube::Error) -> anyhow::Error + '_ {
    move |e| match e {
        kube::Error::Api(s) => anyhow::anyhow!("cannot {what}: {} ({})", s.message, s.code),
        other => anyhow::Error::new(other).context(format!("cannot {what}")),
    }
}

/// Follows one object on a watch (a field selector on its name; no polling), calling `step` with
/// its current state on every change (`None`: it does not exist, or no longer) until `step`
/// returns a value. `Ok(None)` when `timeout` passed first; `step`'s error ends the wait.
///
/// # Errors
/// When the watch fails (the API's error: unreachable, forbidden) or `step` fails.
async fn follow<K, T>(
    api: &Api<K>,
    name: &str,
    timeout: Option<Duration>,
    mut step: impl FnMut(Option<&K>) -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api.clone(), config).boxed();
    // The initial list arrives as Init, InitApply…, InitDone: judge the object once it is whole.
    let mut listed: Option<K> = None;
    let run = async {
        while let Some(event) = events.next().await {
            let current = match event? {
                Event::Init => {
                    listed = None;
                    continue;
                }
                Event::InitApply(o) => {
                    listed = Some(o);
                    continue;
                }
                Event::InitDone => listed.take(),
                Event::Apply(o) => Some(o),
                Event::Delete(_) => None,
            };
            if let Some(t) = step(current.as_ref())? {
                return Ok(Some(t));
            }
        }
        bail!("the watch ended")
    };
    match timeout {
        Some(d) => tokio::time::timeout(d, run).await.unwrap_or(Ok(None)),
        None => run.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--import-deadline 18446744073709551615m` multiplied into an overflow (a panic in a
    /// debug build, a wrong deadline in release).
    #[test]
    fn a_duration_too_long_is_an_error_not_an_overflow() {
        assert_eq!(humantime("2m"), Ok(Duration::from_secs(120)));
        assert!(humantime("18446744073709551615m").unwrap_err().contains("too long"));
    }
}
