//! What a claimed job destroys, and what it must not (I8, I11, I13): the snapshot names the resources;
//! at destruction time a path another environment adopted, an environment passed to another task or
//! still used by a live one, and a dirty worktree without recorded consent are all left alone.
use crate::ids::EnvironmentId;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::anyhow;

use super::state::JobEvent;
pub use super::worktrees::Outcome;
use super::worktrees::{
    Decisions, Dirty, branch_after, branch_kept, claimed_by_another, destroy_worktree, materializer_pending, retry,
};
use super::{Snapshot, snapshot_of};
use crate::domain::branches;
use crate::domain::cleanup::branch_report::BranchDecision;
use crate::domain::writer::{self, Asking, WriterLease};
use crate::domain::{Ctx, environments};
use crate::entity::cleanup_job as job;
use crate::entity::task_environment::EnvironmentStatus;
use crate::error::Result;
use crate::managed_path::ManagedRoot;
use crate::store::cleanup_jobs::JobPatch;
use crate::store::tasks::{self as task_store, live_inheritors};
use crate::store::{environments as env_store, sessions as sessions_store};

/// A job whose snapshot holds no session and no environment, and whose trigger needs no re-check
/// (archive jobs first check that the task is still archived): executing it would change nothing.
pub fn nothing_to_do(j: &job::Model) -> bool {
    !j.trigger.is_archive()
        && snapshot_of(j).is_ok_and(|s| {
            s.environment.is_none()
                && s.superseded.is_empty()
                && s.sessions.is_empty()
                && s.agents.is_empty()
                && s.conversations.is_empty()
        })
}

/// The transition that records an attempt's outcome, with the columns it sets: the retry schedule,
/// then terminal `failed` once the attempts are spent.
pub fn record_of(ctx: &Ctx, j: &job::Model, outcome: Outcome) -> (JobEvent, JobPatch) {
    let now = crate::clock::now();
    let (event, error, next) = match outcome {
        Outcome::Done => (JobEvent::Succeed, None, None),
        Outcome::DoneKeeping(kept) => (JobEvent::Succeed, Some(kept.join("; ")), None),
        Outcome::Cancelled(why) => (JobEvent::ReasonGone, Some(why.to_string()), None),
        Outcome::Terminal(e) => (JobEvent::Fail, Some(format!("{e:#}")), None),
        Outcome::Wait { until, why } => {
            let patch = JobPatch {
                // The claim counted an attempt; waiting is not one.
                attempts: Some((j.attempts - 1).max(0)),
                last_error: Some(Some(why.to_string())),
                next_attempt_at: Some(Some(until)),
                lease_owner: Some(None),
                lease_expires_at: Some(None),
                ..Default::default()
            };
            return (JobEvent::RetryLater, patch);
        }
        Outcome::Retry(e) if j.attempts >= j.max_attempts => (JobEvent::Fail, Some(format!("{e:#}")), None),
        Outcome::Retry(e) => {
            let delays = &ctx.config.cleanup_retry_delays;
            let delay = delays[((j.attempts - 1).max(0) as usize).min(delays.len() - 1)];
            let at = now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::hours(1));
            (JobEvent::RetryLater, Some(format!("{e:#}")), Some(at))
        }
    };
    let finished = matches!(event, JobEvent::Succeed | JobEvent::Fail);
    let patch = JobPatch {
        last_error: Some(error),
        next_attempt_at: Some(next),
        lease_owner: Some(None),
        lease_expires_at: Some(None),
        completed_at: Some(finished.then_some(now)),
        ..Default::default()
    };
    (event, patch)
}

