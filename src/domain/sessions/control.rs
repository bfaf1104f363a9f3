//! Driving a running agent: messages, stop (I28), answers to its questions (I31).
use crate::ids::{ExecutionId, SessionId};

use super::Ctx;
use super::access::{SessionView, project, reload, reload_locked, visible, visible_with_task};
use super::state::{SessionEvent, transition};
use crate::agent::Answered;
use crate::auth::Principal;
use crate::entity::task;
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result};
use crate::store::sessions::{self as store, StatePatch};
use crate::store::tasks as task_store;

/// I28: clear `desired_open` first, then stop the process with escalation; the transcript stays.
pub async fn stop(ctx: &Ctx, p: &Principal, session_id: SessionId) -> Result<SessionView> {
    let s = visible(&ctx.db.conn, p, session_id).await?;
    // Another node runs the agent: it stops it there, by the rule below.
    if !super::routing::forward(ctx, &s, super::routing::Command::Stop).await? {
        stop_session(ctx, &s).await?;
    }
    project(ctx, reload(&ctx.db.conn, s.id).await?).await
}

/// I8 across replicas: a cleanup ends a session's agent wherever it runs, before it touches any file:
/// here, or on the node that runs it (a routed stop, carried out there as a stop requested there; the
/// wait is `routing`'s, `BERTH_ROUTING_DEADLINE_MS`). `Ok` once no agent of the session runs anywhere; an error when the node
/// that runs it did not stop it (the caller does not touch the session's files then).
pub(crate) async fn end_agent(ctx: &Ctx, session_id: SessionId) -> Result<()> {
    if ctx.runtime.stop(session_id).await.is_some() {
        return Ok(());
    }
    // Gone with its task (a delete's job): the delete ended its agent before the rows went.
    let Some(s) = store::find(&ctx.db.conn, session_id).await? else {
        return Ok(());
    };
    super::routing::forward(ctx, &s, super::routing::Command::Stop).await?;
    Ok(())
}

pub(crate) async fn stop_session(ctx: &Ctx, s: &session::Model) -> Result<()> {
    let task = task_store::find(&ctx.db.conn, s.task_id)
        .await?
        .ok_or(Error::NotFound("session"))?;
    let live = ctx.runtime.is_live(s.id);
    let txn = ctx.db.begin_write().await?;
    let current = reload_locked(&txn, s.id).await?;
    let event = SessionEvent::Stop { live };
    if current.state.on(event).is_ok() {
        let patch = StatePatch {
            desired_open: Some(false),
            ..Default::default()
        };
        transition(&txn, ctx, &task, &current, event, patch).await?;
    } else {
        // Already stopping, or over: only the wish to keep it open goes.
        store::clear_desired_open(&txn, s.id, crate::clock::now()).await?;
    }
    ctx.commit(txn).await?;
    // What was still waiting will not be delivered by this agent: visibly cancelled, never lost silently.
    super::inbox::cancel_queued(ctx, &task, s, "the session was stopped").await?;
    if live {
        let ended = ctx.runtime.stop(s.id).await;
        settle_stopped(ctx, &task, s.id, ended).await?;
    }
    Ok(())
}

/// `stopping` → `stopped`, once (the exit report may get there first). The execution is over as the stop
/// returns, before its exit report is read: a launch right after the stop must not find it still live.
async fn settle_stopped(
    ctx: &Ctx,
    task: &task::Model,
    session_id: SessionId,
    ended: Option<(ExecutionId, Option<i32>)>,
) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    let current = reload_locked(&txn, session_id).await?;
    if let Some((execution_id, code)) = ended {
        let patch = crate::store::executions::ExecutionPatch {
            exit_code: Some(code),
            ended_at: Some(crate::clock::now()),
            ..Default::default()
        };
        super::state::transition_execution(
            &txn,
            execution_id,
            super::state::ExecutionEvent::Exited { expected: true },
            patch,
        )
        .await?;
    }
    if current.state == SessionState::Stopping {
        let patch = StatePatch {
            ended_at: Some(crate::clock::now()),
            ..Default::default()
        };
        transition(&txn, ctx, task, &current, SessionEvent::Settled, patch).await?;
    }
    ctx.commit(txn).await
}

