use crate::ids::{EnvironmentId, PullRequestId, RepositoryId, TaskId};
use sea_orm::entity::prelude::*;

/// A pull request berth opened for a task, with its state as last read from its host.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "pull_requests")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: PullRequestId,
    pub task_id: TaskId,
    pub task_environment_id: EnvironmentId,
    pub repository_id: RepositoryId,
    /// The API it was opened through (GitHub's, or a GitHub Enterprise's).
    pub api_url: String,
    pub owner: String,
    pub repo: String,
    pub number: i64,
    /// Its page.
    pub url: String,
    /// `open`, `closed` or `merged`.
    pub state: String,
    pub draft: bool,
    pub head: String,
    pub base: String,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// When its state was last read from its host.
    pub checked_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
