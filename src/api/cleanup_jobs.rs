//! HTTP for cleanup jobs: what operators watch, retry and cancel.
use crate::ids::{CleanupJobId, EnvironmentId, OperationId, TaskId, WorkspaceId};
use actix_web::{get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{CleanupAdmin, CleanupRead, FollowPoint, Unbound};
use super::problem::Problem;
use crate::domain::cleanup::jobs::Filter;
use crate::domain::cleanup::{self, JobFilter};
use crate::entity::cleanup_job::{self, CleanupJobState, CleanupTrigger};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(list_jobs)
        .service(get_job)
        .service(retry_job)
        .service(cancel_job);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CleanupJob {
    pub id: CleanupJobId,
    pub operation_id: OperationId,
    pub task_id: TaskId,
    pub workspace_id: WorkspaceId,
    pub task_environment_id: Option<EnvironmentId>,
    /// `archive`, `delete`, `cascade_archive`, `cascade_delete`, `workspace_delete`, `quick_chat_expire`,
    /// `environment_reset`, `superseded_cleanup`, `session_delete` (what a session delete accepted while
    /// the session's node was down owes that node: its agent ended, its conversation removed).
    pub trigger: CleanupTrigger,
    /// `prepared`, `pending`, `running`, `retry_wait`, `succeeded`, `failed`, `cancelled`.
    pub state: CleanupJobState,
    pub attempts: i32,
    pub max_attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// What the job destroys, captured before the task changed.
    pub resource_snapshot: serde_json::Value,
    pub node_id: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    /// Who asked for it; `null` when berth did on its own (the reconcile pass).
    pub actor: Option<super::events::Actor>,
    /// Set while the job, not over yet, cannot run: `node_unavailable` when only its node may run it and
    /// that node is down (`since`: when its last lease ran out, if known). `null` for a job that runs
    /// as soon as it is due.
    pub waiting_for: Option<cleanup::WaitingFor>,
    /// Set on a job a decommission ended: the node given up, when, and the worktree paths the job would
    /// have removed there (still on that disk: the job's own record of them).
    pub would_have_removed: Option<cleanup::Abandoned>,
}

impl CleanupJob {
    /// The views of `jobs`, each saying whether it waits for a node that is down.
    pub async fn views(ctx: &crate::domain::Ctx, jobs: Vec<cleanup_job::Model>) -> Result<Vec<CleanupJob>, Error> {
        let mut waiting = cleanup::waiting_for(ctx, &jobs).await?;
        Ok(jobs
            .into_iter()
            .map(|j| {
                let w = waiting.remove(&j.id);
                CleanupJob {
                    waiting_for: w,
                    ..j.into()
                }
            })
            .collect())
    }

    pub async fn view(ctx: &crate::domain::Ctx, job: cleanup_job::Model) -> Result<CleanupJob, Error> {
        Ok(Self::views(ctx, vec![job]).await?.remove(0))
    }
}

impl From<cleanup_job::Model> for CleanupJob {
    fn from(j: cleanup_job::Model) -> Self {
        let would_have_removed = cleanup::marks_of(&j).abandoned;
        CleanupJob {
            id: j.id,
            operation_id: j.operation_id,
            task_id: j.task_id,
            workspace_id: j.workspace_id,
            task_environment_id: j.task_environment_id,
            trigger: j.trigger,
            state: j.state,
            attempts: j.attempts,
            max_attempts: j.max_attempts,
            next_attempt_at: j.next_attempt_at,
            last_error: j.last_error.as_deref().map(scrub_paths),
            resource_snapshot: redacted(&j.resource_snapshot),
            node_id: j.node_id,
            created_at: j.created_at,
            updated_at: j.updated_at,
            completed_at: j.completed_at,
            actor: super::events::Actor::of(&j.actor_sub, j.actor_session_id),
            waiting_for: None,
            would_have_removed,
        }
    }
}

/// What the snapshot names, without filesystem paths (I34: paths appear only in environments, sessions
/// and repositories): ids, worktree ids, branches, consent.
fn redacted(snapshot: &serde_json::Value) -> serde_json::Value {
    let environment = |env: &serde_json::Value| {
        if env.is_null() {
            return serde_json::Value::Null;
        }
        let worktrees: Vec<serde_json::Value> = env["worktrees"]
            .as_array()
            .map(|ws| {
                ws.iter()
                    .map(|w| serde_json::json!({"repository_id": w["repository_id"], "worktree_id": w["worktree_id"], "branch": w["branch"], "branch_origin": w["branch_origin"]}))
                    .collect()
            })
            .unwrap_or_default();
        serde_json::json!({"id": env["id"], "worktrees": worktrees})
    };
    let superseded: Vec<serde_json::Value> = snapshot["superseded"]
        .as_array()
        .map(|envs| envs.iter().map(environment).collect())
        .unwrap_or_default();
    serde_json::json!({
        "task_id": snapshot["task_id"],
        "workspace_id": snapshot["workspace_id"],
        "environment": environment(&snapshot["environment"]),
        "superseded": superseded,
        "sessions": snapshot["sessions"],
        "discard_worktree_changes": snapshot["discard_worktree_changes"],
        "delete_branches": snapshot["delete_branches"].as_bool().unwrap_or(false),
        "branches": snapshot.get("branches").cloned().unwrap_or_else(|| serde_json::json!([])),
    })
}

/// Replaces absolute paths in an error message (git's stderr names them) with `<path>`.
fn scrub_paths(message: &str) -> String {
    message
        .split(' ')
        .map(|word| {
            let trimmed = word.trim_matches(|c: char| c == '\'' || c == '"' || c == ',' || c == ':');
            if trimmed.starts_with('/') {
                word.replace(trimmed, "<path>")
            } else {
                word.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn paths_are_scrubbed_from_errors() {
        assert_eq!(
            super::scrub_paths("fatal: '/tmp/x/wt' is not a working tree: /a/b"),
            "fatal: '<path>' is not a working tree: <path>"
        );
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CleanupJobList {
    pub items: Vec<CleanupJob>,
    pub next_cursor: Option<String>,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JobQuery {
    #[param(value_type = Option<CleanupJobState>)]
    pub state: Option<String>,
    pub task_id: Option<TaskId>,
    #[param(value_type = Option<CleanupTrigger>)]
    pub trigger: Option<String>,
    /// Page size, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u64>,
    pub cursor: Option<String>,
}

/// List cleanup jobs
///
/// Cleanup jobs, newest first, optionally by state, task or trigger. Cleanup jobs are the only way berth
/// removes files: durable, retried with backoff, resumed after a restart. Scope `cleanup:read`.
#[utoipa::path(
    operation_id = "listCleanupJobs",
    tag = "cleanup",
    security(("bearer" = ["cleanup:read"])),
    params(JobQuery),
    responses((status = 200, description = "Cleanup jobs, newest first", body = CleanupJobList))
)]
#[get("/cleanup-jobs")]
async fn list_jobs(
    auth: Unbound<CleanupRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    query: web::Query<JobQuery>,
) -> Result<web::Json<CleanupJobList>, Error> {
    let q = query.into_inner();
    let page = crate::domain::pagination::PageRequest::parse(q.limit, q.cursor.as_deref())?;
    // Parsed here, not by serde: a value outside the vocabulary answers an empty page, as it always has.
    let filter = JobFilter {
        state: q.state.as_deref().map(Filter::parse),
        task_id: q.task_id,
        trigger: q.trigger.as_deref().map(Filter::parse),
    };
    let page = cleanup::list(&state.ctx, &auth, filter, page).await?;
    Ok(web::Json(CleanupJobList {
        items: CleanupJob::views(&state.ctx, page.items).await?,
        next_cursor: page.next_cursor,
        latest_seq: seq.0,
    }))
}

/// Get a cleanup job
///
/// One cleanup job with its state, attempts and last error. Scope `cleanup:read`.
#[utoipa::path(
    operation_id = "getCleanupJob",
    tag = "cleanup",
    security(("bearer" = ["cleanup:read"])),
    params(("id" = Uuid, Path, description = "Cleanup job id")),
    responses(
        (status = 200, description = "The job", body = CleanupJob),
        (status = 404, description = "No such job (`not_found`)", body = Problem),
    )
)]
#[get("/cleanup-jobs/{id}")]
async fn get_job(
    auth: Unbound<CleanupRead>,
    state: web::Data<AppState>,
    id: web::Path<CleanupJobId>,
) -> Result<web::Json<CleanupJob>, Error> {
    let job = cleanup::get(&state.ctx, &auth, *id).await?;
    Ok(web::Json(CleanupJob::view(&state.ctx, job).await?))
}

/// Retry a failed cleanup job
///
/// A `failed` job becomes `pending` again with a fresh attempt budget; any other state is `409 conflict`.
/// Scope `cleanup:admin`.
#[utoipa::path(
    operation_id = "retryCleanupJob",
    tag = "cleanup",
    security(("bearer" = ["cleanup:admin"])),
    params(("id" = Uuid, Path, description = "Cleanup job id")),
    responses(
        (status = 200, description = "A failed job, pending again with a fresh attempt budget", body = CleanupJob),
        (status = 404, description = "No such job (`not_found`)", body = Problem),
        (status = 409, description = "The job is not failed (`conflict`)", body = Problem),
    )
)]
#[post("/cleanup-jobs/{id}/retry")]
async fn retry_job(
    auth: Unbound<CleanupAdmin>,
    state: web::Data<AppState>,
    id: web::Path<CleanupJobId>,
) -> Result<web::Json<CleanupJob>, Error> {
    let job = cleanup::retry(&state.ctx, &auth, *id).await?;
    Ok(web::Json(CleanupJob::view(&state.ctx, job).await?))
}

/// Cancel a cleanup job
///
/// Only a job that has not started (`prepared`, `pending` or `retry_wait`) can be cancelled; a running or
/// finished one is `409 conflict`, so a removal is never half-cancelled. Scope `cleanup:admin`.
#[utoipa::path(
    operation_id = "cancelCleanupJob",
    tag = "cleanup",
    security(("bearer" = ["cleanup:admin"])),
    params(("id" = Uuid, Path, description = "Cleanup job id")),
    responses(
        (status = 200, description = "Cancelled", body = CleanupJob),
        (status = 404, description = "No such job (`not_found`)", body = Problem),
        (status = 409, description = "Only a prepared, pending or retry_wait job can be cancelled (`conflict`)", body = Problem),
    )
)]
#[post("/cleanup-jobs/{id}/cancel")]
async fn cancel_job(
    auth: Unbound<CleanupAdmin>,
    state: web::Data<AppState>,
    id: web::Path<CleanupJobId>,
) -> Result<web::Json<CleanupJob>, Error> {
    let job = cleanup::cancel(&state.ctx, &auth, *id).await?;
    Ok(web::Json(CleanupJob::view(&state.ctx, job).await?))
}
