//! Metrics of the Redfish service, registered into the process's registry by the binary.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The label of [`RedfishMetrics::responses`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    /// The HTTP status code.
    pub code: u16,
}

/// The service's counters.
#[derive(Default)]
pub struct RedfishMetrics {
    /// Logins (Basic or session) refused for a wrong user name or password.
    pub login_failures: Counter,
    /// Responses by status code.
    pub responses: Family<StatusLabel, Counter>,
}

/// The process-wide counters.
pub fn get() -> &'static RedfishMetrics {
    static M: OnceLock<RedfishMetrics> = OnceLock::new();
    M.get_or_init(RedfishMetrics::default)
}

/// Registers the counters under `virtplug_redfish_*`.
pub fn register(registry: &mut Registry) {
    let m = get();
    registry.register("virtplug_redfish_login_failures", "Redfish logins refused for wrong credentials", m.login_failures.clone());
    registry.register("virtplug_redfish_responses", "Redfish responses by status code", m.responses.clone());
}
