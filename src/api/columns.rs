//! HTTP for a workspace's board columns.
use crate::ids::{ColumnId, WorkspaceId};
use actix_web::{HttpResponse, delete, get, patch, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::AppState;
use super::extract::{TasksRead, TasksWrite, Unbound};
use super::problem::Problem;
use crate::domain::columns::{self, ColumnPatch, NewColumn};
use crate::entity::workspace_column::{self, MovesInOn};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(list_columns)
        .service(create_column)
        .service(update_column)
        .service(delete_column);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceColumn {
    pub id: ColumnId,
    pub workspace_id: WorkspaceId,
    pub name: String,
    /// 0 is the first column.
    pub position: i32,
    /// What moves a task into this column on its own (only ever forward): `session_started` (a session of
    /// the task started) or `merged` (its work was merged); null: only a person moves tasks here.
    pub moves_in_on: Option<MovesInOn>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<workspace_column::Model> for WorkspaceColumn {
    fn from(c: workspace_column::Model) -> Self {
        WorkspaceColumn {
            id: c.id,
            workspace_id: c.workspace_id,
            name: c.name,
            position: c.position,
            moves_in_on: c.moves_in_on,
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkspaceColumnList {
    /// First to last.
    pub items: Vec<WorkspaceColumn>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateColumn {
    /// Unique in the workspace, at most 100 characters.
    pub name: String,
    /// Where it goes (0 is first); default last.
    pub position: Option<i32>,
    pub moves_in_on: Option<MovesInOn>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateColumn {
    pub name: Option<String>,
    /// Moves the column here (0 is first); the others keep their order.
    pub position: Option<i32>,
    /// `null` clears the rule.
    #[serde(default, deserialize_with = "super::extract::present")]
    #[schema(value_type = Option<MovesInOn>, nullable)]
    pub moves_in_on: Option<Option<MovesInOn>>,
}

/// List a workspace's board columns
///
/// The columns tasks move through, first to last. A workspace starts with `Backlog`, `In progress` (a
/// started session moves a task here), `In review` and `Done` (a merge moves a task here). Scope
/// `tasks:read`.
#[utoipa::path(
    operation_id = "listWorkspaceColumns",
    tag = "workspaces",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    responses(
        (status = 200, description = "The columns, first to last", body = WorkspaceColumnList),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
    )
)]
#[get("/workspaces/{id}/columns")]
async fn list_columns(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
) -> Result<web::Json<WorkspaceColumnList>, Error> {
    let items = columns::list(&state.ctx, &auth, *id).await?;
    Ok(web::Json(WorkspaceColumnList {
        items: items.into_iter().map(Into::into).collect(),
    }))
}

/// Add a board column
///
/// A new column, last unless `position` says where. At most 20 per workspace. Scope `tasks:write`.
#[utoipa::path(
    operation_id = "createWorkspaceColumn",
    tag = "workspaces",
    security(("bearer" = ["tasks:write"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    request_body = CreateColumn,
    responses(
        (status = 201, description = "Added", body = WorkspaceColumn),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
        (status = 409, description = "A column with this name exists (`conflict`)", body = Problem),
        (status = 422, description = "An empty or long name, a negative position, the 21st column (`validation_failed`)", body = Problem),
    )
)]
#[post("/workspaces/{id}/columns")]
async fn create_column(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
    body: web::Json<CreateColumn>,
) -> Result<HttpResponse, Error> {
    let b = body.into_inner();
    let input = NewColumn {
        name: b.name,
        position: b.position,
        moves_in_on: b.moves_in_on,
    };
    let c = columns::create(&state.ctx, &auth, *id, input).await?;
    Ok(super::created(
        format!("/api/v1/workspaces/{}/columns/{}", c.workspace_id, c.id),
        &WorkspaceColumn::from(c),
    ))
}

/// Rename, move or change a board column
///
/// Renames the column, moves it to `position` (the others keep their order), or sets what moves tasks into
/// it. Scope `tasks:write`.
#[utoipa::path(
    operation_id = "updateWorkspaceColumn",
    tag = "workspaces",
    security(("bearer" = ["tasks:write"])),
    params(("id" = Uuid, Path, description = "Workspace id"), ("column_id" = Uuid, Path, description = "Column id")),
    request_body = UpdateColumn,
    responses(
        (status = 200, description = "The column as it is now", body = WorkspaceColumn),
        (status = 404, description = "No such workspace or column (`not_found`)", body = Problem),
        (status = 409, description = "A column with this name exists (`conflict`)", body = Problem),
        (status = 422, description = "An empty or long name, a negative position (`validation_failed`)", body = Problem),
    )
)]
#[patch("/workspaces/{id}/columns/{column_id}")]
async fn update_column(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    path: web::Path<(WorkspaceId, ColumnId)>,
    body: web::Json<UpdateColumn>,
) -> Result<web::Json<WorkspaceColumn>, Error> {
    let (ws, id) = path.into_inner();
    let b = body.into_inner();
    let patch = ColumnPatch {
        name: b.name,
        position: b.position,
        moves_in_on: b.moves_in_on,
    };
    Ok(web::Json(
        columns::update(&state.ctx, &auth, ws, id, patch).await?.into(),
    ))
}

/// Remove an empty board column
///
/// Only a column no task is in (archived ones included), and never a workspace's last. Scope
/// `tasks:write`.
#[utoipa::path(
    operation_id = "deleteWorkspaceColumn",
    tag = "workspaces",
    security(("bearer" = ["tasks:write"])),
    params(("id" = Uuid, Path, description = "Workspace id"), ("column_id" = Uuid, Path, description = "Column id")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such workspace or column (`not_found`)", body = Problem),
        (status = 409, description = "Tasks are in it, or it is the last column (`conflict`)", body = Problem),
    )
)]
#[delete("/workspaces/{id}/columns/{column_id}")]
async fn delete_column(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    path: web::Path<(WorkspaceId, ColumnId)>,
) -> Result<HttpResponse, Error> {
    let (ws, id) = path.into_inner();
    columns::remove(&state.ctx, &auth, ws, id).await?;
    Ok(HttpResponse::NoContent().finish())
}
