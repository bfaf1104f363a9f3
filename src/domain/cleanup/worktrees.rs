//! The primitives a cleanup job removes worktrees with, shared by the current environment's cleanup
//! (`execute`) and the earlier environments' (`leftovers`): how an attempt ends, removing one worktree
//! (only inside the managed root, dirty ones only with consent, or kept and reported), forgetting exactly
//! the registration berth recorded, the branch decisions of a delete, and the wait for a materializer
//! that may still be making what a job would remove.
use crate::ids::{EnvironmentId, InstanceId};
use std::path::Path;

use anyhow::anyhow;

use super::WorktreeSnapshot;
use super::kept::Found;
use super::{EnvironmentSnapshot, Snapshot};
use crate::domain::Ctx;
use crate::domain::branches;
use crate::domain::cleanup::branch_report::{BranchAction, BranchDecision, BranchReason};
use crate::domain::writer::WriterLease;
use crate::entity::task_environment::EnvironmentStatus;
use crate::error::Result;
use crate::managed_path::{Consent, ManagedPath, RecordedRegistration, RegistrationError};
use crate::store::environments as env_store;

/// How an attempt ended. Errors keep their source chain until they are stored (`{:#}`).
#[derive(Debug)]
pub enum Outcome {
    Done,
    /// Done, but something was left in place and is reported (in the job's `last_error`): a git
    /// registration that could not be proven to be the one berth recorded.
    DoneKeeping(Vec<String>),
    /// The reason for the job went away (the task was unarchived): nothing was removed.
    Cancelled(&'static str),
    /// Worth another attempt later.
    Retry(anyhow::Error),
    /// Not yet: due again at `until`, and not an attempt (it spends none of the budget).
    Wait {
        until: chrono::DateTime<chrono::Utc>,
        why: &'static str,
    },
    /// Retrying cannot help (for example a dirty worktree without consent): fail now, touch nothing.
    Terminal(anyhow::Error),
}

pub(super) fn retry(e: impl Into<anyhow::Error>) -> Outcome {
    Outcome::Retry(e.into())
}

/// What a task delete did with each branch (`None`: the job deletes no branch).
pub(super) type Decisions = Option<Vec<BranchDecision>>;

/// A worktree stays: so does its branch (reported on a delete).
pub(super) fn branch_kept(decisions: &mut Decisions, w: &WorktreeSnapshot) {
    if let (Some(d), Some(b)) = (decisions.as_mut(), &w.branch) {
        d.push(BranchDecision {
            repository_id: w.repository_id,
            branch: b.clone(),
            action: BranchAction::Keep,
            reason: BranchReason::WorktreeKept,
        });
    }
}

/// Only a task delete, only once the worktree is gone, only what the policy allows.
pub(super) async fn branch_after(
    ctx: &Ctx,
    snap: &Snapshot,
    w: &WorktreeSnapshot,
    decisions: &mut Decisions,
) -> Outcome {
    let Some(d) = decisions.as_mut() else {
        return Outcome::Done;
    };
    match branches::delete_after_worktree(ctx, w, snap.delete_branches.as_ref()).await {
        Ok(made) => {
            d.extend(made);
            Outcome::Done
        }
        Err(e) => retry(e.context("deleting a branch failed")),
    }
}

/// Another live (not superseded) environment's inventory names this path.
pub(super) async fn claimed_by_another(ctx: &Ctx, env_id: EnvironmentId, path: &str) -> Result<bool> {
    Ok(env_store::others_naming(&ctx.db.conn, path, env_id)
        .await?
        .iter()
        .any(|e| e.status != EnvironmentStatus::Superseded))
}

/// What a worktree with changes and no consent does to the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dirty {
    /// The current worktree of a task that is still there (archive, reset): the job fails, touching
    /// nothing (I11); the task still owns it.
    Fail,
    /// The current worktree of a task that is gone (a delete): the job fails touching nothing, and the
    /// worktree, owned by nothing now, is listed under leftovers.
    FailListed,
    /// A superseded environment's, or one whose delete consented to keeping dirty work: kept, listed,
    /// and the job goes on.
    Keep,
}

