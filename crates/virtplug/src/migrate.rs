//! `virtplug migrate hotplug-to-declarative`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use controller::migrate::{self, Action, Options};

#[derive(Subcommand)]
pub enum Migrate {
    /// Copy VMI-only hot-plugged volumes into their VM specs before declarative hot-plug is on.
    HotplugToDeclarative(HotplugArgs),
}

#[derive(Args)]
pub struct HotplugArgs {
    /// Kubeconfig [default: $KUBECONFIG, ~/.kube/config, in-cluster, then the `up` data dir's].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Only this namespace.
    #[arg(long, short = 'n', conflicts_with = "all_namespaces")]
    namespace: Option<String>,
    /// Every namespace (the default).
    #[arg(long, short = 'A')]
    all_namespaces: bool,
    /// Write nothing; list what would be done.
    #[arg(long)]
    dry_run: bool,
    /// Output format.
    #[arg(long, short = 'o', default_value = "table", value_parser = ["table", "json"])]
    output: String,
}

/// A client for `component` (its User-Agent says which: [`client::user_agent`]). The kubeconfig
/// to use when none is given: the `up` data dir's, if no other is found.
pub async fn connect(explicit: Option<PathBuf>, component: &str) -> anyhow::Result<kube::Client> {
    connect_with(explicit, component, client::Retries::Default).await
}

/// [`connect`] with the given retries ([`client::Retries::None`] for upgraded connections).
pub async fn connect_with(explicit: Option<PathBuf>, component: &str, retries: client::Retries) -> anyhow::Result<kube::Client> {
    let agent = client::user_agent(component);
    if let Some(p) = explicit {
        return client::connect_with(Some(&p), &agent, retries).await.with_context(|| format!("cannot use the kubeconfig {}", p.display()));
    }
    match client::connect_with(None, &agent, retries).await {
        Ok(c) => Ok(c),
        Err(e) => {
            let up = crate::default_data_dir().join("kubeconfig");
            if up.is_file() {
                client::connect_with(Some(&up), &agent, retries)
                    .await
                    .with_context(|| format!("cannot use the kubeconfig {}", up.display()))
            } else {
                Err(e).context("no kubeconfig: pass --kubeconfig, set $KUBECONFIG, or start `virtplug up`")
            }
        }
    }
}

/// Runs the subcommand; returns whether the run succeeded (exit 0) or failed closed.
pub async fn run(cmd: Migrate) -> anyhow::Result<bool> {
    let Migrate::HotplugToDeclarative(args) = cmd;
    let client = connect(args.kubeconfig, "migrate").await?;
    let opts = Options { namespace: args.namespace, dry_run: args.dry_run, ..Options::default() };
    let report = migrate::run(&client, &opts).await?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let rows: Vec<[String; 4]> = report
            .findings
            .iter()
            .map(|f| {
                let action = match f.action {
                    Action::Copy => "copy",
                    Action::Copied => "copied",
                    Action::Refused => "refused",
                    Action::Failed => "failed",
                };
                [format!("{}/{}", f.namespace, f.vm), f.volume.clone(), action.to_owned(), f.reason.clone()]
            })
            .collect();
        if rows.is_empty() {
            println!("No VM has a VMI-only hot-plugged volume; nothing to do.");
        } else {
            let w: Vec<usize> = (0..3)
                .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0).max(["NAMESPACE/VM", "VOLUME", "ACTION"][i].len()))
                .collect();
            println!("{:<w0$}  {:<w1$}  {:<w2$}  REASON", "NAMESPACE/VM", "VOLUME", "ACTION", w0 = w[0], w1 = w[1], w2 = w[2]);
            for r in &rows {
                println!("{:<w0$}  {:<w1$}  {:<w2$}  {}", r[0], r[1], r[2], r[3], w0 = w[0], w1 = w[1], w2 = w[2]);
            }
        }
        let count = |a: Action| report.findings.iter().filter(|f| f.action == a).count();
        eprintln!(
            "summary: {} VM(s) patched, {} volume(s) copied, {} to copy (dry run), {} refused, {} failed",
            report.patched,
            count(Action::Copied),
            count(Action::Copy),
            count(Action::Refused),
            count(Action::Failed)
        );
    }
    Ok(!report.failed())
}
