use crate::ids::{EnvironmentId, InstanceId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Who writes an environment's worktrees now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum Writer {
    /// An agent's turn, from the prompt's delivery until the turn settled (`attention` included).
    #[sea_orm(string_value = "turn")]
    Turn,
    /// A restore to a checkpoint.
    #[sea_orm(string_value = "restore")]
    Restore,
    /// A commit, or a merge that updates a checkout.
    #[sea_orm(string_value = "landing")]
    Landing,
    /// A cleanup job (current, superseded or leftovers) removing what the environment has on disk.
    #[sea_orm(string_value = "cleanup")]
    Cleanup,
}

/// The one writer of an environment's worktrees, while its instance lives.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "writer_leases")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub task_environment_id: EnvironmentId,
    /// This holding: release and takeover are compare-and-set on it.
    pub token: Uuid,
    pub holder: Writer,
    /// The session (a turn) or the cleanup job that holds it.
    pub holder_id: Option<Uuid>,
    pub node_id: String,
    pub instance_id: InstanceId,
    pub acquired_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
