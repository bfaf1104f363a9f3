use crate::ids::{EnvironmentId, ExecutionId, SessionId, TaskId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use super::task_environment::ExecutorType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Created with `Prefer: respond-async`: its task's environment is being materialized in the
    /// background; then `created` (or launched), or `failed` with `last_error`.
    #[sea_orm(string_value = "preparing")]
    Preparing,
    #[sea_orm(string_value = "created")]
    Created,
    #[sea_orm(string_value = "starting")]
    Starting,
    /// The agent is working.
    #[sea_orm(string_value = "running")]
    Running,
    /// Waiting for input.
    #[sea_orm(string_value = "idle")]
    Idle,
    /// The agent asked a question.
    #[sea_orm(string_value = "attention")]
    Attention,
    #[sea_orm(string_value = "recovering")]
    Recovering,
    #[sea_orm(string_value = "stopping")]
    Stopping,
    #[sea_orm(string_value = "stopped")]
    Stopped,
    #[sea_orm(string_value = "failed")]
    Failed,
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
}

/// A session references the task's environment and owns nothing physical (I1).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "task_sessions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: SessionId,
    pub task_id: TaskId,
    pub task_environment_id: Option<EnvironmentId>,
    pub name: String,
    pub executor_type: ExecutorType,
    pub agent_profile: Option<String>,
    pub state: SessionState,
    pub is_primary: bool,
    pub desired_open: bool,
    pub execution_id: Option<ExecutionId>,
    pub agent_session_ref: Option<String>,
    /// What the agent last told berth about itself (model, commands, status lines...), for snapshots.
    pub agent_state: Option<Json>,
    pub last_error_code: Option<String>,
    pub last_error_message: Option<String>,
    pub last_activity_at: DateTimeUtc,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub started_at: Option<DateTimeUtc>,
    pub ended_at: Option<DateTimeUtc>,
    /// Bumped by a trigger on every change of the representation (`ETag`).
    pub row_version: i64,
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
    #[sea_orm(
        belongs_to = "super::task_environment::Entity",
        from = "Column::TaskEnvironmentId",
        to = "super::task_environment::Column::Id"
    )]
    Environment,
}

impl Related<super::task::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Task.def()
    }
}

impl Related<super::task_environment::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Environment.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
