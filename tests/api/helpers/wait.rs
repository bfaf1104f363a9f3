//! The one way tests wait: a probe polled until it answers, with a deadline (never a fixed sleep), and
//! the waits built on it that many files share.
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::TestApp;

/// Calls `probe` every 50 ms until it answers `Ok`, and returns what it answered; once `within` has passed
/// without it, panics naming `what` (what was awaited) and what the probe last saw (its `Err`). A probe
/// may panic itself on a state that can never turn good.
pub async fn wait_until<T, F>(what: &str, within: Duration, probe: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    wait_until_every(what, within, Duration::from_millis(50), probe).await
}

/// [`wait_until`], probing every `every` (a waiter that must not miss a short-lived state probes faster).
pub async fn wait_until_every<T, F>(what: &str, within: Duration, every: Duration, mut probe: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match probe().await {
            Ok(found) => return found,
            Err(seen) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}; last seen: {seen}"
            ),
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls the session (every 50 ms) until `pred` holds, with `within` as the deadline, and returns it.
pub async fn wait_session_within(
    app: &TestApp,
    id: Uuid,
    within: Duration,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(&format!("session {id} to be {what}"), within, || async {
        let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
        seen_json(pred(&s), s)
    })
    .await
}

/// For a `wait_until` probe: `found` when `done`, else what it shows (as debug text).
pub fn seen<T: std::fmt::Debug>(done: bool, found: T) -> Result<T, String> {
    if done { Ok(found) } else { Err(format!("{found:?}")) }
}

/// For a `wait_until` probe: the JSON `found` when `done`, else the JSON as text.
pub fn seen_json(done: bool, found: Value) -> Result<Value, String> {
    if done { Ok(found) } else { Err(found.to_string()) }
}

/// The states a cleanup job ends in.
pub const SETTLED: &[&str] = &["succeeded", "failed", "cancelled"];

/// Waits (with a deadline) until the cleanup job is settled (`succeeded`, `failed` or `cancelled`).
pub async fn wait_job_settled(app: &TestApp, id: Uuid) -> Value {
    wait_job(app, id, Duration::from_secs(60), SETTLED).await
}

/// Waits (with `within` as the deadline, probing every 20 ms) until the cleanup job `id` is in one of
/// `states`, and returns it.
pub async fn wait_job(app: &TestApp, id: Uuid, within: Duration, states: &[&str]) -> Value {
    let every = Duration::from_millis(20);
    wait_until_every(&format!("cleanup job {id} in {states:?}"), within, every, || async {
        let j = app.get(&format!("/api/v1/cleanup-jobs/{id}")).await.ok(200);
        seen_json(states.iter().any(|s| j["state"] == *s), j)
    })
    .await
}
