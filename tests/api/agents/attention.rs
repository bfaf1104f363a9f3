//! Attention requests belong to their session and take answers of their method's shape; notices are
//! events and never ask for attention.
use serde_json::{Value, json};

use super::{uuid, wait_reply, wait_session};
use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(
    attention_requests_belong_to_their_session,
    notices_are_events_and_never_ask_for_attention,
);

// I31: an attention request belongs to one session; no other session can answer it. The snapshot shows
// it, with the transcript and the seq to follow the stream from.
async fn attention_requests_belong_to_their_session(app: TestApp) {
    let f = app.task_with_repo("Ask").await;
    let a = f.agent_prompted("test", "ask").await;
    let b = f.agent("test").await;
    let (a_id, b_id) = (uuid(&a["id"]), uuid(&b["id"]));
    wait_session(&app, a_id, "asking", |s| s["state"] == "attention").await;
    let snap = app.get(&format!("/api/v1/sessions/{a_id}/snapshot")).await.ok(200);
    assert_eq!(snap["state"], "attention");
    assert_eq!(snap["label"], "ask", "the first prompt labels an unnamed session");
    assert_eq!(snap["instance_id"], app.app_state.ctx.instance_id.to_string());
    assert!(snap["latest_seq"].as_i64().unwrap() > 0);
    let requests = snap["attention_requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["method"], "confirm");
    let request_id = requests[0]["id"].as_str().unwrap().to_string();
    // Another session cannot answer it; an unknown id is not pending.
    app.post(
        &format!("/api/v1/sessions/{b_id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .problem(404, "not_found");
    app.post(
        &format!("/api/v1/sessions/{a_id}/attention/nope"),
        json!({"confirmed": true}),
    )
    .await
    .problem(404, "not_found");
    // The answer has the shape the question's method takes, or it is refused and the question stays
    // pending.
    for wrong in [
        json!({"value": "yes"}),
        json!({}),
        json!({"confirmed": true, "value": "yes"}),
        json!({"cancelled": false}),
    ] {
        app.post(&format!("/api/v1/sessions/{a_id}/attention/{request_id}"), wrong)
            .await
            .problem(422, "validation_failed");
    }
    let still = app.get(&format!("/api/v1/sessions/{a_id}/snapshot")).await.ok(200);
    assert_eq!(still["attention_requests"].as_array().unwrap().len(), 1, "{still}");
    assert_eq!(still["state"], "attention");
    app.post(
        &format!("/api/v1/sessions/{a_id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .ok(200);
    assert_eq!(wait_reply(&app, a_id, 1).await[0], "answered true");
    wait_session(&app, a_id, "idle", |s| s["state"] == "idle").await;
    let after = app.get(&format!("/api/v1/sessions/{a_id}/snapshot")).await.ok(200);
    assert!(after["attention_requests"].as_array().unwrap().is_empty());
    let roles: Vec<&str> = after["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, vec!["user", "assistant"]);
    assert_eq!(after["statistics"]["turns"], 1);
    // Answering again: no longer pending.
    app.post(
        &format!("/api/v1/sessions/{a_id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .problem(404, "not_found");
    for id in [a_id, b_id] {
        app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
            .await
            .ok(200);
    }
}

// I31: fire-and-forget UI requests (notify, setStatus, setTitle; they carry ids like questions do) are
// published as events and never put the session in `attention`.
async fn notices_are_events_and_never_ask_for_attention(app: TestApp) {
    let f = app.task_with_repo("Notices").await;
    let s = f.agent_prompted("test", "notify").await;
    let id = uuid(&s["id"]);
    assert_eq!(wait_reply(&app, id, 1).await[0], "notified");
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let mine: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["session_id"] == id.to_string())
        .collect();
    let states: Vec<&str> = mine
        .iter()
        .filter(|e| e["type"] == "session.state_changed")
        .map(|e| e["data"]["state"].as_str().unwrap())
        .collect();
    assert!(
        !states.contains(&"attention"),
        "a notice asked for attention: {states:?}"
    );
    let notices: Vec<&str> = mine
        .iter()
        .filter(|e| e["type"] == "runtime.output" && e["data"]["event"]["type"] == "extension_ui_request")
        .map(|e| e["data"]["event"]["method"].as_str().unwrap())
        .collect();
    assert_eq!(notices, ["notify", "setStatus", "setTitle"]);
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}
