use crate::ids::{SessionId, TaskId, UsageRecordId, WorkspaceId};
use sea_orm::entity::prelude::*;

/// What one assistant message (or one running total's step) cost, as its agent reported it. It
/// outlives its session and task: only its workspace takes it away.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "usage_records")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: UsageRecordId,
    pub workspace_id: WorkspaceId,
    pub task_id: TaskId,
    pub session_id: SessionId,
    /// The session's turn it belongs to, when one had started.
    pub turn: Option<i32>,
    pub agent_profile: String,
    /// The model the agent named (`unknown` when it named none).
    pub model: String,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    /// Billionths of `currency`'s unit.
    pub cost_nanos: Option<i64>,
    pub currency: Option<String>,
    /// The running total this record's cost was the step of (agents that report one).
    pub cumulative_cost_nanos: Option<i64>,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