/// Runs a job from its snapshot (the task row may be gone). `lost` turns true when the heartbeat finds
/// the lease taken: stop before touching anything else.
pub async fn execute(ctx: &Ctx, j: &job::Model, lost: &AtomicBool) -> Outcome {
    let snap: Snapshot = match snapshot_of(j) {
        Ok(s) => s,
        Err(e) => return Outcome::Terminal(e.into()),
    };
    if j.trigger.is_archive() {
        match task_store::find(&ctx.db.conn, snap.task_id).await {
            Ok(Some(t)) if t.archived_at.is_none() => return Outcome::Cancelled("the task was unarchived"),
            Ok(_) => {}
            Err(e) => return retry(e),
        }
    }
    // I8: processes first, wherever they run: nothing is touched while one may still work in a worktree.
    for s in &snap.sessions {
        if let Err(e) = crate::domain::sessions::end_agent(ctx, *s).await {
            return retry(e);
        }
    }
    // Agents of this node that the job recorded and no row names any more (a delete accepted while this
    // node was down): ended here, each only if its process group is proven to be that agent's.
    if let Err(e) = end_recorded_agents(ctx, &snap).await {
        return retry(e);
    }
    // The deleted sessions' conversations are on this node's disk (the job runs on the agents' node).
    for id in &snap.conversations {
        crate::domain::sessions::remove_conversation(ctx, *id).await;
    }
    let mut kept = Vec::new();
    let mut branches = branches::deletes_branches(j.trigger).then(Vec::new);
    // Each environment's paths are touched only by the one writer of its worktrees: a restore or a
    // landing that holds the lease finishes first (the job is retried), a holder gone with its instance
    // is taken over.
    if let Some(env_snap) = &snap.environment {
        let dirty = if super::marks_of(j).keep_dirty_worktrees {
            Dirty::Keep
        } else if j.trigger.deletes_sessions() {
            // The task is gone: a worktree it leaves is owned by nothing unless it is listed.
            Dirty::FailListed
        } else {
            Dirty::Fail
        };
        let lease = match writer::acquire(ctx, env_snap.id, Asking::Cleanup(j.id)).await {
            Ok(lease) => lease,
            Err(e) => return held_elsewhere(e),
        };
        let how = Removal { dirty, lease: &lease };
        let cleaned = clean_current(ctx, &snap, env_snap, how, lost, &mut kept, &mut branches).await;
        writer::release(ctx, lease).await;
        match cleaned {
            Outcome::Done => {}
            other => return other,
        }
    }
    // What earlier environments left on disk goes with the task's lifecycle too.
    for env_snap in &snap.superseded {
        let lease = match writer::acquire(ctx, env_snap.id, Asking::Cleanup(j.id)).await {
            Ok(lease) => lease,
            Err(e) => return held_elsewhere(e),
        };
        let cleaned = super::leftovers::clean(ctx, &snap, env_snap, lost, &mut kept, &mut branches, &lease).await;
        writer::release(ctx, lease).await;
        match cleaned {
            Outcome::Done => {}
            other => return other,
        }
    }
    if branches.is_some() {
        // A delete owes the policy also the task's branches whose worktrees an earlier cleanup removed.
        let rest = match branches::ledger_only(ctx, &snap).await {
            Ok(rest) => rest,
            Err(e) => return retry(e),
        };
        for w in &rest {
            match branch_after(ctx, &snap, w, &mut branches).await {
                Outcome::Done => {}
                other => return other,
            }
        }
    }
    if let Some(decisions) = branches
        && let Err(e) = record_branches(ctx, j, &snap, decisions).await
    {
        return retry(e);
    }
    if kept.is_empty() {
        Outcome::Done
    } else {
        Outcome::DoneKeeping(kept)
    }
}

/// The lease is another writer's (a restore or a landing that began before the barrier): the job waits
/// for it without spending an attempt; any other failure is a retry.
fn held_elsewhere(e: crate::error::Error) -> Outcome {
    match e {
        crate::error::Error::WriterBusy(_) => Outcome::Wait {
            until: crate::clock::now() + chrono::Duration::seconds(1),
            why: "another writer holds the environment's worktrees (a restore or a landing); waiting for it",
        },
        other => retry(other),
    }
}

/// How the current environment's worktrees are removed: what a dirty one gets, under which lease.
struct Removal<'a> {
    dirty: Dirty,
    lease: &'a WriterLease,
}

