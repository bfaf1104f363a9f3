//! A session's durable inbox and abort, with the project's test agent as a real process: a message is
//! stored before it is sent, waits while the agent works, and is never lost silently (it ends
//! `delivered`, `refused` or `cancelled`, each change an event). Restore relaunches only this node's
//! sessions, ends what a crashed berth left running (I27, I29), and a restore that cannot launch fails
//! the session instead of leaving it `recovering`.
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{
    execution_pid, pid_alive, replies, session_states, uuid, wait_delivered, wait_exited, wait_session,
};
use crate::both_backends;
use crate::helpers::{TestApp, seen, seen_json, wait_until_every};

both_backends!(
    a_message_is_stored_then_delivered,
    messages_sent_while_the_agent_works_wait_for_the_turn,
    a_queued_message_can_be_cancelled_until_it_is_delivered,
    abort_ends_the_turn_and_cancels_the_queue_but_keeps_the_agent,
    stopping_cancels_what_waits,
    bad_messages_are_refused_and_store_nothing,
    the_snapshot_shows_the_queue_and_the_latest_notices,
    restore_leaves_another_nodes_sessions_alone,
    a_restore_that_cannot_launch_fails_the_session,
    restore_ends_an_agent_a_crashed_berth_left_running,
    a_question_expires_with_its_own_timeout,
);

const WAIT: Duration = Duration::from_secs(20);
/// How often the waiters here probe.
const EVERY: Duration = Duration::from_millis(20);

/// A running `test` agent on a fresh task; with `prompt`, that is its first message.
async fn session(app: &TestApp, prompt: Option<&str>) -> Uuid {
    let f = app.task_with_repo("Inbox").await;
    uuid(&f.agent_with("test", prompt).await["id"])
}

async fn send(app: &TestApp, id: Uuid, text: &str, delivery: &str) -> Value {
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": text, "delivery": delivery}),
    )
    .await
    .ok(202)
}

pub(crate) async fn messages(app: &TestApp, id: Uuid) -> Vec<Value> {
    app.get(&format!("/api/v1/sessions/{id}/messages")).await.ok(200)["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// Polls until the message is in `state`.
pub(crate) async fn wait_message(app: &TestApp, id: Uuid, message: &Value, state: &str) -> Value {
    wait_until_every(&format!("message {} {state}", message["id"]), WAIT, EVERY, || async {
        let found = messages(app, id)
            .await
            .into_iter()
            .find(|m| m["id"] == message["id"])
            .expect("the message is listed");
        seen_json(found["state"] == state, found)
    })
    .await
}

pub(crate) async fn wait_replies(app: &TestApp, id: Uuid, n: usize) -> Vec<String> {
    wait_until_every(&format!("{n} replies"), WAIT, EVERY, || async {
        let r = replies(app, id).await;
        seen(r.len() >= n, r)
    })
    .await
}

/// The states a message went through, from its `session.message_updated` events.
async fn history(app: &TestApp, message: &Value) -> Vec<String> {
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.message_updated" && e["data"]["message"]["id"] == message["id"])
        .map(|e| e["data"]["message"]["state"].as_str().unwrap().to_string())
        .collect()
}

async fn a_message_is_stored_then_delivered(app: TestApp) {
    let id = session(&app, None).await;
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let m = send(&app, id, "hello", "auto").await;
    assert_eq!(m["session_id"], id.to_string());
    assert_eq!(m["text"], "hello");
    assert_eq!(m["delivery"], "auto");
    // Stored before anything is sent: the answer is the stored message.
    assert!(["queued", "delivered"].contains(&m["state"].as_str().unwrap()), "{m}");
    assert!(m["created_at"].is_string());
    wait_message(&app, id, &m, "delivered").await;
    assert_eq!(wait_replies(&app, id, 1).await, ["hello"]);
    assert_eq!(history(&app, &m).await, ["queued", "delivered"]);
    // A message without a delivery is `auto`.
    let plain = app
        .post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "again"}))
        .await
        .ok(202);
    assert_eq!(plain["delivery"], "auto");
    wait_message(&app, id, &plain, "delivered").await;
}

