//! Agents start only in a proven workspace (seed 000 "Launch admission", I15-I20, I26-I28), with the
//! project's test agent as a real process.
//!
//! This module holds the waiters and probes the agent tests share (other test files use them too); the
//! scenarios are in the submodules, by concern.
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{TestApp, seen, seen_json, wait_session_within, wait_until, wait_until_every};

mod admission;
mod attention;
mod launch;
mod lifecycle;
mod restore;
mod transitions;
mod views;

const WAIT: Duration = Duration::from_secs(20);

pub(crate) use crate::helpers::uuid;

/// Polls the session until `pred` holds (with a deadline of 20 s).
pub(crate) async fn wait_session(app: &TestApp, id: Uuid, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    wait_session_within(app, id, WAIT, what, pred).await
}

/// Waits until `n` of the session's inbox messages are delivered to its agent.
pub(crate) async fn wait_delivered(app: &TestApp, id: Uuid, n: usize) -> Value {
    wait_until(
        &format!("{n} messages of session {id} to be delivered"),
        WAIT,
        || async {
            let list = app.get(&format!("/api/v1/sessions/{id}/messages")).await.ok(200);
            let delivered = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["state"] == "delivered")
                .count();
            seen_json(delivered >= n, list)
        },
    )
    .await
}

/// The texts the agent replied with, from the `runtime.output` events of a session.
pub(crate) async fn replies(app: &TestApp, session: Uuid) -> Vec<String> {
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "runtime.output" && e["session_id"] == session.to_string())
        .filter(|e| e["data"]["event"]["type"] == "message_end" && e["data"]["event"]["message"]["role"] == "assistant")
        .map(|e| {
            e["data"]["event"]["message"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

async fn wait_reply(app: &TestApp, session: Uuid, n: usize) -> Vec<String> {
    wait_until(
        &format!("reply #{n} from the agent of session {session}"),
        WAIT,
        || async {
            let r = replies(app, session).await;
            seen(r.len() >= n, r)
        },
    )
    .await
}

pub(crate) fn pid_alive(pid: i64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Waits (with `within` as the deadline, probing every 20 ms) until the process `pid` has exited.
pub(crate) async fn wait_exited(pid: i64, within: Duration) {
    let every = Duration::from_millis(20);
    wait_until_every(&format!("process {pid} to exit"), within, every, || async {
        seen(!pid_alive(pid), pid)
    })
    .await;
}

pub(crate) async fn execution_pid(app: &TestApp, execution: Uuid) -> i64 {
    use sea_orm::EntityTrait;
    let e = berth::entity::agent_execution::Entity::find_by_id(execution)
        .one(app.db())
        .await
        .unwrap()
        .unwrap();
    e.pid.expect("the durable handle records the pid") as i64
}

/// The states session `id` went through, oldest first, from its `session.state_changed` events (in the
/// first 1000 events).
pub(crate) async fn session_states(app: &TestApp, id: Uuid) -> Vec<String> {
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.state_changed" && e["session_id"] == id.to_string())
        .map(|e| e["data"]["state"].as_str().unwrap().to_string())
        .collect()
}

/// Every event, through replay pages.
pub(crate) async fn all_events(app: &TestApp) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = app
            .get(&format!("/api/v1/events?after={after}&limit=1000"))
            .await
            .ok(200);
        let events = page["events"].as_array().unwrap().clone();
        if events.is_empty() {
            return out;
        }
        after = events.last().unwrap()["seq"].as_i64().unwrap();
        out.extend(events);
    }
}