/// I31: answers an attention request pending on this session (and no other); the agent works on.
pub async fn answer_attention(
    ctx: &Ctx,
    p: &Principal,
    session_id: SessionId,
    request_id: &str,
    answer: Answer,
) -> Result<SessionView> {
    let (s, task) = visible_with_task(&ctx.db.conn, p, session_id).await?;
    // Another node runs the agent: the answer is checked and given there.
    let routed = super::routing::Command::Answer {
        request_id,
        response: response(&answer),
    };
    if !super::routing::forward(ctx, &s, routed).await? {
        answer_session(ctx, &task, &s, request_id, answer).await?;
    }
    project(ctx, reload(&ctx.db.conn, s.id).await?).await
}

/// The answer itself, on the node that runs the agent.
pub(super) async fn answer_session(
    ctx: &Ctx,
    task: &task::Model,
    s: &session::Model,
    request_id: &str,
    answer: Answer,
) -> Result<()> {
    match ctx.runtime.answer(s.id, request_id, &answer) {
        Answered::Sent => {}
        Answered::NotPending => return Err(Error::NotFound("attention request")),
        Answered::Unfit(field, why) => return Err(Error::invalid(field, why)),
    }
    let left = ctx.runtime.attention(s.id);
    let txn = ctx.db.begin_write().await?;
    let current = reload_locked(&txn, s.id).await?;
    let agent_state = super::conversation::with_attention(current.agent_state.as_ref(), &left);
    if left.is_empty() && current.state == SessionState::Attention {
        let patch = StatePatch {
            agent_state,
            ..Default::default()
        };
        let event = SessionEvent::Answered {
            working: ctx.runtime.is_working(s.id),
        };
        let moved = transition(&txn, ctx, task, &current, event, patch).await?;
        ctx.commit(txn).await?;
        // The answer ended the turn (the agent had finished by the time it was recorded): it settles here,
        // as the agent's own end would have settled it (its end checkpoint, its writer lease given back).
        if moved == Some(SessionState::Idle) {
            let (c, id) = (ctx.clone(), s.id);
            crate::actor::spawn(async move { super::turns::settled(&c, id).await });
        }
        return Ok(());
    } else if agent_state.is_some() {
        crate::store::sessions::touch_with(&txn, s.id, crate::clock::now(), agent_state).await?;
    }
    ctx.commit(txn).await?;
    Ok(())
}

/// An answer to an agent's question: `value` (select, input, editor), `confirmed` (confirm), `option_id`
/// (a permission request's options) or `cancelled: true` (any). Whether it fits the question is the
/// agent protocol's to say, on the node that runs the agent.
pub type Answer = crate::agent::Answer;

/// Exactly one of the four, `value` a string and `cancelled` true.
pub fn parse_answer(
    value: Option<serde_json::Value>,
    confirmed: Option<bool>,
    option_id: Option<String>,
    cancelled: Option<bool>,
) -> Result<Answer> {
    match (value, confirmed, option_id, cancelled) {
        (Some(serde_json::Value::String(v)), None, None, None) => Ok(Answer::Value(v)),
        (Some(_), None, None, None) => Err(Error::invalid("value", "must be a string")),
        (None, Some(c), None, None) => Ok(Answer::Confirmed(c)),
        (None, None, Some(o), None) => Ok(Answer::Option(o)),
        (None, None, None, Some(true)) => Ok(Answer::Cancelled),
        (None, None, None, Some(false)) => Err(Error::invalid("cancelled", "only true cancels a question")),
        _ => Err(Error::invalid(
            "body",
            "give exactly one of value, confirmed, option_id or cancelled: true",
        )),
    }
}

/// The answer [`response`] wrote (an answer routed to the node that runs the agent).
pub(super) fn from_response(r: &serde_json::Value) -> Result<Answer> {
    parse_answer(
        r.get("value").cloned(),
        r["confirmed"].as_bool(),
        r["option_id"].as_str().map(str::to_string),
        r["cancelled"].as_bool(),
    )
}

pub(super) fn response(answer: &Answer) -> serde_json::Value {
    match answer {
        Answer::Value(v) => serde_json::json!({ "value": v }),
        Answer::Confirmed(c) => serde_json::json!({ "confirmed": c }),
        Answer::Option(o) => serde_json::json!({ "option_id": o }),
        Answer::Cancelled => serde_json::json!({ "cancelled": true }),
    }
}
