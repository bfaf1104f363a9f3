//! Operations: liveness, readiness, version, metrics. Public (no token), as `docs/api.md` lists.
use actix_web::{HttpResponse, get, web};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::problem::{ErrorCode, Problem};
use crate::store::migrate;

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    /// For readiness: the node whose process answered (issue 39).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// For readiness: the instance (process) that answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<crate::ids::InstanceId>,
}

/// Check that the process is up
///
/// Answers `{"status": "ok"}` as long as the process serves HTTP; it looks at nothing else (use
/// `getReadiness` to know whether requests can succeed). Public: no token.
#[utoipa::path(operation_id = "getHealth", tag = "operations", responses((status = 200, description = "The process is up", body = Health)))]
#[get("/healthz")]
pub async fn healthz() -> web::Json<Health> {
    web::Json(Health {
        status: "ok".into(),
        node_id: None,
        instance_id: None,
    })
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
        (status = 503, description = "Not ready", body = Problem),
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
    HttpResponse::Ok().json(Health {
        status: "ready".into(),
        node_id: Some(state.ctx.config.node_id.clone()),
        instance_id: Some(state.ctx.instance_id),
    })
}

/// The build: package version and git commit.
#[derive(Serialize, ToSchema)]
pub struct Version {
    /// The package version, e.g. `0.1.0`.
    #[schema(example = "0.1.0")]
    pub version: String,
    /// The git commit the binary was built from, or `unknown` when the build had none.
    #[schema(example = "2da7355c0c3f2c0f6a0c7b0a7f1e1f2e3d4c5b6a")]
    pub commit: String,
}

/// Read the build version
///
/// The package version and the git commit this binary was built from (`unknown` when the build saw no
/// commit). Public: no token.
#[utoipa::path(operation_id = "getVersion", tag = "operations", responses((status = 200, description = "The build", body = Version)))]
#[get("/version")]
pub async fn version() -> web::Json<Version> {
    web::Json(Version {
        version: crate::version::VERSION.into(),
        commit: crate::version::COMMIT.into(),
    })
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
/// OpenMetrics text: request counts and latencies by route and status, database pool usage, cleanup
/// jobs by state and claim latency, git command durations and failures, live agents and restarts, open
/// event streams and resets, event publish lag, process metrics and `berth_build_info`. Every value is
/// kept in memory by the code that changes it: a scrape runs no query. Public: no token. A scraper that
/// asks for it (`Accept: application/openmetrics-text`, as Prometheus does) gets OpenMetrics 1.0.0; any
/// other caller gets the Prometheus text format 0.0.4 (`text/plain; version=0.0.4`: counters typed on
/// their `_total` name, build info as a gauge, no `# EOF`).
#[utoipa::path(
    operation_id = "getMetrics",
    tag = "operations",
    responses((status = 200, description = "The Prometheus text exposition (format 0.0.4); OpenMetrics (`application/openmetrics-text; version=1.0.0`) when the request's `Accept` names it", body = String, content_type = "text/plain"))
)]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>, req: actix_web::HttpRequest) -> HttpResponse {
    let ctx = &state.ctx;
    let (pool_open, pool_idle) = ctx.db.pool_usage();
    let body = ctx.metrics.render(crate::metrics::Scrape {
        pool_open,
        pool_idle,
        pool_max: ctx.config.db_max_connections,
        live_agents: ctx.runtime.live_count(),
        restore_max_concurrent: ctx.restore_stats.max_concurrent(),
    });
    let openmetrics = req
        .headers()
        .get(actix_web::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        HttpResponse::Ok()
            .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
            .body(body)
    } else {
        HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4; charset=utf-8")
            .body(crate::metrics::prometheus_text(&body))
    }
}
