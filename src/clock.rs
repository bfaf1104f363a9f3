//! The one clock. A leaf: every layer may read it, it imports nothing of berth.

/// The current time at the precision both databases store (microseconds), so what a create returns
/// equals what a later read returns.
pub fn now() -> chrono::DateTime<chrono::Utc> {
    use chrono::SubsecRound;
    chrono::Utc::now().trunc_subsecs(6)
}
