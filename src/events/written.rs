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
        let awaited = SLOT.with(|s| s.borrow_mut().awaited.take());
        if let Some(a) = awaited {
            if a.published.within(STAMP_WAIT).await {
                a.metrics.event_stamped(a.committed.elapsed());
            } else {
                // Committed all the same; it is delivered when a sequencer stamps it.
                tracing::warn!(
                    waited_ms = STAMP_WAIT.as_millis() as u64,
                    "an event was not stamped in time; answering without waiting further"
                );
            }
        }
        out
    })
    .await
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
