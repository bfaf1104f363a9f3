//! Bringing open sessions back: after a restart of berth (I29), after their agent crashed (I30), and
//! after the instance of this node that ran them died while another runs on.
//!
//! Instances of one node never fight: an agent is ended or relaunched only when the instance that
//! recorded it is gone (`nodes::sibling_alive`: its lease lapsed, or its process is no longer on this
//! host), never while a live sibling runs it. Two instances taking over the same dead one's sessions
//! race on the execution row (one ends it) and on `ux_agent_executions_live` (one launch records a live
//! execution; the other is refused `session_busy` and leaves the session to the winner).
use crate::ids::{ExecutionId, InstanceId, SessionId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;

use super::Ctx;
use super::launch::launch_session;
use super::state::{ExecutionEvent, SessionEvent, transition, transition_execution};
use crate::domain::nodes;
use crate::entity::agent_execution::{self as execution, ExecutionState};
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result};
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

/// At startup, before the cleanup workers run: the agents this node's gone instances left running are
/// ended and their executions recorded over, so that no job touches a worktree one still works in (I8)
/// and no session gets a second agent (I27). A live sibling's agents are left alone.
pub async fn end_orphans(ctx: &Ctx) -> Result<()> {
    let stale =
        crate::store::executions::live_of_other_instances(&ctx.db.conn, &ctx.config.node_id, ctx.instance_id).await?;
    for e in &stale {
        if !nodes::sibling_alive(ctx, e.instance_id, true).await? {
            end_orphan(ctx, e).await?;
        }
    }
    Ok(())
}

