//! A session's inbox: a message is stored before anything is sent, and only then handed to the agent, by
//! the node that runs it, one at a time. While the agent works, `auto` and `follow_up` messages wait in
//! berth and go as the next prompt when the turn settles (Pi's RPC cannot take back a follow-up it was
//! given, so berth keeps them until then); a `steer` is forwarded at once. Every change of a message's
//! state is an event; none is ever dropped silently.
use crate::ids::{InboxItemId, SessionId};
use std::time::Duration;

use serde_json::{Value, json};

use super::Ctx;
use super::access::{SessionView, project, reload, subject, visible, visible_with_task};
use crate::agent::Command;
use crate::agent::Delivery as Sent;
use crate::auth::Principal;
use crate::domain::writer::{self, Asking};
use crate::entity::session_inbox::{self as inbox, Delivery, InboxState};
use crate::entity::session_message::MessageRole;
use crate::entity::task;
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result};
use crate::events::{self, EventType};
use crate::store::inbox as store;

/// How long berth waits for the agent to accept a message.
const ACCEPT: Duration = Duration::from_secs(60);
/// The longest message.
const MAX_TEXT: usize = 200_000;

/// The states in which a session takes messages: its agent runs, or is about to (again).
const TAKES_MESSAGES: [SessionState; 5] = [
    SessionState::Starting,
    SessionState::Running,
    SessionState::Idle,
    SessionState::Attention,
    SessionState::Recovering,
];

/// Stores a message for the session's agent (202: it is delivered as soon as the agent can take it).
pub async fn post(
    ctx: &Ctx,
    p: &Principal,
    session_id: SessionId,
    text: &str,
    delivery: Delivery,
) -> Result<inbox::Model> {
    if text.trim().is_empty() || text.len() > MAX_TEXT {
        return Err(Error::invalid("text", "must be 1 to 200000 bytes"));
    }
    let (s, task) = taking_messages(ctx, p, session_id).await?;
    // A steer the agent cannot take is refused now, never downgraded to a follow-up.
    let protocol = super::conversation::protocol_of(ctx, &s);
    if delivery == Delivery::Steer && !crate::agent::steers(protocol, s.agent_state.as_ref()) {
        return Err(Error::SteerUnsupported);
    }
    let message = enqueue(ctx, &task, &s, text, delivery).await?;
    wake(ctx, s.id);
    Ok(message)
}

/// The session, when the caller sees it and it takes messages (409 otherwise: launch or resume it).
pub(crate) async fn taking_messages(
    ctx: &Ctx,
    p: &Principal,
    session_id: SessionId,
) -> Result<(session::Model, task::Model)> {
    let (s, task) = visible_with_task(&ctx.db.conn, p, session_id).await?;
    if !TAKES_MESSAGES.contains(&s.state) {
        return Err(Error::InvalidState(
            "the session has no running agent; launch or resume it".into(),
        ));
    }
    Ok((s, task))
}

/// A session's messages, oldest first.
pub async fn list(ctx: &Ctx, p: &Principal, session_id: SessionId) -> Result<Vec<inbox::Model>> {
    let s = visible(&ctx.db.conn, p, session_id).await?;
    store::of_session(&ctx.db.conn, s.id).await
}

/// Takes back a message that is still queued (409 once the agent has it).
pub async fn cancel(ctx: &Ctx, p: &Principal, session_id: SessionId, message_id: InboxItemId) -> Result<inbox::Model> {
    let (s, task) = visible_with_task(&ctx.db.conn, p, session_id).await?;
    let message = store::find(&ctx.db.conn, s.id, message_id)
        .await?
        .ok_or(Error::NotFound("message"))?;
    if message.state != InboxState::Queued {
        return Err(Error::InvalidState(format!(
            "the message is {}; only a queued message can be cancelled",
            state_name(message.state)
        )));
    }
    // Not while this node hands messages to the agent: a message being sent is not cancelled under it.
    let lock = ctx.runtime.dispatch_lock(s.id);
    let _guard = match &lock {
        Some(l) => Some(l.lock().await),
        None => None,
    };
    if !settle(
        ctx,
        &task,
        &s,
        message.id,
        InboxState::Cancelled,
        Some("cancelled by request"),
    )
    .await?
    {
        return Err(Error::InvalidState(
            "the message left the queue meanwhile; only a queued message can be cancelled".into(),
        ));
    }
    store::find(&ctx.db.conn, s.id, message_id)
        .await?
        .ok_or(Error::NotFound("message"))
}

