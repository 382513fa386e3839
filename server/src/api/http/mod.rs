//! The HTTP port: `/livez`, `/readyz`, `/status` (JSON, see `health`), `/metrics` (Prometheus
//! text, see [`metrics`]) and the status page (see [`page`]).
//!
//! The port sees a replica only through [`Observed`], which [`crate::replica`] builds: what it
//! reads, and nothing it could change. Modules, bottom up: `observed`, then the handlers
//! (`health`, [`metrics`] with `ns_metrics`, [`page`]); this module only routes.

mod health;
mod metrics;
mod ns_metrics;
mod observed;
mod page;

pub use observed::Observed;

use std::future::Future;
use std::sync::Arc;

use axum::routing::get;
use tokio::net::TcpListener;

pub async fn serve(
    listener: TcpListener,
    observed: Observed,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let app = axum::Router::new()
        .route("/livez", get(health::livez))
        .route("/readyz", get(health::readyz))
        .route("/status", get(health::status))
        .route("/metrics", get(metrics::render))
        .route("/", get(page::page))
        .route("/api/overview", get(page::overview))
        .with_state(Arc::new(observed));
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::warn!(error = %e, "HTTP server ended with an error");
    }
}
