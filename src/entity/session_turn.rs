use crate::ids::{CheckpointId, EnvironmentId, SessionId, TurnId};
use sea_orm::entity::prelude::*;

/// One prompt of a session, from its delivery to the agent to its settling.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "session_turns")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: TurnId,
    pub session_id: SessionId,
    pub task_environment_id: Option<EnvironmentId>,
    /// 1 for a session's first turn.
    pub number: i32,
    pub prompt: String,
    pub started_at: DateTimeUtc,
    pub settled_at: Option<DateTimeUtc>,
    pub start_checkpoint_id: Option<CheckpointId>,
    pub end_checkpoint_id: Option<CheckpointId>,
    pub files_changed: Option<i32>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
