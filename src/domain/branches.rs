//! The branch policy. berth deletes only branches it created (recorded when the environment that
//! `git worktree add -b` made them for is published, or its attempt fails: `branch_origin = created` on the
//! inventory row, and the `task_branches` ledger), only when a task is deleted (archive and reset keep every
//! branch), only after the worktree is gone, and only when the branch holds nothing its base or its upstream
//! lacks, or the delete request said `delete_branches=true`. A branch the user named that already existed, or
//! a default branch that existed before the task, is never deleted, consent or not; neither is one whose
//! origin is unknown (inventory rows from before the record existed). Every decision is reported with its
//! reason.
use crate::ids::{RepositoryId, TaskId, WorkspaceId};
use std::path::Path;

use serde::Serialize;
use utoipa::ToSchema;

use super::Ctx;
use super::cleanup::branch_report::{BranchAction, BranchDecision, BranchReason};
use super::cleanup::{WorktreeSnapshot, snapshot_of};
use crate::auth::UnboundPrincipal;
use crate::entity::cleanup_job::{self as job, CleanupTrigger};
use crate::entity::task;
use crate::entity::task_environment_repo::BranchOrigin;
use crate::error::Result;
use crate::executor::worktree::{Materialized, SlotPlan};
use crate::git::cli::GitError;
use crate::git::{BranchDeletionConsent, BranchName, MergedBranch};
use crate::store::{branches as store, repositories as repo_store, tasks as task_store};

fn decision(w: &WorktreeSnapshot, branch: &str, action: BranchAction, reason: BranchReason) -> BranchDecision {
    BranchDecision {
        repository_id: w.repository_id,
        branch: branch.to_string(),
        action,
        reason,
    }
}

/// The triggers whose jobs delete branches: those that delete the task.
pub fn deletes_branches(trigger: CleanupTrigger) -> bool {
    use CleanupTrigger::*;
    matches!(trigger, Delete | CascadeDelete | QuickChatExpire | WorkspaceDelete)
}

/// At materialization: who made each slot's branch. A branch this attempt created is recorded in the
/// ledger; a branch that already existed is berth's only if the ledger says berth created it for this
/// same task (an earlier environment of it, before a reset); otherwise it is the user's.
pub(crate) async fn record_origins(
    txn: &sea_orm::DatabaseTransaction,
    owner: &task::Model,
    plans: &[SlotPlan],
    made: &[Materialized],
) -> Result<Vec<Option<BranchOrigin>>> {
    let mut origins = Vec::with_capacity(made.len());
    for m in made {
        let (Some(plan), Some(branch)) = (
            plans.iter().find(|p| p.position == m.position),
            m.worktree_branch.as_deref(),
        ) else {
            origins.push(None);
            continue;
        };
        if m.branch_existed == Some(false) {
            store::record_created(txn, owner.workspace_id, m.repository_id, branch, &plan.base, owner.id).await?;
            origins.push(Some(BranchOrigin::Created));
            continue;
        }
        let ours = store::find(txn, m.repository_id, branch)
            .await?
            .is_some_and(|l| l.task_id == Some(owner.id));
        origins.push(Some(if ours {
            BranchOrigin::Created
        } else if plan.branch_named {
            BranchOrigin::UserNamed
        } else {
            BranchOrigin::ExistedBefore
        }));
    }
    Ok(origins)
}

/// What to do with one worktree's branch. `own_worktree` is the task's worktree, when it is still there
/// (a prediction before the job ran): its checkout of the branch does not count.
async fn decide(
    ctx: &Ctx,
    w: &WorktreeSnapshot,
    consent: Option<&BranchDeletionConsent>,
    own_worktree: Option<&Path>,
) -> Option<(BranchDecision, Option<MergedBranch>)> {
    use BranchAction::*;
    use BranchReason::*;
    let name = w.branch.as_deref()?;
    let keep = |reason| Some((decision(w, name, Keep, reason), None));
    match w.branch_origin {
        Some(BranchOrigin::Created) => {}
        Some(BranchOrigin::UserNamed) => return keep(UserNamed),
        Some(BranchOrigin::ExistedBefore) => return keep(ExistedBefore),
        None => return keep(OriginUnknown),
    }
    let Ok(branch) = BranchName::parse(name) else {
        return keep(Unavailable);
    };
    let repo = Path::new(&w.repository_path);
    let asked: std::result::Result<_, GitError> = async {
        let Some(tip) = ctx.git.branch_tip(repo, &branch).await? else {
            return Ok(None);
        };
        let own = own_worktree.and_then(|p| p.canonicalize().ok());
        let elsewhere = ctx
            .git
            .checked_out_at(repo, &branch)
            .await?
            .into_iter()
            .any(|p| p.canonicalize().ok().unwrap_or(p) != *own.as_deref().unwrap_or(Path::new("")));
        let merged = MergedBranch::prove(ctx.git.as_ref(), repo, &branch, &tip, w.base_branch.as_deref()).await?;
        Ok(Some((elsewhere, merged)))
    }
    .await;
    match asked {
        Err(e) => {
            tracing::warn!(repository = %w.repository_id, error = %e, "could not inspect a branch; keeping it");
            keep(Unavailable)
        }
        Ok(None) => Some((decision(w, name, Delete, AlreadyGone), None)),
        Ok(Some((true, _))) => keep(CheckedOut),
        Ok(Some((false, Some((proof, in_base))))) => {
            let reason = if in_base { Merged } else { UpstreamHasCommits };
            Some((decision(w, name, Delete, reason), Some(proof)))
        }
        Ok(Some((false, None))) if consent.is_some() => Some((decision(w, name, Delete, Consented), None)),
        Ok(Some((false, None))) => keep(NotMerged),
    }
}

