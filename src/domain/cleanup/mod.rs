//! Task lifecycle cleanup (seed 001, I5-I13): the only owners of physical cleanup are task archive,
//! delete (and cascades), workspace delete, quick-chat expiry and environment reset
//! (`domain::task_lifecycle`). Each writes a durable job `prepared` with a complete snapshot found
//! through the task (never through sessions) before its mutation, and activates it (`pending`) only once
//! the mutation committed (`barrier`). The worker (`worker::cleanup`) claims it and runs `execute`, which
//! destroys what the snapshot names, re-checking sharing at that moment. Every state write of a job is
//! one transition of `state`'s table; operators list, retry and cancel through `jobs`.
pub mod barrier;
pub mod branch_report;
pub mod claim;
pub mod disposal;
pub mod execute;
pub mod jobs;
pub mod kept;
pub mod leftovers;
pub mod reconcile;
pub mod session_delete;
pub mod state;
pub mod worktrees;

use crate::ids::{EnvironmentId, ExecutionId, InstanceId, RepositoryId, SessionId, TaskId, WorkspaceId};
use serde::{Deserialize, Serialize};

use crate::entity::cleanup_job as job;
use crate::entity::task_environment_repo::BranchOrigin;
use crate::error::{Error, Result};
use crate::git::BranchDeletionConsent;
use crate::managed_path::{Consent, ManagedRoot};
use branch_report::BranchDecision;

pub use crate::entity::cleanup_job::{CleanupJobState, CleanupTrigger};
pub use jobs::{JobFilter, WaitReason, WaitingFor, cancel, get, list, retry, waiting_for};
pub use state::{InvalidTransition, JobEvent};

/// What a job destroys, captured before the mutation (I6). Survives the task row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub task_id: TaskId,
    pub workspace_id: WorkspaceId,
    /// The environment the task owns, if it owns one with anything on disk.
    pub environment: Option<EnvironmentSnapshot>,
    /// The task's earlier environments that still name worktrees (superseded, failed attempts). Their
    /// dirty worktrees are kept and reported unless the job has consent.
    #[serde(default)]
    pub superseded: Vec<EnvironmentSnapshot>,
    /// Sessions whose agents are stopped before anything is touched.
    pub sessions: Vec<SessionId>,
    /// The agents those sessions had running when the job was written. A delete whose agents' node is
    /// down is accepted; the rows naming them go with the task, so the job, which runs on that node
    /// once it is back, ends each of these (proven by its process group's mark) before it touches
    /// anything (I8).
    #[serde(default)]
    pub agents: Vec<AgentProcess>,
    /// Sessions whose conversations berth keeps on the job's node (a delete's; never an archive's or a
    /// reset's, whose sessions stay): removed there once the agents ended, so a delete carried out by
    /// another node, or accepted while this one was down, still removes what is on this node's disk.
    #[serde(default)]
    pub conversations: Vec<SessionId>,
    /// I11: consent to remove worktrees with uncommitted or untracked changes, as the request gave it
    /// (stored as a boolean).
    #[serde(with = "crate::managed_path::recorded_consent")]
    pub discard_worktree_changes: Option<Consent>,
    /// Consent to delete berth-created branches that are not merged (`delete_branches=true` on a task
    /// delete), stored as a boolean.
    #[serde(default, with = "crate::git::recorded_branch_consent")]
    pub delete_branches: Option<BranchDeletionConsent>,
    /// What the job did with each worktree's branch, written once it ran.
    #[serde(default)]
    pub branches: Vec<BranchDecision>,
}

/// What a job records beside its snapshot, in the same JSON object but read and written on its own (every
/// writer of a `Snapshot` keeps them: `with_marks`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Marks {
    /// Consent to go ahead without the dirty check (`keep_dirty_worktrees=true`, for a delete whose
    /// node was down, where the check could not be made): a worktree with changes is kept where it is
    /// and listed under leftovers, never removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_dirty_worktrees: bool,
    /// Set when a decommission ended the job: what it would have removed, kept for the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abandoned: Option<Abandoned>,
}

/// What a job a decommission ended would have removed on its node's disk.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Abandoned {
    /// The node given up.
    pub node_id: String,
    /// When it was.
    pub at: chrono::DateTime<chrono::Utc>,
    /// The worktree paths of every environment the snapshot names.
    pub worktree_paths: Vec<String>,
}

/// The marks a job's snapshot carries (none on an unreadable one).
pub fn marks_of(j: &job::Model) -> Marks {
    serde_json::from_value(j.resource_snapshot.clone()).unwrap_or_default()
}

/// `snapshot` with `marks` written into it.
pub fn with_marks(mut snapshot: serde_json::Value, marks: &Marks) -> serde_json::Value {
    if let (Some(obj), Ok(serde_json::Value::Object(m))) = (snapshot.as_object_mut(), serde_json::to_value(marks)) {
        obj.extend(m);
    }
    snapshot
}

/// An agent process as a job recorded it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentProcess {
    pub execution_id: ExecutionId,
    pub node_id: String,
    pub pid: Option<i32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvironmentSnapshot {
    pub id: EnvironmentId,
    pub task_root: String,
    pub worktrees: Vec<WorktreeSnapshot>,
    /// The environment was being made when the job was written: its materializer may still make
    /// worktrees that no row records once the mutation removed its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlight>,
}

/// A materialization a job's mutation overtook (`environments::in_flight`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InFlight {
    /// When its lease runs out at the latest: the mutation's commit ended its heartbeats. What a job of
    /// another instance waits for; one of `here` waits for the materializer itself to finish.
    pub until: chrono::DateTime<chrono::Utc>,
    pub materializer_id: Option<InstanceId>,
    /// The instance that ran it, when that was the instance that wrote the job.
    pub here: Option<InstanceId>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorktreeSnapshot {
    pub repository_id: RepositoryId,
    pub repository_path: String,
    pub common_git_dir: String,
    pub worktree_path: String,
    pub worktree_id: Option<String>,
    pub branch: Option<String>,
    /// Who made the branch; absent (unknown) in snapshots from before it was recorded.
    #[serde(default)]
    pub branch_origin: Option<BranchOrigin>,
    /// What "fully merged" is measured against: the slot's base branch.
    #[serde(default)]
    pub base_branch: Option<String>,
    /// An imported (adopted) worktree outside `BERTH_WORKTREE_ROOT` is managed inside the directory the
    /// import found it in (kandev's task directory); absent: inside the configured root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_root: Option<String>,
}

impl WorktreeSnapshot {
    /// The root the worktree is managed in (I13): the configured one, or the directory an import adopted
    /// it in.
    pub fn root(
        &self,
        config: &crate::config::Config,
    ) -> std::result::Result<ManagedRoot, crate::managed_path::PathError> {
        match &self.adopted_root {
            Some(dir) => ManagedRoot::adopted(std::path::Path::new(dir)),
            None => Ok(ManagedRoot::from_config(config)),
        }
    }

    /// The `adopted_root` of a worktree an import adopted at `path`: its directory, when that lies outside
    /// the configured root (inside it, the configured root manages it).
    pub fn adopted_root_of(config: &crate::config::Config, path: &str) -> Option<String> {
        let p = std::path::Path::new(path);
        if p.starts_with(&config.worktree_root) {
            return None;
        }
        p.parent().map(|d| d.to_string_lossy().into_owned())
    }
}

pub fn snapshot_of(j: &job::Model) -> Result<Snapshot> {
    serde_json::from_value(j.resource_snapshot.clone())
        .map_err(|e| Error::Internal(anyhow::anyhow!("job {} has an unreadable snapshot: {e}", j.id)))
}
