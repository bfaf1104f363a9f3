//! Operations: liveness, readiness, metrics. Public (no token), as `design/api.md` lists.
use actix_web::{HttpResponse, get, web};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::problem::{ErrorCode, Problem};
use crate::store::migrate;

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: String,
}

/// Check that the process is up
///
/// Answers `{"status": "ok"}` as long as the process serves HTTP; it looks at nothing else (use
/// `getReadiness` to know whether requests can succeed). Public: no token.
#[utoipa::path(operation_id = "getHealth", tag = "operations", responses((status = 200, description = "The process is up", body = Health)))]
#[get("/healthz")]
pub async fn healthz() -> web::Json<Health> {
    web::Json(Health { status: "ok".into() })
}

/// Check that berth can serve requests
///
/// Ready when the database answers and every migration is applied; otherwise `503` with a retryable
/// problem, so a load balancer or an orchestrator holds traffic back until it clears. Public: no token.
#[utoipa::path(
    operation_id = "getReadiness",
    tag = "operations",
    responses(
        (status = 200, description = "Database reachable and migrations applied", body = Health),
        (status = 503, description = "Not ready", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/readyz")]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if !state.ctx.db.ping().await {
        return not_ready("the database is unreachable");
    }
    if !migrate::is_current(&state.ctx.db.conn).await {
        return not_ready("migrations are not applied");
    }
    HttpResponse::Ok().json(Health { status: "ready".into() })
}

fn not_ready(detail: &str) -> HttpResponse {
    Problem {
        retryable: true,
        ..Problem::new(
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal,
            "Not ready",
            detail,
        )
    }
    .response()
}

/// Read the Prometheus metrics
///
/// The Prometheus text exposition: request counters and latencies, database pool usage, cleanup jobs by
/// state, restore counters and live agents. Public: no token.
#[utoipa::path(
    operation_id = "getMetrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain; version=0.0.4"))
)]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let (open, idle) = state.ctx.db.pool_usage();
    let mut body = state.metrics.render(open, idle, state.ctx.config.db_max_connections);
    body.push_str(&cleanup_metrics(&state).await);
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(body)
}

/// Cleanup jobs by state, claim counters, restore and agent gauges.
async fn cleanup_metrics(state: &AppState) -> String {
    let ctx = &state.ctx;
    let by_state = crate::store::cleanup_jobs::count_by_state(&ctx.db.conn)
        .await
        .unwrap_or_default();
    crate::metrics::render_cleanup(
        &by_state,
        &ctx.cleanup_stats,
        &ctx.restore_stats,
        ctx.runtime.live_count(),
    )
}
