use crate::ids::{EnvironmentId, EnvironmentRepoId, RepositoryId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentRepoStatus {
    #[sea_orm(string_value = "active")]
    Active,
    #[sea_orm(string_value = "merged")]
    Merged,
    #[sea_orm(string_value = "deleted")]
    Deleted,
    #[sea_orm(string_value = "failed")]
    Failed,
}

/// Who made a worktree's branch (issue 17): only a branch berth `created` may ever be deleted by berth.
/// Null on rows from before the record existed: unknown, so never deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum BranchOrigin {
    /// berth created it for the task (`git worktree add -b`): the default `berth/<task>` branch, or a
    /// named branch that did not exist yet.
    #[sea_orm(string_value = "created")]
    Created,
    /// The user named a branch that already existed.
    #[sea_orm(string_value = "user_named")]
    UserNamed,
    /// The default branch name already existed before the task (not berth's to delete).
    #[sea_orm(string_value = "existed_before")]
    ExistedBefore,
}

/// The canonical physical-worktree inventory: one active row per (environment, repository, branch slot).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "task_environment_repos")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: EnvironmentRepoId,
    pub task_environment_id: EnvironmentId,
    pub repository_id: RepositoryId,
    pub branch_slug: String,
    pub worktree_id: Option<String>,
    pub worktree_path: Option<String>,
    pub worktree_branch: Option<String>,
    pub base_commit: Option<String>,
    pub position: i32,
    pub status: EnvironmentRepoStatus,
    pub error_message: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub merged_at: Option<DateTimeUtc>,
    pub deleted_at: Option<DateTimeUtc>,
    /// Bumped by a trigger on every change of the representation (`ETag`).
    pub row_version: i64,
    pub branch_origin: Option<BranchOrigin>,
    /// The kandev id this row was imported from (`berth import kandev`); null for rows berth made.
    pub imported_from: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::task_environment::Entity",
        from = "Column::TaskEnvironmentId",
        to = "super::task_environment::Column::Id"
    )]
    Environment,
    #[sea_orm(
        belongs_to = "super::repository::Entity",
        from = "Column::RepositoryId",
        to = "super::repository::Column::Id"
    )]
    Repository,
}

impl Related<super::task_environment::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Environment.def()
    }
}

impl Related<super::repository::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Repository.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
