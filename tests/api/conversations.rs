//! A Pi-protocol session keeps one conversation for its whole life (seed 002 "Identity": "Each runtime
//! recovery restarts with its exact leased session path ... The bridge never substitutes a different
//! session."), with the project's test agent keeping a conversation file as Pi does (`fakepi` profile:
//! `--session <file>`, a header line with the conversation's id, one line per prompt; `history`
//! replies with how many prompts the file holds). The real Pi runs in `pi/`.
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{execution_pid, pid_alive, replies, uuid, wait_delivered, wait_session};
use crate::both_backends;
use crate::helpers::{TestApp, seen_json, wait_until_every};
use crate::inbox::wait_replies;

both_backends!(
    a_pi_session_continues_its_conversation_on_every_relaunch,
    a_missing_conversation_is_never_replaced,
    a_corrupt_conversation_is_refused_and_kept,
    a_conversation_held_by_another_live_session_is_refused,
    deleting_a_session_deletes_its_conversation_and_keeps_the_worktree,
    the_snapshot_shows_what_the_agent_said_about_itself,
);

const WAIT: Duration = Duration::from_secs(20);

fn conversation_file(app: &TestApp, id: Uuid) -> PathBuf {
    app.config.data_dir.join("conversations").join(format!("{id}.jsonl"))
}

async fn pi_session(app: &TestApp, prompt: &str) -> Value {
    let f = app.task_with_repo("Conversation").await;
    f.agent_prompted("fakepi", prompt).await
}

async fn say(app: &TestApp, id: Uuid, text: &str) {
    let before = replies(app, id).await.len();
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": text}))
        .await
        .ok(202);
    wait_replies(app, id, before + 1).await;
}

async fn last_reply(app: &TestApp, id: Uuid) -> String {
    replies(app, id).await.pop().unwrap_or_default()
}

/// A first turn, then the conversation's identity recorded.
async fn recorded(app: &TestApp, prompt: &str) -> (Uuid, String) {
    let s = pi_session(app, prompt).await;
    let id = uuid(&s["id"]);
    wait_replies(app, id, 1).await;
    let s = wait_session(app, id, "recorded", |s| s["agent_session_ref"].is_string()).await;
    assert!(conversation_file(app, id).is_file());
    (id, s["agent_session_ref"].as_str().unwrap().to_string())
}

