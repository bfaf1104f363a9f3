//! The barrier (I6, I7): a `prepared` job with a complete snapshot is written before its mutation,
//! activated in the mutation's own transaction, cancelled if the mutation did not commit, and settled by
//! reconciliation if the operation crashed in between.
use crate::ids::{EnvironmentId, RepositoryId, TaskId};
use std::path::Path;

use sea_orm::{ConnectionTrait, DatabaseTransaction};

use super::state::{JobEvent, transition};
use super::{AgentProcess, EnvironmentSnapshot, Snapshot, WorktreeSnapshot, snapshot_of};
use crate::domain::{Ctx, environments};
use crate::entity::cleanup_job::{self as job, CleanupJobState, CleanupTrigger};
use crate::entity::task::{self, WorkspaceMode};
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::error::{Error, Result};
use crate::managed_path::Consent;
use crate::store::cleanup_jobs::{self as store, JobPatch};
use crate::store::tasks::{self as task_store, ensure_no_cleanup_job};
use crate::store::{environments as env_store, sessions as sessions_store};

/// The environment a task owns (not one it inherits), with its active worktrees.
pub(crate) async fn owned_environment<C: ConnectionTrait>(
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
    let snap = environment_snapshot(conn, ctx, t, &e, &environments::dir_of(t, &e)).await?;
    Ok(Some((e, snap)))
}

/// What a job would remove of one of `t`'s environments, whose directory under the worktree root is
/// `dir`: its active worktrees (and, while it is being made, where its worktrees would be).
async fn environment_snapshot<C: ConnectionTrait>(
    conn: &C,
    ctx: &Ctx,
    t: &task::Model,
    e: &env::Model,
    dir: &str,
) -> Result<EnvironmentSnapshot> {
    if e.executor_type == ExecutorType::Local {
        let snap = EnvironmentSnapshot {
            id: e.id,
            task_root: String::new(),
            worktrees: Vec::new(),
            in_flight: None,
        };
        return Ok(snap);
    }
    // The base each slot measures "merged" against (the branch policy).
    let bases: Vec<(RepositoryId, String, String)> = task_store::slots_with_repositories(conn, t.id)
        .await?
        .into_iter()
        .filter_map(|(slot, repo)| {
            let base = slot.base_branch.or_else(|| repo.map(|r| r.default_branch))?;
            Some((slot.repository_id, slot.branch_slug, base))
        })
        .collect();
    let base_of = |repository_id: RepositoryId, slug: &str| {
        bases
            .iter()
            .find(|(r, s, _)| *r == repository_id && s == slug)
            .map(|(_, _, b)| b.clone())
    };
    let mut worktrees: Vec<WorktreeSnapshot> = env_store::active_repos_with_repository(conn, e.id)
        .await?
        .into_iter()
        .filter_map(|(r, repo)| {
            // A row whose repository is gone names nothing a job could remove through git.
            let repo = repo?;
            Some(WorktreeSnapshot {
                repository_id: r.repository_id,
                repository_path: repo.path,
                common_git_dir: repo.common_git_dir,
                adopted_root: e
                    .imported_from
                    .as_ref()
                    .and_then(|_| WorktreeSnapshot::adopted_root_of(&ctx.config, r.worktree_path.as_deref()?)),
                worktree_path: r.worktree_path?,
                worktree_id: r.worktree_id,
                branch: r.worktree_branch,
                branch_origin: r.branch_origin,
                base_branch: base_of(r.repository_id, &r.branch_slug),
            })
        })
        .collect();
    let task_root = ctx.config.worktree_root.join(dir).to_string_lossy().into_owned();
    if e.status == EnvironmentStatus::Creating {
        // A materialization in flight, or one a crash abandoned: it may have made worktrees it has not
        // recorded yet. Name where they would be. The worker waits while the materializer lives, and
        // `git worktree remove` only ever removes a registered worktree of that repository.
        for p in environments::plans(conn, t, dir).await? {
            let worktree_path = Path::new(&task_root).join(&p.dir).to_string_lossy().into_owned();
            if worktrees.iter().any(|w| w.worktree_path == worktree_path) {
                // Recorded already (a staged transition candidate).
                continue;
            }
            worktrees.push(WorktreeSnapshot {
                repository_id: p.repository_id,
                repository_path: p.repository_path.to_string_lossy().into_owned(),
                common_git_dir: p.common_git_dir.to_string_lossy().into_owned(),
                worktree_path,
                worktree_id: None,
                // Not recorded yet: an unknown origin is never deleted.
                branch: Some(p.branch),
                branch_origin: None,
                base_branch: Some(p.base),
                adopted_root: None,
            });
        }
    }
    Ok(EnvironmentSnapshot {
        id: e.id,
        task_root,
        worktrees,
        in_flight: environments::in_flight(ctx, e),
    })
}

