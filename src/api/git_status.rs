//! HTTP for git status: the environment's, read through the environment or a session.
use crate::ids::{EnvironmentId, RepositoryId, SessionId};
use actix_web::{HttpResponse, get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, FollowPoint, SessionsRead, SessionsWrite, TasksRead};
use super::problem::Problem;
use crate::domain::git_status::{self, Report, ReportedFile};
use crate::entity::git_status_observation::{self, ObservationKind, ReportedKind};
use crate::error::Error;
use crate::git::status::FileStatus;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(environment_status)
        .service(report_observation)
        .service(refresh_status)
        .service(session_status);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GitStatus {
    /// The identity of a status is its environment and repository (I24).
    pub task_environment_id: EnvironmentId,
    pub repository_id: RepositoryId,
    /// Provenance only: which session captured it (null once that session is deleted).
    pub session_id: Option<SessionId>,
    /// `live`, `completion` or `archive`.
    pub kind: ObservationKind,
    pub observed_at: DateTime<Utc>,
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    pub ahead: i32,
    pub behind: i32,
    pub files: Vec<FileStatus>,
}

impl From<git_status_observation::Model> for GitStatus {
    fn from(o: git_status_observation::Model) -> Self {
        GitStatus {
            task_environment_id: o.task_environment_id,
            repository_id: o.repository_id,
            session_id: o.session_id,
            kind: o.kind,
            observed_at: o.observed_at,
            branch: o.branch,
            head_commit: o.head_commit,
            upstream: o.upstream,
            ahead: o.ahead,
            behind: o.behind,
            files: serde_json::from_value(o.files).unwrap_or_default(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GitStatusList {
    /// One current status per repository of the environment.
    pub items: Vec<GitStatus>,
    /// True when the environment is `broken`, superseded or failed: the items are its last known state,
    /// not the present one (reset a broken environment to work again).
    pub stale: bool,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportObservation {
    pub repository_id: RepositoryId,
    // Parsed by the domain after the environment is found, so an unknown kind stays a 422 after a 404.
    /// `live` or `completion`.
    #[schema(value_type = ReportedKind)]
    pub kind: String,
    pub observed_at: DateTime<Utc>,
    pub session_id: Option<SessionId>,
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    #[serde(default)]
    pub ahead: i32,
    #[serde(default)]
    pub behind: i32,
    // The wire shape of `FileStatus`; its statuses are checked by the domain, like the kind.
    /// At most 2,000 entries.
    #[serde(default)]
    #[schema(value_type = Vec<FileStatus>)]
    pub files: Vec<ReportedFile>,
}

fn list(current: git_status::Current, seq: FollowPoint) -> web::Json<GitStatusList> {
    web::Json(GitStatusList {
        items: current.items.into_iter().map(Into::into).collect(),
        stale: current.stale,
        latest_seq: seq.0,
    })
}

/// Get an environment's git status
///
/// One status per repository of the environment: the newest observation, whatever its kind (live,
/// completion or archive); while an agent works there, a fresh inspection. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getEnvironmentGitStatus",
    tag = "git-status",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    responses(
        (status = 200, description = "The current status per repository: the newest observation, whatever its kind; a fresh inspection while an agent works there", body = GitStatusList),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
    )
)]
#[get("/environments/{id}/git-status")]
async fn environment_status(
    auth: Authorized<TasksRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    id: web::Path<EnvironmentId>,
) -> Result<web::Json<GitStatusList>, Error> {
    Ok(list(git_status::current(&state.ctx, &auth, *id).await?, seq))
}

/// Report a git status observation
///
/// Records an observation made by an agent-side monitor. Observations are ordered by `observed_at`: one
/// older than the current one is kept as history or ignored, and changes nothing. Only a ready environment
/// takes them (`409 conflict`); a repository or session of another environment, a future `observed_at` or
/// too many files is `422`. A session-bound token reports only for its own environment. Scope
/// `sessions:write`.
#[utoipa::path(
    operation_id = "reportGitStatusObservation",
    tag = "git-status",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    request_body = ReportObservation,
    responses(
        (status = 201, description = "Recorded (an observation older than the current one is kept as history or ignored, and changes nothing)", body = GitStatus),
        (status = 404, description = "No such environment, or not the token's session's (`not_found`)", body = Problem),
        (status = 409, description = "Only a ready environment takes observations (`conflict`)", body = Problem),
        (status = 422, description = "A repository or session of another environment, a future observed_at, too many files (`validation_failed`)", body = Problem),
    )
)]
#[post("/environments/{id}/git-status/observations")]
async fn report_observation(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
    body: web::Json<ReportObservation>,
) -> Result<HttpResponse, Error> {
    let b = body.into_inner();
    let r = Report {
        repository_id: b.repository_id,
        session_id: b.session_id,
        kind: b.kind,
        observed_at: b.observed_at,
        branch: b.branch,
        head_commit: b.head_commit,
        upstream: b.upstream,
        ahead: b.ahead,
        behind: b.behind,
        files: b.files,
    };
    let stored = git_status::report(&state.ctx, &auth, *id, r).await?;
    Ok(HttpResponse::Created().json(GitStatus::from(stored)))
}

/// Refresh an environment's git status
///
/// berth inspects the environment's worktrees itself (read-only) and records live observations, then
/// answers the current status per repository. Refused with `409 conflict` when the environment is not
/// ready. Scope `sessions:write`.
#[utoipa::path(
    operation_id = "refreshEnvironmentGitStatus",
    tag = "git-status",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    responses(
        (status = 200, description = "berth inspected the worktrees itself (read-only) and recorded live observations", body = GitStatusList),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
        (status = 409, description = "The environment is not ready (`conflict`), or a worktree is gone or no longer a git worktree (`workspace_reuse_unsafe` with `category` `workspace_missing` or `not_a_git_worktree`: reset the environment)", body = Problem),
    )
)]
#[post("/environments/{id}/git-status/refresh")]
async fn refresh_status(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    id: web::Path<EnvironmentId>,
) -> Result<web::Json<GitStatusList>, Error> {
    Ok(list(git_status::refresh(&state.ctx, &auth, *id).await?, seq))
}

/// Get the git status of a session's environment
///
/// The same status as its environment's: the route is by session for a session-bound token, the identity is
/// the environment's, so every session of it answers the same. Scope `sessions:read`.
#[utoipa::path(
    operation_id = "getSessionGitStatus",
    tag = "git-status",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session's environment's current status (the same for every session of it)", body = GitStatusList),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
    )
)]
#[get("/sessions/{id}/git-status")]
async fn session_status(
    auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    id: web::Path<SessionId>,
) -> Result<web::Json<GitStatusList>, Error> {
    Ok(list(git_status::of_session(&state.ctx, &auth, *id).await?, seq))
}
