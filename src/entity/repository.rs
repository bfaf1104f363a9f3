use crate::ids::{RepositoryId, WorkspaceId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Whether the repository's path was a git repository when berth recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum RepositoryStatus {
    #[sea_orm(string_value = "available")]
    Available,
    /// Imported from kandev with a path that was not a git repository: kept, never used for a launch.
    #[sea_orm(string_value = "missing")]
    Missing,
}

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "repositories")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: RepositoryId,
    pub workspace_id: WorkspaceId,
    pub name: String,
    pub path: String,
    pub common_git_dir: String,
    pub default_branch: String,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// Soft delete: archived tasks keep referring to a deregistered repository.
    pub deleted_at: Option<DateTimeUtc>,
    /// The kandev id this row was imported from (`berth import kandev`); null for rows berth made.
    pub imported_from: Option<String>,
    /// `missing` when the path was not a git repository at import time.
    pub status: RepositoryStatus,
    /// The node that registered it, whose disk holds it; none for one registered before nodes were
    /// recorded.
    pub node_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(has_many = "super::task_repository::Entity")]
    Slots,
}

impl Related<super::task_repository::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Slots.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