// While the agent works, `auto` and `follow_up` wait in berth; a `steer` goes at once; the waiting ones
// follow, in order, one prompt per settled turn.
async fn messages_sent_while_the_agent_works_wait_for_the_turn(app: TestApp) {
    let id = session(&app, Some("hang")).await;
    wait_delivered(&app, id, 1).await;
    wait_session(&app, id, "running", |s| s["state"] == "running").await;
    let after = send(&app, id, "after", "auto").await;
    let later = send(&app, id, "later", "follow_up").await;
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 2, "both wait in berth while the agent works");
    for m in messages(&app, id).await.iter().skip(1) {
        assert_eq!(m["state"], "queued", "{m}");
    }
    let steer = send(&app, id, "now", "steer").await;
    wait_message(&app, id, &steer, "delivered").await;
    wait_message(&app, id, &after, "delivered").await;
    wait_message(&app, id, &later, "delivered").await;
    assert_eq!(
        wait_replies(&app, id, 3).await,
        ["steer now", "after", "later"],
        "the steer ended the turn; the waiting messages followed in order"
    );
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 0);
}

async fn a_queued_message_can_be_cancelled_until_it_is_delivered(app: TestApp) {
    let id = session(&app, Some("hang")).await;
    let delivered = wait_delivered(&app, id, 1).await["items"][0].clone();
    let waiting = send(&app, id, "not yet", "follow_up").await;
    let cancelled = app
        .delete(&format!("/api/v1/sessions/{id}/messages/{}", uuid(&waiting["id"])))
        .await
        .ok(200);
    assert_eq!(cancelled["state"], "cancelled");
    assert!(cancelled["reason"].is_string());
    // Once it is no longer queued it cannot be cancelled: neither again, nor a delivered one.
    app.delete(&format!("/api/v1/sessions/{id}/messages/{}", uuid(&waiting["id"])))
        .await
        .problem(409, "conflict");
    app.delete(&format!("/api/v1/sessions/{id}/messages/{}", uuid(&delivered["id"])))
        .await
        .problem(409, "conflict");
    app.delete(&format!("/api/v1/sessions/{id}/messages/{}", Uuid::now_v7()))
        .await
        .problem(404, "not_found");
    assert_eq!(history(&app, &waiting).await, ["queued", "cancelled"]);
    // The cancelled message is never handed over, even after the turn.
    app.post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let m = send(&app, id, "next", "auto").await;
    wait_message(&app, id, &m, "delivered").await;
    assert_eq!(wait_replies(&app, id, 1).await, ["next"]);
    let all = messages(&app, id).await;
    assert_eq!(all[1]["state"], "cancelled");
}

async fn abort_ends_the_turn_and_cancels_the_queue_but_keeps_the_agent(app: TestApp) {
    let id = session(&app, Some("hang")).await;
    wait_delivered(&app, id, 1).await;
    let s = wait_session(&app, id, "running", |s| s["state"] == "running").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    let queued = send(&app, id, "queued behind", "follow_up").await;
    app.post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .ok(200);
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    assert_eq!(s["desired_open"], true);
    assert!(pid_alive(pid), "the agent still runs");
    let cancelled = wait_message(&app, id, &queued, "cancelled").await;
    assert!(cancelled["reason"].as_str().unwrap().contains("abort"), "{cancelled}");
    // The agent takes the next message as usual.
    let m = send(&app, id, "still here", "auto").await;
    wait_message(&app, id, &m, "delivered").await;
    assert_eq!(wait_replies(&app, id, 1).await, ["still here"]);
    // No agent, no abort.
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
    app.post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .problem(409, "conflict");
}

async fn stopping_cancels_what_waits(app: TestApp) {
    let id = session(&app, Some("hang")).await;
    wait_delivered(&app, id, 1).await;
    let waiting = send(&app, id, "never sent", "auto").await;
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
    let m = wait_message(&app, id, &waiting, "cancelled").await;
    assert!(m["reason"].as_str().unwrap().contains("stopped"), "{m}");
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "hello?"}))
        .await
        .problem(409, "conflict");
}

async fn bad_messages_are_refused_and_store_nothing(app: TestApp) {
    let id = session(&app, None).await;
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    for body in [
        json!({"text": ""}),
        json!({"text": "   "}),
        json!({"text": "x".repeat(200_001)}),
    ] {
        app.post(&format!("/api/v1/sessions/{id}/messages"), body)
            .await
            .problem(422, "validation_failed");
    }
    let r = app
        .post(
            &format!("/api/v1/sessions/{id}/messages"),
            json!({"text": "hi", "delivery": "later"}),
        )
        .await;
    assert!([400, 422].contains(&r.status.as_u16()), "{}", r.status);
    assert!(messages(&app, id).await.is_empty(), "nothing was stored");
    app.get(&format!("/api/v1/sessions/{}/messages", Uuid::now_v7()))
        .await
        .problem(404, "not_found");
}