/// Ends the agent's current turn at once, ahead of anything queued: berth's queued messages are
/// cancelled, the agent is told to abort, and the session goes back to `idle` with its agent running.
pub async fn abort(ctx: &Ctx, p: &Principal, session_id: SessionId) -> Result<SessionView> {
    let (s, task) = visible_with_task(&ctx.db.conn, p, session_id).await?;
    // Another node runs the agent: it aborts there, by the rule below.
    if !super::routing::forward(ctx, &s, super::routing::Command::Abort).await? {
        abort_session(ctx, &task, &s).await?;
    }
    project(ctx, reload(&ctx.db.conn, s.id).await?).await
}

/// The abort itself, on the node that runs the agent.
pub(super) async fn abort_session(ctx: &Ctx, task: &task::Model, s: &session::Model) -> Result<()> {
    let Some(lock) = ctx.runtime.dispatch_lock(s.id) else {
        return Err(Error::InvalidState(
            "the session has no running agent; launch or resume it".into(),
        ));
    };
    // Under the delivery lock: nothing queued can be handed over between the cancel and the abort.
    let guard = lock.lock().await;
    cancel_queued(ctx, task, s, "the turn was aborted").await?;
    ctx.runtime.call(s.id, Command::Abort, ACCEPT).await;
    drop(guard);
    Ok(())
}

/// Stores a message (with its event) without waking the delivery.
pub(super) async fn enqueue(
    ctx: &Ctx,
    task: &task::Model,
    s: &session::Model,
    text: &str,
    delivery: Delivery,
) -> Result<inbox::Model> {
    let txn = ctx.db.begin_write().await?;
    let message = store::insert(&txn, s.id, text, delivery, crate::clock::now()).await?;
    record(&txn, ctx, task, s, &message).await?;
    ctx.commit(txn).await?;
    Ok(message)
}

/// Stores a message (with its event) in the caller's transaction, without waking the delivery.
pub(crate) async fn enqueue_in(
    txn: &sea_orm::DatabaseTransaction,
    ctx: &Ctx,
    task: &task::Model,
    s: &session::Model,
    text: &str,
) -> Result<inbox::Model> {
    let message = store::insert(txn, s.id, text, Delivery::default(), crate::clock::now()).await?;
    record(txn, ctx, task, s, &message).await?;
    Ok(message)
}

/// Every queued message of an ending (or aborted) session is cancelled, visibly.
pub(super) async fn cancel_queued(ctx: &Ctx, task: &task::Model, s: &session::Model, why: &str) -> Result<()> {
    for m in store::queued(&ctx.db.conn, s.id).await? {
        settle(ctx, task, s, m.id, InboxState::Cancelled, Some(why)).await?;
    }
    Ok(())
}

/// Delivers in the background (the caller does not wait for the agent to accept).
pub(crate) fn wake(ctx: &Ctx, session_id: SessionId) {
    if !ctx.runtime.is_live(session_id) {
        // The node that runs it (if another one) delivers.
        super::routing::nudge(ctx, session_id);
        return;
    }
    let ctx = ctx.clone();
    crate::actor::spawn(async move {
        if let Err(e) = dispatch(&ctx, session_id).await {
            tracing::warn!(session = %session_id, error = ?e, "could not deliver a queued message");
        }
    });
}

