use crate::ids::{EnvironmentId, InstanceId, TaskId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum ExecutorType {
    /// Runs in the registered repository itself; nothing is created or removed on disk.
    #[sea_orm(string_value = "local")]
    Local,
    /// One git worktree per repository slot under `BERTH_WORKTREE_ROOT`.
    #[sea_orm(string_value = "worktree")]
    Worktree,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentStatus {
    #[sea_orm(string_value = "creating")]
    Creating,
    #[sea_orm(string_value = "ready")]
    Ready,
    #[sea_orm(string_value = "stopped")]
    Stopped,
    #[sea_orm(string_value = "failed")]
    Failed,
    #[sea_orm(string_value = "superseded")]
    Superseded,
    /// Issue 17 item 6: admission found the workspace unsafe (`broken_category` says how). Still the
    /// task's current environment; no agent starts in it until a launch proves it again (it is then ready
    /// again) or a reset replaces it.
    #[sea_orm(string_value = "broken")]
    Broken,
    /// Issue 39 item 3: its node was decommissioned: what it held is gone with it. No task's current
    /// environment; the next session of its task gets a new one where it is carried out.
    #[sea_orm(string_value = "lost")]
    Lost,
}

/// The task-owned workspace root (I1): at most one non-superseded row per task.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "task_environments")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: EnvironmentId,
    pub task_id: TaskId,
    pub executor_type: ExecutorType,
    pub status: EnvironmentStatus,
    pub workspace_path: Option<String>,
    pub node_id: String,
    pub ownership_generation: i64,
    /// Who is materializing a `creating` environment (I14: exactly one).
    pub materializer_id: Option<InstanceId>,
    pub error_message: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub superseded_at: Option<DateTimeUtc>,
    /// Bumped by a trigger on every change of the representation (`ETag`).
    pub row_version: i64,
    /// Why a `broken` environment is (a `ReuseCategory`, as its snake_case name).
    pub broken_category: Option<String>,
    /// The kandev id this row was imported from (`berth import kandev`); null for rows berth made.
    pub imported_from: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::task::Entity",
        from = "Column::TaskId",
        to = "super::task::Column::Id"
    )]
    Task,
    #[sea_orm(has_many = "super::task_environment_repo::Entity")]
    Repos,
}

impl Related<super::task::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Task.def()
    }
}

impl Related<super::task_environment_repo::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Repos.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