/// In the cleanup job, once the worktree is gone: decides and deletes. Err: git failed deleting a branch
/// it meant to delete (worth another attempt; the decision is made again then).
pub(crate) async fn delete_after_worktree(
    ctx: &Ctx,
    w: &WorktreeSnapshot,
    consent: Option<&BranchDeletionConsent>,
) -> std::result::Result<Option<BranchDecision>, anyhow::Error> {
    let Some((decision, proof)) = decide(ctx, w, consent, None).await else {
        return Ok(None);
    };
    if decision.action == BranchAction::Delete {
        let repo = Path::new(&w.repository_path);
        match (decision.reason, proof, consent) {
            (BranchReason::AlreadyGone, _, _) => {}
            (_, Some(proof), _) => ctx.git.branch_delete_merged(repo, &proof).await?,
            (BranchReason::Consented, None, Some(consent)) => {
                let branch = BranchName::parse(&decision.branch).map_err(|e| anyhow::anyhow!(e))?;
                ctx.git.branch_delete_consented(repo, &branch, consent).await?;
            }
            _ => return Ok(Some(decision)),
        }
        store::forget(&ctx.db.conn, w.repository_id, &decision.branch).await?;
    }
    Ok(Some(decision))
}

/// The branches berth created for the job's task that none of its snapshot's worktrees names: their
/// worktrees are already gone (an archive, a reset, a superseded environment's cleanup removed them),
/// and a delete still owes them the policy. As branch-only entries (no worktree path).
pub(crate) async fn ledger_only(ctx: &Ctx, snap: &super::cleanup::Snapshot) -> Result<Vec<WorktreeSnapshot>> {
    let named = |repository_id: RepositoryId, branch: &str| {
        snap.environment
            .iter()
            .chain(snap.superseded.iter())
            .flat_map(|e| e.worktrees.iter())
            .any(|w| w.repository_id == repository_id && w.branch.as_deref() == Some(branch))
    };
    let mut out = Vec::new();
    for row in store::of_task(&ctx.db.conn, snap.task_id).await? {
        if named(row.repository_id, &row.branch) {
            continue;
        }
        let Some(repo) = repo_store::find(&ctx.db.conn, row.repository_id).await? else {
            continue;
        };
        out.push(WorktreeSnapshot {
            repository_id: row.repository_id,
            repository_path: repo.path,
            common_git_dir: repo.common_git_dir,
            worktree_path: String::new(),
            worktree_id: None,
            branch: Some(row.branch),
            branch_origin: Some(BranchOrigin::Created),
            base_branch: Some(row.base_branch),
            adopted_root: None,
        });
    }
    Ok(out)
}

/// For the delete answer: what the jobs will do with each branch, as things stand now (the jobs decide
/// again once the worktrees are gone, and record what they did in their snapshots).
pub async fn predict(ctx: &Ctx, jobs: &[job::Model]) -> Vec<BranchDecision> {
    let mut out = Vec::new();
    for j in jobs {
        let Ok(snap) = snapshot_of(j) else { continue };
        if !deletes_branches(j.trigger) {
            continue;
        }
        if !snap.branches.is_empty() {
            // The job already ran.
            out.extend(snap.branches);
            continue;
        }
        let consent = snap.delete_branches.as_ref();
        for w in snap
            .environment
            .iter()
            .chain(snap.superseded.iter())
            .flat_map(|e| e.worktrees.iter())
        {
            if let Some((d, _)) = decide(ctx, w, consent, Some(Path::new(&w.worktree_path))).await {
                out.push(d);
            }
        }
        for w in ledger_only(ctx, &snap).await.unwrap_or_default() {
            if let Some((d, _)) = decide(ctx, &w, consent, None).await {
                out.push(d);
            }
        }
    }
    out
}

/// A branch berth created that is still in its repository.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeftoverBranch {
    pub repository_id: RepositoryId,
    pub branch: String,
    /// The task it was created for; null when that task is gone.
    pub task_id: Option<TaskId>,
    /// Every commit is in its base branch, or its upstream has them all.
    pub merged: bool,
}

/// The berth-created branches still present in the workspace's repositories (scope `tasks:read`).
pub async fn leftovers(ctx: &Ctx, p: &UnboundPrincipal, workspace_id: WorkspaceId) -> Result<Vec<LeftoverBranch>> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let mut out = Vec::new();
    for l in store::of_workspace(&ctx.db.conn, workspace_id).await? {
        let (Some(repo), Ok(branch)) = (
            repo_store::find(&ctx.db.conn, l.repository_id).await?,
            BranchName::parse(&l.branch),
        ) else {
            continue;
        };
        let path = Path::new(&repo.path);
        let Ok(Some(tip)) = ctx.git.branch_tip(path, &branch).await else {
            continue;
        };
        let merged = MergedBranch::prove(ctx.git.as_ref(), path, &branch, &tip, Some(&l.base_branch))
            .await
            .ok()
            .flatten()
            .is_some();
        let task_id = match l.task_id {
            Some(id) => task_store::find(&ctx.db.conn, id).await?.map(|t| t.id),
            None => None,
        };
        out.push(LeftoverBranch {
            repository_id: l.repository_id,
            branch: l.branch,
            task_id,
            merged,
        });
    }
    Ok(out)
}
