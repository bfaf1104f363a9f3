//! Any replica reaches the agent: a request for a session whose agent another node runs is stored as a
//! command (`session_commands`), that node is woken (PostgreSQL `NOTIFY`; on SQLite its poll finds it),
//! carries it out (`commands`) and records the result, which the caller waits for and answers with, errors
//! included, as if the agent ran here. A message needs no command: it is in the inbox already, and the
//! owner delivers it once woken.
//!
//! Stop and launch of one session are serialized across replicas by the database, not by this module: a
//! launch's `record_handle` and a stop's transition both take the session row (`FOR UPDATE` on
//! PostgreSQL, the writer lock on SQLite); a launch that finds it `stopping` is refused (`session_busy`)
//! and one that finds it `starting` answers with it; `ux_agent_executions_live` admits one `starting` or
//! `running` execution per session over all nodes, so a second launch elsewhere fails `session_busy`
//! with nothing spawned. A launch on a replica while another runs the agent returns it as it is
//! (`launch_session`), and a stop is carried out by the node that runs it.
use crate::ids::{CommandId, ExecutionId, SessionId};
use std::time::Duration;

use serde_json::{Value, json};

use super::Ctx;
use crate::entity::agent_execution::ExecutionState;
use crate::entity::session_command::{CommandKind, CommandState};
use crate::entity::task_session as session;
use crate::error::{Error, FieldError, Result};
use crate::store::session_commands as store;

/// How often the caller looks at its command meanwhile.
const CHECK: Duration = Duration::from_millis(25);
/// Every this many checks, whether the owner still runs the agent (if not, the request is handled here).
const OWNER_CHECK_EVERY: u32 = 20;

/// What a replica asks of the node that runs a session's agent.
pub(super) enum Command<'a> {
    Abort,
    Stop,
    /// An answer to the agent's question `request_id`, in the shape the agent takes it.
    Answer {
        request_id: &'a str,
        response: Value,
    },
    /// A mode or an option for the agent.
    Configure(Value),
}

/// The execution of the session's agent when another instance runs it (it is `starting` or `running`
/// there, and not here): another node's, or a sibling instance's of this node.
pub(super) async fn owner_elsewhere(ctx: &Ctx, s: &session::Model) -> Result<Option<ExecutionId>> {
    Ok(owning_execution(ctx, s).await?.map(|e| e.id))
}

/// Whether another instance runs the session's agent and can be reached (`503` when it cannot).
pub(super) async fn runs_reachably_elsewhere(ctx: &Ctx, s: &session::Model) -> Result<bool> {
    match owning_execution(ctx, s).await? {
        Some(e) => reachable(ctx, &e).await.map(|()| true),
        None => Ok(false),
    }
}

async fn owning_execution(ctx: &Ctx, s: &session::Model) -> Result<Option<crate::entity::agent_execution::Model>> {
    if ctx.runtime.is_live(s.id) {
        return Ok(None);
    }
    let Some(execution_id) = s.execution_id else {
        return Ok(None);
    };
    Ok(crate::store::executions::find(&ctx.db.conn, execution_id)
        .await?
        .filter(|e| {
            matches!(e.state, ExecutionState::Starting | ExecutionState::Running) && e.instance_id != ctx.instance_id
        }))
}

/// A request for an agent whose node is down answers at once (`503 node_unavailable`), never after the
/// routing deadline; one whose instance is gone while its node is up waits for a live instance of that
/// node to take the agent over (`503 unavailable`, retryable).
async fn reachable(ctx: &Ctx, e: &crate::entity::agent_execution::Model) -> Result<()> {
    crate::domain::nodes::require_up(ctx, &e.node_id).await?;
    if !crate::domain::nodes::instance_alive(ctx, e.instance_id).await? {
        return Err(Error::Unavailable(format!(
            "the berth process that ran the session's agent on node {} is gone; another instance of that node takes it over",
            e.node_id
        )));
    }
    Ok(())
}

/// Carries the request out on the node that runs the agent, if that is another one: `true` when it was
/// done there (its error is returned as this node would answer it); `false`: this node handles it.
pub(super) async fn forward(ctx: &Ctx, s: &session::Model, command: Command<'_>) -> Result<bool> {
    let Some(owner) = owning_execution(ctx, s).await? else {
        return Ok(false);
    };
    reachable(ctx, &owner).await?;
    let execution_id = owner.id;
    let (kind, payload) = match command {
        Command::Abort => (CommandKind::Abort, json!({})),
        Command::Stop => (CommandKind::Stop, json!({})),
        Command::Answer { request_id, response } => (
            CommandKind::Answer,
            json!({ "request_id": request_id, "response": response }),
        ),
        Command::Configure(setting) => (CommandKind::Configure, setting),
    };
    let conn = &ctx.db.conn;
    let actor = crate::actor::current();
    let id = store::insert(conn, s.id, execution_id, kind, payload, actor, crate::clock::now()).await?;
    if let Err(e) = store::notify(conn, s.id).await {
        tracing::warn!(session = %s.id, error = %e, "NOTIFY failed; the owner's poll finds the command");
    }
    // How long a caller waits for the owning node to carry it out (then 503, retryable).
    let deadline = tokio::time::Instant::now() + ctx.config.routing_deadline;
    let mut checks = 0u32;
    loop {
        tokio::time::sleep(CHECK).await;
        // Gone with its session (a delete): so is the session.
        let c = store::find(conn, id).await?.ok_or(Error::NotFound("session"))?;
        match c.state {
            CommandState::Done => return Ok(true),
            CommandState::Failed => return Err(decode(c.result.as_ref().unwrap_or(&Value::Null))),
            CommandState::Pending => {}
        }
        checks += 1;
        let owner_gone = checks.is_multiple_of(OWNER_CHECK_EVERY) && {
            let now = super::access::reload(conn, s.id).await?;
            owner_elsewhere(ctx, &now).await? != Some(execution_id)
        };
        // Its node went down meanwhile: answered now, not at the deadline.
        if checks.is_multiple_of(OWNER_CHECK_EVERY)
            && ctx.nodes.cached(&owner.node_id) != crate::domain::nodes::NodeState::Up
            && let Err(e) = crate::domain::nodes::require_up(ctx, &owner.node_id).await
            && give_up(ctx, id, false).await?
        {
            return Err(e);
        }
        let late = tokio::time::Instant::now() >= deadline;
        if (owner_gone || late) && give_up(ctx, id, owner_gone).await? {
            if owner_gone {
                // The agent ended there meanwhile: the request is this node's to answer.
                return Ok(false);
            }
            return Err(Error::Unavailable(format!(
                "the node running the session's agent did not carry out the {kind:?} command in time"
            )));
        }
    }
}

