use crate::ids::{RepositoryId, TaskId, TaskRepositoryId};
use sea_orm::entity::prelude::*;

/// A repository slot a task asks for. The physical inventory lives in `task_environment_repos`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "task_repositories")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: TaskRepositoryId,
    pub task_id: TaskId,
    pub repository_id: RepositoryId,
    pub branch_slug: String,
    pub base_branch: Option<String>,
    pub branch: Option<String>,
    pub position: i32,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {
    #[sea_orm(
        belongs_to = "super::task::Entity",
        from = "Column::TaskId",
        to = "super::task::Column::Id"
    )]
    Task,
    #[sea_orm(
        belongs_to = "super::repository::Entity",
        from = "Column::RepositoryId",
        to = "super::repository::Column::Id"
    )]
    Repository,
}

impl Related<super::task::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Task.def()
    }
}

impl Related<super::repository::Entity> for Entity {
    fn to() -> RelationDef {
        Relation::Repository.def()
    }
}

impl ActiveModelBehavior for ActiveModel {}
