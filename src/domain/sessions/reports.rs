//! What the runtime's reports about an agent (its output, its exit) do to its session.
use crate::ids::{ExecutionId, SessionId};
use serde_json::json;

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::Ctx;
use super::launch::{Seen, record_failure};
use super::state::{ExecutionEvent, SessionEvent, transition, transition_execution};
use super::stream::{Coalescer, Offer, STREAM_CAP, Write};
use crate::agent::Signal;
use crate::entity::session_message::MessageRole;
use crate::error::Result;
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::runtime::RuntimeEvent;
use crate::store::executions::ExecutionPatch;
use crate::store::sessions::{self as store, StatePatch};
use crate::store::tasks as task_store;

/// How many sessions' due deltas are written at once (each its own transaction and connection).
const DUE_WRITERS: usize = 2;

/// Applies the runtime's reports, in order, forever; streamed deltas are coalesced (`stream`) into one
/// event per session per `BERTH_STREAM_INTERVAL_MS`.
pub async fn consume(ctx: Ctx, mut rx: tokio::sync::mpsc::Receiver<RuntimeEvent>) {
    let mut streams = Coalescer::new(ctx.config.stream_interval, STREAM_CAP);
    loop {
        let due = streams.next_due();
        let wake = tokio::time::Instant::from_std(due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)));
        let report = tokio::select! {
            r = rx.recv() => match r {
                Some(r) => Some(r),
                None => break,
            },
            _ = tokio::time::sleep_until(wake), if due.is_some() => None,
        };
        match report {
            Some(RuntimeEvent::Output {
                session_id,
                execution_id,
                record,
                delta,
                signals,
                held,
            }) => {
                let offer = match delta {
                    Some(d) => Offer::Delta(d),
                    None => Offer::Line { record, signals },
                };
                for w in streams.offer(session_id, execution_id, offer, Instant::now()) {
                    write(&ctx, w).await;
                }
                // The line is recorded, or held in its session's bounded buffer: its bytes are free.
                drop(held);
            }
            Some(RuntimeEvent::Exited {
                session_id,
                execution_id,
                code,
                expected,
                stderr_tail,
                out_of_memory,
                not_reading,
            }) => {
                if let Some(w) = streams.flush(session_id) {
                    write(&ctx, w).await;
                }
                let exit = Exit {
                    code,
                    expected,
                    out_of_memory,
                    not_reading,
                };
                let r = on_exit(&ctx, session_id, execution_id, exit, &stderr_tail).await;
                ctx.runtime.forget(session_id, execution_id);
                if let Err(e) = r {
                    tracing::warn!(error = %e, "could not record an agent report");
                }
            }
            Some(RuntimeEvent::EgressRefused {
                session_id,
                execution_id,
                address,
            }) => {
                if let Err(e) = on_refused(&ctx, session_id, execution_id, &address).await {
                    tracing::warn!(error = %e, "could not record a refused connection");
                }
            }
            None => {}
        }
        // Due buffers are of different sessions (order matters only within one): written side by side,
        // so a slow database writes every streaming session each interval, not a few of them.
        futures_util::stream::iter(streams.due(Instant::now()))
            .for_each_concurrent(DUE_WRITERS, |w| write(&ctx, w))
            .await;
    }
    for w in streams.drain() {
        write(&ctx, w).await;
    }
}

async fn write(ctx: &Ctx, w: Write) {
    if let Err(e) = on_output(ctx, w).await {
        tracing::warn!(error = %e, "could not record an agent report");
    }
}

/// The session event a signal means, if any.
fn session_event(signal: &Signal) -> Option<SessionEvent> {
    match signal {
        Signal::TurnStarted => Some(SessionEvent::AgentStart),
        Signal::TurnSettled { .. } => Some(SessionEvent::AgentEnd),
        Signal::Question { .. } => Some(SessionEvent::UiRequest),
        // A question whose own timeout passed: like an answer (the agent resolved it with its default).
        Signal::QuestionExpired { .. } => Some(SessionEvent::Answered { working: true }),
        _ => None,
    }
}

