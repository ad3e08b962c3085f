//! `/healthz`, `/readyz` and `/metrics` of `virtplug controller` and `virtplug node` (plain HTTP
//! on `--health-listen`, for the kubelet's probes and Prometheus; nothing secret is served).
//!
//! - `/healthz`: 200 `ok` while every component runs; 503 naming the one that died (the process
//!   exits right after, so this is mostly for the moment in between).
//! - `/readyz`: the same answer: a standby controller replica is ready (as kube-controller-manager's
//!   are); the body says whether this process leads.
//! - `/metrics`: the process's Prometheus registry.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use apiserver::health::Health;
use axum::http::StatusCode;
use tokio::sync::watch;

/// What the endpoints report.
#[derive(Clone)]
pub struct State {
    pub health: Health,
    /// `Some(leading)` for a controller that runs leader election.
    pub leading: Option<watch::Receiver<bool>>,
    pub registry: apiserver::metrics::SharedRegistry,
}

fn health(state: &State) -> (StatusCode, String) {
    let failures = state.health.failures();
    if let Some(f) = failures.first() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{f}\n"));
    }
    let lead = match &state.leading {
        Some(rx) if *rx.borrow() => " (leader)",
        Some(_) => " (standby: another replica leads)",
        None => "",
    };
    (StatusCode::OK, format!("ok{lead}\n"))
}

/// Serves the endpoints on `addr`; returns the bound address (the port may be 0).
///
/// # Errors
/// When `addr` cannot be bound.
pub async fn serve(addr: SocketAddr, state: State) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("--health-listen: cannot listen on {addr}"))?;
    let bound = listener.local_addr().context("cannot read the health listen address")?;
    let state = Arc::new(state);
    let (s1, s2, s3) = (Arc::clone(&state), Arc::clone(&state), state);
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(move || async move { health(&s1) }))
        .route("/readyz", axum::routing::get(move || async move { health(&s2) }))
        .route(
            "/metrics",
            axum::routing::get(move || async move {
                ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], apiserver::metrics::render(&s3.registry))
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("the health listener stopped: {e}");
        }
    });
    Ok(bound)
}
