//! `/metrics`: the process's Prometheus registry in the text exposition format, and the API
//! server's own request counter. The binary registers every component's metrics (client,
//! controller, node agent) into the same registry, so one scrape sees them together.

use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub code: String,
}

/// The API server's counters.
#[derive(Default)]
pub struct ApiMetrics {
    pub requests: Family<RequestLabels, Counter>,
}

/// The process-wide counters.
pub fn get() -> &'static ApiMetrics {
    static M: OnceLock<ApiMetrics> = OnceLock::new();
    M.get_or_init(ApiMetrics::default)
}

/// Registers `virtplug_apiserver_requests` (by method and status code).
pub fn register(registry: &mut Registry) {
    registry.register("virtplug_apiserver_requests", "API requests served, by method and status code", get().requests.clone());
}

/// A registry shared by the components of one process.
pub type SharedRegistry = Arc<Mutex<Registry>>;

/// The registry in the text exposition format.
#[must_use]
pub fn render(registry: &SharedRegistry) -> String {
    let mut out = String::new();
    let r = registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
        out.clear();
    }
    out
}
