//! Read-your-writes on PostgreSQL: a request remembers the newest event its open transaction appended,
//! so that `Ctx::commit` waits until the sequencer stamped it and this replica published it. A client
//! that gets its answer then finds its change in `GET /events` and on every stream.
//!
//! Outside a request (workers, agent reports) there is no slot and nothing waits: those events are
//! delivered as soon as they are stamped, and nobody is holding a response for them.
use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static APPENDED: Cell<Option<i64>>;
}

/// Runs a request with the slot.
pub async fn request_scope<F: Future>(f: F) -> F::Output {
    APPENDED.scope(Cell::new(None), f).await
}

/// `events::append` inserted event `id` (ids grow, so the newest is the one to wait for).
pub(crate) fn appended(id: i64) {
    let _ = APPENDED.try_with(|slot| slot.set(Some(slot.get().map_or(id, |m| m.max(id)))));
}

/// The newest event id appended since the last call (and forgets it): at commit, and at the start of a
/// transaction, so that one rolled back leaves nothing to wait for.
pub fn take_appended() -> Option<i64> {
    APPENDED.try_with(Cell::take).ok().flatten()
}
