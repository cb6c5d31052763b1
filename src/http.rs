//! `/metrics`, `/healthz` and `/readyz` on one listener. A scrape only renders
//! what the sources last recorded; it never polls.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::coordination::{Leadership, hide_standby};
use crate::sources::Health;
use crate::telemetry::snapshot;

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    pub metrics: PrometheusHandle,
    pub health: Arc<Health>,
    /// Which sources this agent exports; the others are hidden from `/metrics`.
    pub leadership: Arc<Leadership>,
    /// Cancelled when the agent begins to shut down: `/readyz` turns false first.
    pub stopping: CancellationToken,
}

/// The router of the agent's HTTP endpoints.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let standing_by = state.leadership.standing_by();
            let mut text = hide_standby(state.metrics.render(), &standing_by);
            snapshot::render(&mut text, &standing_by);
            text
        },
    )
}

/// 200 once every source this agent owns has finished its first poll (a
/// source that is down is reported here and by `inboxwatch_source_up`; one
/// another agent owns is on standby), 503 before that and while shutting
/// down. The body lists each source's state.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let sources = state.health.snapshot();
    let mut body = String::new();
    let mut ready = !state.stopping.is_cancelled();
    if !ready {
        body.push_str("shutting down\n");
    }
    for (name, h) in &sources {
        let word = match (h.polled, h.up) {
            _ if h.standby => "standby (another agent owns it)",
            (false, _) => {
                ready = false;
                "starting"
            }
            (true, true) => "up",
            (true, false) => "down",
        };
        let _ = write!(body, "{name}: {word}");
        if let Some(e) = &h.error {
            let _ = write!(body, ": {e}");
        }
        body.push('\n');
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

/// Serves until `shutdown` fires, then finishes in-flight requests.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
