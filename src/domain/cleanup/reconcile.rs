//! The reconcile pass. Leaks heal for tasks that live on: a superseded environment of this node whose
//! inventory still names worktrees, superseded longer than the grace period, of a task that is quiet (no
//! agent live or busy in any of its environments, nothing being materialized, no other cleanup under
//! way), gets one durable `superseded_cleanup` job. The job is an ordinary cleanup job: the barrier rule
//! I7 holds while it runs (the task accepts no new session until it is done, as during a reset's job),
//! and `leftovers::clean` keeps and reports a worktree holding changes. One job per environment: a kept
//! dirty worktree is reported once, not every pass.
use crate::ids::{CleanupJobId, OperationId};

use super::state::{JobEvent, job_event, transition};
use super::{Snapshot, barrier};
use crate::domain::Ctx;
use crate::entity::cleanup_job::{self as job, CleanupJobState, CleanupTrigger};
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::error::{Error, Result};
use crate::store::cleanup_jobs::{self as store, JobPatch};
use crate::store::tasks::{self as task_store, ensure_no_cleanup_job, lock_task};
use crate::store::{environments as env_store, sessions as sessions_store};

/// At most this many environments per pass: a pass stays short; the next one takes the rest.
const PER_PASS: u64 = 32;

/// One pass: returns how many jobs it wrote.
pub async fn reconcile_superseded(ctx: &Ctx) -> Result<usize> {
    let grace = chrono::Duration::from_std(ctx.config.superseded_grace).unwrap_or(chrono::Duration::minutes(10));
    let before = crate::clock::now() - grace;
    let mut written = 0;
    for e in env_store::superseded_with_worktrees(&ctx.db.conn, &ctx.config.node_id, before, PER_PASS).await? {
        match reconcile_one(ctx, &e).await {
            Ok(true) => written += 1,
            Ok(false) => {}
            // Someone else's cleanup took the task meanwhile: theirs covers this environment.
            Err(Error::TaskCleanupInProgress) => {}
            Err(err) => return Err(err),
        }
    }
    if written > 0 {
        ctx.cleanup_wake.notify_waiters();
    }
    Ok(written)
}

async fn reconcile_one(ctx: &Ctx, e: &env::Model) -> Result<bool> {
    let conn = &ctx.db.conn;
    let already = store::of_environment(conn, e.id, CleanupTrigger::SupersededCleanup).await?;
    if !already.is_empty() {
        return Ok(false);
    }
    let Some(t) = task_store::find(conn, e.task_id).await? else {
        return Ok(false);
    };
    // Archived tasks: their archive job named this environment, or unarchive brought it back on purpose.
    if t.archived_at.is_some() || !quiet(ctx, &t).await? {
        return Ok(false);
    }
    let txn = ctx.db.begin_write().await?;
    let t = lock_task(&txn, t.id).await?;
    ensure_no_cleanup_job(&txn, &[t.id]).await?;
    let current = crate::domain::environments::current(&txn, t.id).await?;
    if current
        .as_ref()
        .is_some_and(|c| c.status == EnvironmentStatus::Creating)
    {
        txn.rollback().await?;
        return Ok(false);
    }
    let leftovers = barrier::leftover_environments(&txn, ctx, &t, current.map(|c| c.id)).await?;
    let Some(snap) = leftovers.into_iter().find(|s| s.id == e.id) else {
        txn.rollback().await?;
        return Ok(false);
    };
    let snapshot = Snapshot {
        task_id: t.id,
        workspace_id: t.workspace_id,
        environment: None,
        superseded: vec![snap],
        sessions: Vec::new(),
        agents: Vec::new(),
        conversations: Vec::new(),
        discard_worktree_changes: None,
        delete_branches: None,
        branches: Vec::new(),
    };
    let now = crate::clock::now();
    let model = job::Model {
        id: CleanupJobId::now_v7(),
        operation_id: OperationId::now_v7(),
        task_id: t.id,
        workspace_id: t.workspace_id,
        task_environment_id: Some(e.id),
        trigger: CleanupTrigger::SupersededCleanup,
        state: CleanupJobState::Prepared,
        attempts: 0,
        max_attempts: ctx.config.cleanup_max_attempts as i32,
        next_attempt_at: None,
        last_error: None,
        resource_snapshot: serde_json::to_value(&snapshot).map_err(|err| Error::Internal(err.into()))?,
        node_id: e.node_id.clone(),
        lease_owner: None,
        lease_expires_at: None,
        created_at: now,
        updated_at: now,
        completed_at: None,
        // berth does this on its own.
        actor_sub: None,
        actor_session_id: None,
    };
    store::insert(&txn, &model).await?;
    job_event(&txn, ctx, &model).await?;
    // Nothing else changes, so nothing to wait for: pending at once, in the same transaction.
    let patch = JobPatch {
        next_attempt_at: Some(Some(now)),
        ..Default::default()
    };
    transition(&txn, ctx, &model, JobEvent::Activate, None, patch).await?;
    ctx.commit(txn).await?;
    tracing::info!(
        job = %model.id,
        environment = %e.id,
        task = %t.id,
        worktrees = snapshot.superseded[0].worktrees.len(),
        "superseded environment cleanup scheduled"
    );
    Ok(true)
}

/// No agent is live or busy in any environment of the task, and no other task's live session borrows
/// one of them.
async fn quiet(ctx: &Ctx, t: &crate::entity::task::Model) -> Result<bool> {
    let conn = &ctx.db.conn;
    for s in sessions_store::of_task(conn, t.id).await? {
        if s.state.is_busy() || ctx.runtime.is_live(s.id) {
            return Ok(false);
        }
    }
    for e in env_store::all_of(conn, t.id).await? {
        if !sessions_store::live_borrowers(conn, e.id, t.id).await?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}
