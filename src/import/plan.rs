//! What the import will write, in berth's terms but still keyed by kandev ids (the writer maps them to
//! berth ids). Built by `normalize` and `mapping` from the kandev rows alone: no database, no disk.
use crate::entity::cleanup_job::{CleanupJobState, CleanupTrigger};
use crate::entity::git_status_observation::ObservationKind;
use crate::entity::session_message::MessageRole;
use crate::entity::task::{TaskKind, WorkspaceMode};
use crate::entity::task_environment::{EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::EnvironmentRepoStatus;
use crate::entity::task_session::SessionState;

use super::model::{Repository, Ts};
use super::report::Entry;

#[derive(Debug, Default)]
pub struct Plan {
    pub repositories: Vec<Repository>,
    pub tasks: Vec<PlannedTask>,
    pub environments: Vec<PlannedEnv>,
    pub sessions: Vec<PlannedSession>,
    pub messages: Vec<PlannedMessage>,
    pub observations: Vec<PlannedObservation>,
    /// kandev's cleanup work still owed, carried over as berth cleanup jobs.
    pub jobs: Vec<PlannedJob>,
    pub history: Vec<Entry>,
    pub refused: Vec<Entry>,
}

#[derive(Debug, Clone)]
pub struct PlannedTask {
    pub id: String,
    pub title: String,
    pub description: String,
    /// The parent's kandev id, when the parent is imported too.
    pub parent_id: Option<String>,
    pub kind: TaskKind,
    pub mode: WorkspaceMode,
    pub archived_at: Option<Ts>,
    pub created_at: Ts,
    pub updated_at: Ts,
    pub slots: Vec<PlannedSlot>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSlot {
    pub repository_id: String,
    pub branch_slug: String,
    pub base_branch: Option<String>,
    pub branch: Option<String>,
    pub position: i32,
}

#[derive(Debug, Clone)]
pub struct PlannedEnv {
    /// `imported_from`: the kandev environment id, or `task:<task id>` for one the import creates.
    pub key: String,
    pub task_id: String,
    pub executor: ExecutorType,
    pub status: EnvironmentStatus,
    pub workspace_path: Option<String>,
    pub created_at: Ts,
    pub updated_at: Ts,
    pub rows: Vec<PlannedRow>,
}

#[derive(Debug, Clone)]
pub struct PlannedRow {
    /// `imported_from`: the kandev physical `worktree_id`, or `env-repo:<row id>` for a row without one.
    pub key: String,
    pub repository_id: String,
    pub branch_slug: String,
    pub worktree_path: Option<String>,
    pub worktree_branch: Option<String>,
    pub position: i32,
    pub status: EnvironmentRepoStatus,
    pub error_message: Option<String>,
    pub created_at: Ts,
    pub updated_at: Ts,
}

impl PlannedRow {
    /// A row that records a physical worktree (not a preparation failure).
    pub fn is_worktree(&self) -> bool {
        self.worktree_path.is_some() && !self.key.starts_with("env-repo:")
    }
}

#[derive(Debug, Clone)]
pub struct PlannedSession {
    pub id: String,
    pub task_id: String,
    /// The `PlannedEnv::key` it is bound to (its own task's, or the environment it borrows).
    pub env_key: String,
    pub executor: ExecutorType,
    pub state: SessionState,
    pub name: String,
    pub is_primary: bool,
    pub created_at: Ts,
    pub updated_at: Ts,
    pub ended_at: Option<Ts>,
}

#[derive(Debug, Clone)]
pub struct PlannedMessage {
    pub id: String,
    pub session_id: String,
    pub role: MessageRole,
    pub content: serde_json::Value,
    pub created_at: Ts,
}

#[derive(Debug, Clone)]
pub struct PlannedObservation {
    pub id: String,
    pub env_key: String,
    pub repository_id: String,
    pub session_id: Option<String>,
    pub kind: ObservationKind,
    pub observed_at: Ts,
    pub branch: Option<String>,
    pub head_commit: Option<String>,
    pub upstream: Option<String>,
    pub ahead: i32,
    pub behind: i32,
    pub files: serde_json::Value,
}

/// What the import found out about a kandev repository's path (read-only, before the transaction).
#[derive(Debug, Clone)]
pub struct RepoProbe {
    /// The canonical work tree root, or kandev's path as recorded when it is not a git repository.
    pub path: String,
    /// `None` when the path is not a git repository (imported as `missing`).
    pub common_git_dir: Option<String>,
    pub head_branch: Option<String>,
}

/// A berth cleanup job the import writes for kandev's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedJob {
    /// kandev's job ids: several owed jobs of one task become one berth job (one active job per task, I7).
    pub ids: Vec<String>,
    /// kandev's task id; the task is imported (archived) or kandev deleted it.
    pub task_id: String,
    pub trigger: CleanupTrigger,
    /// `pending` (the worker runs it) or `failed` (kandev gave up; an operator may retry it in berth).
    pub state: CleanupJobState,
    pub last_error: Option<String>,
    pub worktrees: Vec<JobWorktree>,
    /// The consent to discard changes that kandev's job recorded (`discard_worktree_changes`).
    pub discard_worktree_changes: bool,
}

/// A worktree kandev's job snapshot named, by kandev's repository id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobWorktree {
    pub repository_id: String,
    pub path: String,
    pub branch: Option<String>,
    pub base_branch: Option<String>,
}