/// Hands the agent what it can take now, oldest first: a prompt when it is idle, steers while it works.
pub(crate) async fn dispatch(ctx: &Ctx, session_id: SessionId) -> Result<()> {
    let Some(lock) = ctx.runtime.dispatch_lock(session_id) else {
        return Ok(());
    };
    let _guard = lock.lock().await;
    let Some((s, Some(task))) = crate::store::sessions::find_with_task(&ctx.db.conn, session_id).await? else {
        return Ok(());
    };
    for m in store::queued(&ctx.db.conn, s.id).await? {
        let working = ctx.runtime.is_working(s.id);
        let command = match (m.delivery, working) {
            (_, false) => Command::Prompt(m.text.clone()),
            (Delivery::Steer, true) => Command::Steer(m.text.clone()),
            // Held until the turn settles.
            (Delivery::Auto | Delivery::FollowUp, true) => continue,
        };
        // A prompt starts a turn, which holds the environment's writer lease until it settled: while
        // another writer holds it (a restore, a landing, another session's turn) the prompt waits here,
        // queued, and goes when it is released.
        let lease = match (&command, s.task_environment_id) {
            (Command::Prompt(_), Some(env_id)) => match writer::acquire(ctx, env_id, Asking::Turn(s.id)).await {
                Ok(lease) => Some(lease),
                Err(Error::WriterBusy(_)) => {
                    wake_when_free(ctx, s.id, env_id);
                    return Ok(());
                }
                Err(err) => return Err(err),
            },
            _ => None,
        };
        // The turn is recorded before the agent can finish it (taken back if the agent does not take the
        // prompt); the worktree as the agent finds it is its checkpoint.
        let turn = match &command {
            Command::Prompt(_) => match super::turns::start(ctx, &s, &m.text, lease.as_ref()).await {
                Ok(t) => Some(t),
                Err(err) => {
                    if let Some(lease) = lease {
                        writer::release(ctx, lease).await;
                    }
                    return Err(err);
                }
            },
            _ => None,
        };
        // In the transcript before the agent can answer it (a reply must never come first); taken back if
        // the agent does not take the message.
        let entry = crate::store::messages::append(
            &ctx.db.conn,
            s.id,
            MessageRole::User,
            json!({ "text": m.text, "delivery": m.delivery }),
            crate::clock::now(),
        )
        .await?;
        let outcome = match ctx.runtime.call(s.id, command, ACCEPT).await {
            Sent::Accepted(_) => Outcome::Delivered,
            Sent::Refused { reason, .. } => Outcome::Refused(reason),
            Sent::Unsupported(u) => Outcome::Refused(u.to_string()),
            // A prompt: it was working after all, the message waits for the turn to settle. A steer: the
            // turn had ended, the message waits to be the next prompt.
            Sent::Busy => Outcome::Wait,
            // It has the message and did not refuse it: a refusal comes at once.
            Sent::NoAnswer => Outcome::Delivered,
            Sent::Gone => Outcome::Gone,
        };
        if !matches!(outcome, Outcome::Delivered) {
            if let Some(lease) = lease {
                writer::release(ctx, lease).await;
            }
            if let Some(t) = turn {
                super::turns::take_back(ctx, t).await?;
            }
        }
        match outcome {
            Outcome::Delivered => {
                settle(ctx, &task, &s, m.id, InboxState::Delivered, None).await?;
            }
            Outcome::Refused(reason) => {
                crate::store::messages::remove(&ctx.db.conn, entry).await?;
                settle(ctx, &task, &s, m.id, InboxState::Refused, Some(&reason)).await?;
            }
            Outcome::Wait => {
                crate::store::messages::remove(&ctx.db.conn, entry).await?;
            }
            // The agent is gone: the message stays queued for its next launch (or is cancelled by a stop).
            Outcome::Gone => {
                crate::store::messages::remove(&ctx.db.conn, entry).await?;
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Sessions whose prompt waits for an environment's writer lease, each watched once.
static WAITING: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<SessionId>>> =
    std::sync::LazyLock::new(Default::default);

/// Delivers the session's queue again once the environment's writer lease is free.
fn wake_when_free(ctx: &Ctx, session_id: SessionId, env_id: crate::ids::EnvironmentId) {
    if !WAITING.lock().unwrap().insert(session_id) {
        return;
    }
    let ctx = ctx.clone();
    crate::actor::spawn(async move {
        let free = writer::wait_free(&ctx, env_id, Duration::from_secs(3600)).await;
        WAITING.lock().unwrap().remove(&session_id);
        if let Err(err) = free {
            tracing::warn!(session = %session_id, error = %err, "could not wait for the writer lease");
        }
        wake(&ctx, session_id);
    });
}

enum Outcome {
    Delivered,
    Refused(String),
    Wait,
    Gone,
}

/// `queued` → `next`, with its event, if it was still queued.
async fn settle(
    ctx: &Ctx,
    task: &task::Model,
    s: &session::Model,
    id: InboxItemId,
    next: InboxState,
    reason: Option<&str>,
) -> Result<bool> {
    let txn = ctx.db.begin_write().await?;
    if !store::settle(&txn, id, next, reason, crate::clock::now()).await? {
        return Ok(false);
    }
    let message = store::find(&txn, s.id, id).await?.ok_or(Error::NotFound("message"))?;
    record(&txn, ctx, task, s, &message).await?;
    ctx.commit(txn).await?;
    Ok(true)
}

async fn record(
    txn: &sea_orm::DatabaseTransaction,
    ctx: &Ctx,
    task: &task::Model,
    s: &session::Model,
    message: &inbox::Model,
) -> Result<()> {
    events::append(
        txn,
        ctx.instance_id,
        EventType::SessionMessageUpdated,
        subject(task, s),
        json!({ "message": view(message) }),
    )
    .await?;
    Ok(())
}

/// A message as events and the API show it.
pub fn view(m: &inbox::Model) -> Value {
    json!({
        "id": m.id,
        "session_id": m.session_id,
        "text": m.text,
        "delivery": m.delivery,
        "state": m.state,
        "reason": m.reason,
        "created_at": m.created_at,
    })
}

fn state_name(s: InboxState) -> &'static str {
    match s {
        InboxState::Queued => "queued",
        InboxState::Delivered => "delivered",
        InboxState::Refused => "refused",
        InboxState::Cancelled => "cancelled",
    }
}