/// Removes one worktree the snapshot names. `Done` also when it was kept (`Dirty::Keep`, reported in
/// `kept`): the caller tells the two apart by `kept`.
pub(super) async fn destroy_worktree(
    ctx: &Ctx,
    w: &WorktreeSnapshot,
    consent: Option<&Consent>,
    dirty_policy: Dirty,
    owner: super::kept::Owner,
    kept: &mut Vec<String>,
    _lease: &WriterLease,
) -> Outcome {
    // I13: only inside the managed root, never through a symlink.
    let root = match w.root(&ctx.config) {
        Ok(r) => r,
        Err(e) => {
            return Outcome::Terminal(anyhow::Error::new(e).context("refusing an adopted worktree's directory"));
        }
    };
    let target = match root.adopt(Path::new(&w.worktree_path)) {
        Ok(t) => t,
        Err(e) => {
            return Outcome::Terminal(
                anyhow::Error::new(e).context("refusing a worktree path outside the managed root"),
            );
        }
    };
    let repo = Path::new(&w.repository_path);
    let meta = std::fs::symlink_metadata(target.as_path());
    if meta.is_err() {
        // Already gone counts as done (I9); forget its registration, and only that one.
        return forget_registration(ctx, repo, &target, w, kept).await;
    }
    if meta.is_ok_and(|m| m.file_type().is_symlink()) {
        return Outcome::Terminal(anyhow!("the worktree path is a symlink; not following it"));
    }
    // git never runs in a directory that is not the worktree berth made (a user replaced or re-cloned
    // it): that directory is the user's, removed only with consent, moved aside otherwise.
    match super::kept::examine(&target, w).await {
        Found::Worktree => {}
        Found::RepositoryAway => return retry(anyhow!("the repository's git directory is not there")),
        Found::Refused(refusal) => {
            return match super::kept::refused_directory(ctx, &root, &target, w, owner, consent, refusal).await {
                Ok(()) => forget_registration(ctx, repo, &target, w, kept).await,
                // Moving or removing it failed: it will fail the same way again (permissions, a full disk).
                Err(e) => Outcome::Terminal(e),
            };
        }
    }
    let dirty = match ctx.git.dirty_file_count(target.as_path()).await {
        Ok(n) => n,
        Err(e) => return retry(e),
    };
    let removed = match (dirty, consent) {
        (0, _) => ctx.git.worktree_remove(repo, &target).await,
        // I11: forced only with the consent the job recorded.
        (_, Some(consent)) => ctx.git.worktree_remove_consented(repo, &target, consent).await,
        (_, None) if dirty_policy == Dirty::Keep => {
            tracing::warn!(repository = %w.repository_id, dirty, "kept a worktree holding changes");
            if let Err(e) = super::kept::keep_dirty(ctx, owner, w, dirty).await {
                return retry(e);
            }
            kept.push(format!(
                "kept the worktree of repository {}: {dirty} changed files and removing them was not consented to; listed under leftovers",
                w.repository_id
            ));
            return Outcome::Done;
        }
        (_, None) => {
            if dirty_policy == Dirty::FailListed
                && let Err(e) = super::kept::keep_dirty(ctx, owner, w, dirty).await
            {
                return retry(e);
            }
            return Outcome::Terminal(anyhow!(
                "the worktree of repository {} has {dirty} changed files and removing them was not consented to",
                w.repository_id
            ));
        }
    };
    if let Err(e) = removed {
        // Exit code 128 is not proof of anything: look.
        if std::fs::symlink_metadata(target.as_path()).is_err() {
            return forget_registration(ctx, repo, &target, w, kept).await;
        }
        return retry(e);
    }
    // `git worktree remove` removed its registration with it.
    Outcome::Done
}