async fn the_snapshot_shows_the_queue_and_the_latest_notices(app: TestApp) {
    let id = session(&app, None).await;
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let m = send(&app, id, "notify", "auto").await;
    wait_message(&app, id, &m, "delivered").await;
    wait_replies(&app, id, 1).await;
    let snap = wait_until_every("the agent's title", WAIT, EVERY, || async {
        let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
        seen_json(snap["agent"]["title"] == "berth test", snap)
    })
    .await;
    assert_eq!(snap["agent"]["status"]["ext"], "busy");
    assert_eq!(snap["agent"]["notifications"][0]["message"], "working on it");
    assert_eq!(snap["agent"]["notifications"][0]["notify_type"], "info");
    assert_eq!(snap["queue_length"], 0);
    assert_eq!(snap["state"], "idle", "notices never ask for attention");
    assert_eq!(snap["label"], "notify", "the first prompt, without a name");
}

/// Builds a second server on the same database and data directory, as another node or after a restart.
async fn another_server(app: &TestApp, config: berth::config::Config) -> berth::startup::Application {
    let _ = app;
    berth::startup::Application::build(config)
        .await
        .expect("the server starts")
}

// A replica restores only its own node's sessions.
async fn restore_leaves_another_nodes_sessions_alone(app: TestApp) {
    let id = session(&app, None).await;
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    let mut config = app.config.clone();
    config.node_id = "another-node".into();
    let other = another_server(&app, config).await;
    assert_eq!(
        other.state.ctx.runtime.live_count(),
        0,
        "nothing of the first node relaunched"
    );
    let after = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(after["state"], "idle");
    assert_eq!(after["execution_id"], s["execution_id"]);
    assert!(pid_alive(pid), "the first node's agent keeps running");
    for b in other.background() {
        b.abort();
    }
}

// A restore that fails for a reason other than admission (the profile was removed) fails the session
// with the reason and its event, never leaving it `recovering`.
async fn a_restore_that_cannot_launch_fails_the_session(app: TestApp) {
    let id = session(&app, None).await;
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    app.app_state.ctx.runtime.stop_all().await;
    let mut config = app.config.clone();
    config.agents.remove("test");
    let restarted = another_server(&app, config).await;
    let s = wait_session(&app, id, "failed", |s| s["state"] == "failed").await;
    assert_eq!(s["last_error"]["code"], "restore_failed", "{s}");
    let states = session_states(&app, id).await;
    let states: Vec<&str> = states.iter().map(String::as_str).collect();
    assert!(states.ends_with(&["recovering", "failed"]), "{states:?}");
    for b in restarted.background() {
        b.abort();
    }
}

// I27: a berth that crashed left its agent running; the next start ends that process group before it
// relaunches the session, so there are never two agents for one session.
async fn restore_ends_an_agent_a_crashed_berth_left_running(app: TestApp) {
    let id = session(&app, None).await;
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let old_pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    // The first server is not stopped (a crash): its agent still runs when the next one starts.
    let restarted = another_server(&app, app.config.clone()).await;
    assert!(
        !pid_alive(old_pid) || {
            // The kill is asynchronous to the kernel's reaping: wait for it.
            wait_exited(old_pid, WAIT).await;
            true
        }
    );
    let s = wait_session(&app, id, "idle again", |s| {
        s["state"] == "idle" && s["execution_id"] != json!(null)
    })
    .await;
    let new_pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    assert_ne!(new_pid, old_pid);
    assert!(pid_alive(new_pid));
    assert_eq!(restarted.state.ctx.runtime.live_count(), 1);
    restarted.state.ctx.runtime.stop_all().await;
    for b in restarted.background() {
        b.abort();
    }
}

// A dialog's own timeout expires it: the session stops waiting for an answer nobody can give.
async fn a_question_expires_with_its_own_timeout(app: TestApp) {
    let id = session(&app, None).await;
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let m = send(&app, id, "ask-timeout 300", "auto").await;
    wait_message(&app, id, &m, "delivered").await;
    // It asks (attention), then the question expires and the session works on, with nothing pending.
    let asked = std::cell::Cell::new(false);
    let snap = wait_until_every("the question to expire", WAIT, EVERY, || async {
        let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
        let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
        let expired = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "runtime.output" && e["data"]["event"]["type"] == "extension_ui_expired");
        asked.set(
            asked.get()
                || page["events"].as_array().unwrap().iter().any(|e| {
                    e["type"] == "session.state_changed"
                        && e["session_id"] == id.to_string()
                        && e["data"]["state"] == "attention"
                }),
        );
        seen_json(expired && snap["state"] == "running", snap)
    })
    .await;
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    assert!(asked.get(), "the question put the session in attention first");
    app.post(
        &format!("/api/v1/sessions/{id}/attention/q-timed"),
        json!({"value": "a"}),
    )
    .await
    .problem(404, "not_found");
}
