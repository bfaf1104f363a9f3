//! What a task's earlier environments left on disk. A reset whose job could not finish, an executor
//! transition, a transition a crash cut off: each leaves a superseded (or failed) environment whose
//! inventory still names worktrees. The task's archive and delete name them in their snapshot
//! (`barrier::leftover_environments`), and the reconcile pass (`reconcile`) makes a `superseded_cleanup`
//! job for those of tasks that live on. Either way this is what runs: the same sharing and managed-path
//! rules as the current environment's worktrees, except that a worktree holding changes without consent
//! is kept and reported instead of failing the job (never destroyed without consent, and nobody is
//! waiting on a superseded worktree). A task's archive and delete also name an executor transition's
//! candidate that is still `creating` (I18): this waits for its materializer first, as the current
//! environment's cleanup does.
use crate::ids::EnvironmentId;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::anyhow;

use super::worktrees::{Decisions, Dirty, Outcome, branch_after, branch_kept, claimed_by_another, destroy_worktree};
use super::{EnvironmentSnapshot, Snapshot};
use crate::domain::Ctx;
use crate::domain::writer::WriterLease;
use crate::error::Result;
use crate::managed_path::ManagedRoot;
use crate::store::{environments as env_store, sessions as sessions_store, tasks as task_store};

/// Removes what `env_snap` names, keeping (and reporting in `kept`) dirty worktrees without consent;
/// the inventory rows of what is gone become `deleted`, the kept ones stay.
pub async fn clean(
    ctx: &Ctx,
    snap: &Snapshot,
    env_snap: &EnvironmentSnapshot,
    lost: &AtomicBool,
    kept: &mut Vec<String>,
    decisions: &mut Decisions,
    lease: &WriterLease,
) -> Outcome {
    // An executor transition's candidate, perhaps still being made.
    if let Some(not_yet) = super::worktrees::materializer_pending(ctx, env_snap).await {
        return not_yet;
    }
    match in_use(ctx, snap, env_snap.id).await {
        Ok(Some(why)) => return Outcome::Retry(anyhow!(why)),
        Ok(None) => {}
        Err(e) => return Outcome::Retry(e.into()),
    }
    let root = ManagedRoot::from_config(&ctx.config);
    let mut gone = Vec::new();
    for w in &env_snap.worktrees {
        if lost.load(Ordering::Acquire) {
            return Outcome::Retry(anyhow!("the lease was lost"));
        }
        // Adopted by a live environment since the snapshot: not this environment's any more.
        match claimed_by_another(ctx, env_snap.id, &w.worktree_path).await {
            Ok(true) => {
                gone.push(w.worktree_path.clone());
                branch_kept(decisions, w);
                continue;
            }
            Ok(false) => {}
            Err(e) => return Outcome::Retry(e.into()),
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
            Dirty::Keep,
            owner,
            kept,
            lease,
        )
        .await
        {
            Outcome::Done => {}
            other => return other,
        }
        if std::fs::symlink_metadata(&w.worktree_path).is_err() {
            gone.push(w.worktree_path.clone());
            match branch_after(ctx, snap, w, decisions).await {
                Outcome::Done => {}
                other => return other,
            }
        } else {
            branch_kept(decisions, w);
        }
    }
    if !env_snap.task_root.is_empty()
        && let Ok(dir) = root.adopt(Path::new(&env_snap.task_root))
    {
        // Only if empty (I13).
        let _ = std::fs::remove_dir(dir.as_path());
    }
    // Its checkpoints go with it, unless it keeps a worktree: they are that work's history (a restore
    // point), and go when the kept worktree is disposed of.
    let repositories: Vec<String> = env_snap.worktrees.iter().map(|w| w.repository_path.clone()).collect();
    if gone.len() == env_snap.worktrees.len()
        && let Err(e) = crate::domain::checkpoints::forget(ctx, env_snap.id, &repositories, lease).await
    {
        return Outcome::Retry(e.into());
    }
    match retire(ctx, snap, env_snap.id, &gone).await {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Retry(e.into()),
    }
}

/// Re-checked at destruction time (I8): a superseded environment passed to another task, or one a live
/// session still works in (another task's borrower, or a `superseded_cleanup` that raced a relaunch),
/// is not touched now.
async fn in_use(ctx: &Ctx, snap: &Snapshot, env_id: EnvironmentId) -> Result<Option<&'static str>> {
    let conn = &ctx.db.conn;
    let Some(e) = env_store::find(conn, env_id).await? else {
        return Ok(None);
    };
    if e.task_id != snap.task_id {
        return Ok(Some("the environment belongs to another task now"));
    }
    for s in sessions_store::in_environment(conn, env_id).await? {
        if s.state.is_busy() || ctx.runtime.is_live(s.id) {
            let borrower_archived = s.task_id != snap.task_id
                && task_store::find(conn, s.task_id)
                    .await?
                    .is_none_or(|t| t.archived_at.is_some());
            if !borrower_archived && !snap.sessions.contains(&s.id) {
                return Ok(Some("a live session still uses the superseded environment"));
            }
        }
    }
    Ok(None)
}

/// The rows of what is gone become `deleted`, if the environment still belongs to the job's task.
async fn retire(ctx: &Ctx, snap: &Snapshot, env_id: EnvironmentId, gone: &[String]) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    let belongs = env_store::find(&txn, env_id)
        .await?
        .is_some_and(|e| e.task_id == snap.task_id);
    if belongs {
        env_store::delete_inventory_paths(&txn, env_id, gone, crate::clock::now()).await?;
    }
    ctx.commit(txn).await
}
