//! What a delete does with each branch berth created: predicted in the delete answer, recorded as done
//! in the cleanup job's snapshot. The policy that decides lives in `domain::branches`.
use crate::ids::RepositoryId;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BranchAction {
    Delete,
    Keep,
}

/// Why a branch is deleted or kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BranchReason {
    /// Deleted: every commit is in its base branch.
    Merged,
    /// Deleted: its upstream has every commit.
    UpstreamHasCommits,
    /// Deleted: not merged, but the request said `delete_branches=true`.
    Consented,
    /// Already gone: nothing to delete.
    AlreadyGone,
    /// Kept: the user named a branch that already existed.
    UserNamed,
    /// Kept: the branch existed before the task.
    ExistedBefore,
    /// Kept: created before berth recorded branch ownership; it cannot prove it made the branch.
    OriginUnknown,
    /// Kept: it has commits neither its base nor its upstream has.
    NotMerged,
    /// Kept: a worktree (the user's, or another task's) has it checked out.
    CheckedOut,
    /// Kept: the task's worktree stays (another environment adopted it, or it is still in use).
    WorktreeKept,
    /// Kept: git could not be asked; the branch is left as it is.
    Unavailable,
}

/// One branch's fate, in the delete answer (predicted) and in the cleanup job's snapshot (as done).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BranchDecision {
    pub repository_id: RepositoryId,
    pub branch: String,
    pub action: BranchAction,
    pub reason: BranchReason,
}
