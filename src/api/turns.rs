//! HTTP for a session's turns and what each changed.
use crate::ids::{CheckpointId, EnvironmentId, SessionId};
use actix_web::{HttpRequest, HttpResponse, get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, SessionsRead, TasksWrite, Unbound};
use super::problem::Problem;
use crate::domain::diff::{Diff, MAX_CONTEXT};
use crate::domain::sessions::turns;
use crate::entity::session_turn;
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(list_turns).service(turn_diff).service(restore_environment);
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreEnvironment {
    /// A checkpoint of this environment (a turn's `start_checkpoint_id` or `end_checkpoint_id`).
    pub checkpoint_id: CheckpointId,
    /// Consent to discard what changed since the environment's last checkpoint (refused without it
    /// when something did).
    #[serde(default)]
    pub discard_worktree_changes: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Restored {
    pub task_environment_id: EnvironmentId,
    /// The checkpoint restored.
    pub checkpoint_id: CheckpointId,
    /// The checkpoint of the worktrees as they are now.
    pub new_checkpoint_id: CheckpointId,
}

/// Restore an environment to a checkpoint
///
/// Puts the environment's worktrees back to a checkpoint: files it does not hold are removed, the others
/// written as it holds them (`.gitignore`d files are left alone; the worktrees' index and branches are not
/// touched). Refused while an agent works there (`409 session_busy`), and, without
/// `discard_worktree_changes: true`, when the worktrees changed since their last checkpoint (`409
/// conflict`). Event `environment.restored`. Scope `tasks:write`.
#[utoipa::path(
    operation_id = "restoreEnvironment",
    tag = "diffs",
    security(("bearer" = ["tasks:write"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    request_body = RestoreEnvironment,
    responses(
        (status = 200, description = "Restored; the state after it is a new checkpoint", body = Restored),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
        (status = 409, description = "Another writer holds the environment's worktrees (`session_busy`: an agent's turn, a question it waits on included; `restore_in_progress`, `landing_in_progress`, `task_cleanup_in_progress`; `writer` names it), the task is archived or being cleaned (`task_archived`, `task_cleanup_in_progress`), the worktrees changed since the last checkpoint and no consent was given (`conflict`), or the environment is broken (`workspace_reuse_unsafe`)", body = Problem),
        (status = 422, description = "Not a checkpoint of this environment (`validation_failed`)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[post("/environments/{id}/restore")]
async fn restore_environment(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
    body: web::Json<RestoreEnvironment>,
) -> Result<web::Json<Restored>, Error> {
    let b = body.into_inner();
    let after =
        crate::domain::checkpoints::restore(&state.ctx, &auth, *id, b.checkpoint_id, b.discard_worktree_changes)
            .await?;
    Ok(web::Json(Restored {
        task_environment_id: *id,
        checkpoint_id: b.checkpoint_id,
        new_checkpoint_id: after.id,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Turn {
    /// 1 for the session's first turn.
    pub number: i32,
    /// What the agent was asked.
    pub prompt: String,
    pub started_at: DateTime<Utc>,
    /// Null while the turn runs.
    pub settled_at: Option<DateTime<Utc>>,
    /// The environment's state before the agent had the prompt (null when none could be taken).
    pub start_checkpoint_id: Option<CheckpointId>,
    /// Its state once the turn settled.
    pub end_checkpoint_id: Option<CheckpointId>,
    /// Files that differ between the two checkpoints.
    pub files_changed: Option<i32>,
}

impl From<session_turn::Model> for Turn {
    fn from(t: session_turn::Model) -> Self {
        Turn {
            number: t.number,
            prompt: t.prompt,
            started_at: t.started_at,
            settled_at: t.settled_at,
            start_checkpoint_id: t.start_checkpoint_id,
            end_checkpoint_id: t.end_checkpoint_id,
            files_changed: t.files_changed,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TurnList {
    /// First to last.
    pub items: Vec<Turn>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TurnDiffQuery {
    /// Lines of context around each change (default 3, at most 1000).
    #[param(minimum = 0, maximum = 1000)]
    pub context: Option<u32>,
}

/// List a session's turns
///
/// Each prompt the agent took, with the checkpoints of the environment at its start (before the agent had
/// it) and once it settled, and how many files it changed. Scope `sessions:read`.
#[utoipa::path(
    operation_id = "listSessionTurns",
    tag = "sessions",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The turns, first to last", body = TurnList),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
    )
)]
#[get("/sessions/{id}/turns")]
async fn list_turns(
    auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
) -> Result<web::Json<TurnList>, Error> {
    let items = turns::list(&state.ctx, &auth, *id).await?;
    Ok(web::Json(TurnList {
        items: items.into_iter().map(Into::into).collect(),
    }))
}

/// Get what one turn changed
///
/// The diff between the turn's two checkpoints, in the shape of an environment's diff (`scope: turn`;
/// `base` and `head` are the checkpoints' trees). Scope `sessions:read`.
#[utoipa::path(
    operation_id = "getSessionTurnDiff",
    tag = "diffs",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Session id"), ("number" = i32, Path, description = "Turn number"), TurnDiffQuery),
    responses(
        (status = 200, description = "What the turn changed, per repository slot", body = Diff, headers(("ETag" = String, description = "The answer's content hash"))),
        (status = 304, description = "Unchanged since the `If-None-Match` ETag"),
        (status = 404, description = "No such session or turn (`not_found`)", body = Problem),
        (status = 409, description = "The turn has not settled, or has no checkpoint at one end (`conflict`)", body = Problem),
        (status = 422, description = "Too much context (`validation_failed`)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[get("/sessions/{id}/turns/{number}/diff")]
async fn turn_diff(
    auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(SessionId, i32)>,
    query: web::Query<TurnDiffQuery>,
) -> Result<HttpResponse, Error> {
    let (id, number) = path.into_inner();
    let context = query.context.unwrap_or(3);
    if context > MAX_CONTEXT {
        return Err(Error::invalid("context", "must be at most 1000"));
    }
    Ok(super::diff::answer(
        &req,
        turns::diff(&state.ctx, &auth, id, number, context).await?,
    ))
}
