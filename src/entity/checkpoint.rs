use crate::ids::{CheckpointId, EnvironmentId, SessionId};
use sea_orm::entity::prelude::*;

/// The state of an environment's worktrees at one moment: one git tree per slot.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "checkpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: CheckpointId,
    pub task_environment_id: EnvironmentId,
    pub session_id: Option<SessionId>,
    /// `[{repository_id, position, tree}]`
    pub trees: Json,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
