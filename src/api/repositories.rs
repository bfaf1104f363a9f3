//! HTTP for source repositories.
use crate::ids::{RepositoryId, WorkspaceId};
use actix_web::{HttpResponse, delete, get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::extract::{FollowPoint, TasksRead, Unbound, WorkspacesAdmin};
use super::problem::Problem;
use super::{AppState, PageQuery};
use crate::domain::repositories::{self, NewRepository};
use crate::entity::repository::{self, RepositoryStatus};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(register_repository)
        .service(list_repositories)
        .service(get_repository)
        .service(delete_repository);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Repository {
    pub id: RepositoryId,
    pub workspace_id: WorkspaceId,
    /// Names the repository's worktree directory inside a task root.
    pub name: String,
    /// The canonical work tree root.
    pub path: String,
    /// The canonical common git directory: the repository's identity.
    pub common_git_dir: String,
    pub default_branch: String,
    /// `missing` when the path was not a git repository at import time (`berth import kandev`): kept so
    /// its tasks keep their slots, never admitted for a launch.
    pub status: RepositoryStatus,
    /// The kandev repository id it was imported from; null for a repository registered in berth.
    pub imported_from: Option<String>,
    /// The node whose disk holds it (its tasks' work happens there); null for one registered before
    /// berth recorded nodes.
    pub node_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<repository::Model> for Repository {
    fn from(m: repository::Model) -> Self {
        Repository {
            id: m.id,
            workspace_id: m.workspace_id,
            name: m.name,
            path: m.path,
            common_git_dir: m.common_git_dir,
            default_branch: m.default_branch,
            status: m.status,
            imported_from: m.imported_from,
            node_id: m.node_id,
            created_at: m.created_at,
            updated_at: m.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RepositoryList {
    pub items: Vec<Repository>,
    pub next_cursor: Option<String>,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRepository {
    /// Absolute, canonical path of a non-bare git work tree root (inside `BERTH_REPO_ROOTS` when set).
    pub path: String,
    /// Defaults to the directory's name.
    pub name: Option<String>,
    /// Defaults to the branch HEAD names.
    pub default_branch: Option<String>,
    /// The node whose disk holds the path (`GET /nodes`); defaults to the node of the berth process that
    /// takes the request. Another node's registration is carried out by that node (`503
    /// node_unavailable` while it is down).
    pub node_id: Option<String>,
}

/// Register a repository in a workspace
///
/// Registers an existing, non-bare git work tree so tasks can use it. The path must be absolute and
/// canonical, and inside the configured repository roots when those are set (`422 path_not_allowed`); it
/// must be a git work tree root (`422 not_a_git_repository`). The repository's identity is its common git
/// directory: registering the same repository twice in a workspace is `409 conflict`. Nothing on disk is
/// changed. The repository belongs to the node that proves the path (`node_id`, by default the one
/// that takes the request): a task's repositories must all be on one node, where its work then happens.
/// Scope `workspaces:admin`.
#[utoipa::path(
    operation_id = "registerRepository",
    tag = "repositories",
    security(("bearer" = ["workspaces:admin"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    request_body = RegisterRepository,
    responses(
        (status = 201, description = "Registered", body = Repository, headers(("Location" = String))),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
        (status = 409, description = "Already registered (`conflict`)", body = Problem),
        (status = 422, description = "`not_a_git_repository`, `path_not_allowed` or `validation_failed`", body = Problem),
    )
)]
#[post("/workspaces/{id}/repositories")]
async fn register_repository(
    auth: Unbound<WorkspacesAdmin>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
    body: web::Json<RegisterRepository>,
) -> Result<HttpResponse, Error> {
    let body = body.into_inner();
    if let Some(node) = body.node_id.as_deref()
        && node != state.ctx.config.node_id
    {
        // Forwarded requests only arrive at the node they name (`forward`): this one is not it.
        return Err(Error::invalid(
            "node_id",
            format!("this request reached node {}, not {node}", state.ctx.config.node_id),
        ));
    }
    let input = NewRepository {
        path: body.path,
        name: body.name,
        default_branch: body.default_branch,
    };
    let repo = repositories::register(&state.ctx, &auth, *id, input).await?;
    Ok(super::created(
        format!("/api/v1/repositories/{}", repo.id),
        &Repository::from(repo),
    ))
}

/// List a workspace's repositories
///
/// The repositories registered in the workspace, newest first, one keyset page at a time. Scope
/// `tasks:read`.
#[utoipa::path(
    operation_id = "listWorkspaceRepositories",
    tag = "repositories",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id"), PageQuery),
    responses(
        (status = 200, description = "Registered repositories, newest first", body = RepositoryList),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
    )
)]
#[get("/workspaces/{id}/repositories")]
async fn list_repositories(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    id: web::Path<WorkspaceId>,
    query: web::Query<PageQuery>,
) -> Result<web::Json<RepositoryList>, Error> {
    let page = repositories::list(&state.ctx, &auth, *id, query.page()?).await?;
    Ok(web::Json(RepositoryList {
        items: page.items.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
        latest_seq: seq.0,
    }))
}

/// Get a repository
///
/// One registered repository, with its canonical path and default branch. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getRepository",
    tag = "repositories",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Repository id")),
    responses(
        (status = 200, description = "The repository", body = Repository),
        (status = 404, description = "No such repository (`not_found`)", body = Problem),
    )
)]
#[get("/repositories/{id}")]
async fn get_repository(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<RepositoryId>,
) -> Result<web::Json<Repository>, Error> {
    Ok(web::Json(repositories::get(&state.ctx, &auth, *id).await?.into()))
}

/// Deregister a repository
///
/// Removes the registration only: the repository on disk is never touched. Refused with `409
/// repository_in_use` while a task that is not deleted still uses it, so no environment loses its source.
/// Scope `workspaces:admin`.
#[utoipa::path(
    operation_id = "deleteRepository",
    tag = "repositories",
    security(("bearer" = ["workspaces:admin"])),
    params(("id" = Uuid, Path, description = "Repository id")),
    responses(
        (status = 204, description = "Deregistered; nothing on disk is touched"),
        (status = 404, description = "No such repository (`not_found`)", body = Problem),
        (status = 409, description = "A live task uses it (`repository_in_use`)", body = Problem),
    )
)]
#[delete("/repositories/{id}")]
async fn delete_repository(
    auth: Unbound<WorkspacesAdmin>,
    state: web::Data<AppState>,
    id: web::Path<RepositoryId>,
) -> Result<HttpResponse, Error> {
    repositories::delete(&state.ctx, &auth, *id).await?;
    Ok(HttpResponse::NoContent().finish())
}
