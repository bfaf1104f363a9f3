//! An agent's end: stop escalating to SIGKILL, deleting an idle session, and a crashing agent restarted
//! until a threshold, then failed.
use std::path::PathBuf;

use serde_json::json;

use super::{execution_pid, pid_alive, uuid, wait_delivered, wait_reply, wait_session};
use crate::both_backends;
use crate::helpers::{TestApp, worktrees_of};

both_backends!(
    stop_escalates_to_sigkill_for_an_agent_that_ignores_abort,
    deleting_an_idle_session_stops_its_agent_and_keeps_the_workspace,
    a_crashed_agent_is_restarted_then_failed_past_the_threshold,
);

// I28: stop clears desired_open, aborts, waits, SIGTERMs, and SIGKILLs an agent that ignores both.
async fn stop_escalates_to_sigkill_for_an_agent_that_ignores_abort(app: TestApp) {
    let f = app.task_with_repo("Stubborn").await;
    let s = f.agent_prompted("stubborn", "hang").await;
    let id = uuid(&s["id"]);
    let s = wait_session(&app, id, "running", |s| s["state"] == "running").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    assert!(pid_alive(pid));
    // The launch prompt is stored first, then handed to the agent: wait until it has it (it hangs).
    wait_delivered(&app, id, 1).await;
    // Busy: a running session cannot be deleted.
    app.delete(&format!("/api/v1/sessions/{id}"))
        .await
        .problem(409, "session_busy");
    let stopped = app
        .post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
    assert_eq!(stopped["state"], "stopped");
    assert_eq!(stopped["desired_open"], false);
    assert!(!pid_alive(pid), "the process group was killed");
    // The transcript is kept; messages to a stopped session are refused.
    assert!(app.count("session_messages").await >= 1);
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "hello?"}))
        .await
        .problem(409, "conflict");
}

// I4 with a live agent: an idle session has its process stopped first; the workspace stays.
async fn deleting_an_idle_session_stops_its_agent_and_keeps_the_workspace(app: TestApp) {
    let f = app.task_with_repo("Idle delete").await;
    let source = f.repo_dir.clone();
    let s = f.agent_prompted("test", "write note.txt kept").await;
    let id = uuid(&s["id"]);
    wait_reply(&app, id, 1).await;
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    app.delete(&format!("/api/v1/sessions/{id}")).await.ok(204);
    assert!(!pid_alive(pid));
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    assert_eq!(std::fs::read_to_string(worktree.join("note.txt")).unwrap(), "kept");
    assert!(worktrees_of(&source).contains(&worktree.display().to_string()));
    assert_eq!(app.count("task_resource_cleanup_jobs").await, 0);
}

// I30: an agent that dies is restarted in the same workspace (recovering), a bounded number of times in a
// window; past that the session is failed with the reason.
async fn a_crashed_agent_is_restarted_then_failed_past_the_threshold(app: TestApp) {
    let Some(app) = app
        .respawn_with(&[
            ("BERTH_AGENT_RESTART_MAX", "2"),
            ("BERTH_AGENT_RESTART_BACKOFF_MS", "10"),
        ])
        .await
    else {
        return;
    };
    let f = app.task_with_repo("Crashy").await;
    let s = f.agent("test").await;
    let id = uuid(&s["id"]);
    let mut execution = s["execution_id"].clone();
    for round in 1..=2 {
        app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "crash"}))
            .await
            .ok(202);
        let back = wait_session(&app, id, "restarted", |v| {
            v["state"] == "idle" && v["execution_id"] != execution
        })
        .await;
        assert_eq!(
            back["workspace_path"], s["workspace_path"],
            "round {round}: the same workspace"
        );
        execution = back["execution_id"].clone();
    }
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "crash"}))
        .await
        .ok(202);
    let failed = wait_session(&app, id, "failed", |v| v["state"] == "failed").await;
    assert_eq!(failed["last_error"]["code"], "agent_exited");
    assert!(
        failed["last_error"]["message"].as_str().unwrap().contains("status 3"),
        "{failed}"
    );
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let recovering = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.state_changed" && e["data"]["state"] == "recovering")
        .count();
    assert_eq!(recovering, 2, "each restart is visible");
    assert_eq!(app.app_state.ctx.runtime.live_count(), 0);
}
