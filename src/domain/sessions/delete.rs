//! Deleting a session: its row and its conversation, nothing else (I2). Refused while the session is busy
//! (I4, `409 session_busy`); an idle or attention session has its agent stopped first, wherever it runs.
//! The primary passes to another session (I4).
//!
//! A session whose node is down is deleted all the same. Its agent cannot be asked to stop and its
//! conversation is on that node's disk, so what the delete owes the node waits as a `session_delete`
//! cleanup job for it (visible in `GET /cleanup-jobs`, `node_id` set): once the node is back the job ends
//! the agent the row named (only if its process group is proven to be that agent's) and removes the
//! conversation. A decommission ends the job instead.
use crate::ids::{SessionId, TaskId};
use sea_orm::DatabaseTransaction;
use serde_json::json;

use super::Ctx;
use super::access::{reload, subject, visible};
use crate::auth::Principal;
use crate::domain::cleanup::AgentProcess;
use crate::entity::task::Model as Task;
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result};
use crate::events::{self, EventType};
use crate::store::sessions as store;
use crate::store::tasks::lock_task;

pub async fn delete(ctx: &Ctx, p: &Principal, id: SessionId) -> Result<()> {
    let s = visible(&ctx.db.conn, p, id).await?;
    if let Some(node) = down_elsewhere(ctx, id).await? {
        return delete_for_down_node(ctx, &s, node).await;
    }
    // An idle agent another instance runs is stopped there first (its row would otherwise go with nothing
    // left to reach the process).
    if !s.state.is_busy()
        && !ctx.runtime.is_live(id)
        && super::routing::forward(ctx, &s, super::routing::Command::Stop).await?
    {
        return Box::pin(delete(ctx, p, id)).await;
    }
    let txn = ctx.db.begin_write().await?;
    let task = lock_task(&txn, s.task_id).await?;
    // Re-read under the task's lock: the state may have moved since.
    let s = reload(&txn, id).await?;
    if s.state.is_busy() {
        return Err(Error::SessionBusy);
    }
    if ctx.runtime.is_live(id) {
        // I4: an idle or attention session has its process stopped first (outside the transaction).
        drop(txn);
        super::control::stop_session(ctx, &s).await?;
        return Box::pin(delete(ctx, p, id)).await;
    }
    remove_row(&txn, ctx, &task, &s).await?;
    ctx.commit(txn).await?;
    // Its conversation is session data: it goes with the session (its worktrees stay, I2).
    super::conversation::remove(ctx, id).await;
    Ok(())
}

/// The node the session's work is on, when that is another node and it is down (not given up: a
/// decommissioned node's agents and disk are gone already).
async fn down_elsewhere(ctx: &Ctx, id: SessionId) -> Result<Option<String>> {
    let Some(node) = crate::domain::nodes::placement::of_session(ctx, id).await? else {
        return Ok(None);
    };
    if node == ctx.config.node_id {
        return Ok(None);
    }
    match crate::domain::nodes::require_up(ctx, &node).await {
        Err(Error::NodeUnavailable {
            decommissioned: false, ..
        }) => Ok(Some(node)),
        _ => Ok(None),
    }
}

/// The row goes now; the agent and the conversation on the down node wait for it as a job.
async fn delete_for_down_node(ctx: &Ctx, s: &session::Model, node: String) -> Result<()> {
    let id = s.id;
    let txn = ctx.db.begin_write().await?;
    let task = lock_task(&txn, s.task_id).await?;
    let s = reload(&txn, id).await?;
    // I4 holds on a down node too: a busy session is left to its task's delete or to a decommission.
    if s.state.is_busy() {
        return Err(Error::SessionBusy);
    }
    let agents = crate::store::executions::live_of_sessions(&txn, &[id])
        .await?
        .into_iter()
        .map(|e| AgentProcess {
            execution_id: e.id,
            node_id: e.node_id,
            pid: e.pid,
        })
        .collect();
    let job = crate::domain::cleanup::session_delete::write(&txn, ctx, &task, id, node, agents).await?;
    remove_row(&txn, ctx, &task, &s).await?;
    ctx.commit(txn).await?;
    tracing::info!(session = %id, job = %job.id, node = %job.node_id, "session deleted; its node's part waits for it");
    Ok(())
}

/// The row, its event, and the primary passed on; the caller holds the task's lock.
async fn remove_row(txn: &DatabaseTransaction, ctx: &Ctx, task: &Task, s: &session::Model) -> Result<()> {
    store::delete(txn, s.id).await?;
    // A turn that had not settled holds the environment's writer lease: it ends with the session.
    crate::domain::writer::end_turn(txn, s.id).await?;
    events::append(
        txn,
        ctx.instance_id,
        EventType::SessionDeleted,
        subject(task, s),
        json!({ "was_primary": s.is_primary }),
    )
    .await?;
    if s.is_primary
        && let Some(promoted) = promote(txn, task.id).await?
    {
        events::append(
            txn,
            ctx.instance_id,
            EventType::SessionPrimaryChanged,
            subject(task, &promoted),
            json!({ "previous_session_id": s.id, "reason": "primary_deleted" }),
        )
        .await?;
    }
    Ok(())
}

/// I4: a running session first, then the most recently active non-terminal one, then any.
async fn promote(txn: &DatabaseTransaction, task_id: TaskId) -> Result<Option<session::Model>> {
    let candidates = store::by_activity(txn, task_id).await?;
    let chosen = candidates
        .iter()
        .find(|s| s.state == SessionState::Running)
        .or_else(|| candidates.iter().find(|s| !s.state.is_terminal()))
        .or_else(|| candidates.first())
        .cloned();
    if let Some(s) = &chosen {
        store::set_primary(txn, s.id, crate::clock::now()).await?;
    }
    Ok(chosen)
}
