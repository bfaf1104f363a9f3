//! HTTP for what berth kept on disk: listed, and disposed of with consent.
use crate::ids::{LeftoverId, WorkspaceId};
use actix_web::{HttpResponse, delete, get, web};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{TasksDelete, TasksRead, Unbound};
use super::problem::Problem;
use crate::domain::cleanup::disposal::{self, Leftover};
use crate::error::Error;
use crate::managed_path::Consent;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(list_leftovers).service(dispose_leftover);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LeftoverList {
    pub items: Vec<Leftover>,
}

/// List what berth kept on disk
///
/// Directories berth left on disk because they hold someone's work and nobody consented to discarding
/// it, oldest first: `dirty_worktree`, a worktree of an earlier environment of a task (a reset or an
/// executor transition superseded it) with uncommitted changes, kept where it is; `set_aside`, what a
/// reset, archive or delete found in a worktree's place that was no longer that worktree or no longer the
/// repository's (replaced, re-cloned), moved aside whole under the worktree root so a fresh worktree could
/// take its place. git never ran in it. A directory someone removed by hand leaves the list. Scope
/// `tasks:read`.
#[utoipa::path(
    operation_id = "listWorkspaceLeftovers",
    tag = "workspaces",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    responses(
        (status = 200, description = "What berth kept, oldest first", body = LeftoverList),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
    )
)]
#[get("/workspaces/{id}/leftovers")]
async fn list_leftovers(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
) -> Result<web::Json<LeftoverList>, Error> {
    let items = disposal::list(&state.ctx, &auth, *id).await?;
    Ok(web::Json(LeftoverList { items }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DisposeQuery {
    /// Consent to destroy what the leftover holds: required (`true`).
    pub discard_worktree_changes: Option<bool>,
}

/// Dispose of what berth kept
///
/// Removes a kept directory and what it holds, so only with `discard_worktree_changes=true` (without it:
/// `422 validation_failed`, nothing changes). A worktree kept in place is proven to still be that worktree
/// and removed with its git registration (its branch stays); a directory set aside is removed. Refused
/// with `409 conflict` while an environment works in the path again. Scope `tasks:delete`.
#[utoipa::path(
    operation_id = "deleteWorkspaceLeftover",
    tag = "workspaces",
    security(("bearer" = ["tasks:delete"])),
    params(
        ("id" = Uuid, Path, description = "Workspace id"),
        ("leftover_id" = Uuid, Path, description = "Leftover id"),
        DisposeQuery,
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such workspace or leftover (`not_found`)", body = Problem),
        (status = 409, description = "An environment works in it again (`conflict`); nothing changed", body = Problem),
        (status = 422, description = "No consent (`validation_failed`); nothing changed", body = Problem),
    )
)]
#[delete("/workspaces/{id}/leftovers/{leftover_id}")]
async fn dispose_leftover(
    auth: Unbound<TasksDelete>,
    state: web::Data<AppState>,
    path: web::Path<(WorkspaceId, LeftoverId)>,
    query: web::Query<DisposeQuery>,
) -> Result<HttpResponse, Error> {
    let (workspace_id, id) = *path;
    let consent = Consent::from_discard_flag(query.discard_worktree_changes);
    disposal::dispose(&state.ctx, &auth, workspace_id, id, consent).await?;
    Ok(HttpResponse::NoContent().finish())
}
