//! Launching agents: the profiles listed, an agent at work in its worktree or in the repository, one live
//! process per session, and bad launch requests refused cleanly.
use std::path::PathBuf;

use reqwest::Method;
use serde_json::json;

use super::{execution_pid, pid_alive, session_states, uuid, wait_reply, wait_session};
use crate::both_backends;
use crate::helpers::{TestApp, id_of, worktrees_of};

both_backends!(
    profiles_are_listed_without_their_environment,
    an_agent_works_in_its_admitted_worktree,
    a_local_agent_works_in_the_repository,
    a_second_launch_returns_the_running_session,
    bad_agent_requests_fail_cleanly,
);

async fn profiles_are_listed_without_their_environment(app: TestApp) {
    let r = app.get("/api/v1/agent-profiles").await;
    let list = r.ok(200);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["fakepi", "missing", "stubborn", "test"]);
    assert!(
        !r.text.contains("s3cret-value"),
        "environment values never leave the config"
    );
}

// I15, I17, I19: the agent's working directory is the admitted worktree; prompts and messages arrive.
async fn an_agent_works_in_its_admitted_worktree(app: TestApp) {
    let f = app.task_with_repo("Agent").await;
    let s = f.agent_prompted("test", "pwd").await;
    let id = uuid(&s["id"]);
    assert!(s["execution_id"].is_string());
    assert_eq!(s["desired_open"], true);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    assert_eq!(
        wait_reply(&app, id, 1).await[0],
        worktree.display().to_string(),
        "the agent runs in the worktree"
    );
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    assert!(pid_alive(pid));
    // The profile's environment reaches the agent.
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "env BERTH_TEST_SECRET"}),
    )
    .await
    .ok(202);
    assert_eq!(wait_reply(&app, id, 2).await[1], "s3cret-value");
    // Nothing else of berth's environment does: the test process holds CARGO_* variables and, in CI, the
    // PostgreSQL URL; the agent sees only the allow-list, its profile's and its session's.
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "envkeys"}))
        .await
        .ok(202);
    let keys = wait_reply(&app, id, 3).await[2].clone();
    let keys: Vec<&str> = keys.split(' ').collect();
    assert!(keys.contains(&"PATH") && keys.contains(&"BERTH_SESSION_ID"), "{keys:?}");
    let leaked: Vec<&&str> = keys
        .iter()
        .filter(|k| {
            !(berth::runtime::INHERITED_ENV.contains(k)
                || k.starts_with("LC_")
                || ["BERTH_TEST_SECRET", "BERTH_SESSION_ID", "BERTH_EXECUTION_ID"].contains(k)
                // The box (bwrap --chdir) names the working directory, as a shell would.
                || *k == &"PWD")
        })
        .collect();
    assert!(leaked.is_empty(), "the agent inherited {leaked:?}");
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "write hello.txt hi there"}),
    )
    .await
    .ok(202);
    wait_reply(&app, id, 4).await;
    assert_eq!(std::fs::read_to_string(worktree.join("hello.txt")).unwrap(), "hi there");
    // Events: the state went starting -> idle/running, and output is visible as runtime.output.
    let states = session_states(&app, id).await;
    assert_eq!(states.first().map(String::as_str), Some("starting"));
    assert!(
        states.contains(&"running".to_string()) && states.contains(&"idle".to_string()),
        "{states:?}"
    );
    // The transcript is kept in the conversation history.
    assert!(app.count("session_messages").await >= 6);
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
    assert!(!pid_alive(pid));
}

async fn a_local_agent_works_in_the_repository(app: TestApp) {
    let f = app.task_with_repo("Local agent").await;
    let source = f.repo_dir.clone();
    let s = f
        .session_with(json!({"executor_type": "local", "agent_profile": "test", "prompt": "pwd"}))
        .await;
    assert_eq!(
        wait_reply(&app, uuid(&s["id"]), 1).await[0],
        source.display().to_string()
    );
    app.post(&format!("/api/v1/sessions/{}/stop", uuid(&s["id"])), json!({}))
        .await
        .ok(200);
}

// I27: one live process per session; launching a running session returns it.
async fn a_second_launch_returns_the_running_session(app: TestApp) {
    let f = app.task_with_repo("Once").await;
    let s = f.agent("test").await;
    let id = uuid(&s["id"]);
    let url = format!("/api/v1/sessions/{id}/launch");
    let again = futures_util::future::join_all((0..3).map(|_| app.post(&url, json!({})))).await;
    for r in again {
        assert_eq!(r.ok(200)["execution_id"], s["execution_id"]);
    }
    assert_eq!(app.count("agent_executions").await, 1);
    assert_eq!(app.app_state.ctx.runtime.live_count(), 1);
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

async fn bad_agent_requests_fail_cleanly(app: TestApp) {
    let f = app.task_with_repo("Bad agents").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    let url = format!("/api/v1/tasks/{task}/sessions");
    app.post(&url, json!({"executor_type": "worktree", "agent_profile": "nope"}))
        .await
        .problem(422, "validation_failed");
    app.post(&url, json!({"executor_type": "worktree", "start": true}))
        .await
        .problem(422, "validation_failed");
    app.post(
        &url,
        json!({"executor_type": "worktree", "agent_profile": "test", "start": false, "prompt": "x"}),
    )
    .await
    .problem(422, "validation_failed");
    assert_eq!(app.count("task_sessions").await, 0);
    // A profile whose command does not exist: a typed failure, the session failed, nothing else changed.
    let r = app
        .post(&url, json!({"executor_type": "worktree", "agent_profile": "missing"}))
        .await;
    let p = r.problem(409, "conflict");
    assert_eq!(p["action"], "check_agent_profile");
    assert!(!r.text.contains("/nonexistent"), "no path in the body");
    let sessions = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200);
    let s = &sessions["items"][0];
    assert_eq!(s["state"], "failed");
    assert_eq!(s["last_error"]["code"], "agent_start_failed");
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200)["status"],
        "ready"
    );
    assert_eq!(worktrees_of(&source).len(), 2, "the workspace stays");
    // A session without a profile cannot be launched; messages need a running agent.
    let plain = id_of(&app.post(&url, json!({"executor_type": "worktree"})).await.ok(201));
    app.post(&format!("/api/v1/sessions/{plain}/launch"), json!({}))
        .await
        .problem(422, "validation_failed");
    app.post(&format!("/api/v1/sessions/{plain}/messages"), json!({"text": "hi"}))
        .await
        .problem(409, "conflict");
    app.post(&format!("/api/v1/sessions/{plain}/launch"), json!({"bogus": 1}))
        .await
        .problem(400, "validation_failed");
    let reader = app.token("sessions:read");
    app.call(
        Method::POST,
        &format!("/api/v1/sessions/{plain}/launch"),
        Some(&reader),
        Some(json!({})),
    )
    .await
    .problem(403, "insufficient_scope");
}
