//! Who did it: the actor every event and every cleanup job records.
//!
//! A request's actor is its verified token's `sub` (and, for an agent's token, its session). The
//! `actor::middleware` opens an empty slot around each request; authentication fills it (`record`); an
//! event appended or a job written anywhere below reads it (`current`), so no signature between a handler
//! and `events::append` carries it. Work a request hands to another task keeps its actor through
//! `actor::spawn`. Work berth starts itself (a worker, a reconcile pass, crash recovery) has no actor:
//! `None`, which the API shows as `actor: null`. A cleanup job runs on behalf of whoever asked for it:
//! the worker runs it `within` the job's recorded actor.
use crate::ids::SessionId;
use std::future::Future;
use std::sync::{Arc, OnceLock};

/// The caller as its token proved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub sub: String,
    /// An agent's session-bound token: the session it acts for.
    pub session_id: Option<SessionId>,
}

impl Actor {
    pub fn of(sub: Option<String>, session_id: Option<SessionId>) -> Option<Actor> {
        sub.map(|sub| Actor { sub, session_id })
    }
}

type Slot = Arc<OnceLock<Actor>>;

tokio::task_local! {
    static SLOT: Slot;
}

/// The actor of the work running now, if a caller proved one.
pub fn current() -> Option<Actor> {
    SLOT.try_with(|slot| slot.get().cloned()).ok().flatten()
}

/// Records the request's actor once authentication proved it (the first proof wins: one request, one
/// caller). Outside a request scope it is a no-op.
pub fn record(actor: Actor) {
    let _ = SLOT.try_with(|slot| {
        let _ = slot.set(actor);
    });
}

/// Runs `f` on behalf of `actor` (a cleanup job's requester), or of nobody.
pub async fn within<F: Future>(actor: Option<Actor>, f: F) -> F::Output {
    let slot: Slot = Arc::new(OnceLock::new());
    if let Some(a) = actor {
        let _ = slot.set(a);
    }
    SLOT.scope(slot, f).await
}

/// Runs `f` with an empty slot that authentication below fills (the request scope).
pub async fn request_scope<F: Future>(f: F) -> F::Output {
    SLOT.scope(Arc::new(OnceLock::new()), f).await
}

/// `tokio::spawn` that keeps the current actor (the slot itself, so an actor recorded later is seen too).
pub fn spawn<F>(f: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match SLOT.try_with(Arc::clone) {
        Ok(slot) => tokio::spawn(SLOT.scope(slot, f)),
        Err(_) => tokio::spawn(f),
    }
}

/// Wraps a future so it keeps the current actor wherever it is polled (for executors other than
/// `tokio::spawn`, such as actix's).
pub fn carry<F: Future>(f: F) -> impl Future<Output = F::Output> {
    let slot = SLOT.try_with(Arc::clone).unwrap_or_else(|_| Arc::new(OnceLock::new()));
    SLOT.scope(slot, f)
}
