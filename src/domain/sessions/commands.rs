//! The owner's side of routing: a background loop on every node carries out the commands other replicas
//! stored for the agents this node runs (`routing`), with the same rules as a request made here, records
//! each result, and delivers what other replicas put in those agents' inboxes. It is woken by PostgreSQL
//! `NOTIFY` and otherwise polls (`BERTH_ROUTING_POLL_MS`).
use crate::ids::{CommandId, SessionId};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::Ctx;
use super::control;
use super::inbox;
use super::routing;
use crate::entity::session_command::{self as command, CommandKind, CommandState};
use crate::error::{Error, Result};
use crate::store::session_commands as store;

/// How long a finished command is kept (its caller read it long before).
const KEEP_FINISHED: Duration = Duration::from_secs(3600);
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// What is being carried out now, so that the next wake does not start it twice.
#[derive(Clone)]
struct InFlight<Id>(Arc<Mutex<HashSet<Id>>>);

impl<Id: Copy + Eq + std::hash::Hash> InFlight<Id> {
    fn new() -> Self {
        Self(Arc::default())
    }
    fn claim(&self, id: Id) -> bool {
        self.0.lock().unwrap().insert(id)
    }
    fn release(&self, id: Id) {
        self.0.lock().unwrap().remove(&id);
    }
}

/// Runs until the process ends (a background task of `startup`).
pub async fn serve_routed(ctx: Ctx) {
    let (commands, deliveries) = (InFlight::<CommandId>::new(), InFlight::<SessionId>::new());
    let mut listener = None;
    let mut trimmed = tokio::time::Instant::now();
    loop {
        if !ctx.db.is_sqlite() && listener.is_none() {
            listener = listen(&ctx).await;
        }
        let mut lost = false;
        match listener.as_mut() {
            Some(l) => tokio::select! {
                r = l.recv() => if let Err(e) = r {
                    tracing::warn!(error = %e, "routing LISTEN connection lost; reconnecting");
                    lost = true;
                },
                _ = tokio::time::sleep(ctx.config.routing_poll) => {}
            },
            None => tokio::time::sleep(ctx.config.routing_poll).await,
        }
        if lost {
            listener = None;
        }
        if let Err(e) = wake(&ctx, &commands, &deliveries).await {
            tracing::warn!(error = %e, "could not look for routed commands and messages");
        }
        if trimmed.elapsed() >= TRIM_EVERY {
            trimmed = tokio::time::Instant::now();
            let before = crate::clock::now() - chrono::Duration::from_std(KEEP_FINISHED).unwrap_or_default();
            if let Err(e) = store::delete_finished_before(&ctx.db.conn, before).await {
                tracing::warn!(error = %e, "could not trim finished routed commands");
            }
        }
    }
}

async fn listen(ctx: &Ctx) -> Option<sea_orm::sqlx::postgres::PgListener> {
    let pool = ctx.db.conn.get_postgres_connection_pool().clone();
    let mut l = match sea_orm::sqlx::postgres::PgListener::connect_with(&pool).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the routing LISTEN connection; polling");
            return None;
        }
    };
    match l.listen(store::PG_CHANNEL).await {
        Ok(()) => Some(l),
        Err(e) => {
            tracing::warn!(error = %e, "routing LISTEN failed; polling");
            None
        }
    }
}

/// One look: pending commands of the agents live here are started, and their queued messages delivered.
async fn wake(ctx: &Ctx, commands: &InFlight<CommandId>, deliveries: &InFlight<SessionId>) -> Result<()> {
    let live = ctx.runtime.live_sessions();
    if live.is_empty() {
        return Ok(());
    }
    for c in store::pending_for(&ctx.db.conn, &live).await? {
        if !commands.claim(c.id) {
            continue;
        }
        let (ctx, commands) = (ctx.clone(), commands.clone());
        crate::actor::spawn(async move {
            // On behalf of whoever asked on the other replica: its events name them.
            let actor = crate::actor::Actor::of(c.actor_sub.clone(), c.actor_session_id);
            let outcome = crate::actor::within(actor, execute(&ctx, &c)).await;
            let (state, result) = match &outcome {
                Ok(()) => (CommandState::Done, json!({ "ok": true })),
                Err(e) => (CommandState::Failed, routing::encode(e)),
            };
            if let Err(e) = store::finish(&ctx.db.conn, c.id, state, result, crate::clock::now()).await {
                tracing::warn!(session = %c.session_id, error = %e, "could not record a routed command's result");
            }
            commands.release(c.id);
        });
    }
    for session_id in crate::store::inbox::sessions_with_queued(&ctx.db.conn, &live).await? {
        if !deliveries.claim(session_id) {
            continue;
        }
        let (ctx, deliveries) = (ctx.clone(), deliveries.clone());
        crate::actor::spawn(async move {
            if let Err(e) = inbox::dispatch(&ctx, session_id).await {
                tracing::warn!(session = %session_id, error = %e, "could not deliver a routed message");
            }
            deliveries.release(session_id);
        });
    }
    Ok(())
}

/// A routed command, by the same rules as the request made on this node.
async fn execute(ctx: &Ctx, c: &command::Model) -> Result<()> {
    let Some((s, Some(task))) = crate::store::sessions::find_with_task(&ctx.db.conn, c.session_id).await? else {
        return Err(Error::NotFound("session"));
    };
    if s.execution_id != Some(c.execution_id) {
        return Err(Error::Stale(
            "the session's agent was relaunched meanwhile; retry".into(),
        ));
    }
    match c.kind {
        CommandKind::Abort => inbox::abort_session(ctx, &task, &s).await,
        CommandKind::Stop => control::stop_session(ctx, &s).await,
        CommandKind::Answer => {
            let request_id = c.payload["request_id"].as_str().unwrap_or_default();
            let answer = control::from_response(&c.payload["response"])?;
            control::answer_session(ctx, &task, &s, request_id, answer).await
        }
        CommandKind::Configure => {
            let setting = super::settings::Setting::from_payload(&c.payload)?;
            super::settings::configure_session(ctx, &s, &setting).await
        }
    }
}