/// Ends one execution a gone instance of this node left: its process group if it is on this host (only a
/// group proven to be that execution's is signalled), then its row. False when another instance recorded
/// it over first.
async fn end_orphan(ctx: &Ctx, e: &execution::Model) -> Result<bool> {
    let here = match crate::store::nodes::find_instance(&ctx.db.conn, e.instance_id).await? {
        Some(i) => i.host == nodes::lease::this_host(),
        // Recorded before instances were: by a process of this node, as restore always assumed.
        None => true,
    };
    // A crashed berth may have left the agent (or a tool it started) running: end its process group, and
    // wait until it is gone, before relaunching, so the session never has two agents (I27).
    if let (true, Some(pid)) = (here, e.pid) {
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
    transition_execution(&ctx.db.conn, e.id, ExecutionEvent::Orphaned, patch).await
}

/// An agent of a decommissioned node is over as far as berth knows (its process went with the node).
pub(crate) async fn end_lost_execution(txn: &sea_orm::DatabaseTransaction, id: ExecutionId) -> Result<bool> {
    let patch = ExecutionPatch {
        exit_code: Some(None),
        ended_at: Some(crate::clock::now()),
        ..Default::default()
    };
    transition_execution(txn, id, ExecutionEvent::Orphaned, patch).await
}

/// At startup, after `end_orphans` (which `startup` runs before the cleanup workers): sessions that were
/// open are relaunched through admission, two at a time (I29); others that claimed a process are
/// stopped. Sessions a live instance runs (another node's, or a sibling's on this node) are left to it.
pub async fn restore(ctx: &Ctx) -> Result<usize> {
    let mut to_open = Vec::new();
    for s in store::in_states(&ctx.db.conn, &CLAIMING).await? {
        if ctx.runtime.is_live(s.id) || runs_elsewhere(ctx, &s).await? {
            continue;
        }
        if let Some(s) = settle_claim(ctx, s, None).await? {
            to_open.push(s);
        }
    }
    Ok(relaunch(ctx, to_open).await)
}

/// While serving (each lease renewal): the sessions whose agent an instance of this node ran and that
/// instance is gone (it died, or shut down cleanly and gave its lease back) are taken over here: a live
/// agent it left is ended, and each open session relaunched through admission.
pub async fn take_over(ctx: &Ctx) -> Result<usize> {
    let claimed = crate::store::executions::claimed_on_node_by_others(
        &ctx.db.conn,
        &ctx.config.node_id,
        ctx.instance_id,
        &CLAIMING,
    )
    .await?;
    let mut alive: HashMap<InstanceId, bool> = HashMap::new();
    let mut to_open = Vec::new();
    for e in claimed {
        let live = match alive.get(&e.instance_id) {
            Some(l) => *l,
            None => {
                let l = nodes::sibling_alive(ctx, e.instance_id, false).await?;
                alive.insert(e.instance_id, l);
                l
            }
        };
        if live {
            continue;
        }
        if matches!(e.state, ExecutionState::Starting | ExecutionState::Running) && !end_orphan(ctx, &e).await? {
            // Another instance recorded it over first: that one takes the session.
            continue;
        }
        let Some(s) = store::find(&ctx.db.conn, e.session_id).await? else {
            continue;
        };
        if ctx.runtime.is_live(s.id) {
            continue;
        }
        if let Some(s) = settle_claim(ctx, s, Some(e.id)).await? {
            to_open.push(s);
        }
    }
    Ok(relaunch(ctx, to_open).await)
}

/// Relaunches the sessions, two at a time (I29); how many opened.
async fn relaunch(ctx: &Ctx, to_open: Vec<session::Model>) -> usize {
    let in_flight = AtomicUsize::new(0);
    futures_util::stream::iter(to_open)
        .map(|s| {
            let in_flight = &in_flight;
            async move {
                let now = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                ctx.restore_stats.max_concurrent.fetch_max(now, Ordering::AcqRel);
                let id = s.id;
                let ok = match launch_session(ctx, s, None).await {
                    Ok(_) => true,
                    // Another instance launched it first: it is that one's now.
                    Err(Error::SessionBusy) => false,
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
        .await
}

/// A session that claims a process this one does not run: an open one is recovering now (returned, to
/// relaunch), any other is stopped. With `execution`, only while the session still names that execution
/// (an instance that took it over meanwhile has relaunched it).
async fn settle_claim(ctx: &Ctx, s: session::Model, execution: Option<ExecutionId>) -> Result<Option<session::Model>> {
    let Some(task) = task_store::find(&ctx.db.conn, s.task_id).await? else {
        return Ok(None);
    };
    let txn = ctx.db.begin_write().await?;
    let Some(current) = store::find_locked(&txn, s.id).await? else {
        return Ok(None);
    };
    if execution.is_some() && current.execution_id != execution {
        return Ok(None);
    }
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
pub(super) fn restart_after_crash(ctx: &Ctx, session_id: SessionId, execution_id: ExecutionId, recent_failures: u64) {
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

/// Whether the session's agent is another node's (its current execution was recorded there: that node
/// restores it), or a live sibling's on this node: this instance leaves it alone.
async fn runs_elsewhere(ctx: &Ctx, s: &session::Model) -> Result<bool> {
    let Some(execution_id) = s.execution_id else {
        return Ok(false);
    };
    let Some(e) = crate::store::executions::find(&ctx.db.conn, execution_id).await? else {
        return Ok(false);
    };
    if e.node_id != ctx.config.node_id {
        return Ok(true);
    }
    Ok(e.instance_id != ctx.instance_id && nodes::sibling_alive(ctx, e.instance_id, true).await?)
}

/// A relaunch that failed for any reason (a removed profile, a cleanup barrier, the database) fails the
/// session with that reason, instead of leaving it `recovering` for good. Launch refusals that already
/// failed it (admission, the conversation) find it failed and leave it so.
async fn fail_if_recovering(ctx: &Ctx, session_id: SessionId, e: &crate::error::Error) {
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
        let seen = super::launch::Seen::exactly(&s);
        super::launch::record_failure(
            ctx,
            &task,
            session_id,
            seen,
            "restore_failed",
            &format!("restore failed: {e}"),
        )
        .await?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(session = %session_id, error = %e, "could not record a failed restore");
    }
}