async fn on_output(ctx: &Ctx, w: Write) -> Result<()> {
    let Write {
        session_id,
        execution_id,
        event,
        signals,
    } = w;
    let txn = ctx.db.begin_write().await?;
    // The row first, as every session writer takes it before the event sequence; and it is written once:
    // a second UPDATE of a row this transaction wrote re-checks its foreign keys on PostgreSQL (a
    // key-share lock on the task), which deadlocked against launches.
    let Some(s) = store::find_locked(&txn, session_id).await? else {
        return Ok(());
    };
    if s.execution_id != Some(execution_id) {
        return Ok(());
    }
    let Some(task) = task_store::find(&txn, s.task_id).await? else {
        return Ok(());
    };
    let now = crate::clock::now();
    let mut spent = Vec::new();
    for signal in &signals {
        match signal {
            Signal::Assistant(message) => {
                crate::store::messages::append(&txn, session_id, MessageRole::Assistant, message.clone(), now).await?;
            }
            Signal::Usage(report) => spent.extend(crate::domain::usage::record(&txn, &s, &task, report).await?),
            _ => {}
        }
    }
    // Outside running/idle/attention, or already there, a report changes no state.
    let moves = signals
        .iter()
        .filter_map(session_event)
        .find(|e| s.state.on(*e).is_ok());
    // What the agent says about itself and the pending questions are kept for snapshots, in the row's one
    // write.
    let noticed = super::conversation::noticed(s.agent_state.as_ref(), &signals);
    let known = noticed.as_ref().or(s.agent_state.as_ref());
    let agent_state = super::conversation::with_attention(known, &ctx.runtime.attention(session_id)).or(noticed);
    if moves.is_none() {
        store::touch_with(&txn, session_id, now, agent_state.clone()).await?;
    }
    let subject = Subject {
        session_id: Some(session_id),
        task_environment_id: s.task_environment_id,
        execution_id: Some(execution_id),
        ..Subject::task(task.workspace_id, task.id)
    };
    if let Some(event) = event {
        events::append(
            &txn,
            ctx.instance_id,
            EventType::RuntimeOutput,
            subject,
            json!({ "event": event }),
        )
        .await?;
    }
    // Another question may still be pending after one expired: then the session keeps waiting.
    let moves = match moves {
        Some(SessionEvent::Answered { .. }) if !ctx.runtime.attention(session_id).is_empty() => None,
        Some(SessionEvent::Answered { .. }) => Some(SessionEvent::Answered {
            working: ctx.runtime.is_working(session_id),
        }),
        other => other,
    };
    let mut settled = false;
    if let Some(e) = moves {
        let patch = StatePatch {
            last_activity_at: Some(now),
            agent_state,
            ..Default::default()
        };
        settled = transition(&txn, ctx, &task, &s, e, patch).await?.is_some() && e == SessionEvent::AgentEnd;
    }
    ctx.commit(txn).await?;
    for r in &spent {
        crate::domain::usage::counted(ctx, r);
    }
    // What waited for the turn goes now (a steer or an abort may end a turn without a state change).
    if signals.iter().any(|s| matches!(s, Signal::TurnSettled { .. })) {
        super::inbox::wake(ctx, session_id);
    }
    // Once per turn: a newer Pi reports the end twice; only the report that moved the session to `idle`
    // settles the turn.
    if settled {
        // Seed 004: a finished turn is captured as a completion observation of the environment.
        let c = ctx.clone();
        crate::actor::spawn(async move { crate::domain::git_status::capture_completion(&c, session_id).await });
        // The turn's end checkpoint, after its answer (never holding it up).
        let c = ctx.clone();
        crate::actor::spawn(async move { super::turns::settled(&c, session_id).await });
        // An agent that is asked tells who it is (Pi: its conversation file exists from the first turn on).
        if crate::agent::asks_state(super::conversation::protocol_of(ctx, &s)) {
            let c = ctx.clone();
            crate::actor::spawn(async move {
                if let Err(e) = super::conversation::learn(&c, session_id, false).await {
                    tracing::warn!(session = %session_id, error = %e, "could not learn the agent's state");
                }
            });
        }
    }
    Ok(())
}

