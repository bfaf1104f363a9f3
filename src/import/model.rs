//! kandev's rows as the importer reads them (`docs/kandev-schema.md`), as plain structs: empty text is
//! already `None` ("absent"), timestamps are parsed instants, a missing column has its documented default.
use chrono::{DateTime, Utc};

pub type Ts = DateTime<Utc>;

/// Which schema generation the file has (docs/kandev-schema.md §2), detected from the schema, never the
/// version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Generation {
    /// `task_session_worktrees` and the flat environment columns.
    Legacy,
    /// Legacy, with lifecycle columns on `task_environment_repos` (a preview build).
    LegacyPreview,
    /// The normalized shape plus a stale `task_session_worktrees`.
    Hybrid,
    Normalized,
}

#[derive(Debug, Clone, Default)]
pub struct Source {
    pub generation: Option<Generation>,
    pub kandev_version: Option<String>,
    pub repositories: Vec<Repository>,
    pub tasks: Vec<Task>,
    pub task_repositories: Vec<TaskRepository>,
    /// `executors.id` → `executors.type`.
    pub executors: Vec<(String, String)>,
    pub environments: Vec<Environment>,
    pub env_repos: Vec<EnvRepo>,
    pub sessions: Vec<Session>,
    pub session_worktrees: Vec<SessionWorktree>,
    pub messages: Vec<Message>,
    pub snapshots: Vec<GitSnapshot>,
    pub cleanup_jobs: Vec<CleanupJob>,
}

#[derive(Debug, Clone)]
pub struct Repository {
    pub id: String,
    pub name: String,
    pub local_path: Option<String>,
    pub default_branch: Option<String>,
    pub deleted_at: Option<Ts>,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone)]
pub struct Task {
    pub id: String,
    pub title: String,
    pub description: Option<String>,
    pub parent_id: Option<String>,
    pub ephemeral: bool,
    pub archived_at: Option<Ts>,
    /// `metadata.workspace.mode`: `inherit_parent`, `new_workspace` or `shared_group`.
    pub workspace_mode: Option<String>,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone)]
pub struct TaskRepository {
    pub task_id: String,
    pub repository_id: String,
    pub base_branch: Option<String>,
    pub checkout_branch: Option<String>,
    pub position: i64,
}

/// The deprecated flat worktree columns of a legacy `task_environments` row.
#[derive(Debug, Clone)]
pub struct FlatWorktree {
    pub repository_id: Option<String>,
    pub worktree_id: String,
    pub path: Option<String>,
    pub branch: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Environment {
    pub id: String,
    pub task_id: String,
    pub executor_type: Option<String>,
    pub status: Option<String>,
    pub workspace_path: Option<String>,
    /// Present only when the flat columns exist and `worktree_id` is not empty.
    pub flat: Option<FlatWorktree>,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone)]
pub struct EnvRepo {
    pub id: String,
    pub env_id: String,
    pub repository_id: String,
    pub branch_slug: String,
    pub worktree_id: Option<String>,
    pub path: Option<String>,
    pub branch: Option<String>,
    pub position: i64,
    pub error_message: Option<String>,
    /// `status='deleted'` or `deleted_at` set.
    pub deleted: bool,
    pub merged: bool,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub task_id: String,
    /// kandev's state, upper case (`RUNNING`, `COMPLETED`, ...).
    pub state: String,
    pub env_id: Option<String>,
    pub executor_id: Option<String>,
    pub name: Option<String>,
    pub is_primary: bool,
    pub started_at: Ts,
    pub updated_at: Ts,
    pub completed_at: Option<Ts>,
}

impl Session {
    /// `COMPLETED`, `FAILED` and `CANCELLED` are terminal; every other state is live.
    pub fn is_terminal(&self) -> bool {
        matches!(self.state.as_str(), "COMPLETED" | "FAILED" | "CANCELLED")
    }
}

#[derive(Debug, Clone)]
pub struct SessionWorktree {
    pub id: String,
    pub session_id: String,
    pub worktree_id: Option<String>,
    pub repository_id: Option<String>,
    pub branch_slug: String,
    pub position: i64,
    pub path: Option<String>,
    pub branch: Option<String>,
    /// `status='deleted'` or `deleted_at` set.
    pub deleted: bool,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone)]
pub struct Message {
    pub id: String,
    pub session_id: String,
    pub author_type: String,
    pub kind: String,
    pub content: String,
    pub created_at: Ts,
}

#[derive(Debug, Clone)]
pub struct GitSnapshot {
    pub id: String,
    pub session_id: Option<String>,
    /// Later kandev builds key the table by environment.
    pub env_id: Option<String>,
    pub snapshot_type: Option<String>,
    pub triggered_by: Option<String>,
    pub branch: Option<String>,
    pub remote_branch: Option<String>,
    pub head_commit: Option<String>,
    pub ahead: i64,
    pub behind: i64,
    pub files: serde_json::Value,
    /// `metadata.repository_name`; `None` names the single (or root) repository.
    pub repository_name: Option<String>,
    pub created_at: Ts,
}

#[derive(Debug, Clone)]
pub struct CleanupJob {
    pub id: String,
    pub task_id: Option<String>,
    pub trigger: String,
    pub state: Option<String>,
    /// `resource_snapshot`: what kandev meant to remove (`worktrees`, `discard_worktree_changes`, ...).
    pub snapshot: serde_json::Value,
    pub last_error: Option<String>,
    pub created_at: Ts,
}
