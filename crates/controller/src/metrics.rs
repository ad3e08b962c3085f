//! The controller's metrics, registered into the process's registry by the binary.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Which controller and how its reconcile ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reconcile {
    /// `vm`, `claim`, `datavolume`.
    pub controller: String,
    /// `ok` or `error`.
    pub result: String,
}

/// Reconciles by controller and result.
pub fn reconciles() -> &'static Family<Reconcile, Counter> {
    static M: OnceLock<Family<Reconcile, Counter>> = OnceLock::new();
    M.get_or_init(Family::default)
}

/// Counts one reconcile.
pub fn count(controller: &str, ok: bool) {
    reconciles().get_or_create(&Reconcile { controller: controller.to_owned(), result: if ok { "ok" } else { "error" }.to_owned() }).inc();
}

/// 1 while this process leads (or runs without leader election), else 0.
pub fn leader() -> &'static Gauge {
    static M: OnceLock<Gauge> = OnceLock::new();
    M.get_or_init(Gauge::default)
}

/// Registers `virtplug_controller_reconciles` and `virtplug_controller_leader`.
pub fn register(registry: &mut Registry) {
    registry.register("virtplug_controller_reconciles", "Reconciles by controller and result", reconciles().clone());
    registry.register("virtplug_controller_leader", "1 while this controller process leads (reconciles), else 0", leader().clone());
}
