use crate::ids::{EnvironmentId, ExecutionId, InstanceId, SessionId, TaskId, WorkspaceId};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "events")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub seq: i64,
    pub instance_id: InstanceId,
    #[sea_orm(column_name = "type")]
    pub event_type: crate::event_type::EventType,
    pub workspace_id: Option<WorkspaceId>,
    pub task_id: Option<TaskId>,
    pub session_id: Option<SessionId>,
    pub task_environment_id: Option<EnvironmentId>,
    pub execution_id: Option<ExecutionId>,
    pub data: Json,
    pub created_at: DateTimeUtc,
    /// Who did it: the token's `sub`; null when berth did it on its own.
    pub actor_sub: Option<String>,
    /// For an agent's session-bound token: its session.
    pub actor_session_id: Option<SessionId>,
    /// PostgreSQL: the write-order id the sequencer stamps `seq` by; null on SQLite, where `seq` is
    /// assigned in the writing transaction. Never shown to clients.
    pub id: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
