//! Pi's extension UI through berth: a confirm dialog asks for attention and the answer reaches the agent;
//! notices are shown and leave the state alone.
use serde_json::{Value, json};

use super::{pi_session, say, stop, uuid, wait_message, wait_session, wait_snapshot, with_pi};
use crate::agents::session_states;
use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(
    a_confirm_dialog_asks_for_attention_and_the_answer_reaches_the_agent,
    notices_from_pi_leave_the_state_alone,
);

/// The texts of the snapshot's latest notifications (`agent.notifications`, each with a `message`).
fn notification_texts(snap: &Value) -> Vec<String> {
    snap["agent"]["notifications"]
        .as_array()
        .unwrap_or_else(|| panic!("no notifications in the snapshot: {snap}"))
        .iter()
        .filter_map(|n| n["message"].as_str().map(str::to_string))
        .collect()
}

// I31: Pi's `confirm` dialog puts the session in `attention`; the answer (the shape the method takes)
// reaches the extension, which notifies it; the session leaves attention. The command never calls the
// model.
async fn a_confirm_dialog_asks_for_attention_and_the_answer_reaches_the_agent(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let m = say(&app, id, "/confirm-me Ship it?", None).await;
    wait_session(&app, id, "asking", |v| v["state"] == "attention").await;
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    let requests = snap["attention_requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{snap}");
    assert_eq!(requests[0]["method"], "confirm");
    assert_eq!(requests[0]["title"], "Ship it?");
    let request_id = requests[0]["id"].as_str().unwrap().to_string();
    app.post(
        &format!("/api/v1/sessions/{id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .ok(200);
    let snap = wait_snapshot(&app, id, "the answer notified back", |s| {
        notification_texts(s).contains(&"confirmed: true".to_string())
    })
    .await;
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    wait_session(&app, id, "idle after the answer", |v| v["state"] == "idle").await;
    wait_message(&app, id, &m, "delivered").await;
    assert!(
        pi.model.requests().is_empty(),
        "an extension command never calls the model"
    );
    stop(&app, id).await;
}

// I31: notify, setStatus and setTitle from Pi are shown by the snapshot and never put the session in
// attention.
async fn notices_from_pi_leave_the_state_alone(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let m = say(&app, id, "/notice all is well", None).await;
    let snap = wait_snapshot(&app, id, "the notice", |s| {
        s["agent"]["notifications"].is_array()
            && notification_texts(s).contains(&"all is well".to_string())
            && s["agent"]["title"].is_string()
    })
    .await;
    assert_eq!(snap["agent"]["status"]["berth-test"], "status: all is well", "{snap}");
    assert_eq!(snap["agent"]["title"], "title: all is well", "{snap}");
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    wait_message(&app, id, &m, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    let states = session_states(&app, id).await;
    let states: Vec<&str> = states.iter().map(String::as_str).collect();
    assert!(
        !states.contains(&"attention"),
        "a notice asked for attention: {states:?}"
    );
    assert!(pi.model.requests().is_empty());
    stop(&app, id).await;
}
