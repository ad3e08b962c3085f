//! Metrics of the read-modify-write path, registered into the process's registry by the binary.

use std::sync::OnceLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Counters of [`crate::update`].
#[derive(Default)]
pub struct UpdateMetrics {
    /// Writes sent and accepted.
    pub updates: Counter,
    /// 409 Conflicts that were retried on a fresh read.
    pub conflicts_retried: Counter,
    /// Updates that gave up after the attempt limit.
    pub giveups: Counter,
    /// Mutations that changed nothing, so no write was sent.
    pub noop_skips: Counter,
}

/// The process-wide counters.
pub fn get() -> &'static UpdateMetrics {
    static M: OnceLock<UpdateMetrics> = OnceLock::new();
    M.get_or_init(UpdateMetrics::default)
}

/// Registers the counters under `virtplug_client_*`.
pub fn register(registry: &mut Registry) {
    let m = get();
    registry.register("virtplug_client_updates", "Writes sent by the read-modify-write path", m.updates.clone());
    registry.register("virtplug_client_update_conflicts_retried", "Conflicts retried on a fresh read", m.conflicts_retried.clone());
    registry.register("virtplug_client_update_giveups", "Updates that gave up after the attempt limit", m.giveups.clone());
    registry.register("virtplug_client_update_noop_skips", "Mutations that changed nothing (no request sent)", m.noop_skips.clone());
}
