//! Delete, with cascades and transfer to an heir (I8), and quick-chat expiry (I12), which goes through
//! the same path. Dirty worktrees need consent (I11).
use crate::ids::TaskId;
use std::collections::HashSet;

use serde_json::json;

use super::chain::{Leaving, keep_whole};
use crate::auth::UnboundPrincipal;
use crate::domain::Ctx;
use crate::domain::cleanup::barrier::{
    activate, leftover_environments, owned_environment, prepare, settle, stop_agents,
};
use crate::domain::cleanup::kept::{self, Found};
use crate::domain::cleanup::{CleanupTrigger, EnvironmentSnapshot, Marks, marks_of, snapshot_of, with_marks};
use crate::domain::nodes;
use crate::domain::tasks;
use crate::entity::cleanup_job as job;
use crate::entity::task;
use crate::error::{DirtyRepository, Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::git::BranchDeletionConsent;
use crate::managed_path::Consent;
use crate::store::cleanup_jobs::{self as jobs_store};
use crate::store::environments as env_store;
use crate::store::sessions as sessions_store;
use crate::store::tasks::{self as task_store, live_inheritors, lock_in_order, lock_task, subtree};

/// Which of a task's environments a dirty check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checked {
    /// The current one (a reset: only it is removed).
    Current,
    /// The current one and every earlier one still naming worktrees (a delete removes them all, so no
    /// dirty work is left without an owner).
    All,
}

/// I11: the worktrees of these tasks that hold changes, found before anything changes. A directory that
/// is no longer the worktree berth made is not asked (git never runs in it): the job moves it aside
/// whole, so nothing in it is lost (`cleanup::kept`). Worktrees on another node's disk are never judged
/// here (decision 4): while that node is down the check cannot be made, so the answer is `503
/// node_unavailable`, as for every request that needs its disk (a node given up holds nothing any more).
pub(super) async fn dirty_worktrees(ctx: &Ctx, tasks: &[task::Model], which: Checked) -> Result<Vec<DirtyRepository>> {
    let mut dirty = Vec::new();
    for t in tasks {
        for env in environments_of(ctx, t, which).await? {
            if !judged_here(ctx, &env).await? {
                continue;
            }
            for w in env.worktrees {
                let Ok(target) = w
                    .root(&ctx.config)
                    .and_then(|root| root.adopt(std::path::Path::new(&w.worktree_path)))
                else {
                    continue;
                };
                if !target.as_path().is_dir() {
                    continue;
                }
                match kept::examine(&target, &w).await {
                    Found::Worktree => {}
                    // Moved aside whole by the job: nothing in it is lost.
                    Found::Refused(_) => continue,
                    Found::RepositoryAway => {
                        return Err(Error::Unavailable("a worktree's repository is not there".into()));
                    }
                }
                match ctx.git.dirty_file_count(target.as_path()).await {
                    Ok(0) => {}
                    Ok(n) => dirty.push(DirtyRepository {
                        repository_id: w.repository_id,
                        task_environment_id: env.id,
                        dirty_file_count: n,
                    }),
                    // Unknown is not clean, and not dirty either: refuse, say so, change nothing.
                    Err(e) => return Err(Error::Unavailable(format!("inspecting a worktree failed: {e}"))),
                }
            }
        }
    }
    Ok(dirty)
}

/// The environments of `t` whose worktrees a cleanup of it removes.
async fn environments_of(ctx: &Ctx, t: &task::Model, which: Checked) -> Result<Vec<EnvironmentSnapshot>> {
    let mut envs = Vec::new();
    let current = owned_environment(&ctx.db.conn, ctx, t).await?;
    let current_id = current.as_ref().map(|(e, _)| e.id);
    envs.extend(current.map(|(_, snap)| snap));
    if which == Checked::All {
        envs.extend(leftover_environments(&ctx.db.conn, ctx, t, current_id).await?);
    }
    Ok(envs)
}

