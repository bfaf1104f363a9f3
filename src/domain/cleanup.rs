//! Task lifecycle cleanup (seed 001, I5-I13): the only owners of physical cleanup are task archive,
//! delete (and cascades), workspace delete, quick-chat expiry and environment reset. Each writes a durable
//! job `prepared` with a complete snapshot found through the task (never through sessions) before its
//! mutation, and activates it (`pending`) only once the mutation committed. The worker (`worker::cleanup`)
//! destroys what the snapshot names, re-checking sharing at that moment.
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::Ctx;
use super::environments;
use super::pagination::{Page, PageRequest};
use crate::auth::Principal;
use crate::entity::cleanup_job as job;
use crate::entity::task::{self, WorkspaceMode};
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::{self as env_repo, EnvironmentRepoStatus};
use crate::entity::task_session::{self as session, SessionState};
use crate::entity::{repository, task_repository, workspace};
use crate::error::{DirtyRepository, Error, Result};
use crate::events::{self, Subject};
use crate::store::tasks::{ensure_no_cleanup, live_inheritors, lock_in_order, lock_task, owner_of, subtree};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Archive,
    Delete,
    CascadeArchive,
    CascadeDelete,
    WorkspaceDelete,
    QuickChatExpire,
    EnvironmentReset,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Archive => "archive",
            Trigger::Delete => "delete",
            Trigger::CascadeArchive => "cascade_archive",
            Trigger::CascadeDelete => "cascade_delete",
            Trigger::WorkspaceDelete => "workspace_delete",
            Trigger::QuickChatExpire => "quick_chat_expire",
            Trigger::EnvironmentReset => "environment_reset",
        }
    }
}

