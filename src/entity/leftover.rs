use crate::ids::{EnvironmentId, LeftoverId, RepositoryId, TaskId, WorkspaceId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Why berth left a directory on disk (issue 38): it holds someone's work and nobody consented to
/// discarding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum LeftoverReason {
    /// A worktree with changes nobody consented to discard (a superseded environment's, or a deleted
    /// task's): kept where it is, still a git worktree.
    #[sea_orm(string_value = "dirty_worktree")]
    DirtyWorktree,
    /// What sat in a worktree's place that admission refused (no longer the worktree, or no longer the
    /// repository's): moved aside under the worktree root, untouched by git.
    #[sea_orm(string_value = "set_aside")]
    SetAside,
}

/// A directory berth kept (`GET /workspaces/{id}/leftovers`). No foreign keys: it outlives its task.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "leftovers")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: LeftoverId,
    pub workspace_id: WorkspaceId,
    pub task_id: Option<TaskId>,
    pub task_environment_id: Option<EnvironmentId>,
    pub repository_id: Option<RepositoryId>,
    pub path: String,
    pub original_path: String,
    pub reason: LeftoverReason,
    pub detail: String,
    pub worktree: Json,
    pub created_at: DateTimeUtc,
    /// The node whose disk holds it; none for one kept before nodes were recorded.
    pub node_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
