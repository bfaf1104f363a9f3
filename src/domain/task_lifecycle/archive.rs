//! Archive (agents stopped, sessions cancelled, clean worktrees removed by a job; branches kept) and
//! unarchive (waiting archive jobs cancelled, a running one waited for, I10).
use crate::ids::{CleanupJobId, RepositoryId, TaskId};
use std::collections::HashSet;

use sea_orm::DatabaseTransaction;
use serde::Serialize;
use serde_json::json;

use super::chain::{Leaving, keep_whole};
use crate::auth::UnboundPrincipal;
use crate::domain::Ctx;
use crate::domain::cleanup::barrier::{activate, prepare, settle, stop_agents};
use crate::domain::cleanup::state::{JobEvent, transition};
use crate::domain::cleanup::{CleanupJobState, CleanupTrigger, snapshot_of};
use crate::domain::sessions::state::{self as session_state, SessionEvent};
use crate::domain::tasks;
use crate::entity::cleanup_job as job;
use crate::entity::task;
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::store::cleanup_jobs::{self as jobs_store, JobPatch};
use crate::store::repositories as repo_store;
use crate::store::sessions::{self as sessions_store, StatePatch};
use crate::store::tasks::{self as task_store, lock_in_order, lock_task, owner_of, subtree};

/// Whether a task's branch is still there to recover its work from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BranchStatus {
    Local,
    Missing,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BranchRecovery {
    pub repository_id: RepositoryId,
    /// `local` when the task's branch still exists in the repository, else `missing`.
    pub branch_status: BranchStatus,
}

pub async fn archive(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    task_id: TaskId,
    cascade: bool,
) -> Result<(tasks::TaskView, Vec<job::Model>)> {
    let root = tasks::readable(&ctx.db.conn, p, task_id).await?;
    if root.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let tasks = subtree(&ctx.db.conn, &root, cascade, false).await?;
    // 1. The barrier: prepared jobs with complete snapshots, serialized with creation on each task.
    let txn = ctx.db.begin_write().await?;
    lock_in_order(&txn, &tasks).await?;
    let mut jobs = Vec::new();
    for t in &tasks {
        let t = lock_task(&txn, t.id).await?;
        let trigger = if t.id == root.id {
            CleanupTrigger::Archive
        } else {
            CleanupTrigger::CascadeArchive
        };
        jobs.push(prepare(&txn, ctx, &t, trigger, None).await?);
    }
    ctx.commit(txn).await?;
    // 2. Stop the agents, then the mutation, which activates the jobs.
    // One that did not stop (its node did not carry the stop out) is stopped by the job before it touches
    // a file, or the job retries: the archived task's rows still name it.
    let _ = stop_agents(ctx, &jobs).await;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lock_in_order(&txn, &tasks).await?;
        let now = crate::clock::now();
        let leaving: HashSet<TaskId> = tasks.iter().map(|t| t.id).collect();
        for (t, j) in tasks.iter().zip(jobs.iter_mut()) {
            // Live inheritors keep working; the environment passes to the nearest one.
            let t = &lock_task(&txn, t.id).await?;
            if keep_whole(&txn, ctx, t, j.task_environment_id, &leaving, Leaving::Archive).await? {
                let mut snap = snapshot_of(j)?;
                snap.environment = None;
                j.resource_snapshot = serde_json::to_value(&snap).map_err(|e| Error::Internal(e.into()))?;
                jobs_store::set_snapshot(&txn, j.id, j.resource_snapshot.clone()).await?;
            }
            task_store::set_archived(&txn, t.id, Some(now), now).await?;
            cancel_sessions(&txn, ctx, t).await?;
            events::append(
                &txn,
                ctx.instance_id,
                EventType::TaskArchived,
                Subject::task(t.workspace_id, t.id),
                json!({ "cascade": cascade }),
            )
            .await?;
        }
        activate(&txn, ctx, &mut jobs).await?;
        ctx.commit(txn).await
    }
    .await;
    settle(ctx, &jobs, result).await?;
    Ok((tasks::get(ctx, p, task_id).await?, jobs))
}

/// Archive cancels the task's sessions that are not over yet (each with its event, through the one
/// session transition).
async fn cancel_sessions(txn: &DatabaseTransaction, ctx: &Ctx, t: &task::Model) -> Result<()> {
    let now = crate::clock::now();
    for s in sessions_store::not_over_of_task_locked(txn, t.id).await? {
        let patch = StatePatch {
            desired_open: Some(false),
            ended_at: Some(now),
            ..Default::default()
        };
        session_state::transition(txn, ctx, t, &s, SessionEvent::Archive, patch).await?;
    }
    Ok(())
}

