//! The node agent's metrics, registered into the process's registry by the binary:
//! per-phase hot-plug latency histograms, attempts, failures and the volumes waiting now.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Which part of a hot-plug a latency measures.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Phase {
    /// `open` (source opened), `qemu` (QMP attach or medium change), `total` (from the first
    /// attempt to `Ready`), `unplug` (detach or eject).
    pub phase: String,
}

/// The agent's metrics.
pub struct NodeMetrics {
    pub phase_seconds: Family<Phase, Histogram>,
    pub attempts: Counter,
    pub failures: Counter,
    pub waiting: Gauge,
}

fn histogram() -> Histogram {
    // 1 ms .. ~33 s
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The process-wide metrics.
pub fn get() -> &'static NodeMetrics {
    static M: OnceLock<NodeMetrics> = OnceLock::new();
    M.get_or_init(|| NodeMetrics {
        phase_seconds: Family::new_with_constructor(histogram),
        attempts: Counter::default(),
        failures: Counter::default(),
        waiting: Gauge::default(),
    })
}

/// Observes `seconds` for `phase`.
pub fn observe(phase: &str, seconds: f64) {
    get().phase_seconds.get_or_create(&Phase { phase: phase.to_owned() }).observe(seconds);
}

/// Registers everything under `virtplug_node_*`.
pub fn register(registry: &mut Registry) {
    let m = get();
    registry.register(
        "virtplug_node_hotplug_phase_seconds",
        "Hot-plug latency by phase (open, qemu, total, unplug)",
        m.phase_seconds.clone(),
    );
    registry.register("virtplug_node_hotplug_attempts", "Attach attempts", m.attempts.clone());
    registry.register("virtplug_node_hotplug_failures", "Attach attempts that failed (not ready, refused, QEMU error)", m.failures.clone());
    registry.register("virtplug_node_volumes_waiting", "Hot-plug volumes waiting for their storage or a retry now", m.waiting.clone());
}
