//! HTTP for diffs: what changed in an environment's worktrees, through the environment or a session.
use crate::ids::{EnvironmentId, RepositoryId, SessionId};
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, get, web};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, SessionsRead, TasksRead};
use super::problem::Problem;
use crate::domain::diff::{self, Diff, MAX_CONTEXT, Query};
use crate::error::Error;
use crate::git::diff::Scope;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(environment_diff).service(session_diff);
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// `all` (default: committed since the base, staged, unstaged and untracked), `uncommitted` (against
    /// HEAD) or `committed` (the base to HEAD).
    pub scope: Option<String>,
    /// Lines of context around each change (default 3, at most 1000).
    #[param(minimum = 0, maximum = 1000)]
    pub context: Option<u32>,
    /// Only these paths, comma-separated (each taken literally: a file, or a directory and what is in it).
    pub paths: Option<String>,
    /// Only this repository of the environment.
    pub repository_id: Option<RepositoryId>,
    /// The page after the one that gave this `next_cursor`.
    pub cursor: Option<String>,
}

impl DiffQuery {
    fn parse(self) -> Result<Query, Error> {
        let scope = match self.scope.as_deref() {
            None => Scope::All,
            Some(s) => {
                Scope::parse(s).ok_or_else(|| Error::invalid("scope", "must be all, uncommitted or committed"))?
            }
        };
        let context = self.context.unwrap_or(3);
        if context > MAX_CONTEXT {
            return Err(Error::invalid("context", "must be at most 1000"));
        }
        let paths = self
            .paths
            .as_deref()
            .map(|p| p.split(',').filter(|p| !p.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        Ok(Query {
            scope,
            context,
            paths,
            repository_id: self.repository_id,
            cursor: self.cursor,
        })
    }
}

/// 304 when the caller has this answer already.
pub(super) fn answer(req: &HttpRequest, (diff, etag): (Diff, String)) -> HttpResponse {
    let unchanged = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if unchanged {
        return HttpResponse::NotModified().insert_header((header::ETAG, etag)).finish();
    }
    HttpResponse::Ok().insert_header((header::ETAG, etag)).json(diff)
}

/// Get an environment's diff
///
/// Per repository slot of the environment: what changed, against the merge base of the task branch with
/// the slot's base branch (`scope=all`, the default, and `committed`) or HEAD (`uncommitted`), with each
/// file's status (renames and copies detected), line counts and unified patch. A `.gitignore`d file never
/// appears; a symlink is shown as a link; a binary file has no line counts; a patch that is not UTF-8 is
/// base64 (`patch_encoding`). Read without writing to the worktree, its index or its refs. Bounded by
/// `BERTH_DIFF_MAX_FILE_BYTES` per file (`truncated`) and `BERTH_DIFF_MAX_FILES` per answer (then paged:
/// `next_cursor`). `ETag` is the answer's content; `If-None-Match` answers 304. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getEnvironmentDiff",
    tag = "diffs",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Environment id"), DiffQuery),
    responses(
        (status = 200, description = "The diff, per repository slot", body = Diff, headers(("ETag" = String, description = "The answer's content hash"))),
        (status = 304, description = "Unchanged since the `If-None-Match` ETag"),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
        (status = 409, description = "The environment is not ready (`conflict`), or a worktree is gone or no longer a git worktree (`workspace_reuse_unsafe`: reset the environment)", body = Problem),
        (status = 422, description = "An unknown scope, too much context, a repository not in the environment, a cursor this diff did not give (`validation_failed`)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[get("/environments/{id}/diff")]
async fn environment_diff(
    auth: Authorized<TasksRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<EnvironmentId>,
    query: web::Query<DiffQuery>,
) -> Result<HttpResponse, Error> {
    let q = query.into_inner().parse()?;
    Ok(answer(&req, diff::of_environment(&state.ctx, &auth, *id, q).await?))
}

/// Get the diff of a session's environment
///
/// The same as the environment's diff, for the environment the session runs in. Scope `sessions:read`.
#[utoipa::path(
    operation_id = "getSessionDiff",
    tag = "diffs",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Session id"), DiffQuery),
    responses(
        (status = 200, description = "The diff of the session's environment, per repository slot", body = Diff, headers(("ETag" = String, description = "The answer's content hash"))),
        (status = 304, description = "Unchanged since the `If-None-Match` ETag"),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 409, description = "The session has no environment yet, or it is not ready (`conflict`), or a worktree is gone (`workspace_reuse_unsafe`)", body = Problem),
        (status = 422, description = "An unknown scope, too much context, a repository not in the environment, a cursor this diff did not give (`validation_failed`)", body = Problem),
        (status = 503, description = "The environment's node is down (`node_unavailable`, retryable)", body = Problem),
    )
)]
#[get("/sessions/{id}/diff")]
async fn session_diff(
    auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    req: HttpRequest,
    id: web::Path<SessionId>,
    query: web::Query<DiffQuery>,
) -> Result<HttpResponse, Error> {
    let q = query.into_inner().parse()?;
    Ok(answer(&req, diff::of_session(&state.ctx, &auth, *id, q).await?))
}
