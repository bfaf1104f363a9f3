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

#[utoipa::path(tag = "operations", responses((status = 200, description = "The process is up", body = Health)))]
#[get("/healthz")]
pub async fn healthz() -> web::Json<Health> {
    web::Json(Health { status: "ok".into() })
}

#[utoipa::path(
    tag = "operations",
    responses(
        (status = 200, description = "Database reachable and migrations applied", body = Health),
        (status = 503, description = "Not ready", body = Problem, content_type = "application/problem+json"),
    )
)]
#[get("/readyz")]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let db = &state.ctx.db.conn;
    if db.ping().await.is_err() {
        return not_ready("the database is unreachable");
    }
    if !migrate::is_current(db).await {
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

#[utoipa::path(
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

/// Cleanup jobs by state, and how long due jobs waited to be claimed.
async fn cleanup_metrics(state: &AppState) -> String {
    use sea_orm::{ConnectionTrait, Statement};
    use std::fmt::Write;
    use std::sync::atomic::Ordering;
    let db = &state.ctx.db.conn;
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT state, COUNT(*) AS n FROM task_resource_cleanup_jobs GROUP BY state",
        ))
        .await
        .unwrap_or_default();
    let mut out = String::from("# HELP berth_cleanup_jobs Cleanup jobs by state.\n# TYPE berth_cleanup_jobs gauge\n");
    for row in rows {
        let (Ok(s), Ok(n)) = (row.try_get::<String>("", "state"), row.try_get::<i64>("", "n")) else {
            continue;
        };
        let _ = writeln!(out, "berth_cleanup_jobs{{state=\"{s}\"}} {n}");
    }
    let stats = &state.ctx.cleanup_stats;
    let _ = writeln!(
        out,
        "# HELP berth_cleanup_claims_total Cleanup job claims by this process.\n# TYPE berth_cleanup_claims_total counter"
    );
    let _ = writeln!(
        out,
        "berth_cleanup_claims_total {}",
        stats.claims.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP berth_cleanup_claim_latency_seconds_sum Time due jobs waited to be claimed.\n# TYPE berth_cleanup_claim_latency_seconds_sum counter"
    );
    let _ = writeln!(
        out,
        "berth_cleanup_claim_latency_seconds_sum {}",
        stats.claim_latency_ms.load(Ordering::Relaxed) as f64 / 1000.0
    );
    let _ = writeln!(
        out,
        "# HELP berth_restore_max_concurrent The most session relaunches that ran at once at startup.\n# TYPE berth_restore_max_concurrent gauge"
    );
    let _ = writeln!(
        out,
        "berth_restore_max_concurrent {}",
        state.ctx.restore_stats.max_concurrent.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP berth_agents_live Live agent processes.\n# TYPE berth_agents_live gauge"
    );
    let _ = writeln!(out, "berth_agents_live {}", state.ctx.runtime.live_count());
    out
}
