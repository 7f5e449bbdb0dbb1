//! The HTTP surface as one router: each area (the gateway, the API and console, the static
//! console assets) routed with its own state, plus `/healthz` and `/metrics`. `server` builds
//! the state and serves this router.

use crate::api::{self, ApiState};
use crate::gateway::{self, Gateway};
use crate::metrics::Snapshot;
use crate::middleware::{MakeRequestV7, body_deadline, forget_client_request_id, request_span};
use crate::walk::Runtime;
use crate::web;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::Arc;
use tower_http::request_id::SetRequestIdLayer;
use tower_http::trace::TraceLayer;

/// What the server's routes share: each area's own state.
#[derive(Clone)]
pub struct AppState {
    pub gateway: Gateway,
    pub api: ApiState,
}

/// Every route: the gateway's, the API's, the console's, `/healthz` and `/metrics`, each area
/// with its own state; every request gets rota's id and a span, a body deadline and `nosniff`.
pub fn router(state: AppState) -> Router {
    let runtime = state.api.runtime.clone();
    let live = runtime.live();
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(runtime)
        .merge(gateway::router().with_state(state.gateway))
        .merge(api::router().with_state(state.api))
        .merge(web::router())
        .layer(axum::middleware::from_fn_with_state(live, body_deadline))
        .layer(axum::middleware::map_response(nosniff))
        .layer(TraceLayer::new_for_http().make_span_with(request_span).on_response(
            |r: &axum::response::Response, latency: std::time::Duration, span: &tracing::Span| {
                crate::telemetry::request_ended(span, r.status());
                tower_http::trace::OnResponse::on_response(
                    tower_http::trace::DefaultOnResponse::new(),
                    r,
                    latency,
                    span,
                )
            },
        ))
        .layer(SetRequestIdLayer::x_request_id(MakeRequestV7))
        .layer(axum::middleware::map_request(forget_client_request_id))
}

/// Every answer says its content type is the one to use: a browser never sniffs an error
/// message or an upstream's text into HTML.
async fn nosniff(mut r: axum::response::Response) -> axum::response::Response {
    r.headers_mut().insert(http::header::X_CONTENT_TYPE_OPTIONS, http::HeaderValue::from_static("nosniff"));
    r
}

/// Prometheus exposition (OpenMetrics text): with `server.metrics_token_file`, only for its bearer
/// token; without, only over loopback (`metrics::scrape_allowed`).
async fn metrics(
    State(runtime): State<Arc<Runtime>>,
    peer: Option<axum::Extension<crate::middleware::Peer>>,
    headers: http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let peer = peer.map(|p| p.0.0.ip());
    if !crate::metrics::scrape_allowed(&runtime.settings().config.server, &headers, peer) {
        let challenge = [("www-authenticate", "Bearer realm=\"rota metrics\"")];
        let why =
            "a bearer token is needed (server.metrics_token_file); without one, /metrics answers only over loopback\n";
        return (http::StatusCode::UNAUTHORIZED, challenge, why).into_response();
    }
    let now = runtime.clock.now();
    let mut snapshot =
        Snapshot::of(runtime.book.states(now), now, runtime.audit.health(), runtime.book.writer_state().0);
    snapshot.limit_used = crate::limits::used(runtime.store.as_ref(), &runtime.settings().config, now).await;
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], runtime.metrics.render(snapshot))
        .into_response()
}

/// Always 200 while rota serves (a load balancer keeps sending: requests are answered even
/// when the database fails); `status` is `degraded` while a writer fails, the audit queue is
/// over half full, the database has not answered for `watchdog::TIMEOUT` or its files cannot
/// be written, with the details
/// (docs/api.md).
async fn healthz(State(runtime): State<Arc<Runtime>>) -> Json<Value> {
    let audit = runtime.audit.health();
    let (stats_failing, stats_waiting) = runtime.book.writer_state();
    let answering = runtime.watchdog.answering();
    let files = runtime.watchdog.files();
    let clock = &runtime.clock;
    let degraded = audit.degraded() || stats_failing || !answering || files.is_some() || !clock.trusted();
    Json(json!({
        "status": if degraded { "degraded" } else { "ok" },
        "version": env!("CARGO_PKG_VERSION"),
        "audit": {
            "queued": audit.queued,
            "capacity": audit.capacity,
            "dropped_requests": audit.dropped_requests,
            "dropped_attempts": audit.dropped_attempts,
            "invalid_requests": audit.invalid_requests,
            "invalid_attempts": audit.invalid_attempts,
            "failing": audit.failing,
            "lag_ms": audit.lag_ms,
            "held": audit.held,
            "slowest_write_ms": audit.slowest_write_ms,
        },
        "stats": {
            "failing": stats_failing,
            "waiting": stats_waiting,
            "slowest_write_ms": runtime.book.slowest_write().as_millis() as u64,
        },
        "clock": {
            "trusted": clock.trusted(),
            "system_minus_rota_ms": clock.drift(),
        },
        "database": {
            "answering": answering,
            "silent_ms": runtime.watchdog.silent_for().as_millis() as u64,
            "files": files,
            "wal_bytes": runtime.store.wal_bytes(),
            "checkpoint_hold_ms": runtime.store.checkpoint_hold().map(|d| d.as_secs_f64() * 1000.0),
        },
    }))
}