async fn stop(app: &TestApp, id: Uuid) {
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

async fn a_pi_session_continues_its_conversation_on_every_relaunch(app: TestApp) {
    let (id, reference) = recorded(&app, "first").await;
    let file = conversation_file(&app, id);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "conversations are owner-only");
    // Stop, then resume: the same conversation (the agent counts two prompts).
    stop(&app, id).await;
    app.post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    say(&app, id, "history").await;
    assert_eq!(last_reply(&app, id).await, "history 2");
    // A crash: berth restarts the agent (I30) on the same conversation.
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    // SAFETY: kill(2) on the test agent's pid; no memory is involved.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let crashed_execution = s["execution_id"].clone();
    let s = wait_session(&app, id, "restarted", |s| {
        s["state"] == "idle" && s["execution_id"] != crashed_execution
    })
    .await;
    let new_pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    assert_ne!(new_pid, pid);
    assert!(!pid_alive(pid));
    say(&app, id, "history").await;
    assert_eq!(last_reply(&app, id).await, "history 3");
    // A berth restart: the open session is relaunched on the same conversation (I29).
    app.app_state.ctx.runtime.stop_all().await;
    let restarted = berth::startup::Application::build(app.config.clone()).await.unwrap();
    assert_eq!(restarted.state.ctx.runtime.live_count(), 1);
    let base = format!("http://127.0.0.1:{}", restarted.port());
    let runtime = restarted.state.ctx.runtime.clone();
    let background = restarted.background();
    let handle = restarted.handle();
    tokio::spawn(restarted.run_until_stopped());
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    assert_eq!(
        s["agent_session_ref"],
        reference.as_str(),
        "the same conversation throughout"
    );
    // The restarted server runs the agent: the message goes to it.
    let r = crate::helpers::client()
        .post(format!("{base}/api/v1/sessions/{id}/messages"))
        .bearer_auth(&app.admin)
        .json(&json!({"text": "history"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    wait_replies(&app, id, 4).await;
    assert_eq!(last_reply(&app, id).await, "history 4");
    runtime.stop_all().await;
    handle.stop(false).await;
    for b in background {
        b.abort();
    }
}

async fn a_missing_conversation_is_never_replaced(app: TestApp) {
    let (id, _) = recorded(&app, "first").await;
    stop(&app, id).await;
    let file = conversation_file(&app, id);
    std::fs::remove_file(&file).unwrap();
    let p = app
        .post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .problem(409, "agent_session_unavailable");
    assert_eq!(p["category"], "missing");
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(s["state"], "failed");
    assert_eq!(s["last_error"]["code"], "agent_session_unavailable");
    assert!(!file.exists(), "no new conversation was started in its place");
}

async fn a_corrupt_conversation_is_refused_and_kept(app: TestApp) {
    let (id, _) = recorded(&app, "first").await;
    stop(&app, id).await;
    let file = conversation_file(&app, id);
    // Another conversation's file in its place is not this conversation either.
    for content in ["not json at all\n", "{\"type\":\"session\",\"id\":\"someone-else\"}\n"] {
        std::fs::write(&file, content).unwrap();
        let p = app
            .post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
            .await
            .problem(409, "agent_session_unavailable");
        assert_eq!(p["category"], "corrupt");
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            content,
            "the file is left as it was"
        );
    }
}

async fn a_conversation_held_by_another_live_session_is_refused(app: TestApp) {
    let (id, reference) = recorded(&app, "first").await;
    stop(&app, id).await;
    // Another open session recorded as continuing the same conversation (an import, a copy).
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    let task = uuid(&s["task_id"]);
    let other = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let other = uuid(&other["id"]);
    wait_session(&app, other, "idle", |s| s["state"] == "idle").await;
    {
        use berth::entity::task_session as session;
        use sea_orm::{ActiveModelTrait, ActiveValue::Set};
        session::ActiveModel {
            id: Set(other.into()),
            agent_session_ref: Set(Some(reference.clone())),
            ..Default::default()
        }
        .update(app.db())
        .await
        .unwrap();
    }
    let p = app
        .post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .problem(409, "agent_session_unavailable");
    assert_eq!(p["category"], "leased");
    assert!(conversation_file(&app, id).is_file(), "nothing was removed");
}

async fn deleting_a_session_deletes_its_conversation_and_keeps_the_worktree(app: TestApp) {
    let (id, _) = recorded(&app, "first").await;
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    let file = conversation_file(&app, id);
    app.delete(&format!("/api/v1/sessions/{id}")).await.ok(204);
    assert!(!file.exists(), "the conversation went with its session");
    assert!(worktree.is_dir(), "the worktree stays (I2)");
}

async fn the_snapshot_shows_what_the_agent_said_about_itself(app: TestApp) {
    let (id, _) = recorded(&app, "first").await;
    wait_delivered(&app, id, 1).await;
    let snap = wait_until_every(
        "the agent's commands and name",
        WAIT,
        Duration::from_millis(20),
        || async {
            let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
            let learned = snap["agent"]["commands"].as_array().is_some_and(|c| !c.is_empty())
                && snap["agent"]["session_name"].is_string();
            seen_json(learned, snap)
        },
    )
    .await;
    assert_eq!(snap["label"], "fake pi work", "the agent's own name for the session");
    assert_eq!(snap["agent"]["model"]["id"], "echo");
    assert_eq!(snap["agent"]["thinking_level"], "off");
    assert_eq!(snap["agent"]["commands"][0]["name"], "review");
    assert_eq!(snap["agent"]["models"][0]["id"], "echo");
}
