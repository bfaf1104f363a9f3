//! When the database was last unreachable, so that a pool checks the connections that predate it.
//!
//! A pool pings a connection before use only when it sat idle for 30 s. After a PostgreSQL restart,
//! every idle connection opened before it is dead, and each would fail one request with a 503 before
//! the pool dropped it. So any "unavailable" error is noted here, and a connection idle since before
//! the last one is pinged before use: a dead one is replaced, and the request never sees it.
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Milliseconds since `start()` at the last unavailable error, plus one (0: none yet).
static LAST: AtomicU64 = AtomicU64::new(0);

fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    start().elapsed().as_millis() as u64 + 1
}

/// The database could not be reached, or a statement failed on a dead connection.
pub fn note() {
    LAST.store(now_ms(), Ordering::Relaxed);
}

/// Whether a connection idle for `idle_for` has been idle since before the last unavailable error.
pub fn predates_last(idle_for: Duration) -> bool {
    let last = LAST.load(Ordering::Relaxed);
    last != 0 && idle_for.as_millis() as u64 > now_ms().saturating_sub(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_idle_since_before_the_outage_is_suspect() {
        note();
        assert!(predates_last(Duration::from_secs(10)), "idle since before the error");
        assert!(!predates_last(Duration::ZERO), "returned to the pool after it");
    }
}
