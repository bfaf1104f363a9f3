//! Messages sent while Pi works: follow-ups held in berth's inbox until the turn ends, steers forwarded at
//! once, and abort cancelling what is queued while the agent stays.
use serde_json::json;
use uuid::Uuid;

use super::{
    Pi, WAIT, continued, execution_pid, pi_session, pid_alive, say, stop, texts, uuid, wait_message, wait_session,
    wait_snapshot, with_pi,
};
use crate::both_backends;
use crate::helpers::TestApp;
use crate::model_server::{Gate, Outcome, Reply};

both_backends!(
    a_follow_up_sent_mid_turn_reaches_the_model_after_the_turn,
    a_steer_reaches_the_model_inside_the_turn_ahead_of_follow_ups,
    abort_cancels_queued_messages_and_keeps_the_agent,
);

/// Sends `first` with a gated reply and waits until the turn runs: the model holds it, berth says `running`.
async fn gated_turn(app: &TestApp, pi: &Pi, session: Uuid, first: &str) -> Gate {
    let gate = Gate::new();
    pi.model.reply_to(first, Reply::echo().gated(&gate));
    say(app, session, first, None).await;
    pi.model.wait_request(1, Outcome::Held, WAIT).await;
    wait_session(app, session, "running", |v| v["state"] == "running").await;
    gate
}

// Messages sent while Pi works are held in berth's inbox (`queued`) and reach the model after the turn,
// one turn each, in order; none is refused or lost.
async fn a_follow_up_sent_mid_turn_reaches_the_model_after_the_turn(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let gate = gated_turn(&app, &pi, id, "first").await;
    let auto = say(&app, id, "second", None).await;
    let follow = say(&app, id, "third", Some("follow_up")).await;
    let withdrawn = say(&app, id, "withdrawn", None).await;
    assert_eq!(auto["state"], "queued", "held while the agent works: {auto}");
    assert_eq!(follow["state"], "queued", "{follow}");
    let d = app
        .delete(&format!("/api/v1/sessions/{id}/messages/{}", uuid(&withdrawn["id"])))
        .await
        .ok(200);
    assert_eq!(d["state"], "cancelled", "{d}");
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 2, "{snap}");
    assert_eq!(pi.model.requests().len(), 1, "nothing reached the model mid-turn");
    gate.release();
    let requests = pi.model.wait_completed(3, WAIT).await;
    assert_eq!(requests[1].conversation(), continued("first", "second"));
    assert_eq!(
        requests[2].conversation(),
        texts(&[
            ("user", "first"),
            ("assistant", "echo: first"),
            ("user", "second"),
            ("assistant", "echo: second"),
            ("user", "third"),
        ])
    );
    wait_message(&app, id, &auto, "delivered").await;
    wait_message(&app, id, &follow, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 0);
    assert_eq!(
        pi.model.requests().len(),
        3,
        "the withdrawn message never reached the model"
    );
    app.delete(&format!("/api/v1/sessions/{id}/messages/{}", uuid(&auto["id"])))
        .await
        .problem(409, "conflict");
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let updates: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.message_updated" && e["data"]["message"]["id"] == auto["id"])
        .map(|e| e["data"]["message"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        updates.last(),
        Some(&"delivered"),
        "each change is an event: {updates:?}"
    );
    stop(&app, id).await;
}

// A steer is forwarded at once while Pi works (delivered mid-turn, counted in the queue from Pi's
// queue_update) and reaches the model before a follow-up that berth holds until the turn ends.
async fn a_steer_reaches_the_model_inside_the_turn_ahead_of_follow_ups(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    let gate = gated_turn(&app, &pi, id, "first").await;
    let follow = say(&app, id, "afterwards", Some("follow_up")).await;
    let steer = say(&app, id, "change course", Some("steer")).await;
    wait_message(&app, id, &steer, "delivered").await;
    let held = pi.model.requests();
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].outcome,
        Outcome::Held,
        "the steer was delivered inside the turn"
    );
    assert_eq!(wait_message(&app, id, &follow, "queued").await["state"], "queued");
    wait_snapshot(&app, id, "one queued in berth and one in Pi", |s| {
        s["queue_length"] == 2
    })
    .await;
    gate.release();
    let requests = pi.model.wait_completed(3, WAIT).await;
    assert_eq!(requests[1].conversation(), continued("first", "change course"));
    assert_eq!(requests[2].last_user_text(), "afterwards");
    assert!(
        requests[2].mentions("echo: change course"),
        "the follow-up came after the steer's turn"
    );
    wait_message(&app, id, &follow, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    stop(&app, id).await;
}

// Abort stops the turn at once (the model request is dropped), cancels what berth queued (never
// sent to the model), and leaves the session idle with the same agent alive.
async fn abort_cancels_queued_messages_and_keeps_the_agent(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    let _gate = gated_turn(&app, &pi, id, "first").await;
    let queued = say(&app, id, "never sent", None).await;
    assert_eq!(queued["state"], "queued");
    let r = app
        .post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .ok(200);
    assert_eq!(r["id"], id.to_string(), "abort answers the session");
    let cancelled = wait_message(&app, id, &queued, "cancelled").await;
    assert!(cancelled["reason"].is_string(), "{cancelled}");
    pi.model.wait_request(1, Outcome::Dropped, WAIT).await;
    let idle = wait_session(&app, id, "idle after abort", |v| v["state"] == "idle").await;
    assert_eq!(idle["execution_id"], s["execution_id"], "the same agent");
    assert!(pid_alive(execution_pid(&app, &s["execution_id"]).await));
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(snap["queue_length"], 0, "{snap}");
    // The agent takes the next message.
    let after = say(&app, id, "after the abort", None).await;
    let request = pi.model.wait_request(2, Outcome::Completed, WAIT).await;
    assert_eq!(request.last_user_text(), "after the abort");
    assert!(request.mentions("first"), "the conversation goes on");
    wait_message(&app, id, &after, "delivered").await;
    wait_session(&app, id, "idle", |v| v["state"] == "idle").await;
    let all = pi.model.requests();
    assert_eq!(all.len(), 2, "nothing else reached the model");
    assert!(
        !all.iter().any(|r| r.mentions("never sent")),
        "the cancelled message was never sent"
    );
    stop(&app, id).await;
}
