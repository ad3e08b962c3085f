//! The DataVolume importer's flags, shared by `virtplug up` and `virtplug controller`.

use std::time::Duration;

use clap::Args;
use controller::storage::import::{AllowEntry, ImportConfig};

/// Which hosts an import may reach, and how long and how slowly it may run.
#[derive(Args, Clone, Debug)]
pub struct ImportArgs {
    /// Let DataVolume imports reach this host, address or network (CIDR) although it is refused
    /// by default: loopback, link-local (cloud metadata), multicast, broadcast, unspecified and
    /// this machine's own addresses. Repeatable, e.g. `--import-allow-host 127.0.0.1
    /// --import-allow-host images.internal`. A host name allows whatever it resolves to.
    #[arg(long = "import-allow-host", value_name = "HOST_OR_CIDR")]
    import_allow_host: Vec<AllowEntry>,
    /// Longest time one import attempt may take (a slower one is retried with backoff).
    #[arg(long, default_value = "60m", value_parser = crate::cli::humantime)]
    import_deadline: Duration,
    /// Slowest import accepted, in bytes per second averaged over --import-min-rate-window
    /// (as curl's --speed-limit); 0 turns the check off.
    #[arg(long, default_value_t = 16 * 1024, value_name = "BYTES_PER_SECOND")]
    import_min_rate: u64,
    /// The window over which --import-min-rate is measured (as curl's --speed-time).
    #[arg(long, default_value = "60s", value_parser = crate::cli::humantime)]
    import_min_rate_window: Duration,
}

impl ImportArgs {
    /// The importer's configuration.
    ///
    /// # Errors
    /// A zero deadline or window (nothing could ever be imported).
    pub fn config(&self) -> anyhow::Result<ImportConfig> {
        anyhow::ensure!(
            !self.import_deadline.is_zero(),
            "--import-deadline 0 would abort every import at once: give a duration such as 60m"
        );
        anyhow::ensure!(
            !self.import_min_rate_window.is_zero(),
            "--import-min-rate-window 0 cannot measure a rate: give a duration such as 60s (or --import-min-rate 0 to turn the check off)"
        );
        Ok(ImportConfig {
            allow_hosts: self.import_allow_host.clone(),
            deadline: self.import_deadline,
            min_rate: self.import_min_rate,
            min_rate_window: self.import_min_rate_window,
            ..ImportConfig::default()
        })
    }
}
