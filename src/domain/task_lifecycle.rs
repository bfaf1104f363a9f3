//! The task lifecycle operations that own physical cleanup (seed 001, I5-I13): archive, unarchive,
//! delete (and cascades, with transfer to an heir), workspace delete, environment reset and quick-chat
//! expiry. Each follows the barrier (`cleanup::barrier`): prepared jobs, stop the agents, the mutation
//! that activates them, then settle.
use std::collections::HashSet;

use sea_orm::{ActiveValue::Set, ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::Ctx;
use super::cleanup::barrier::{activate, owned_environment, prepare, settle, stop_agents};
use super::cleanup::state::{JobEvent, transition};
use super::cleanup::{CleanupJobState, CleanupTrigger, snapshot_of};
use super::environments;
use crate::auth::Principal;
use crate::entity::cleanup_job as job;
use crate::entity::task;
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{DirtyRepository, Error, Result};
use crate::events::{self, Subject};
use crate::managed_path::Consent;
use crate::store::cleanup_jobs::{self as jobs_store, JobPatch};
use crate::store::lifecycle;
use crate::store::tasks::{live_inheritors, lock_in_order, lock_task, owner_of, subtree};

/// Whether a task's branch is still there to recover its work from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BranchStatus {
    Local,
    Missing,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BranchRecovery {
    pub repository_id: Uuid,
    /// `local` when the task's branch still exists in the repository, else `missing`.
    pub branch_status: BranchStatus,
}

pub async fn archive(
    ctx: &Ctx,
    p: &Principal,
    task_id: Uuid,
    cascade: bool,
) -> Result<(super::tasks::TaskView, Vec<job::Model>)> {
    p.require_unbound()?;
    let root = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
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
    stop_agents(ctx, &jobs).await;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lock_in_order(&txn, &tasks).await?;
        let now = crate::clock::now();
        for t in &tasks {
            lifecycle::set_archived(&txn, t.id, Some(now), now).await?;
            cancel_sessions(&txn, ctx, t).await?;
            events::append(
                &txn,
                ctx.instance_id,
                "task.archived",
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
    Ok((super::tasks::get(ctx, p, task_id).await?, jobs))
}

async fn cancel_sessions(txn: &DatabaseTransaction, ctx: &Ctx, t: &task::Model) -> Result<()> {
    let live = session::Entity::find()
        .filter(session::Column::TaskId.eq(t.id))
        .filter(session::Column::State.is_not_in([
            SessionState::Stopped,
            SessionState::Failed,
            SessionState::Cancelled,
        ]))
        .all(txn)
        .await?;
    let now = crate::clock::now();
    for s in live {
        session::Entity::update(session::ActiveModel {
            id: Set(s.id),
            state: Set(SessionState::Cancelled),
            desired_open: Set(false),
            ended_at: Set(Some(now)),
            updated_at: Set(now),
            ..Default::default()
        })
        .exec(txn)
        .await?;
        let subject = Subject {
            session_id: Some(s.id),
            task_environment_id: s.task_environment_id,
            ..Subject::task(t.workspace_id, t.id)
        };
        events::append(
            txn,
            ctx.instance_id,
            "session.state_changed",
            subject,
            json!({ "state": SessionState::Cancelled }),
        )
        .await?;
    }
    Ok(())
}

/// I11: the worktrees of these tasks that hold changes, found before anything changes.
async fn dirty_worktrees(ctx: &Ctx, tasks: &[task::Model]) -> Result<Vec<DirtyRepository>> {
    let mut dirty = Vec::new();
    for t in tasks {
        let Some((_, snap)) = owned_environment(&ctx.db.conn, ctx, t).await? else {
            continue;
        };
        for w in snap.worktrees {
            let path = std::path::Path::new(&w.worktree_path);
            if !path.is_dir() {
                continue;
            }
            match ctx.git.dirty_file_count(path).await {
                Ok(0) => {}
                Ok(n) => dirty.push(DirtyRepository {
                    repository_id: w.repository_id,
                    dirty_file_count: n,
                }),
                // Unknown is not clean, and not dirty either: refuse, say so, change nothing.
                Err(e) => return Err(Error::Unavailable(format!("inspecting a worktree failed: {e}"))),
            }
        }
    }
    Ok(dirty)
}

/// `consent` comes only from the request's explicit `discard_worktree_changes=true` (I11).
pub async fn delete(
    ctx: &Ctx,
    p: &Principal,
    task_id: Uuid,
    cascade: bool,
    consent: Option<Consent>,
) -> Result<Vec<job::Model>> {
    p.require_unbound()?;
    let root = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    let tasks = subtree(&ctx.db.conn, &root, cascade, true).await?;
    if consent.is_none() {
        // An environment that will pass to a surviving subtask loses nothing: not checked.
        let doomed: HashSet<Uuid> = tasks.iter().map(|t| t.id).collect();
        let mut checked = Vec::new();
        for t in &tasks {
            let heirs = live_inheritors(&ctx.db.conn, t.id).await?;
            if !heirs.iter().any(|h| !doomed.contains(&h.id)) {
                checked.push(t.clone());
            }
        }
        let dirty = dirty_worktrees(ctx, &checked).await?;
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
    delete_tasks(ctx, &tasks, trigger, consent.as_ref()).await
}

/// The shared delete path (task delete, cascade, quick-chat expiry): barrier, stop, transfer, delete.
pub(crate) async fn delete_tasks(
    ctx: &Ctx,
    tasks: &[task::Model],
    trigger: impl Fn(&task::Model) -> CleanupTrigger,
    consent: Option<&Consent>,
) -> Result<Vec<job::Model>> {
    let doomed: HashSet<Uuid> = tasks.iter().map(|t| t.id).collect();
    let txn = ctx.db.begin_write().await?;
    lock_in_order(&txn, tasks).await?;
    let mut jobs = Vec::new();
    for t in tasks {
        let t = lock_task(&txn, t.id).await?;
        jobs.push(prepare(&txn, ctx, &t, trigger(&t), consent).await?);
    }
    ctx.commit(txn).await?;
    stop_agents(ctx, &jobs).await;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lock_in_order(&txn, tasks).await?;
        for (t, j) in tasks.iter().zip(jobs.iter_mut()) {
            // I8: an environment that a surviving inherit_parent subtask uses is transferred, not destroyed.
            if let Some(env_id) = j.task_environment_id
                && let Some(heir) = heir_of(&txn, t, &doomed).await?
            {
                transfer(&txn, ctx, t, env_id, &heir).await?;
                let mut snap = snapshot_of(j)?;
                snap.environment = None;
                j.resource_snapshot = serde_json::to_value(&snap).map_err(|e| Error::Internal(e.into()))?;
                jobs_store::set_snapshot(&txn, j.id, j.resource_snapshot.clone()).await?;
            }
            lifecycle::delete_task(&txn, t.id).await?;
            events::append(
                &txn,
                ctx.instance_id,
                "task.deleted",
                Subject::task(t.workspace_id, t.id),
                json!({ "trigger": j.trigger }),
            )
            .await?;
        }
        activate(&txn, ctx, &mut jobs).await?;
        ctx.commit(txn).await
    }
    .await;
    settle(ctx, &jobs, result).await?;
    Ok(jobs)
}

/// A live subtask (not being deleted) that inherits this task's workspace.
async fn heir_of(txn: &DatabaseTransaction, t: &task::Model, doomed: &HashSet<Uuid>) -> Result<Option<task::Model>> {
    Ok(live_inheritors(txn, t.id)
        .await?
        .into_iter()
        .find(|c| !doomed.contains(&c.id)))
}

/// Hands a deleted task's environment to its heir: the heir owns it from now on, and its siblings that
/// inherited through the deleted task inherit through the heir.
async fn transfer(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    from: &task::Model,
    env_id: Uuid,
    heir: &task::Model,
) -> Result<()> {
    let e = lifecycle::environment(txn, env_id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    lifecycle::transfer_environment(txn, &e, from, heir, crate::clock::now()).await?;
    let subject = Subject {
        task_environment_id: Some(env_id),
        ..Subject::task(heir.workspace_id, heir.id)
    };
    events::append(
        txn,
        ctx.instance_id,
        "task.updated",
        subject,
        json!({ "changed": { "workspace_mode": "new_workspace" }, "environment_transferred_from": from.id }),
    )
    .await?;
    Ok(())
}

pub async fn unarchive(
    ctx: &Ctx,
    p: &Principal,
    task_id: Uuid,
) -> Result<(super::tasks::TaskView, Vec<Uuid>, Vec<BranchRecovery>)> {
    p.require_unbound()?;
    let t = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    if t.archived_at.is_none() {
        return Err(Error::Conflict("the task is not archived".into()));
    }
    let mut cancelled = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let txn = ctx.db.begin_write().await?;
        lock_task(&txn, task_id).await?;
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
                return Err(Error::Conflict(
                    "an archive cleanup is still running; retry shortly".into(),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        }
        lifecycle::set_archived(&txn, task_id, None, crate::clock::now()).await?;
        events::append(
            &txn,
            ctx.instance_id,
            "task.unarchived",
            Subject::task(t.workspace_id, t.id),
            json!({ "cancelled_cleanup_jobs": cancelled }),
        )
        .await?;
        ctx.commit(txn).await?;
        break;
    }
    let recovery = branch_recovery(ctx, &t).await?;
    Ok((super::tasks::get(ctx, p, task_id).await?, cancelled, recovery))
}

/// I10: per repository, whether the task's branch still exists.
async fn branch_recovery(ctx: &Ctx, t: &task::Model) -> Result<Vec<BranchRecovery>> {
    let owner = owner_of(&ctx.db.conn, t).await?;
    let mut out = Vec::new();
    for slot in lifecycle::repository_slots(&ctx.db.conn, owner.id).await? {
        let Some(repo) = lifecycle::repository(&ctx.db.conn, slot.repository_id).await? else {
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

/// Destroys the current environment's resources through a job, so the next session materializes afresh.
pub async fn reset_environment(ctx: &Ctx, p: &Principal, task_id: Uuid) -> Result<job::Model> {
    p.require_unbound()?;
    let t = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    if t.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let owner = owner_of(&ctx.db.conn, &t).await?;
    let txn = ctx.db.begin_write().await?;
    let owner = lock_task(&txn, owner.id).await?;
    let current = environments::current(&txn, owner.id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    let users = lifecycle::sessions_in_environment(&txn, current.id).await?;
    if users.iter().any(|s| s.state.is_busy() || ctx.runtime.is_live(s.id)) {
        return Err(Error::SessionBusy);
    }
    let mut jobs = vec![prepare(&txn, ctx, &owner, CleanupTrigger::EnvironmentReset, None).await?];
    ctx.commit(txn).await?;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lifecycle::mark_superseded(&txn, current.id, crate::clock::now()).await?;
        let subject = Subject {
            task_environment_id: Some(current.id),
            ..Subject::task(owner.workspace_id, owner.id)
        };
        events::append(
            &txn,
            ctx.instance_id,
            "environment.reset",
            subject,
            json!({ "cleanup_job_id": jobs[0].id }),
        )
        .await?;
        activate(&txn, ctx, &mut jobs).await?;
        ctx.commit(txn).await
    }
    .await;
    settle(ctx, &jobs, result).await?;
    Ok(jobs.remove(0))
}

pub async fn delete_workspace(
    ctx: &Ctx,
    p: &Principal,
    workspace_id: Uuid,
    confirm_name: Option<&str>,
) -> Result<Vec<job::Model>> {
    p.require_unbound()?;
    let ws = super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    if confirm_name != Some(ws.name.as_str()) {
        return Err(Error::BadRequest("confirm_name must equal the workspace's name".into()));
    }
    let txn = ctx.db.begin_write().await?;
    // The workspace row first: task creation share-locks it and refuses a `deleting` workspace, so the
    // task list read here is complete (no task can escape its job).
    lifecycle::lock_workspace(&txn, workspace_id)
        .await?
        .ok_or(Error::NotFound("workspace"))?;
    let tasks = lifecycle::tasks_of_workspace(&txn, workspace_id).await?;
    let mut jobs = Vec::new();
    for t in &tasks {
        let t = lock_task(&txn, t.id).await?;
        jobs.push(prepare(&txn, ctx, &t, CleanupTrigger::WorkspaceDelete, None).await?);
    }
    lifecycle::mark_workspace_deleting(&txn, workspace_id, crate::clock::now()).await?;
    ctx.commit(txn).await?;
    stop_agents(ctx, &jobs).await;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lifecycle::delete_workspace(&txn, workspace_id).await?;
        events::append(
            &txn,
            ctx.instance_id,
            "workspace.deleted",
            Subject::workspace(workspace_id),
            json!({ "tasks": tasks.len() }),
        )
        .await?;
        activate(&txn, ctx, &mut jobs).await?;
        ctx.commit(txn).await
    }
    .await;
    settle(ctx, &jobs, result).await?;
    Ok(jobs)
}

/// I12: quick-chat tasks idle past their retention, with no live session, go through the ordinary delete
/// path with trigger `quick_chat_expire`. Dirty worktrees are never discarded without consent: such a
/// task is kept and logged.
pub async fn expire_quick_chats(ctx: &Ctx) -> Result<usize> {
    let cutoff = crate::clock::now()
        - chrono::Duration::from_std(ctx.config.quick_chat_retention).unwrap_or(chrono::Duration::days(7));
    let mut expired = 0;
    for t in lifecycle::idle_quick_chats(&ctx.db.conn, cutoff).await? {
        let sessions = lifecycle::sessions_of_task(&ctx.db.conn, t.id).await?;
        let newest = sessions.iter().map(|s| s.last_activity_at).max();
        if newest.is_some_and(|n| n >= cutoff)
            || sessions.iter().any(|s| ctx.runtime.is_live(s.id) || s.state.is_busy())
        {
            continue;
        }
        if !dirty_worktrees(ctx, std::slice::from_ref(&t)).await?.is_empty() {
            tracing::warn!(task = %t.id, "an expired quick chat holds uncommitted work; keeping it");
            continue;
        }
        match delete_tasks(ctx, std::slice::from_ref(&t), |_| CleanupTrigger::QuickChatExpire, None).await {
            Ok(_) => expired += 1,
            Err(Error::TaskCleanupInProgress) => {}
            Err(e) => tracing::warn!(task = %t.id, error = %e, "could not expire a quick chat"),
        }
    }
    Ok(expired)
}