/// What a job destroys, captured before the mutation (I6). Survives the task row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub task_id: Uuid,
    pub workspace_id: Uuid,
    /// The environment the task owns, if it owns one with anything on disk.
    pub environment: Option<EnvironmentSnapshot>,
    /// Sessions whose agents are stopped before anything is touched.
    pub sessions: Vec<Uuid>,
    /// I11: consent to remove worktrees with uncommitted or untracked changes.
    pub discard_worktree_changes: bool,
    /// Branches are kept (unarchive re-materializes from them).
    pub keep_branches: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvironmentSnapshot {
    pub id: Uuid,
    pub task_root: String,
    pub worktrees: Vec<WorktreeSnapshot>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorktreeSnapshot {
    pub repository_id: Uuid,
    pub repository_path: String,
    pub common_git_dir: String,
    pub worktree_path: String,
    pub worktree_id: Option<String>,
    pub branch: Option<String>,
}

/// Whether a task's branch is still there to recover its work from.
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum BranchStatus {
    Local,
    Missing,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BranchRecovery {
    pub repository_id: Uuid,
    /// `local` when the task's branch still exists in the repository, else `missing`.
    #[schema(value_type = BranchStatus)]
    pub branch_status: String,
}

/// The environment a task owns (not one it inherits), with its active worktrees.
async fn owned_environment<C: ConnectionTrait>(
    conn: &C,
    ctx: &Ctx,
    t: &task::Model,
) -> Result<Option<(env::Model, EnvironmentSnapshot)>> {
    if t.workspace_mode == WorkspaceMode::InheritParent {
        return Ok(None);
    }
    let Some(e) = environments::current(conn, t.id).await? else {
        return Ok(None);
    };
    if e.executor_type == ExecutorType::Local {
        return Ok(Some((
            e.clone(),
            EnvironmentSnapshot {
                id: e.id,
                task_root: String::new(),
                worktrees: Vec::new(),
            },
        )));
    }
    let rows = env_repo::Entity::find()
        .filter(env_repo::Column::TaskEnvironmentId.eq(e.id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .all(conn)
        .await?;
    let repos: BTreeMap<Uuid, repository::Model> = repository::Entity::find()
        .filter(repository::Column::Id.is_in(rows.iter().map(|r| r.repository_id)))
        .all(conn)
        .await?
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
    let mut worktrees: Vec<WorktreeSnapshot> = rows
        .into_iter()
        .filter_map(|r| {
            let repo = repos.get(&r.repository_id)?;
            Some(WorktreeSnapshot {
                repository_id: r.repository_id,
                repository_path: repo.path.clone(),
                common_git_dir: repo.common_git_dir.clone(),
                worktree_path: r.worktree_path?,
                worktree_id: r.worktree_id,
                branch: r.worktree_branch,
            })
        })
        .collect();
    let task_root = ctx.config.worktree_root.join(&t.slug).to_string_lossy().into_owned();
    if e.status == EnvironmentStatus::Creating {
        // A materialization in flight, or one a crash abandoned: it may have made worktrees it has not
        // recorded yet. Name where they would be. The worker waits while the materializer lives, and
        // `git worktree remove` only ever removes a registered worktree of that repository.
        for p in environments::plans(conn, t, &t.slug).await? {
            worktrees.push(WorktreeSnapshot {
                repository_id: p.repository_id,
                repository_path: p.repository_path.to_string_lossy().into_owned(),
                common_git_dir: p.common_git_dir.to_string_lossy().into_owned(),
                worktree_path: Path::new(&task_root).join(&p.dir).to_string_lossy().into_owned(),
                worktree_id: None,
                branch: Some(p.branch),
            });
        }
    }
    Ok(Some((
        e.clone(),
        EnvironmentSnapshot {
            id: e.id,
            task_root,
            worktrees,
        },
    )))
}

/// Writes the `prepared` barrier job for a task (I6); the caller holds the task's lock.
async fn prepare(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    t: &task::Model,
    trigger: Trigger,
    consent: bool,
    with_env: bool,
) -> Result<job::Model> {
    ensure_no_cleanup(txn, &[t.id]).await?;
    let owned = if with_env {
        owned_environment(txn, ctx, t).await?
    } else {
        None
    };
    let sessions: Vec<Uuid> = session::Entity::find()
        .select_only()
        .column(session::Column::Id)
        .filter(session::Column::TaskId.eq(t.id))
        .into_tuple()
        .all(txn)
        .await?;
    let snapshot = Snapshot {
        task_id: t.id,
        workspace_id: t.workspace_id,
        environment: owned.as_ref().map(|(_, s)| s.clone()),
        sessions,
        discard_worktree_changes: consent,
        keep_branches: true,
    };
    let now = crate::clock::now();
    let model = job::Model {
        id: Uuid::now_v7(),
        operation_id: Uuid::now_v7(),
        task_id: t.id,
        workspace_id: t.workspace_id,
        task_environment_id: owned.as_ref().map(|(e, _)| e.id),
        trigger: trigger.as_str().into(),
        state: "prepared".into(),
        attempts: 0,
        max_attempts: ctx.config.cleanup_max_attempts as i32,
        next_attempt_at: None,
        last_error: None,
        resource_snapshot: serde_json::to_value(&snapshot).map_err(|e| Error::Internal(e.into()))?,
        node_id: owned
            .as_ref()
            .map(|(e, _)| e.node_id.clone())
            .unwrap_or_else(|| ctx.config.node_id.clone()),
        lease_owner: None,
        lease_expires_at: None,
        created_at: now,
        updated_at: now,
        completed_at: None,
    };
    let am: job::ActiveModel = model.clone().into();
    job::Entity::insert(am).exec_without_returning(txn).await?;
    job_event(txn, ctx, &model).await?;
    Ok(model)
}

pub(crate) async fn job_event(txn: &DatabaseTransaction, ctx: &Ctx, j: &job::Model) -> Result<()> {
    let subject = Subject {
        task_environment_id: j.task_environment_id,
        ..Subject::task(j.workspace_id, j.task_id)
    };
    events::append(
        txn,
        ctx.instance_id,
        "cleanup_job.updated",
        subject,
        json!({ "cleanup_job_id": j.id, "state": j.state, "trigger": j.trigger }),
    )
    .await?;
    Ok(())
}

/// `prepared` → `pending` (the mutation committed) in the mutation's own transaction.
async fn activate(txn: &DatabaseTransaction, ctx: &Ctx, jobs: &mut [job::Model]) -> Result<()> {
    let now = crate::clock::now();
    for j in jobs.iter_mut() {
        let activated = job::Entity::update_many()
            .col_expr(job::Column::State, sea_orm::sea_query::Expr::value("pending"))
            .col_expr(job::Column::NextAttemptAt, sea_orm::sea_query::Expr::value(Some(now)))
            .col_expr(job::Column::UpdatedAt, sea_orm::sea_query::Expr::value(now))
            .filter(job::Column::Id.eq(j.id))
            .filter(job::Column::State.eq("prepared"))
            .exec(txn)
            .await?;
        if activated.rows_affected == 0 {
            // Cancelled meanwhile (an operator, or reconciliation): the barrier may have lifted, so the
            // mutation must not commit against a snapshot that could now be incomplete.
            return Err(Error::Conflict(
                "the cleanup was cancelled before the task changed; nothing changed, retry".into(),
            ));
        }
        j.state = "pending".into();
        j.next_attempt_at = Some(now);
        job_event(txn, ctx, j).await?;
    }
    Ok(())
}

/// The mutation did not commit: its prepared jobs are cancelled (I6).
async fn cancel_prepared(ctx: &Ctx, jobs: &[job::Model]) {
    for j in jobs {
        let r = job::Entity::update_many()
            .col_expr(job::Column::State, sea_orm::sea_query::Expr::value("cancelled"))
            .col_expr(
                job::Column::UpdatedAt,
                sea_orm::sea_query::Expr::value(crate::clock::now()),
            )
            .filter(job::Column::Id.eq(j.id))
            .filter(job::Column::State.eq("prepared"))
            .exec(&ctx.db.conn)
            .await;
        if let Err(e) = r {
            tracing::warn!(job = %j.id, error = %e, "could not cancel a prepared job; reconciliation will settle it");
        }
    }
}

/// Stops the live agents of the jobs' sessions (before anything is touched, I8).
async fn stop_agents(ctx: &Ctx, jobs: &[job::Model]) {
    for j in jobs {
        for id in snapshot_of(j).map(|s| s.sessions).unwrap_or_default() {
            ctx.runtime.stop(id).await;
        }
    }
}

/// After the mutation: if it did not commit, its prepared jobs are cancelled (I6); if it did, the
/// workers are woken for the now pending jobs.
async fn settle(ctx: &Ctx, jobs: &[job::Model], mutation: Result<()>) -> Result<()> {
    if let Err(e) = mutation {
        cancel_prepared(ctx, jobs).await;
        return Err(e);
    }
    ctx.cleanup_wake.notify_waiters();
    Ok(())
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
            Trigger::Archive
        } else {
            Trigger::CascadeArchive
        };
        jobs.push(prepare(&txn, ctx, &t, trigger, false, true).await?);
    }
    ctx.commit(txn).await?;
    // 2. Stop the agents, then the mutation, which activates the jobs.
    stop_agents(ctx, &jobs).await;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lock_in_order(&txn, &tasks).await?;
        let now = crate::clock::now();
        for t in &tasks {
            task::Entity::update(task::ActiveModel {
                id: Set(t.id),
                archived_at: Set(Some(now)),
                updated_at: Set(now),
                ..Default::default()
            })
            .exec(&txn)
            .await?;
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

pub async fn delete(ctx: &Ctx, p: &Principal, task_id: Uuid, cascade: bool, discard: bool) -> Result<Vec<job::Model>> {
    p.require_unbound()?;
    let root = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    let tasks = subtree(&ctx.db.conn, &root, cascade, true).await?;
    if !discard {
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
            Trigger::Delete
        } else {
            Trigger::CascadeDelete
        }
    };
    delete_tasks(ctx, &tasks, trigger, discard).await
}

/// The shared delete path (task delete, cascade, quick-chat expiry): barrier, stop, transfer, delete.
pub(crate) async fn delete_tasks(
    ctx: &Ctx,
    tasks: &[task::Model],
    trigger: impl Fn(&task::Model) -> Trigger,
    discard: bool,
) -> Result<Vec<job::Model>> {
    let doomed: HashSet<Uuid> = tasks.iter().map(|t| t.id).collect();
    let txn = ctx.db.begin_write().await?;
    lock_in_order(&txn, tasks).await?;
    let mut jobs = Vec::new();
    for t in tasks {
        let t = lock_task(&txn, t.id).await?;
        jobs.push(prepare(&txn, ctx, &t, trigger(&t), discard, true).await?);
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
                job::Entity::update(job::ActiveModel {
                    id: Set(j.id),
                    resource_snapshot: Set(j.resource_snapshot.clone()),
                    ..Default::default()
                })
                .exec(&txn)
                .await?;
            }
            task::Entity::delete_by_id(t.id).exec(&txn).await?;
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
    let now = crate::clock::now();
    let e = env::Entity::find_by_id(env_id)
        .one(txn)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    env::Entity::update(env::ActiveModel {
        id: Set(env_id),
        task_id: Set(heir.id),
        ownership_generation: Set(e.ownership_generation + 1),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    task::Entity::update(task::ActiveModel {
        id: Set(heir.id),
        workspace_mode: Set(WorkspaceMode::NewWorkspace),
        parent_task_id: Set(None),
        slug: Set(from.slug.clone()),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    task::Entity::update_many()
        .col_expr(
            task::Column::ParentTaskId,
            sea_orm::sea_query::Expr::value(Some(heir.id)),
        )
        .filter(task::Column::ParentTaskId.eq(from.id))
        .filter(task::Column::Id.ne(heir.id))
        .exec(txn)
        .await?;
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
        let jobs = job::Entity::find()
            .filter(job::Column::TaskId.eq(task_id))
            .filter(job::Column::Trigger.is_in(["archive", "cascade_archive"]))
            .filter(job::Column::State.is_in(["prepared", "pending", "retry_wait", "running", "failed"]))
            .all(&txn)
            .await?;
        let mut running = false;
        for j in jobs {
            if j.state == "running" {
                running = true;
                continue;
            }
            // Also a failed one: retrying it later would remove the worktrees the task works in again.
            let now = crate::clock::now();
            let res = job::Entity::update_many()
                .col_expr(job::Column::State, sea_orm::sea_query::Expr::value("cancelled"))
                .col_expr(job::Column::UpdatedAt, sea_orm::sea_query::Expr::value(now))
                .col_expr(job::Column::CompletedAt, sea_orm::sea_query::Expr::value(Some(now)))
                .filter(job::Column::Id.eq(j.id))
                .filter(job::Column::State.eq(j.state.clone()))
                .exec(&txn)
                .await?;
            if res.rows_affected == 0 {
                // A worker claimed it meanwhile: wait for it like any running one.
                running = true;
                continue;
            }
            job_event(
                &txn,
                ctx,
                &job::Model {
                    state: "cancelled".into(),
                    ..j.clone()
                },
            )
            .await?;
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
        let now = crate::clock::now();
        task::Entity::update(task::ActiveModel {
            id: Set(task_id),
            archived_at: Set(None),
            updated_at: Set(now),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
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
    let slots = task_repository::Entity::find()
        .filter(task_repository::Column::TaskId.eq(owner.id))
        .all(&ctx.db.conn)
        .await?;
    let mut out = Vec::new();
    for slot in slots {
        let Some(repo) = repository::Entity::find_by_id(slot.repository_id)
            .one(&ctx.db.conn)
            .await?
        else {
            continue;
        };
        let branch = slot.branch.clone().unwrap_or_else(|| format!("berth/{}", owner.slug));
        let path = std::path::PathBuf::from(&repo.path);
        let exists = tokio::task::spawn_blocking(move || crate::git::branch_exists(&path, &branch).unwrap_or(false))
            .await
            .unwrap_or(false);
        out.push(BranchRecovery {
            repository_id: slot.repository_id,
            branch_status: if exists { "local".into() } else { "missing".into() },
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
    let users = session::Entity::find()
        .filter(session::Column::TaskEnvironmentId.eq(current.id))
        .all(&txn)
        .await?;
    if users.iter().any(|s| s.state.is_busy() || ctx.runtime.is_live(s.id)) {
        return Err(Error::SessionBusy);
    }
    let mut jobs = vec![prepare(&txn, ctx, &owner, Trigger::EnvironmentReset, false, true).await?];
    ctx.commit(txn).await?;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        let now = crate::clock::now();
        env::Entity::update(env::ActiveModel {
            id: Set(current.id),
            status: Set(EnvironmentStatus::Superseded),
            superseded_at: Set(Some(now)),
            updated_at: Set(now),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
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
    workspace::Entity::find_by_id(workspace_id)
        .lock_exclusive()
        .one(&txn)
        .await?
        .ok_or(Error::NotFound("workspace"))?;
    let tasks = task::Entity::find()
        .filter(task::Column::WorkspaceId.eq(workspace_id))
        .order_by_asc(task::Column::Id)
        .all(&txn)
        .await?;
    let mut jobs = Vec::new();
    for t in &tasks {
        let t = lock_task(&txn, t.id).await?;
        jobs.push(prepare(&txn, ctx, &t, Trigger::WorkspaceDelete, false, true).await?);
    }
    workspace::Entity::update(workspace::ActiveModel {
        id: Set(workspace_id),
        status: Set(crate::entity::workspace::WorkspaceStatus::Deleting),
        updated_at: Set(crate::clock::now()),
        ..Default::default()
    })
    .exec(&txn)
    .await?;
    ctx.commit(txn).await?;
    stop_agents(ctx, &jobs).await;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        // Children of the cascade first: tasks (with their environments), then repositories, then the row.
        task::Entity::delete_many()
            .filter(task::Column::WorkspaceId.eq(workspace_id))
            .exec(&txn)
            .await?;
        repository::Entity::delete_many()
            .filter(repository::Column::WorkspaceId.eq(workspace_id))
            .exec(&txn)
            .await?;
        workspace::Entity::delete_by_id(workspace_id).exec(&txn).await?;
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

pub fn snapshot_of(j: &job::Model) -> Result<Snapshot> {
    serde_json::from_value(j.resource_snapshot.clone())
        .map_err(|e| Error::Internal(anyhow::anyhow!("job {} has an unreadable snapshot: {e}", j.id)))
}

// ---- Operator views ----

pub struct JobFilter {
    pub state: Option<String>,
    pub task_id: Option<Uuid>,
    pub trigger: Option<String>,
}

pub async fn list(ctx: &Ctx, p: &Principal, filter: JobFilter, page: PageRequest) -> Result<Page<job::Model>> {
    p.require_unbound()?;
    let mut q = job::Entity::find();
    if let Some(ids) = p.workspace_filter() {
        q = q.filter(job::Column::WorkspaceId.is_in(ids.iter().copied()));
    }
    if let Some(s) = filter.state {
        q = q.filter(job::Column::State.eq(s));
    }
    if let Some(t) = filter.task_id {
        q = q.filter(job::Column::TaskId.eq(t));
    }
    if let Some(t) = filter.trigger {
        q = q.filter(job::Column::Trigger.eq(t));
    }
    if let Some(before) = page.before {
        q = q.filter(job::Column::Id.lt(before));
    }
    let rows = q
        .order_by_desc(job::Column::Id)
        .limit(page.fetch())
        .all(&ctx.db.conn)
        .await?;
    Ok(Page::from_rows(rows, &page, |j| j.id))
}

pub async fn get(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<job::Model> {
    p.require_unbound()?;
    job::Entity::find_by_id(id)
        .one(&ctx.db.conn)
        .await?
        .filter(|j| p.sees_workspace(j.workspace_id))
        .ok_or(Error::NotFound("cleanup job"))
}

/// A `failed` job gets a fresh attempt budget, if what it would remove is still meant to go.
pub async fn retry(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<job::Model> {
    let j = get(ctx, p, id).await?;
    if matches!(j.trigger.as_str(), "archive" | "cascade_archive") {
        let archived = task::Entity::find_by_id(j.task_id)
            .one(&ctx.db.conn)
            .await?
            .is_some_and(|t| t.archived_at.is_some());
        if !archived {
            return Err(Error::Conflict(
                "the task is no longer archived; its worktrees are in use".into(),
            ));
        }
    }
    transition(ctx, p, id, &["failed"], "pending", true).await
}

/// Only a waiting job can be cancelled; a running one finishes its attempt.
pub async fn cancel(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<job::Model> {
    transition(ctx, p, id, &["prepared", "pending", "retry_wait"], "cancelled", false).await
}

async fn transition(
    ctx: &Ctx,
    p: &Principal,
    id: Uuid,
    from: &[&str],
    to: &str,
    reset_attempts: bool,
) -> Result<job::Model> {
    let j = get(ctx, p, id).await?;
    let txn = ctx.db.begin_write().await?;
    let now = crate::clock::now();
    let mut q = job::Entity::update_many()
        .col_expr(job::Column::State, sea_orm::sea_query::Expr::value(to))
        .col_expr(job::Column::UpdatedAt, sea_orm::sea_query::Expr::value(now))
        .filter(job::Column::Id.eq(id))
        .filter(job::Column::State.is_in(from.iter().copied()));
    if reset_attempts {
        q = q
            .col_expr(job::Column::Attempts, sea_orm::sea_query::Expr::value(0))
            .col_expr(job::Column::NextAttemptAt, sea_orm::sea_query::Expr::value(Some(now)))
            .col_expr(
                job::Column::LeaseOwner,
                sea_orm::sea_query::Expr::value(Option::<String>::None),
            )
            .col_expr(
                job::Column::CompletedAt,
                sea_orm::sea_query::Expr::value(Option::<chrono::DateTime<chrono::Utc>>::None),
            );
    } else {
        q = q.col_expr(job::Column::CompletedAt, sea_orm::sea_query::Expr::value(Some(now)));
    }
    if q.exec(&txn).await?.rows_affected == 0 {
        return Err(Error::Conflict(format!(
            "the job is {}; this needs {}",
            j.state,
            from.join(" or ")
        )));
    }
    let updated = job::Entity::find_by_id(id)
        .one(&txn)
        .await?
        .ok_or(Error::NotFound("cleanup job"))?;
    job_event(&txn, ctx, &updated).await?;
    ctx.commit(txn).await?;
    ctx.cleanup_wake.notify_waiters();
    Ok(updated)
}

/// I12: quick-chat tasks idle past their retention, with no live session, go through the ordinary delete
/// path with trigger `quick_chat_expire`. Dirty worktrees are never discarded without consent: such a
/// task is kept and logged.
pub async fn expire_quick_chats(ctx: &Ctx) -> Result<usize> {
    let cutoff = crate::clock::now()
        - chrono::Duration::from_std(ctx.config.quick_chat_retention).unwrap_or(chrono::Duration::days(7));
    let candidates = task::Entity::find()
        .filter(task::Column::Kind.eq(crate::entity::task::TaskKind::QuickChat))
        .filter(task::Column::ArchivedAt.is_null())
        .filter(task::Column::LastActivityAt.lt(cutoff))
        .all(&ctx.db.conn)
        .await?;
    let mut expired = 0;
    for t in candidates {
        let sessions = session::Entity::find()
            .filter(session::Column::TaskId.eq(t.id))
            .all(&ctx.db.conn)
            .await?;
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
        match delete_tasks(ctx, std::slice::from_ref(&t), |_| Trigger::QuickChatExpire, false).await {
            Ok(_) => expired += 1,
            Err(Error::TaskCleanupInProgress) => {}
            Err(e) => tracing::warn!(task = %t.id, error = %e, "could not expire a quick chat"),
        }
    }
    Ok(expired)
}