/// `t`'s other environments that still name worktrees on disk (superseded by a reset or an executor
/// transition, failed attempts), without the paths a live environment names (adopted by a later attempt:
/// not theirs to remove). With them, an executor transition's candidate (I18): `creating` beside the
/// current environment, in a directory of its own, perhaps with worktrees no row names yet.
pub(crate) async fn leftover_environments<C: ConnectionTrait>(
    conn: &C,
    ctx: &Ctx,
    t: &task::Model,
    current: Option<EnvironmentId>,
) -> Result<Vec<EnvironmentSnapshot>> {
    if t.workspace_mode == WorkspaceMode::InheritParent {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in env_store::all_of(conn, t.id).await? {
        if Some(e.id) == current
            || e.executor_type == ExecutorType::Local
            || !matches!(
                e.status,
                EnvironmentStatus::Superseded | EnvironmentStatus::Failed | EnvironmentStatus::Creating
            )
        {
            continue;
        }
        let dir = match e.status {
            EnvironmentStatus::Creating => environments::transition_dir(t, &e),
            _ => environments::dir_of(t, &e),
        };
        let mut snap = environment_snapshot(conn, ctx, t, &e, &dir).await?;
        let mut mine = Vec::new();
        for w in snap.worktrees {
            let adopted = env_store::others_naming(conn, &w.worktree_path, e.id)
                .await?
                .iter()
                .any(|o| o.status != EnvironmentStatus::Superseded);
            if !adopted {
                mine.push(w);
            }
        }
        if !mine.is_empty() {
            snap.worktrees = mine;
            out.push(snap);
        }
    }
    Ok(out)
}

/// A lifecycle job covers every environment the task had: a `superseded_cleanup` job still waiting is
/// cancelled in its favour (a running one is waited for: `task_cleanup_in_progress`, retryable).
async fn subsume_superseded_cleanups(txn: &DatabaseTransaction, ctx: &Ctx, task_id: TaskId) -> Result<()> {
    let waiting = crate::store::cleanup_jobs::of_task(
        txn,
        task_id,
        &[CleanupTrigger::SupersededCleanup],
        &[CleanupJobState::Pending, CleanupJobState::RetryWait],
    )
    .await?;
    for j in waiting {
        let patch = crate::store::cleanup_jobs::JobPatch {
            completed_at: Some(Some(crate::clock::now())),
            ..Default::default()
        };
        // A worker that claimed it meanwhile: the check below answers 409 and the caller retries.
        crate::domain::cleanup::state::transition(txn, ctx, &j, JobEvent::Subsumed, None, patch).await?;
    }
    Ok(())
}

/// I8: the agents that `session_delete` jobs of the task still owe their node (sessions deleted while it
/// was down, so no row names them any more). A lifecycle job ends them itself, from its own snapshot,
/// before it touches a worktree: it never relies on the other job having run first (both may be claimed
/// at once when the node is back). The caller holds the task's lock, as a session delete does.
async fn agents_of_session_deletes(txn: &DatabaseTransaction, task_id: TaskId) -> Result<Vec<AgentProcess>> {
    let jobs = store::of_task(txn, task_id, &[CleanupTrigger::SessionDelete], &job::ACTIVE_STATES).await?;
    let mut agents = Vec::new();
    for j in jobs {
        agents.extend(snapshot_of(&j)?.agents);
    }
    Ok(agents)
}

/// Writes the `prepared` barrier job for a task (I6); the caller holds the task's lock.
pub(crate) async fn prepare(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    t: &task::Model,
    trigger: CleanupTrigger,
    consent: Option<&Consent>,
) -> Result<job::Model> {
    subsume_superseded_cleanups(txn, ctx, t.id).await?;
    ensure_no_cleanup_job(txn, &[t.id]).await?;
    let owned = owned_environment(txn, ctx, t).await?;
    let superseded = leftover_environments(txn, ctx, t, owned.as_ref().map(|(e, _)| e.id)).await?;
    let sessions = sessions_store::ids_of_task(txn, t.id).await?;
    let mut agents: Vec<AgentProcess> = crate::store::executions::live_of_sessions(txn, &sessions)
        .await?
        .into_iter()
        .map(|e| AgentProcess {
            execution_id: e.id,
            node_id: e.node_id,
            pid: e.pid,
        })
        .collect();
    agents.extend(agents_of_session_deletes(txn, t.id).await?);
    let snapshot = Snapshot {
        task_id: t.id,
        workspace_id: t.workspace_id,
        environment: owned.as_ref().map(|(_, s)| s.clone()),
        superseded,
        conversations: if trigger.deletes_sessions() {
            sessions.clone()
        } else {
            Vec::new()
        },
        sessions,
        agents,
        discard_worktree_changes: consent.cloned(),
        delete_branches: None,
        branches: Vec::new(),
    };
    let node_id = owned
        .as_ref()
        .map(|(e, _)| e.node_id.clone())
        .unwrap_or_else(|| ctx.config.node_id.clone());
    let environment = owned.as_ref().map(|(e, _)| e.id);
    super::state::create(txn, ctx, &snapshot, trigger, environment, node_id).await
}

/// `prepared` → `pending` (the mutation committed) in the mutation's own transaction.
pub(crate) async fn activate(txn: &DatabaseTransaction, ctx: &Ctx, jobs: &mut [job::Model]) -> Result<()> {
    let now = crate::clock::now();
    for j in jobs.iter_mut() {
        let patch = JobPatch {
            next_attempt_at: Some(Some(now)),
            ..Default::default()
        };
        let Some(activated) = transition(txn, ctx, j, JobEvent::Activate, None, patch).await? else {
            // Cancelled meanwhile (an operator, or reconciliation): the barrier may have lifted, so the
            // mutation must not commit against a snapshot that could now be incomplete.
            return Err(Error::Stale(
                "the cleanup was cancelled before the task changed; nothing changed, retry".into(),
            ));
        };
        *j = activated;
    }
    Ok(())
}

/// The mutation did not commit: its prepared jobs are cancelled (I6).
async fn cancel_prepared(ctx: &Ctx, jobs: &[job::Model]) {
    for j in jobs {
        // As written: an activation the rolled-back mutation made in memory never reached the row.
        let prepared = job::Model {
            state: CleanupJobState::Prepared,
            ..j.clone()
        };
        let r: Result<()> = async {
            let txn = ctx.db.begin_write().await?;
            transition(&txn, ctx, &prepared, JobEvent::Abandon, None, JobPatch::default()).await?;
            ctx.commit(txn).await
        }
        .await;
        if let Err(e) = r {
            let e = anyhow::Error::from(e);
            tracing::warn!(job = %j.id, error = format!("{e:#}"), "could not cancel a prepared job; reconciliation will settle it");
        }
    }
}

/// Stops the live agents of the jobs' sessions wherever they run (before anything is touched, I8).
pub(crate) async fn stop_agents(ctx: &Ctx, jobs: &[job::Model]) -> Result<()> {
    let mut first = Ok(());
    for j in jobs {
        for id in snapshot_of(j).map(|s| s.sessions).unwrap_or_default() {
            // Wherever it runs (another replica stops it on request). Every agent is asked, whatever
            // became of the others. One whose node is down cannot be asked: the job, which runs on that
            // node once it is back, ends it first (`Snapshot::agents`).
            match crate::domain::sessions::end_agent(ctx, id).await {
                Ok(()) => continue,
                Err(Error::NodeUnavailable {
                    decommissioned: false, ..
                }) => continue,
                Err(e) => {
                    tracing::warn!(session = %id, error = %e, "could not stop the agent before the cleanup");
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
    }
    first
}

/// After the mutation: if it did not commit, its prepared jobs are cancelled (I6); if it did, the
/// workers are woken for the now pending jobs.
pub(crate) async fn settle(ctx: &Ctx, jobs: &[job::Model], mutation: Result<()>) -> Result<()> {
    if let Err(e) = mutation {
        cancel_prepared(ctx, jobs).await;
        return Err(e);
    }
    ctx.cleanup_wake.notify_waiters();
    Ok(())
}

/// I6: did the mutation of this `prepared` job commit? Read from what the mutation changes.
async fn mutation_committed(ctx: &Ctx, j: &job::Model) -> Result<bool> {
    let conn = &ctx.db.conn;
    Ok(match j.trigger {
        CleanupTrigger::Archive | CleanupTrigger::CascadeArchive => task_store::find(conn, j.task_id)
            .await?
            .is_some_and(|t| t.archived_at.is_some()),
        CleanupTrigger::EnvironmentReset => match j.task_environment_id {
            Some(id) => env_store::find(conn, id)
                .await?
                .is_none_or(|e| e.status == EnvironmentStatus::Superseded),
            None => true,
        },
        // Written pending in one transaction with nothing else to wait for.
        CleanupTrigger::SupersededCleanup | CleanupTrigger::SessionDelete => true,
        CleanupTrigger::Delete
        | CleanupTrigger::CascadeDelete
        | CleanupTrigger::WorkspaceDelete
        | CleanupTrigger::QuickChatExpire => task_store::find(conn, j.task_id).await?.is_none(),
    })
}

/// I6: a `prepared` job whose operation crashed is activated if its mutation committed, else cancelled.
pub async fn reconcile_prepared(ctx: &Ctx) -> Result<()> {
    let grace = chrono::Duration::from_std(ctx.config.cleanup_prepared_grace).unwrap_or(chrono::Duration::minutes(1));
    for j in store::prepared_before(&ctx.db.conn, crate::clock::now() - grace).await? {
        let (event, next) = if mutation_committed(ctx, &j).await? {
            (JobEvent::Activate, Some(crate::clock::now()))
        } else {
            (JobEvent::Abandon, None)
        };
        let patch = JobPatch {
            next_attempt_at: Some(next),
            ..Default::default()
        };
        let txn = ctx.db.begin_write().await?;
        if let Some(settled) = transition(&txn, ctx, &j, event, None, patch).await? {
            tracing::info!(job = %j.id, state = ?settled.state, "reconciled a prepared cleanup job");
        }
        ctx.commit(txn).await?;
    }
    Ok(())
}