/// Whether this replica asks git about the environment's worktrees: only when they are on this node's
/// disk (decision 4). A request that reaches here for another node's disk was not forwarded there (the
/// node is down, or just died): `503 node_unavailable`. `false` for a node given up (it holds nothing).
async fn judged_here(ctx: &Ctx, env: &EnvironmentSnapshot) -> Result<bool> {
    if env.worktrees.is_empty() {
        return Ok(false);
    }
    let Some(e) = env_store::find(&ctx.db.conn, env.id).await? else {
        return Ok(true);
    };
    match nodes::here(ctx, &e.node_id).await {
        Ok(()) => Ok(true),
        Err(Error::NodeUnavailable {
            decommissioned: true, ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Refuses (`503 node_unavailable`) a delete of these tasks while a node holding one of their worktrees is
/// down: what is on its disk cannot be checked (a workspace delete, which asks no consent of its own).
pub(super) async fn refuse_down_nodes(ctx: &Ctx, tasks: &[task::Model]) -> Result<()> {
    for t in tasks {
        for env in environments_of(ctx, t, Checked::All).await? {
            judged_here(ctx, &env).await?;
        }
    }
    Ok(())
}

/// What a delete may do with worktrees that hold changes, as the request said.
#[derive(Debug, Clone, Default)]
pub struct DirtyConsent {
    /// `discard_worktree_changes=true` (I11): removed with their changes.
    pub discard: Option<Consent>,
    /// `keep_dirty_worktrees=true`: no dirty check (it cannot be made while a worktree's node is down);
    /// the job keeps each worktree with changes where it is and lists it under leftovers.
    pub keep: bool,
}

impl DirtyConsent {
    pub fn from_flags(discard: Option<bool>, keep: Option<bool>) -> Result<DirtyConsent> {
        let consent = DirtyConsent {
            discard: Consent::from_discard_flag(discard),
            keep: keep == Some(true),
        };
        if consent.keep && consent.discard.is_some() {
            return Err(Error::invalid(
                "keep_dirty_worktrees",
                "keeping and discarding dirty worktrees cannot both be asked",
            ));
        }
        Ok(consent)
    }

    /// Whether the dirty check runs before the delete: only when nothing was consented to.
    fn checks(&self) -> bool {
        self.discard.is_none() && !self.keep
    }
}

/// `consent` comes only from the request's explicit flags (I11).
pub async fn delete(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    task_id: TaskId,
    cascade: bool,
    dirty: DirtyConsent,
    branch_consent: Option<BranchDeletionConsent>,
) -> Result<Vec<job::Model>> {
    let root = tasks::readable(&ctx.db.conn, p, task_id).await?;
    let tasks = subtree(&ctx.db.conn, &root, cascade, true).await?;
    if dirty.checks() {
        // An environment that will pass to a surviving subtask loses nothing: not checked.
        let doomed: HashSet<TaskId> = tasks.iter().map(|t| t.id).collect();
        let mut checked = Vec::new();
        for t in &tasks {
            let heirs = live_inheritors(&ctx.db.conn, t.id).await?;
            if !heirs.iter().any(|h| !doomed.contains(&h.id)) {
                checked.push(t.clone());
            }
        }
        let dirty = dirty_worktrees(ctx, &checked, Checked::All).await?;
        if !dirty.is_empty() {
            return Err(Error::TaskDeleteDirtyWorktree(dirty));
        }
    }
    let trigger = |t: &task::Model| {
        if t.id == root.id {
            CleanupTrigger::Delete
        } else {
            CleanupTrigger::CascadeDelete
        }
    };
    delete_tasks(ctx, &tasks, trigger, &dirty, branch_consent.as_ref()).await
}

/// The shared delete path (task delete, cascade, quick-chat expiry): barrier, stop, transfer, delete.
pub(crate) async fn delete_tasks(
    ctx: &Ctx,
    tasks: &[task::Model],
    trigger: impl Fn(&task::Model) -> CleanupTrigger,
    dirty: &DirtyConsent,
    branch_consent: Option<&BranchDeletionConsent>,
) -> Result<Vec<job::Model>> {
    let doomed: HashSet<TaskId> = tasks.iter().map(|t| t.id).collect();
    let txn = ctx.db.begin_write().await?;
    lock_in_order(&txn, tasks).await?;
    let mut jobs = Vec::new();
    for t in tasks {
        let t = lock_task(&txn, t.id).await?;
        let mut j = prepare(&txn, ctx, &t, trigger(&t), dirty.discard.as_ref()).await?;
        if let Some(branch_consent) = branch_consent {
            // Consent to delete unmerged berth-created branches, recorded with the job.
            let mut snap = snapshot_of(&j)?;
            snap.delete_branches = Some(branch_consent.clone());
            j.resource_snapshot = serde_json::to_value(&snap).map_err(|e| Error::Internal(e.into()))?;
            jobs_store::set_snapshot(&txn, j.id, j.resource_snapshot.clone()).await?;
        }
        if dirty.keep {
            keep_dirty(&txn, &mut j).await?;
        }
        jobs.push(j);
    }
    ctx.commit(txn).await?;
    // I8: the rows this delete removes are what names the agents' processes; once they are gone no job
    // could have one stopped. An agent that did not stop (its node did not carry the stop out) refuses
    // the delete, which changes nothing (503, retryable).
    let stopped = stop_agents(ctx, &jobs).await;
    if stopped.is_err() {
        settle(ctx, &jobs, stopped).await?;
    }
    let mut sessions = Vec::new();
    for t in tasks {
        sessions.extend(
            sessions_store::of_task(&ctx.db.conn, t.id)
                .await?
                .into_iter()
                .map(|s| s.id),
        );
    }
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lock_in_order(&txn, tasks).await?;
        for (t, j) in tasks.iter().zip(jobs.iter_mut()) {
            // I8: the chain through the task stays whole; an environment that a surviving inheritor uses
            // is transferred, not destroyed.
            let t = &lock_task(&txn, t.id).await?;
            if keep_whole(&txn, ctx, t, j.task_environment_id, &doomed, Leaving::Delete).await? {
                let mut snap = snapshot_of(j)?;
                snap.environment = None;
                let value = serde_json::to_value(&snap).map_err(|e| Error::Internal(e.into()))?;
                j.resource_snapshot = with_marks(value, &marks_of(j));
                jobs_store::set_snapshot(&txn, j.id, j.resource_snapshot.clone()).await?;
            }
            task_store::delete(&txn, t.id).await?;
            events::append(
                &txn,
                ctx.instance_id,
                EventType::TaskDeleted,
                Subject::task(t.workspace_id, t.id),
                json!({ "trigger": j.trigger }),
            )
            .await?;
        }
        activate(&txn, ctx, &mut jobs).await?;
        ctx.commit(txn).await
    }
    .await;
    let deleted = result.is_ok();
    settle(ctx, &jobs, result).await?;
    if deleted {
        // Their sessions went with them; so do the sessions' conversations (worktrees go by the jobs).
        for id in sessions {
            crate::domain::sessions::remove_conversation(ctx, id).await;
        }
    }
    Ok(jobs)
}

/// Records with a prepared job the consent to keep dirty worktrees (`keep_dirty_worktrees=true`).
pub(super) async fn keep_dirty(txn: &sea_orm::DatabaseTransaction, j: &mut job::Model) -> Result<()> {
    let marks = Marks {
        keep_dirty_worktrees: true,
        ..marks_of(j)
    };
    j.resource_snapshot = with_marks(j.resource_snapshot.clone(), &marks);
    jobs_store::set_snapshot(txn, j.id, j.resource_snapshot.clone()).await
}

/// I12: quick-chat tasks idle past their retention, with no live session, go through the ordinary delete
/// path with trigger `quick_chat_expire`. Dirty worktrees are never discarded without consent: such a
/// task is kept and logged.
pub async fn expire_quick_chats(ctx: &Ctx) -> Result<usize> {
    let cutoff = crate::clock::now()
        - chrono::Duration::from_std(ctx.config.quick_chat_retention).unwrap_or(chrono::Duration::days(7));
    let mut expired = 0;
    for t in task_store::idle_quick_chats(&ctx.db.conn, cutoff).await? {
        let sessions = sessions_store::of_task(&ctx.db.conn, t.id).await?;
        let newest = sessions.iter().map(|s| s.last_activity_at).max();
        if newest.is_some_and(|n| n >= cutoff)
            || sessions.iter().any(|s| ctx.runtime.is_live(s.id) || s.state.is_busy())
        {
            continue;
        }
        match dirty_worktrees(ctx, std::slice::from_ref(&t), Checked::All).await {
            Ok(dirty) if dirty.is_empty() => {}
            Ok(_) => {
                tracing::warn!(task = %t.id, "an expired quick chat holds uncommitted work; keeping it");
                continue;
            }
            // Its node is down: it is asked again once the node is back.
            Err(Error::NodeUnavailable { .. }) => continue,
            Err(e) => return Err(e),
        }
        match delete_tasks(
            ctx,
            std::slice::from_ref(&t),
            |_| CleanupTrigger::QuickChatExpire,
            &DirtyConsent::default(),
            None,
        )
        .await
        {
            Ok(_) => expired += 1,
            Err(Error::TaskCleanupInProgress) => {}
            Err(e) => {
                let e = anyhow::Error::from(e);
                tracing::warn!(task = %t.id, error = format!("{e:#}"), "could not expire a quick chat");
            }
        }
    }
    Ok(expired)
}