/// The worktree directory is gone: remove the registration berth recorded for it (its worktree id),
/// once proven to name this managed path; anything else is left and reported (never a
/// repository-wide prune, which drops the user's own missing worktrees too).
async fn forget_registration(
    ctx: &Ctx,
    repo: &Path,
    target: &ManagedPath,
    w: &WorktreeSnapshot,
    kept: &mut Vec<String>,
) -> Outcome {
    let Some(id) = w.worktree_id.as_deref() else {
        // A planned path of an unfinished materialization: nothing recorded, nothing to prove.
        return Outcome::Done;
    };
    if !repo.is_dir() {
        return Outcome::Done;
    }
    let mut keep = |why: String| {
        tracing::warn!(repository = %w.repository_id, worktree_id = id, reason = %why, "kept a worktree registration");
        kept.push(format!(
            "kept the registration {id} of repository {}: {why}",
            w.repository_id
        ));
        Outcome::Done
    };
    match RecordedRegistration::prove(target, Path::new(&w.common_git_dir), id) {
        Ok(None) => Outcome::Done,
        // It came back between the two looks: the next attempt removes it properly.
        Err(RegistrationError::StillThere) => retry(anyhow!("the worktree directory reappeared")),
        Err(e) => keep(e.to_string()),
        Ok(Some(proof)) => match ctx.git.worktree_forget(repo, &proof).await {
            Ok(()) => Outcome::Done,
            Err(_) if std::fs::symlink_metadata(proof.admin_dir()).is_err() => Outcome::Done,
            Err(e) => keep(e.to_string()),
        },
    }
}

/// How long a job waits in place for a materializer of this process before it lets its claim go (and
/// looks again later): well within any job lease, which its heartbeat renews meanwhile.
const IN_PLACE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits for a materializer of this process, a bounded while (no re-poll, so no events meanwhile):
/// whether it finished, so the job goes on the moment it is done.
async fn finished_here(ctx: &Ctx, materializer_id: Option<InstanceId>) -> bool {
    let deadline = tokio::time::Instant::now() + IN_PLACE_WAIT;
    ctx.materializing.finished(materializer_id, deadline).await
}

/// I13 with I14: nothing is removed under a materializer that may still be making it. `None` once none
/// can be (or there never was one); else how this attempt ends.
pub(super) async fn materializer_pending(ctx: &Ctx, env_snap: &EnvironmentSnapshot) -> Option<Outcome> {
    use crate::domain::environments::is_fresh_creating;
    let preparing = || Some(Outcome::Retry(anyhow!("the environment is still being prepared")));
    match env_store::find(&ctx.db.conn, env_snap.id).await {
        // Still being materialized: its publish (a transition: its launch) will meet the barrier and
        // remove what it made; wait (in place when it runs here). Abandoned by a crash (lease expired):
        // nobody will publish it; its planned paths are in the snapshot.
        Ok(Some(e)) if is_fresh_creating(ctx, &e) => {
            if !(ctx.materializing.is_running(e.materializer_id) && finished_here(ctx, e.materializer_id).await) {
                return preparing();
            }
            // Ours, and done: its row says what it left.
            match env_store::find(&ctx.db.conn, env_snap.id).await {
                Ok(Some(e)) if is_fresh_creating(ctx, &e) => preparing(),
                Ok(_) => None,
                Err(e) => Some(retry(e)),
            }
        }
        // Gone with its task while it was being made: its materializer may still be running git, and no
        // row shows it any more. Its publish meets the barrier and removes what it made; if it is killed
        // first, what it made is at the planned paths this job removes once it is surely done.
        Ok(None) => {
            let f = env_snap.in_flight.as_ref()?;
            let mut until = crate::domain::environments::still_in_flight(ctx, f)?;
            if f.here == Some(ctx.instance_id) {
                if finished_here(ctx, f.materializer_id).await {
                    return None;
                }
                until = crate::domain::environments::still_in_flight(ctx, f)?;
            }
            Some(Outcome::Wait {
                until,
                why: "the environment was being prepared when its task went; waiting for its materializer",
            })
        }
        Ok(_) => None,
        Err(e) => Some(retry(e)),
    }
}
