//! Bringing open sessions back: after a restart of berth (I29), and after their agent crashed (I30).
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use uuid::Uuid;

use super::Ctx;
use super::launch::launch_session;
use super::state::{ExecutionEvent, SessionEvent, transition, transition_execution};
use crate::entity::task_session::{self as session, SessionState};
use crate::error::Result;
use crate::runtime::Orphan;
use crate::store::executions::ExecutionPatch;
use crate::store::sessions::{self as store, StatePatch};
use crate::store::tasks as task_store;

/// The states of a session that claims a process.
const CLAIMING: [SessionState; 6] = [
    SessionState::Starting,
    SessionState::Running,
    SessionState::Idle,
    SessionState::Attention,
    SessionState::Recovering,
    SessionState::Stopping,
];

/// At startup: executions of earlier processes are over; sessions that were open are relaunched
/// through admission, two at a time (I29); others that claimed a process are stopped.
pub async fn restore(ctx: &Ctx) -> Result<usize> {
    let stale =
        crate::store::executions::live_of_other_instances(&ctx.db.conn, &ctx.config.node_id, ctx.instance_id).await?;
    for e in &stale {
        // A crashed berth may have left the agent (or a tool it started) running: end its process group,
        // and wait until it is gone, before relaunching, so the session never has two agents (I27). Only a
        // group proven to be that execution's is signalled.
        if let Some(pid) = e.pid {
            match crate::runtime::end_orphan(pid as u32, e.id, ctx.config.agent_term_grace).await {
                Orphan::Gone => {}
                Orphan::Ended => {
                    tracing::info!(session = %e.session_id, pid, "ended an agent a previous berth left running")
                }
                Orphan::Lingering => tracing::warn!(
                    session = %e.session_id,
                    pid,
                    "an agent a previous berth left running outlived SIGKILL; relaunching anyway"
                ),
            }
        }
        let patch = ExecutionPatch {
            exit_code: Some(None),
            ended_at: Some(crate::clock::now()),
            ..Default::default()
        };
        transition_execution(&ctx.db.conn, e.id, ExecutionEvent::Orphaned, patch).await?;
    }
    let mut to_open = Vec::new();
    for s in store::in_states(&ctx.db.conn, &CLAIMING).await? {
        if ctx.runtime.is_live(s.id) || runs_elsewhere(ctx, &s).await? {
            continue;
        }
        if let Some(s) = settle_claim(ctx, s).await? {
            to_open.push(s);
        }
    }
    let in_flight = AtomicUsize::new(0);
    let opened = futures_util::stream::iter(to_open)
        .map(|s| {
            let in_flight = &in_flight;
            async move {
                let now = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                ctx.restore_stats.max_concurrent.fetch_max(now, Ordering::AcqRel);
                let id = s.id;
                let ok = match launch_session(ctx, s, None).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(session = %id, error = %e, "could not restore a session");
                        fail_if_recovering(ctx, id, &e).await;
                        false
                    }
                };
                in_flight.fetch_sub(1, Ordering::AcqRel);
                ok
            }
        })
        // I29: two at a time.
        .buffer_unordered(2)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    Ok(opened)
}

/// A session that claims a process this one does not run: an open one is recovering now (returned, to
/// relaunch), any other is stopped.
async fn settle_claim(ctx: &Ctx, s: session::Model) -> Result<Option<session::Model>> {
    let Some(task) = task_store::find(&ctx.db.conn, s.task_id).await? else {
        return Ok(None);
    };
    let txn = ctx.db.begin_write().await?;
    let Some(current) = store::find_locked(&txn, s.id).await? else {
        return Ok(None);
    };
    let event = SessionEvent::Restore {
        open: current.desired_open,
    };
    // Whatever state the previous process left (a launch cut off in `starting`, say), an open session
    // is recovering now: nothing runs for it in this process yet.
    let moved = if current.state.on(event).is_ok() {
        transition(&txn, ctx, &task, &current, event, StatePatch::default()).await?
    } else {
        None
    };
    ctx.commit(txn).await?;
    let state = moved.unwrap_or(current.state);
    Ok((current.desired_open && state == SessionState::Recovering).then_some(session::Model { state, ..current }))
}

/// I30: relaunches a crashed session after its backoff, through admission, if nothing (a stop, a delete)
/// changed it meanwhile.
pub(super) fn restart_after_crash(ctx: &Ctx, session_id: Uuid, execution_id: Uuid, recent_failures: u64) {
    ctx.metrics.agent_restarted();
    let backoff =
        ctx.config.agent_restart_backoff * 2u32.saturating_pow(recent_failures.saturating_sub(1) as u32).min(64);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(backoff).await;
        let Ok(Some(current)) = store::find(&ctx.db.conn, session_id).await else {
            return;
        };
        if current.state != SessionState::Recovering
            || current.execution_id != Some(execution_id)
            || !current.desired_open
        {
            return;
        }
        if let Err(e) = launch_session(&ctx, current, None).await {
            tracing::warn!(session = %session_id, error = %e, "restarting a crashed agent failed");
            fail_if_recovering(&ctx, session_id, &e).await;
        }
    });
}

/// Whether the session's agent is another node's (its current execution was recorded there): that node
/// restores it, this one leaves it alone.
async fn runs_elsewhere(ctx: &Ctx, s: &session::Model) -> Result<bool> {
    let Some(execution_id) = s.execution_id else {
        return Ok(false);
    };
    Ok(crate::store::executions::find(&ctx.db.conn, execution_id)
        .await?
        .is_some_and(|e| e.node_id != ctx.config.node_id))
}

/// A relaunch that failed for any reason (a removed profile, a cleanup barrier, the database) fails the
/// session with that reason, instead of leaving it `recovering` for good. Launch refusals that already
/// failed it (admission, the conversation) find it failed and leave it so.
async fn fail_if_recovering(ctx: &Ctx, session_id: Uuid, e: &crate::error::Error) {
    let result: Result<()> = async {
        let Some(s) = store::find(&ctx.db.conn, session_id).await? else {
            return Ok(());
        };
        if s.state != SessionState::Recovering {
            return Ok(());
        }
        let Some(task) = task_store::find(&ctx.db.conn, s.task_id).await? else {
            return Ok(());
        };
        super::launch::record_failure(
            ctx,
            &task,
            session_id,
            "restore_failed",
            &format!("restore failed: {e}"),
        )
        .await
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(session = %session_id, error = %e, "could not record a failed restore");
    }
}
