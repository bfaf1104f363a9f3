//! HTTP for landing an environment's work: commit, merge, push, pull requests.
use crate::ids::{EnvironmentId, RepositoryId};
use actix_web::{HttpResponse, post, web};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{TasksLand, TasksWrite, Unbound};
use super::problem::Problem;
use crate::domain::landing::pull_requests::{self, NewPullRequest, PullRequest};
use crate::domain::landing::{self, Committed, MergeRequest, Merged, Pushed, Strategy};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(commit_environment)
        .service(merge_environment)
        .service(push_environment)
        .service(create_pull_request);
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCommit {
    pub message: String,
    /// Only these repositories of the environment (default: every one with something to commit).
    pub repository_ids: Option<Vec<RepositoryId>>,
    /// Only these paths, relative to each worktree (default: every change, untracked files included).
    #[serde(default)]
    pub paths: Vec<String>,
}

/// Commit an environment's changes
///
/// Commits what is in the environment's worktrees (everything, or `paths`) on each slot's task branch.
/// The author is the token's `name` and `email` claims when it has both, else `BERTH_GIT_AUTHOR`, else
/// berth; the committer is berth; hooks do not run. Refused while an agent's turn runs there (`409
/// session_busy`), with nothing to commit (`409 nothing_to_commit`), on a broken environment (`409
/// workspace_reuse_unsafe`). Event `environment.committed`; git status is observed again. Scope
/// `tasks:write`; a session-bound token is refused (an agent's work is committed by a person).
#[utoipa::path(
    operation_id = "commitEnvironment",
    tag = "landing",
    security(("bearer" = ["tasks:write"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    request_body = CreateCommit,
    responses(
        (status = 201, description = "Committed: one commit per repository that had changes", body = Committed),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
        (status = 409, description = "Another writer holds the environment's worktrees (`session_busy`: an agent's turn; `restore_in_progress`, `landing_in_progress`, `task_cleanup_in_progress`; `writer` names it), the task is archived (`task_archived`), nothing to commit (`nothing_to_commit`), the environment is not ready or is local (`conflict`), or it is broken (`workspace_reuse_unsafe`)", body = Problem),
        (status = 422, description = "An empty message, a path outside the worktree, a repository not in the environment (`validation_failed`)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[post("/environments/{id}/commits")]
async fn commit_environment(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
    body: web::Json<CreateCommit>,
) -> Result<HttpResponse, Error> {
    let b = body.into_inner();
    let done = landing::commit(
        &state.ctx,
        &auth,
        *id,
        &b.message,
        b.repository_ids.as_deref(),
        &b.paths,
    )
    .await?;
    Ok(HttpResponse::Created().json(done))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeEnvironment {
    pub repository_id: RepositoryId,
    /// The branch to merge into (default: the slot's base branch).
    pub into: Option<String>,
    pub strategy: Strategy,
    /// The merge or squash commit's message (default: git's merge message, or the task's title).
    pub message: Option<String>,
    /// Refuse (`409 branch_moved`) unless `into` points at this commit.
    pub expected_into_commit: Option<String>,
}

/// Merge a task branch
///
/// Merges the slot's task branch into `into`, computed in the object store (`git merge-tree`), never in a
/// worktree. A conflict answers `409 merge_conflict` with `conflicting_paths` and changes nothing. The
/// target moves by compare-and-set (`409 branch_moved`, retryable, when it moved meanwhile). Where the
/// target is checked out, berth moves that checkout only when it is clean (a fast-forward of what it has),
/// and otherwise refuses (`409 target_checked_out`) without touching it. The task branch and worktree
/// are kept. Event `environment.merged`; the task moves to the column that takes merged work. Scope
/// `tasks:land`; a target other than the slot's base branch needs `admin`; a session-bound token is refused.
#[utoipa::path(
    operation_id = "mergeEnvironment",
    tag = "landing",
    security(("bearer" = ["tasks:land"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    request_body = MergeEnvironment,
    responses(
        (status = 200, description = "Merged: where the target points now", body = Merged),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
        (status = 409, description = "Conflicts (`merge_conflict`), the target moved (`branch_moved`, retryable), the target is checked out with changes (`target_checked_out`) or where a `local` session's agent works (`target_in_use`), nothing to merge or not a fast-forward (`conflict`), a broken environment (`workspace_reuse_unsafe`)", body = Problem),
        (status = 422, description = "A repository not in the environment, a target branch that does not exist (`validation_failed`)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[post("/environments/{id}/merge")]
async fn merge_environment(
    auth: Unbound<TasksLand>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
    body: web::Json<MergeEnvironment>,
) -> Result<web::Json<Merged>, Error> {
    let b = body.into_inner();
    let req = MergeRequest {
        repository_id: b.repository_id,
        into: b.into,
        strategy: b.strategy,
        message: b.message,
        expected_into_commit: b.expected_into_commit,
    };
    Ok(web::Json(landing::merge(&state.ctx, &auth, *id, req).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushEnvironment {
    pub repository_id: RepositoryId,
    /// A remote of the repository (default `origin`).
    pub remote: Option<String>,
    /// Replace the remote branch if it is where berth last saw it (`--force-with-lease`).
    #[serde(default)]
    pub force_with_lease: bool,
}

/// Push a task branch
///
/// Pushes the slot's task branch to the remote under its own name, with the credentials configured for
/// the host of the URL git really pushes to (`[remotes."<host>"]`), given to git by berth's credential
/// helper for that protocol and host only, and never written into the repository. A push URL sent
/// elsewhere than the remote's URL while a credential is at stake, several push URLs, or a URL git and
/// berth could read two ways is refused before git sends anything (`422 validation_failed`, field
/// `remote`). Errors: `409 push_rejected` (git's reason), `502 remote_auth_failed`, `502
/// remote_unreachable` (retryable). Event `environment.pushed`. Scope
/// `tasks:land`; a session-bound token is refused.
#[utoipa::path(
    operation_id = "pushEnvironment",
    tag = "landing",
    security(("bearer" = ["tasks:land"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    request_body = PushEnvironment,
    responses(
        (status = 200, description = "Pushed", body = Pushed),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
        (status = 409, description = "The remote rejected the push (`push_rejected`), or the environment is not ready (`conflict`, `workspace_reuse_unsafe`)", body = Problem),
        (status = 422, description = "No such remote, a repository not in the environment, or a push URL berth refuses: elsewhere than the remote's URL, several, or readable two ways (`validation_failed`)", body = Problem),
        (status = 502, description = "The remote refused the credentials (`remote_auth_failed`) or could not be reached (`remote_unreachable`, retryable)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[post("/environments/{id}/push")]
async fn push_environment(
    auth: Unbound<TasksLand>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
    body: web::Json<PushEnvironment>,
) -> Result<web::Json<Pushed>, Error> {
    let b = body.into_inner();
    let remote = b.remote.as_deref().unwrap_or("origin");
    Ok(web::Json(
        landing::push(&state.ctx, &auth, *id, b.repository_id, remote, b.force_with_lease).await?,
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePullRequest {
    pub repository_id: RepositoryId,
    pub title: String,
    pub body: Option<String>,
    /// The branch it merges into (default: the slot's base branch).
    pub base: Option<String>,
    #[serde(default)]
    pub draft: bool,
}

/// Open a pull request
///
/// Pushes the slot's task branch to `origin`, then opens a pull request on the GitHub (or GitHub
/// Enterprise, `api_url`) that `origin`'s URL names, with the token configured for its host. It is
/// recorded on the task (`pull_requests[]`), and its state is read again every
/// `BERTH_PULL_REQUEST_POLL_SECS`. Errors as for a push; the host refusing the pull request is `409
/// conflict` with its message. Event `pull_request.updated`. Scope `tasks:land`;
/// a session-bound token is refused.
#[utoipa::path(
    operation_id = "createPullRequest",
    tag = "landing",
    security(("bearer" = ["tasks:land"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    request_body = CreatePullRequest,
    responses(
        (status = 201, description = "Opened", body = PullRequest),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
        (status = 409, description = "The push was rejected (`push_rejected`), the host refused the pull request or the environment is not ready (`conflict`)", body = Problem),
        (status = 422, description = "An empty title, a repository not in the environment or whose origin is not a GitHub repository (`validation_failed`)", body = Problem),
        (status = 502, description = "No token or a refused one (`remote_auth_failed`), the remote or its API unreachable (`remote_unreachable`, retryable)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[post("/environments/{id}/pull-requests")]
async fn create_pull_request(
    auth: Unbound<TasksLand>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
    body: web::Json<CreatePullRequest>,
) -> Result<HttpResponse, Error> {
    let b = body.into_inner();
    let new = NewPullRequest {
        repository_id: b.repository_id,
        title: b.title,
        body: b.body,
        base: b.base,
        draft: b.draft,
    };
    let row = pull_requests::open(&state.ctx, &auth, *id, new).await?;
    Ok(super::created(
        format!("/api/v1/tasks/{}", row.task_id),
        &PullRequest::from(row),
    ))
}