/// The agent asked its box for an address its profile does not list: an event of its session.
async fn on_refused(ctx: &Ctx, session_id: SessionId, execution_id: ExecutionId, address: &str) -> Result<()> {
    tracing::warn!(session = %session_id, %address, "the agent's box refused an address its profile does not list");
    let Some(s) = store::find(&ctx.db.conn, session_id).await? else {
        return Ok(());
    };
    let Some(task) = task_store::find(&ctx.db.conn, s.task_id).await? else {
        return Ok(());
    };
    let txn = ctx.db.begin_write().await?;
    let subject = Subject {
        execution_id: Some(execution_id),
        ..super::access::subject(&task, &s)
    };
    events::append(
        &txn,
        ctx.instance_id,
        EventType::SessionEgressRefused,
        subject,
        json!({ "address": address, "execution_id": execution_id }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(())
}

/// How an agent's process ended.
struct Exit {
    code: Option<i32>,
    expected: bool,
    /// Its box's memory limit ended it.
    out_of_memory: bool,
    /// berth ended it: it stopped reading its stdin with its queue full.
    not_reading: bool,
}

async fn on_exit(
    ctx: &Ctx,
    session_id: SessionId,
    execution_id: ExecutionId,
    Exit {
        code,
        expected,
        out_of_memory,
        not_reading,
    }: Exit,
    stderr_tail: &str,
) -> Result<()> {
    transition_execution(
        &ctx.db.conn,
        execution_id,
        ExecutionEvent::Exited { expected },
        ExecutionPatch {
            exit_code: Some(code),
            ended_at: Some(crate::clock::now()),
            ..Default::default()
        },
    )
    .await?;
    if expected {
        return Ok(());
    }
    let Some(s) = store::find(&ctx.db.conn, session_id).await? else {
        return Ok(());
    };
    if s.execution_id != Some(execution_id) || s.state.is_terminal() {
        return Ok(());
    }
    let Some(task) = task_store::find(&ctx.db.conn, s.task_id).await? else {
        return Ok(());
    };
    let message = exit_message(code, stderr_tail);
    if out_of_memory {
        // Its limit would end it again: failed alone, berth and every other agent going on.
        let message = format!("the agent reached its memory limit and was ended; {message}");
        record_failure(
            ctx,
            &task,
            s.id,
            Seen::on_execution(Some(execution_id)),
            "out_of_memory",
            &message,
        )
        .await?;
        return Ok(());
    }
    if not_reading {
        // A restart would meet the same agent: failed alone, berth's memory as it was.
        let message = format!(
            "the agent stopped reading its stdin while berth held {} bytes for it (BERTH_AGENT_STDIN_QUEUE_MAX_BYTES) and was ended; {message}",
            ctx.config.agent_stdin_queue_max_bytes
        );
        record_failure(
            ctx,
            &task,
            s.id,
            Seen::on_execution(Some(execution_id)),
            "agent_not_reading",
            &message,
        )
        .await?;
        return Ok(());
    }
    // I30: an open session whose agent died is restarted in the same workspace, with backoff, a bounded
    // number of times in a window; past that it is failed with the reason.
    let window = chrono::Duration::from_std(ctx.config.agent_restart_window).unwrap_or(chrono::Duration::minutes(10));
    let recent_failures =
        crate::store::executions::failures_since(&ctx.db.conn, session_id, crate::clock::now() - window).await?;
    if !s.desired_open || recent_failures > u64::from(ctx.config.agent_restart_max) {
        let message = if s.desired_open {
            format!("{message}; {recent_failures} failures in the restart window")
        } else {
            message
        };
        record_failure(
            ctx,
            &task,
            s.id,
            Seen::on_execution(Some(execution_id)),
            "agent_exited",
            &message,
        )
        .await?;
        return Ok(());
    }
    let txn = ctx.db.begin_write().await?;
    if let Some(current) = store::find_locked(&txn, session_id).await?
        && current.execution_id == Some(execution_id)
        && current.state.on(SessionEvent::Crashed).is_ok()
    {
        let patch = StatePatch {
            last_error: Some(Some(("agent_exited".to_string(), message))),
            ..Default::default()
        };
        transition(&txn, ctx, &task, &current, SessionEvent::Crashed, patch).await?;
    }
    ctx.commit(txn).await?;
    super::restore::restart_after_crash(ctx, session_id, execution_id, recent_failures);
    Ok(())
}

/// The reason an agent exited unasked, with the last line it wrote to stderr.
fn exit_message(code: Option<i32>, stderr_tail: &str) -> String {
    let last_line = stderr_tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(300)
        .collect::<String>();
    let status = code.map(|c| format!("status {c}")).unwrap_or_else(|| "a signal".into());
    if last_line.is_empty() {
        format!("the agent exited unexpectedly with {status}")
    } else {
        format!("the agent exited unexpectedly with {status}: {last_line}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_that_move_a_session() {
        assert_eq!(session_event(&Signal::TurnStarted), Some(SessionEvent::AgentStart));
        assert_eq!(
            session_event(&Signal::TurnSettled { stop_reason: None }),
            Some(SessionEvent::AgentEnd)
        );
        let q = Signal::Question {
            request: json!({"id": "q"}),
            timeout_ms: None,
        };
        assert_eq!(session_event(&q), Some(SessionEvent::UiRequest));
        assert_eq!(session_event(&Signal::ToolEnded), None);
        assert_eq!(session_event(&Signal::QuestionsCleared), None);
    }

    #[test]
    fn exit_messages_carry_the_last_stderr_line() {
        assert_eq!(
            exit_message(Some(3), "first\nlast words\n\n"),
            "the agent exited unexpectedly with status 3: last words"
        );
        assert_eq!(exit_message(None, ""), "the agent exited unexpectedly with a signal");
    }
}
