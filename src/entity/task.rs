use crate::ids::{ColumnId, TaskId, WorkspaceId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    #[sea_orm(string_value = "standard")]
    Standard,
    #[sea_orm(string_value = "quick_chat")]
    QuickChat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceMode {
    #[sea_orm(string_value = "new_workspace")]
    NewWorkspace,
    #[sea_orm(string_value = "inherit_parent")]
    InheritParent,
}

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tasks")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: TaskId,
    pub workspace_id: WorkspaceId,
    pub parent_task_id: Option<TaskId>,
    pub title: String,
    /// Fixed at creation; names the worktree directory and default branch.
    pub slug: String,
    pub description: String,
    pub kind: TaskKind,
    pub workspace_mode: WorkspaceMode,
    pub archived_at: Option<DateTimeUtc>,
    pub last_activity_at: DateTimeUtc,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// Bumped by a trigger on every change of the representation (`ETag`).
    pub row_version: i64,
    /// The kandev id this row was imported from (`berth import kandev`); null for rows berth made.
    pub imported_from: Option<String>,
    /// The workspace column the task is in.
    pub column_id: Option<ColumnId>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(has_many = "super::task_repository::Entity")]
    Repositories,
    #[sea_orm(has_many = "super::task_environment::Entity")]
    Environments,
}

impl Related<super::task_repository::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Repositories.def()
    }
}

impl Related<super::task_environment::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Environments.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
