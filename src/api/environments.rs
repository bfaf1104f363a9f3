//! HTTP for environments: the task-owned workspace and its worktree inventory.
use crate::ids::{EnvironmentId, EnvironmentRepoId, RepositoryId, TaskId};
use actix_web::{HttpResponse, get, web};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{Authorized, TasksRead};
use super::problem::Problem;
use crate::domain::environments::{self, EnvironmentView};
use crate::entity::task_environment::{EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::EnvironmentRepoStatus;
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(get_task_environment).service(get_environment);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentRepo {
    pub id: EnvironmentRepoId,
    pub repository_id: RepositoryId,
    /// The repository slot: the task's branch for it, or empty.
    pub branch_slug: String,
    /// The linked worktree's git id; null for the local executor.
    pub worktree_id: Option<String>,
    pub worktree_path: Option<String>,
    pub worktree_branch: Option<String>,
    pub position: i32,
    pub status: EnvironmentRepoStatus,
    /// Why preparing this repository failed, when it did.
    pub error_message: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Environment {
    pub id: EnvironmentId,
    /// The owning task (for an `inherit_parent` subtask, its ancestor's id).
    pub task_id: TaskId,
    pub executor_type: ExecutorType,
    pub status: EnvironmentStatus,
    /// The effective workspace: the worktree for one repository, the task root for several.
    pub workspace_path: Option<String>,
    /// The node whose filesystem holds it.
    pub node_id: String,
    pub ownership_generation: i64,
    pub error_message: Option<String>,
    /// For a `broken` environment: what admission found (issue 17).
    pub broken_category: Option<crate::error::ReuseCategory>,
    pub repos: Vec<EnvironmentRepo>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<EnvironmentView> for Environment {
    fn from(v: EnvironmentView) -> Self {
        let e = v.env;
        Environment {
            id: e.id,
            task_id: e.task_id,
            executor_type: e.executor_type,
            status: e.status,
            workspace_path: e.workspace_path,
            node_id: e.node_id,
            ownership_generation: e.ownership_generation,
            error_message: e.error_message,
            broken_category: e
                .broken_category
                .as_deref()
                .and_then(crate::error::ReuseCategory::parse),
            repos: v
                .repos
                .into_iter()
                .map(|r| EnvironmentRepo {
                    id: r.id,
                    repository_id: r.repository_id,
                    branch_slug: r.branch_slug,
                    worktree_id: r.worktree_id,
                    worktree_path: r.worktree_path,
                    worktree_branch: r.worktree_branch,
                    position: r.position,
                    status: r.status,
                    error_message: r.error_message,
                })
                .collect(),
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

/// Get a task's current environment
///
/// The environment the task's sessions use now (its parent's, for an `inherit_parent` subtask), with its
/// worktree inventory. `404` before the first session has materialized one. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getTaskEnvironment",
    tag = "environments",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task's current environment (its parent's for an inherit_parent subtask)", body = Environment, headers(("ETag" = String, description = "The environment's version, inventory included"))),
        (status = 404, description = "No such task, or it has no environment yet (`not_found`)", body = Problem),
    )
)]
#[get("/tasks/{id}/environment")]
async fn get_task_environment(
    auth: Authorized<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
) -> Result<HttpResponse, Error> {
    let view = environments::of_task(&state.ctx, &auth, *id).await?;
    Ok(super::ok_tagged(&view.etag(), &Environment::from(view)))
}

/// Get an environment
///
/// One environment by id, current or superseded, with its worktree inventory: each repository's worktree,
/// branch and state. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getEnvironment",
    tag = "environments",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Environment id")),
    responses(
        (status = 200, description = "The environment, current or superseded", body = Environment, headers(("ETag" = String, description = "The environment's version, inventory included"))),
        (status = 404, description = "No such environment (`not_found`)", body = Problem),
    )
)]
#[get("/environments/{id}")]
async fn get_environment(
    auth: Authorized<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<EnvironmentId>,
) -> Result<HttpResponse, Error> {
    let view = environments::get(&state.ctx, &auth, *id).await?;
    Ok(super::ok_tagged(&view.etag(), &Environment::from(view)))
}
