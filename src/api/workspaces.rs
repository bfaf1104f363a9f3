//! HTTP for workspaces.
use crate::ids::WorkspaceId;
use actix_web::{HttpResponse, delete, get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::extract::{FollowPoint, TasksRead, Unbound, WorkspacesAdmin};
use super::problem::Problem;
use super::{AppState, PageQuery};
use crate::domain::branches::LeftoverBranch;
use crate::domain::workspaces;
use crate::entity::workspace::{self, WorkspaceStatus};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(create_workspace)
        .service(list_workspaces)
        .service(get_workspace)
        .service(delete_workspace)
        .service(workspace_summary)
        .service(list_workspace_branches);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Workspace {
    pub id: WorkspaceId,
    pub name: String,
    /// `active`, or `deleting` while its cleanup runs.
    pub status: WorkspaceStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<workspace::Model> for Workspace {
    fn from(m: workspace::Model) -> Self {
        Workspace {
            id: m.id,
            name: m.name,
            status: m.status,
            created_at: m.created_at,
            updated_at: m.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceList {
    pub items: Vec<Workspace>,
    pub next_cursor: Option<String>,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkspace {
    /// Unique; it confirms deletion later.
    pub name: String,
}

/// Create a workspace
///
/// A workspace is the tenancy boundary: repositories, tasks and their sessions belong to exactly one, and a
/// token limited to some workspaces sees nothing of the others. Names are unique (a second one with the
/// same name is `409 conflict`); the name confirms deletion later. Scope `workspaces:admin`, with a token
/// not bound to a session.
#[utoipa::path(
    operation_id = "createWorkspace",
    tag = "workspaces",
    security(("bearer" = ["workspaces:admin"])),
    request_body = CreateWorkspace,
    responses(
        (status = 201, description = "Created", body = Workspace, headers(("Location" = String))),
        (status = 409, description = "A workspace with this name exists (`conflict`)", body = Problem),
        (status = 422, description = "Invalid name (`validation_failed`)", body = Problem),
    )
)]
#[post("/workspaces")]
async fn create_workspace(
    auth: Unbound<WorkspacesAdmin>,
    state: web::Data<AppState>,
    body: web::Json<CreateWorkspace>,
) -> Result<HttpResponse, Error> {
    let ws = workspaces::create(&state.ctx, &auth, &body.name).await?;
    Ok(super::created(
        format!("/api/v1/workspaces/{}", ws.id),
        &Workspace::from(ws),
    ))
}

/// List workspaces
///
/// The workspaces the token may see (all of them, or those its `workspaces` claim names), newest first,
/// one keyset page at a time. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "listWorkspaces",
    tag = "workspaces",
    security(("bearer" = ["tasks:read"])),
    params(PageQuery),
    responses((status = 200, description = "Workspaces the token may see, newest first", body = WorkspaceList))
)]
#[get("/workspaces")]
async fn list_workspaces(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    query: web::Query<PageQuery>,
) -> Result<web::Json<WorkspaceList>, Error> {
    let page = workspaces::list(&state.ctx, &auth, query.page()?).await?;
    Ok(web::Json(WorkspaceList {
        items: page.items.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
        latest_seq: seq.0,
    }))
}

/// Get a workspace
///
/// One workspace. A workspace outside the token's `workspaces` claim answers `404`, never `403`, so its
/// existence does not leak. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getWorkspace",
    tag = "workspaces",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    responses(
        (status = 200, description = "The workspace", body = Workspace),
        (status = 404, description = "No such workspace, or not the token's (`not_found`)", body = Problem),
    )
)]
#[get("/workspaces/{id}")]
async fn get_workspace(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
) -> Result<web::Json<Workspace>, Error> {
    Ok(web::Json(workspaces::get(&state.ctx, &auth, *id).await?.into()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteWorkspaceQuery {
    /// Must equal the workspace's name.
    pub confirm_name: Option<String>,
    /// Consent to delete while a node holding a task's worktrees is down (`503 node_unavailable`
    /// otherwise): each worktree that holds changes when its job runs there is kept, untouched, and
    /// listed under leftovers.
    pub keep_dirty_worktrees: Option<bool>,
}

/// Delete a workspace with its tasks and repositories
///
/// Deletes the workspace, its repositories and every task in it, in one step, once `confirm_name` repeats the
/// workspace's name (a mismatch is `400` and changes nothing). Files are never removed inline: each task's
/// worktrees and environment are removed by a durable cleanup job, returned here, which survives restarts
/// and is retried. While a node holding a task's worktrees is down the answer is `503 node_unavailable` and
/// nothing changes, unless `keep_dirty_worktrees=true`: then its jobs keep each worktree with changes, listed
/// under leftovers. Refused with `409 task_cleanup_in_progress` while a task's cleanup already runs, and
/// with `503 unavailable` (retryable, nothing changed) when a replica running one of its agents does not
/// carry out the stop in time. Scope `workspaces:admin`.
#[utoipa::path(
    operation_id = "deleteWorkspace",
    tag = "workspaces",
    security(("bearer" = ["workspaces:admin"])),
    params(("id" = Uuid, Path, description = "Workspace id"), DeleteWorkspaceQuery),
    responses(
        (status = 202, description = "Deleted with its tasks and repositories; a durable job per task removes its worktrees", body = super::tasks::CleanupJobs),
        (status = 400, description = "confirm_name does not match (`validation_failed`)", body = Problem),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
        (status = 409, description = "A task's cleanup is already in progress (`task_cleanup_in_progress`)", body = Problem),
        (status = 503, description = "A node holding a task's worktrees is down (`node_unavailable`, retryable; nothing changed): repeat with `keep_dirty_worktrees=true`", body = Problem),
    )
)]
#[delete("/workspaces/{id}")]
async fn delete_workspace(
    auth: Unbound<WorkspacesAdmin>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
    query: web::Query<DeleteWorkspaceQuery>,
) -> Result<HttpResponse, Error> {
    let jobs = crate::domain::task_lifecycle::delete_workspace(
        &state.ctx,
        &auth,
        *id,
        query.confirm_name.as_deref(),
        query.keep_dirty_worktrees == Some(true),
    )
    .await?;
    let branches = crate::domain::branches::predict(&state.ctx, &jobs).await;
    Ok(HttpResponse::Accepted().json(super::tasks::CleanupJobs {
        cleanup_jobs: super::cleanup_jobs::CleanupJob::views(&state.ctx, jobs).await?,
        branches,
    }))
}

/// Get a workspace's task and session counts
///
/// Counts for a dashboard: tasks by state, and sessions open, working, recovering, asking for attention and
/// in error, in total and per environment directory (six or more open sessions in one directory add a
/// warning). Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getWorkspaceSummary",
    tag = "workspaces",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    responses(
        (status = 200, description = "Tasks by state; sessions open, working, recovering, asking for attention and in error, in total and per environment directory (six or more open in one directory add a warning)", body = crate::domain::workspaces::WorkspaceSummary),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
    )
)]
#[get("/workspaces/{id}/summary")]
async fn workspace_summary(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
) -> Result<web::Json<crate::domain::workspaces::WorkspaceSummary>, Error> {
    Ok(web::Json(
        crate::domain::workspaces::summary(&state.ctx, &auth, *id).await?,
    ))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceBranchList {
    pub items: Vec<LeftoverBranch>,
}

/// List the branches berth created that are still there
///
/// The branches berth created for tasks of this workspace (the default `berth/<task>` branch, or a named
/// branch that did not exist yet) that are still present in the workspace's repositories: those of live
/// and archived tasks, and those a task delete kept because they were not merged (`task_id` is null once
/// the task is gone). `merged` says whether every commit is in the branch's base or its upstream, so that
/// deleting it would lose nothing. Branches the user named or that existed before a task are not listed:
/// they are not berth's. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "listWorkspaceBranches",
    tag = "workspaces",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    responses(
        (status = 200, description = "The berth-created branches still present, oldest first", body = WorkspaceBranchList),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
    )
)]
#[get("/workspaces/{id}/branches")]
async fn list_workspace_branches(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
) -> Result<web::Json<WorkspaceBranchList>, Error> {
    let items = crate::domain::branches::leftovers(&state.ctx, &auth, *id).await?;
    Ok(web::Json(WorkspaceBranchList { items }))
}
