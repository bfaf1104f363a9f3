use crate::ids::{ColumnId, WorkspaceId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What moves a task into a column on its own (issue 40 item 4); a task is only ever moved forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum MovesInOn {
    /// A session of the task started (its agent was launched).
    #[sea_orm(string_value = "session_started")]
    SessionStarted,
    /// The task's work was merged into its base branch.
    #[sea_orm(string_value = "merged")]
    Merged,
}

/// One column of a workspace's board.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "workspace_columns")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ColumnId,
    pub workspace_id: WorkspaceId,
    pub name: String,
    /// 0 is the first; positions are dense.
    pub position: i32,
    pub moves_in_on: Option<MovesInOn>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
