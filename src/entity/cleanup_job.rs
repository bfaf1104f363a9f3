use crate::ids::{CleanupJobId, EnvironmentId, OperationId, SessionId, TaskId, WorkspaceId};
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Where a cleanup job is in its life (documents the `state` strings; generated clients get an enum).
// The transitions: `domain::cleanup::state` (one table, one helper that writes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
pub enum CleanupJobState {
    // Written before its mutation (the barrier, I6); nothing runs it yet.
    #[sea_orm(string_value = "prepared")]
    Prepared,
    #[sea_orm(string_value = "pending")]
    Pending,
    #[sea_orm(string_value = "running")]
    Running,
    #[sea_orm(string_value = "retry_wait")]
    RetryWait,
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "failed")]
    Failed,
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
}

/// The lifecycle operation that wrote a cleanup job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize, ToSchema)]
#[sea_orm(rs_type = "String", db_type = "Text")]
#[serde(rename_all = "snake_case")]
#[schema(as = CleanupJobTrigger)]
pub enum CleanupTrigger {
    #[sea_orm(string_value = "archive")]
    Archive,
    #[sea_orm(string_value = "delete")]
    Delete,
    #[sea_orm(string_value = "cascade_archive")]
    CascadeArchive,
    #[sea_orm(string_value = "cascade_delete")]
    CascadeDelete,
    #[sea_orm(string_value = "workspace_delete")]
    WorkspaceDelete,
    #[sea_orm(string_value = "quick_chat_expire")]
    QuickChatExpire,
    #[sea_orm(string_value = "environment_reset")]
    EnvironmentReset,
    /// The reconcile pass (issue 17 item 1): what a superseded environment left on disk, once no session
    /// uses it and its grace period passed.
    #[sea_orm(string_value = "superseded_cleanup")]
    SupersededCleanup,
    /// Issue 39 item 2: what a session delete owes a node that was down when it was accepted (ending the
    /// session's agent there, removing its conversation). Touches no environment and no worktree.
    #[sea_orm(string_value = "session_delete")]
    SessionDelete,
}

impl CleanupTrigger {
    /// Archive jobs re-check that the task is still archived before they touch anything.
    pub fn is_archive(self) -> bool {
        matches!(self, CleanupTrigger::Archive | CleanupTrigger::CascadeArchive)
    }

    /// The operation deleted sessions: their conversations go with the job.
    pub fn deletes_sessions(self) -> bool {
        use CleanupTrigger::*;
        matches!(
            self,
            Delete | CascadeDelete | WorkspaceDelete | QuickChatExpire | SessionDelete
        )
    }
}

/// A durable cleanup job. No foreign key to its task: it outlives it (I9).
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "task_resource_cleanup_jobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: CleanupJobId,
    pub operation_id: OperationId,
    pub task_id: TaskId,
    pub workspace_id: WorkspaceId,
    pub task_environment_id: Option<EnvironmentId>,
    pub trigger: CleanupTrigger,
    pub state: CleanupJobState,
    pub attempts: i32,
    pub max_attempts: i32,
    pub next_attempt_at: Option<DateTimeUtc>,
    pub last_error: Option<String>,
    pub resource_snapshot: Json,
    pub node_id: String,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub completed_at: Option<DateTimeUtc>,
    /// Who asked for it: the token's `sub`; null when berth did on its own.
    pub actor_sub: Option<String>,
    pub actor_session_id: Option<SessionId>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// The states that hold the barrier (I7): sessions, environments and inventory rows cannot be created.
pub const ACTIVE_STATES: [CleanupJobState; 4] = [
    CleanupJobState::Prepared,
    CleanupJobState::Pending,
    CleanupJobState::Running,
    CleanupJobState::RetryWait,
];
