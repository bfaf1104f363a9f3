use crate::ids::{RepositoryId, TaskBranchId, TaskId, WorkspaceId};
use sea_orm::entity::prelude::*;

/// A branch berth created for a task: the ledger behind `GET /workspaces/{id}/branches`. It outlives the
/// task (no foreign key to it) and goes when berth deletes the branch, or with the repository.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "task_branches")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: TaskBranchId,
    pub workspace_id: WorkspaceId,
    pub repository_id: RepositoryId,
    pub branch: String,
    pub base_branch: String,
    pub task_id: Option<TaskId>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