pub async fn unarchive(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    task_id: TaskId,
) -> Result<(tasks::TaskView, Vec<CleanupJobId>, Vec<BranchRecovery>)> {
    let t = tasks::readable(&ctx.db.conn, p, task_id).await?;
    if t.archived_at.is_none() {
        return Err(Error::InvalidState("the task is not archived".into()));
    }
    let mut cancelled = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let txn = ctx.db.begin_write().await?;
        let locked = lock_task(&txn, task_id).await?;
        // Before anything changes.
        ensure_owner_live(&txn, &locked).await?;
        let jobs = jobs_store::of_task(
            &txn,
            task_id,
            &[CleanupTrigger::Archive, CleanupTrigger::CascadeArchive],
            &[
                CleanupJobState::Prepared,
                CleanupJobState::Pending,
                CleanupJobState::RetryWait,
                CleanupJobState::Running,
                CleanupJobState::Failed,
            ],
        )
        .await?;
        let mut running = false;
        for j in jobs {
            if j.state == CleanupJobState::Running {
                running = true;
                continue;
            }
            // Also a failed one: retrying it later would remove the worktrees the task works in again.
            let patch = JobPatch {
                completed_at: Some(Some(crate::clock::now())),
                ..Default::default()
            };
            if transition(&txn, ctx, &j, JobEvent::Unarchive, None, patch)
                .await?
                .is_none()
            {
                // A worker claimed it meanwhile: wait for it like any running one.
                running = true;
                continue;
            }
            cancelled.push(j.id);
        }
        if running {
            // I10: wait for the in-flight one to finish before answering.
            ctx.commit(txn).await?;
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Stale(
                    "an archive cleanup is still running; retry shortly".into(),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        }
        task_store::set_archived(&txn, task_id, None, crate::clock::now()).await?;
        events::append(
            &txn,
            ctx.instance_id,
            EventType::TaskUnarchived,
            Subject::task(t.workspace_id, t.id),
            json!({ "cancelled_cleanup_jobs": cancelled }),
        )
        .await?;
        ctx.commit(txn).await?;
        break;
    }
    let recovery = branch_recovery(ctx, &t).await?;
    Ok((tasks::get(ctx, p, task_id).await?, cancelled, recovery))
}

/// An `inherit_parent` task works in its owner's environment: while that owner is archived (its
/// environment cleaned or about to be) the task cannot come back on its own, `409 task_archived`
/// naming the owner's archive; a chain that leads nowhere (data older than whole chains) is `409
/// conflict`. Either way nothing changes.
async fn ensure_owner_live<C: sea_orm::ConnectionTrait>(conn: &C, t: &task::Model) -> Result<()> {
    if t.workspace_mode != task::WorkspaceMode::InheritParent {
        return Ok(());
    }
    match owner_of(conn, t).await {
        Ok(owner) if owner.archived_at.is_none() => Ok(()),
        Ok(_) => Err(Error::OwnerArchived),
        Err(Error::NotFound(_)) => Err(Error::InvalidState(
            "the task inherits the workspace of a task that no longer exists; nothing was changed".into(),
        )),
        Err(e) => Err(e),
    }
}

/// I10: per repository, whether the task's branch still exists.
async fn branch_recovery(ctx: &Ctx, t: &task::Model) -> Result<Vec<BranchRecovery>> {
    let owner = owner_of(&ctx.db.conn, t).await?;
    let mut out = Vec::new();
    for slot in task_store::slots_of(&ctx.db.conn, owner.id).await? {
        let Some(repo) = repo_store::find(&ctx.db.conn, slot.repository_id).await? else {
            continue;
        };
        let branch = slot.branch.clone().unwrap_or_else(|| format!("berth/{}", owner.slug));
        let path = std::path::PathBuf::from(&repo.path);
        let exists = tokio::task::spawn_blocking(move || crate::git::branch_exists(&path, &branch).unwrap_or(false))
            .await
            .unwrap_or(false);
        out.push(BranchRecovery {
            repository_id: slot.repository_id,
            branch_status: if exists {
                BranchStatus::Local
            } else {
                BranchStatus::Missing
            },
        });
    }
    Ok(out)
}
