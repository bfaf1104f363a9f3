//! Retrying a git mutation that met another process's lock file: how it is recognized, and how long to
//! wait before the next attempt.
use std::time::Duration;

/// The first and longest wait between attempts.
pub(super) const LOCK_BACKOFF_FIRST: Duration = Duration::from_millis(25);
pub(super) const LOCK_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// git's messages when a `*.lock` file (index, ref, config, packed-refs) is held by another process.
pub(super) fn is_lock_contention(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    let names_a_lock = s.contains(".lock")
        || s.contains("cannot lock")
        || s.contains("could not lock")
        || s.contains("unable to lock");
    s.contains("another git process seems to be running")
        || (names_a_lock && (s.contains("file exists") || s.contains("unable to create")))
}

/// The wait before attempt `attempt + 1`: doubling from the first, capped, with jitter so that two
/// processes backing off from each other do not collide again.
pub(super) fn backoff(attempt: u32) -> Duration {
    let base = LOCK_BACKOFF_FIRST
        .saturating_mul(1 << attempt.min(16))
        .min(LOCK_BACKOFF_MAX);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    base + Duration::from_millis(u64::from(nanos) % (base.as_millis() as u64 / 2 + 1))
}
