//! Read-your-writes on PostgreSQL: a request remembers the newest event its open transaction appended;
//! at commit (`Ctx::commit`) that event becomes the one the request waits for, and before the answer
//! leaves (`request_scope`) the request waits until the sequencer stamped it and this replica published
//! it. A client that gets its answer then finds its change in `GET /events` and on every stream.
//!
//! One wait per request, at its end, not one per commit: a request that commits several times (the first
//! session of a task elects, materializes, publishes and records) waits once, for its newest event.
//! Publication is in seq order and a later commit's events are stamped no earlier than an earlier one's,
//! so the newest one published means every earlier one is.
//!
//! Work a request hands to a task of its own and awaits (the first session's materialization) runs in a
//! slot of its own ([`handed`]) and gives what it committed back to the request ([`adopt`]).
//!
//! Because the answer waits for a stamp, and a stamp is a flushed commit later in PostgreSQL's one log, a
//! request's own commits need not wait for their flush when nothing outside the database acts on them
//! before the answer (`Ctx::commit_answered`): the stamp's flush makes them durable first. Should the
//! stamp not come in time, the request flushes the log itself before answering ([`owe_flush`], `flush_log`).
//!
//! Outside a request (workers, agent reports) there is no slot and nothing waits: those events are
//! delivered as soon as they are stamped, and nobody is holding a response for them.
use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::PublishedId;
use crate::metrics::Metrics;

tokio::task_local! {
    static SLOT: RefCell<Slot>;
}

#[derive(Default)]
struct Slot {
    /// The newest event id appended by the open transaction.
    appended: Option<i64>,
    /// The newest committed event's publication, which the request waits for before answering.
    awaited: Option<Awaited>,
    /// A commit of this request returned before the log flush: the answer must not leave before one.
    owes_flush: Option<sea_orm::DatabaseConnection>,
}

/// What work handed to a task of its own left for the request to wait for ([`handed`], [`adopt`]).
#[derive(Default)]
pub struct Handoff {
    awaited: Option<Awaited>,
    owes_flush: Option<sea_orm::DatabaseConnection>,
}

impl Slot {
    /// What the answer must wait for, taken from the slot.
    fn take_owed(&mut self) -> Handoff {
        Handoff {
            awaited: self.awaited.take(),
            owes_flush: self.owes_flush.take(),
        }
    }
}

struct Awaited {
    published: PublishedId,
    committed: Instant,
    metrics: Arc<Metrics>,
}

/// How long a request waits for its events to be stamped (a leader taking over needs `TAKEOVER`).
const STAMP_WAIT: Duration = Duration::from_secs(2);

/// Runs a request with the slot; before its answer leaves, waits for the publication of its newest
/// committed event (at most `STAMP_WAIT`).
pub async fn request_scope<F: Future>(f: F) -> F::Output {
    SLOT.scope(RefCell::new(Slot::default()), async move {
        let out = f.await;
        let Handoff { awaited, owes_flush } = SLOT.with(|s| s.borrow_mut().take_owed());
        let mut flushed = false;
        if let Some(a) = awaited {
            if a.published.within(STAMP_WAIT).await {
                // Visible to the tailer only once its (synchronous) commit flushed the log.
                flushed = true;
                a.metrics.event_stamped(a.committed.elapsed());
            } else {
                // Committed all the same; it is delivered when a sequencer stamps it.
                tracing::warn!(
                    waited_ms = STAMP_WAIT.as_millis() as u64,
                    "an event was not stamped in time; answering without waiting further"
                );
            }
        }
        if let Some(db) = owes_flush
            && !flushed
            && let Err(e) = flush_log(&db).await
        {
            tracing::warn!(error = %e, "could not flush the log before answering");
        }
        out
    })
    .await
}

/// Returns once everything committed so far is flushed to the log: a commit that takes a transaction id
/// and waits for its flush flushes all of the log before it (PostgreSQL).
async fn flush_log(db: &sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let txn = db.begin().await?;
    txn.execute_unprepared("SET LOCAL synchronous_commit TO ON").await?;
    txn.execute_unprepared("SELECT txid_current()").await?;
    txn.commit().await
}

/// Whether a commit now would be waited for: inside a request, with events appended by the open
/// transaction.
pub(crate) fn will_wait() -> bool {
    SLOT.try_with(|s| s.borrow().appended.is_some()).unwrap_or(false)
}

/// A commit of this request returns before its log flush: the answer waits for one (the stamp's, or its
/// own on `db`).
pub(crate) fn owe_flush(db: sea_orm::DatabaseConnection) {
    let _ = SLOT.try_with(|s| s.borrow_mut().owes_flush = Some(db));
}

/// Wraps work a request hands to a task of its own and awaits: inside a request it runs with a slot of its
/// own, and returns, beside its output, what it committed, for the request to [`adopt`]. Outside a request
/// it runs as it is.
pub fn handed<F: Future>(f: F) -> impl Future<Output = (F::Output, Handoff)> {
    let inside = SLOT.try_with(|_| ()).is_ok();
    async move {
        if !inside {
            return (f.await, Handoff::default());
        }
        SLOT.scope(RefCell::new(Slot::default()), async move {
            let out = f.await;
            (out, SLOT.with(|s| s.borrow_mut().take_owed()))
        })
        .await
    }
}

/// The request waits for what handed work committed, as for its own commits (the handed work ran after
/// them, so its events are stamped no earlier).
pub fn adopt(h: Handoff) {
    let _ = SLOT.try_with(|s| {
        let mut s = s.borrow_mut();
        if let Some(a) = h.awaited {
            s.awaited = Some(a);
        }
        if let Some(db) = h.owes_flush {
            s.owes_flush = Some(db);
        }
    });
}

/// `events::append` inserted event `id` (ids grow, so the newest is the one to wait for).
pub(crate) fn appended(id: i64) {
    let _ = SLOT.try_with(|s| {
        let mut s = s.borrow_mut();
        s.appended = Some(s.appended.map_or(id, |m| m.max(id)));
    });
}

/// The newest event id appended since the last call (and forgets it): at commit, and at the start of a
/// transaction, so that one rolled back leaves nothing to wait for.
pub fn take_appended() -> Option<i64> {
    SLOT.try_with(|s| s.borrow_mut().appended.take()).ok().flatten()
}

/// The transaction whose events' publication `published` reports committed: the request waits for it
/// before answering (it replaces an earlier commit's, which is published no later).
pub(crate) fn committed(published: PublishedId, committed: Instant, metrics: Arc<Metrics>) {
    let _ = SLOT.try_with(|s| {
        s.borrow_mut().awaited = Some(Awaited {
            published,
            committed,
            metrics,
        });
    });
}
