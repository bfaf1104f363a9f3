use crate::ids::{EnvironmentId, ExecutionId, InstanceId, SessionId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The life of one agent process (the transitions are in `domain::sessions::state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum ExecutionState {
    /// Recorded before the process is spawned.
    #[sea_orm(string_value = "starting")]
    Starting,
    #[sea_orm(string_value = "running")]
    Running,
    /// Ended as asked (a stop), or found over after a restart.
    #[sea_orm(string_value = "exited")]
    Exited,
    /// Did not start, or died unasked.
    #[sea_orm(string_value = "failed")]
    Failed,
}

/// The durable handle of one agent process: written before the process is reported running.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "agent_executions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ExecutionId,
    pub session_id: SessionId,
    pub task_environment_id: Option<EnvironmentId>,
    pub instance_id: InstanceId,
    pub node_id: String,
    pub pid: Option<i32>,
    pub state: ExecutionState,
    pub workspace_path: String,
    pub exit_code: Option<i32>,
    pub started_at: DateTimeUtc,
    pub ended_at: Option<DateTimeUtc>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