/// The task's current environment: its worktrees, its branches (on a delete), its root, its record.
async fn clean_current(
    ctx: &Ctx,
    snap: &Snapshot,
    env_snap: &super::EnvironmentSnapshot,
    Removal { dirty, lease }: Removal<'_>,
    lost: &AtomicBool,
    kept: &mut Vec<String>,
    decisions: &mut Decisions,
) -> Outcome {
    if let Some(not_yet) = materializer_pending(ctx, env_snap).await {
        return not_yet;
    }
    match shared_elsewhere(ctx, snap, env_snap.id).await {
        Ok(true) => return Outcome::Done,
        Ok(false) => {}
        Err(e) => return retry(e),
    }
    let root = ManagedRoot::from_config(&ctx.config);
    let mut keeps_one = false;
    for w in &env_snap.worktrees {
        if lost.load(Ordering::Acquire) {
            return Outcome::Retry(anyhow!("the lease was lost"));
        }
        // A path that another environment's inventory now names (it adopted it) is not this job's.
        match claimed_by_another(ctx, env_snap.id, &w.worktree_path).await {
            Ok(true) => {
                branch_kept(decisions, w);
                continue;
            }
            Ok(false) => {}
            Err(e) => return retry(e),
        }
        let owner = super::kept::Owner {
            workspace_id: snap.workspace_id,
            task_id: Some(snap.task_id),
            environment_id: Some(env_snap.id),
        };
        match destroy_worktree(
            ctx,
            w,
            snap.discard_worktree_changes.as_ref(),
            dirty,
            owner,
            kept,
            lease,
        )
        .await
        {
            Outcome::Done => {}
            other => return other,
        }
        if std::fs::symlink_metadata(&w.worktree_path).is_ok() {
            // Kept (with its changes, listed): so are its branch and its checkpoints.
            branch_kept(decisions, w);
            keeps_one = true;
            continue;
        }
        match branch_after(ctx, snap, w, decisions).await {
            Outcome::Done => {}
            other => return other,
        }
    }
    if !env_snap.task_root.is_empty()
        && let Ok(dir) = root.adopt(Path::new(&env_snap.task_root))
    {
        // Only if empty: berth never removes what the inventory does not name (I13).
        let _ = std::fs::remove_dir(dir.as_path());
    }
    // The environment's checkpoints go with it (berth's refs in its repositories), unless it keeps a
    // worktree: they are that work's restore points, and go when it is disposed of.
    let repositories: Vec<String> = env_snap.worktrees.iter().map(|w| w.repository_path.clone()).collect();
    if !keeps_one && let Err(e) = crate::domain::checkpoints::forget(ctx, env_snap.id, &repositories, lease).await {
        return retry(e);
    }
    match retire_environment(ctx, snap, env_snap.id).await {
        Ok(()) => Outcome::Done,
        Err(e) => retry(e),
    }
}

async fn end_recorded_agents(ctx: &Ctx, snap: &Snapshot) -> crate::error::Result<()> {
    for a in &snap.agents {
        let Some(pid) = a.pid else { continue };
        if a.node_id != ctx.config.node_id {
            continue;
        }
        if crate::store::executions::find(&ctx.db.conn, a.execution_id)
            .await?
            .is_some()
        {
            // Still named by a row: `end_agent` and restore see to it.
            continue;
        }
        if let crate::runtime::Orphan::Lingering =
            crate::runtime::end_orphan(pid as u32, a.execution_id, ctx.config.agent_term_grace).await
        {
            return Err(crate::error::Error::Unavailable(format!(
                "an agent of the deleted sessions (pid {pid}) outlived SIGKILL"
            )));
        }
    }
    Ok(())
}

/// What the job did with the branches, in its snapshot (what `GET /cleanup-jobs/{id}` shows).
async fn record_branches(ctx: &Ctx, j: &job::Model, snap: &Snapshot, decisions: Vec<BranchDecision>) -> Result<()> {
    let recorded = Snapshot {
        branches: decisions,
        ..snap.clone()
    };
    let value = serde_json::to_value(&recorded).map_err(|e| crate::error::Error::Internal(e.into()))?;
    let value = super::with_marks(value, &super::marks_of(j));
    let txn = ctx.db.begin_write().await?;
    crate::store::cleanup_jobs::set_snapshot(&txn, j.id, value).await?;
    ctx.commit(txn).await
}

/// Re-checked at destruction time (I8): the environment was transferred to another task, or a live task
/// still works in it.
async fn shared_elsewhere(ctx: &Ctx, snap: &Snapshot, env_id: EnvironmentId) -> Result<bool> {
    let conn = &ctx.db.conn;
    let Some(e) = env_store::find(conn, env_id).await? else {
        return Ok(false);
    };
    if e.task_id != snap.task_id {
        return Ok(true);
    }
    if !live_inheritors(conn, snap.task_id).await?.is_empty() {
        return Ok(true);
    }
    for b in sessions_store::live_borrowers(conn, env_id, snap.task_id).await? {
        if task_store::find(conn, b.task_id)
            .await?
            .is_some_and(|t| t.archived_at.is_none())
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// After destruction: the inventory rows are `deleted` and the environment superseded, if it still
/// belongs to the job's task.
async fn retire_environment(ctx: &Ctx, snap: &Snapshot, env_id: EnvironmentId) -> Result<()> {
    let now = crate::clock::now();
    let txn = ctx.db.begin_write().await?;
    let Some(e) = env_store::find(&txn, env_id).await? else {
        txn.rollback().await?;
        return Ok(());
    };
    if e.task_id != snap.task_id {
        txn.rollback().await?;
        return Ok(());
    }
    env_store::delete_inventory(&txn, env_id, now).await?;
    // The environment still belongs to the job's task, so the task row is there (it cascades).
    if e.status != EnvironmentStatus::Superseded
        && let Some(t) = task_store::find(&txn, snap.task_id).await?
    {
        environments::supersede(&txn, ctx, &t, env_id, "cleanup").await?;
    }
    ctx.commit(txn).await
}
