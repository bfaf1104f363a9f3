//! A Pi conversation through berth survives a berth restart, a crash of the agent, and stop and resume;
//! a missing or corrupt conversation file is refused, never replaced.
use std::path::Path;

use serde_json::json;

use super::{
    agent_session_ref, continued, conversation_file, execution_pid, pi_session, pid_alive, restart, stop, texts, turn,
    uuid, wait_session, with_pi,
};
use crate::both_backends;
use crate::helpers::TestApp;

both_backends!(
    a_pi_conversation_survives_a_berth_restart,
    a_pi_conversation_survives_a_crash_of_the_agent,
    a_pi_conversation_survives_stop_and_resume,
    a_missing_or_corrupt_conversation_is_refused_never_replaced,
);

// I26, I29: after a berth restart the open session is relaunched (a new execution) on its own conversation
// file, and the model receives the earlier turn with the next message.
async fn a_pi_conversation_survives_a_berth_restart(app: TestApp) {
    let Some((mut app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    turn(&app, &pi, id, "before the restart", 1).await;
    let recorded = agent_session_ref(&app, id).await;
    let old_pid = execution_pid(&app, &s["execution_id"]).await;
    let restarted = restart(&mut app).await;
    assert!(!pid_alive(old_pid), "the first berth's Pi is gone");
    let back = wait_session(&app, id, "relaunched", |v| {
        v["state"] == "idle" && v["execution_id"].is_string() && v["execution_id"] != s["execution_id"]
    })
    .await;
    assert!(pid_alive(execution_pid(&app, &back["execution_id"]).await));
    let after = turn(&app, &pi, id, "after the restart", 2).await;
    assert_eq!(
        after.conversation(),
        continued("before the restart", "after the restart")
    );
    assert_eq!(agent_session_ref(&app, id).await, recorded, "the same conversation");
    stop(&app, id).await;
    drop(restarted);
}

// I30: SIGKILL of the agent; berth restarts it (recovering, a new execution) on the same conversation
// file, and the model receives the earlier turn.
async fn a_pi_conversation_survives_a_crash_of_the_agent(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[("BERTH_AGENT_RESTART_BACKOFF_MS", "10")]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    turn(&app, &pi, id, "before the crash", 1).await;
    let recorded = agent_session_ref(&app, id).await;
    let pid = execution_pid(&app, &s["execution_id"]).await;
    // SAFETY: kill(2) on the pid of the agent this test's berth started; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let back = wait_session(&app, id, "restarted after the crash", |v| {
        v["state"] == "idle" && v["execution_id"].is_string() && v["execution_id"] != s["execution_id"]
    })
    .await;
    assert_eq!(back["workspace_path"], s["workspace_path"]);
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "session.state_changed"
                && e["session_id"] == id.to_string()
                && e["data"]["state"] == "recovering"),
        "the restart went through recovering"
    );
    let after = turn(&app, &pi, id, "after the crash", 2).await;
    assert_eq!(after.conversation(), continued("before the crash", "after the crash"));
    assert_eq!(agent_session_ref(&app, id).await, recorded);
    stop(&app, id).await;
}

// I27, I28: stop keeps the conversation; resume, and launch after another stop, continue it; deleting the
// session deletes it.
async fn a_pi_conversation_survives_stop_and_resume(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let s = pi_session(&app).await;
    let id = uuid(&s["id"]);
    turn(&app, &pi, id, "one", 1).await;
    let recorded = agent_session_ref(&app, id).await;
    let pid = execution_pid(&app, &s["execution_id"]).await;
    let dir = conversation_file(&app, id).parent().unwrap().to_path_buf();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700, "conversations are owner-only");
    // I27: resuming a live session returns it as it is, no second process.
    let same = app
        .post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .ok(200);
    assert_eq!(same["execution_id"], s["execution_id"]);
    assert_eq!(app.app_state.ctx.runtime.live_count(), 1);
    stop(&app, id).await;
    assert!(!pid_alive(pid));
    assert!(conversation_file(&app, id).exists(), "stop keeps the conversation");
    app.post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle after resume", |v| v["state"] == "idle").await;
    let two = turn(&app, &pi, id, "two", 2).await;
    assert_eq!(two.conversation(), continued("one", "two"));
    stop(&app, id).await;
    app.post(&format!("/api/v1/sessions/{id}/launch"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle after launch", |v| v["state"] == "idle").await;
    let three = turn(&app, &pi, id, "three", 3).await;
    assert_eq!(
        three.conversation(),
        texts(&[
            ("user", "one"),
            ("assistant", "echo: one"),
            ("user", "two"),
            ("assistant", "echo: two"),
            ("user", "three"),
        ])
    );
    assert_eq!(agent_session_ref(&app, id).await, recorded);
    stop(&app, id).await;
    // The conversation is session data: deleting the session deletes it (the worktree stays).
    app.delete(&format!("/api/v1/sessions/{id}")).await.ok(204);
    assert!(
        !conversation_file(&app, id).exists(),
        "the conversation file went with the session"
    );
    assert!(Path::new(s["workspace_path"].as_str().unwrap()).is_dir());
}

// I29: a recorded conversation whose file is missing, or corrupt, is never replaced by a new one: the
// launch is refused with 409 `agent_session_unavailable` and its category, the session is failed with
// that code, no process starts, and the file is left as it is.
async fn a_missing_or_corrupt_conversation_is_refused_never_replaced(app: TestApp) {
    let Some((app, pi)) = with_pi(app, &[]).await else {
        return;
    };
    let id = uuid(&pi_session(&app).await["id"]);
    turn(&app, &pi, id, "remember this", 1).await;
    stop(&app, id).await;
    let file = conversation_file(&app, id);
    let kept = std::fs::read_to_string(&file).unwrap();
    let executions = app.count("agent_executions").await;
    let moved = file.with_extension("moved");
    std::fs::rename(&file, &moved).unwrap();
    for (category, break_it) in [
        ("missing", Box::new(|| {}) as Box<dyn Fn()>),
        (
            "corrupt",
            Box::new(|| std::fs::write(&file, "not a conversation\n").unwrap()),
        ),
    ] {
        break_it();
        let before = std::fs::read(&file).ok();
        let r = app.post(&format!("/api/v1/sessions/{id}/resume"), json!({})).await;
        let p = r.problem(409, "agent_session_unavailable");
        assert_eq!(p["category"], category, "{}", r.text);
        assert!(
            !r.text.contains(&app.config.data_dir.display().to_string()),
            "no path in the body"
        );
        let failed = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
        assert_eq!(failed["state"], "failed");
        assert_eq!(failed["last_error"]["code"], "agent_session_unavailable");
        assert_eq!(
            std::fs::read(&file).ok(),
            before,
            "{category}: the file is left as it was"
        );
        assert_eq!(
            app.count("agent_executions").await,
            executions,
            "{category}: no process"
        );
        assert_eq!(app.app_state.ctx.runtime.live_count(), 0);
    }
    assert_eq!(pi.model.requests().len(), 1, "the model heard nothing more");
    // Mended, the same conversation goes on.
    std::fs::rename(&moved, &file).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), kept);
    app.post(&format!("/api/v1/sessions/{id}/resume"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "idle after the mend", |v| v["state"] == "idle").await;
    let next = turn(&app, &pi, id, "still there?", 2).await;
    assert_eq!(next.conversation(), continued("remember this", "still there?"));
    stop(&app, id).await;
}