/// Marks a command the caller no longer waits for as failed, so that it never runs late; false when the
/// owner finished it first.
async fn give_up(ctx: &Ctx, id: CommandId, owner_gone: bool) -> Result<bool> {
    let why = if owner_gone {
        "the agent is no longer running on that node"
    } else {
        "the caller stopped waiting"
    };
    store::finish(
        &ctx.db.conn,
        id,
        CommandState::Failed,
        json!({ "code": "abandoned", "message": why }),
        crate::clock::now(),
    )
    .await
}

/// Wakes the node that may run the session's agent to deliver what its inbox holds (PostgreSQL only;
/// elsewhere the owner's poll finds it).
pub(super) fn nudge(ctx: &Ctx, session_id: SessionId) {
    if ctx.db.is_sqlite() {
        return;
    }
    let conn = ctx.db.conn.clone();
    tokio::spawn(async move {
        if let Err(e) = store::notify(&conn, session_id).await {
            tracing::warn!(session = %session_id, error = %e, "NOTIFY failed; the owner's poll delivers");
        }
    });
}

/// The result of a command that failed on the owner, kept so the caller answers with the same problem.
pub(super) fn encode(e: &Error) -> Value {
    match e {
        Error::NotFound(what) => json!({ "code": "not_found", "what": what }),
        Error::Invalid { detail, errors } => json!({ "code": "invalid", "message": detail, "errors": errors }),
        Error::InvalidState(m) => json!({ "code": "invalid_state", "message": m }),
        Error::Stale(m) => json!({ "code": "stale", "message": m }),
        Error::SessionBusy => json!({ "code": "session_busy" }),
        Error::Unavailable(m) => json!({ "code": "unavailable", "message": m }),
        Error::NodeUnavailable {
            node_id,
            decommissioned,
            retry_after,
        } => json!({ "code": "node_unavailable", "node_id": node_id, "decommissioned": decommissioned,
                     "retry_after_ms": retry_after.as_millis() as u64 }),
        other => json!({ "code": "internal", "message": other.to_string() }),
    }
}

/// The error a failed command's result stands for (the inverse of [`encode`]).
fn decode(result: &Value) -> Error {
    let message = result["message"].as_str().unwrap_or_default().to_string();
    match result["code"].as_str() {
        Some("not_found") => Error::NotFound(match result["what"].as_str() {
            Some("attention request") => "attention request",
            Some("message") => "message",
            _ => "session",
        }),
        Some("invalid") => Error::Invalid {
            detail: message,
            errors: result["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| FieldError {
                    field: f["field"].as_str().unwrap_or_default().to_string(),
                    message: f["message"].as_str().unwrap_or_default().to_string(),
                })
                .collect(),
        },
        Some("invalid_state") => Error::InvalidState(message),
        Some("stale") => Error::Stale(message),
        Some("session_busy") => Error::SessionBusy,
        Some("unavailable" | "abandoned") => Error::Unavailable(message),
        Some("node_unavailable") => Error::NodeUnavailable {
            node_id: result["node_id"].as_str().unwrap_or_default().to_string(),
            decommissioned: result["decommissioned"] == true,
            retry_after: Duration::from_millis(result["retry_after_ms"].as_u64().unwrap_or(15_000)),
        },
        _ => Error::Internal(anyhow::anyhow!("the node running the agent failed: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_come_back_as_they_were() {
        let cases = [
            Error::NotFound("attention request"),
            Error::invalid("confirmed", "a confirm question is answered with confirmed"),
            Error::InvalidState("no agent".into()),
            Error::Stale("retry".into()),
            Error::SessionBusy,
            Error::Unavailable("later".into()),
            Error::NodeUnavailable {
                node_id: "n1".into(),
                decommissioned: false,
                retry_after: Duration::from_secs(15),
            },
        ];
        for e in cases {
            let back = decode(&encode(&e));
            assert_eq!(back.to_string(), e.to_string());
            assert_eq!(std::mem::discriminant(&back), std::mem::discriminant(&e));
        }
        assert!(matches!(
            decode(&json!({"code": "internal", "message": "x"})),
            Error::Internal(_)
        ));
    }
}
