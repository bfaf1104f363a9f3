//! Refusal marks the environment (I15–I19): when admission finds the current workspace unsafe, the
//! environment goes `broken` with its category and an `environment.broken` event, its git status reads stale,
//! it refuses launches, new sessions and refreshes with the same typed 409, and a reset is the way back (a
//! launch also proves it again: mended, it is ready again, as
//! `agents::admission_refuses_a_broken_workspace_and_changes_nothing` shows). The local executor is refused
//! the same way and nothing of the user's repository is touched, by the refusal or by the reset.
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, git, uuid, wait_job_settled};

both_backends!(
    a_refused_worktree_environment_is_broken_until_reset,
    a_refused_local_environment_touches_nothing_of_the_repository,
);

/// Resets the task's environment (202) and waits until its cleanup job is settled; returns the job.
async fn reset(app: &TestApp, task: Uuid) -> Value {
    let job = app
        .post(&format!("/api/v1/tasks/{task}/environment/reset"), json!({}))
        .await
        .ok(202);
    wait_job_settled(app, uuid(&job["cleanup_job"]["id"])).await
}

async fn broken_events(app: &TestApp, task: Uuid) -> Vec<Value> {
    app.get(&format!("/api/v1/events?task_id={task}&types=environment.broken"))
        .await
        .ok(200)["events"]
        .as_array()
        .unwrap()
        .clone()
}

async fn a_refused_worktree_environment_is_broken_until_reset(app: TestApp) {
    let f = app.task_with_repo("Broken").await;
    let task = f.task;
    let s = app.unstarted_agent(task, "worktree", "test").await;
    let sid = uuid(&s["id"]);
    let env_id = uuid(&s["task_environment_id"]);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    app.post(&format!("/api/v1/environments/{env_id}/git-status/refresh"), json!({}))
        .await
        .ok(200);
    std::fs::remove_dir_all(&worktree).unwrap();

    let p = app
        .post(&format!("/api/v1/sessions/{sid}/launch"), json!({}))
        .await
        .problem(409, "workspace_reuse_unsafe");
    assert_eq!(p["category"], "workspace_missing");
    assert_eq!(p["action"], "reset_environment");
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(env["id"], env_id.to_string(), "still the task's environment");
    assert_eq!(env["status"], "broken");
    assert_eq!(env["broken_category"], "workspace_missing");
    let events = broken_events(&app, task).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0]["data"],
        json!({"category": "workspace_missing", "recovery": "reset_environment"})
    );
    let status = app
        .get(&format!("/api/v1/environments/{env_id}/git-status"))
        .await
        .ok(200);
    assert_eq!(status["stale"], true, "{status}");
    assert_eq!(
        status["items"].as_array().unwrap().len(),
        1,
        "the last known state stays readable"
    );
    let fine = app.get(&format!("/api/v1/sessions/{sid}/git-status")).await.ok(200);
    assert_eq!(fine["stale"], true);

    // Everything that would work in it is refused the same way, and changes nothing.
    app.post(&format!("/api/v1/environments/{env_id}/git-status/refresh"), json!({}))
        .await
        .problem(409, "workspace_reuse_unsafe");
    let sessions_before = app.count("task_sessions").await;
    let p = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "start": false}),
        )
        .await
        .problem(409, "workspace_reuse_unsafe");
    assert_eq!(p["category"], "workspace_missing");
    assert_eq!(app.count("task_sessions").await, sessions_before, "no session was made");
    app.post(&format!("/api/v1/sessions/{sid}/launch"), json!({}))
        .await
        .problem(409, "workspace_reuse_unsafe");
    assert_eq!(
        broken_events(&app, task).await.len(),
        1,
        "broken once, not once per refusal"
    );
    assert!(!worktree.exists(), "nothing was made behind the refusal");

    // The way back: a reset, then the old session resumes in a fresh environment.
    assert_eq!(reset(&app, task).await["state"], "succeeded");
    let relaunched = app
        .post(&format!("/api/v1/sessions/{sid}/launch"), json!({}))
        .await
        .ok(200);
    let fresh = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_ne!(fresh["id"], env_id.to_string());
    assert_eq!(fresh["status"], "ready");
    assert!(fresh["broken_category"].is_null());
    assert_eq!(relaunched["task_environment_id"], fresh["id"]);
    assert!(worktree.is_dir(), "materialized again");
    let status = app
        .get(&format!("/api/v1/environments/{}/git-status", uuid(&fresh["id"])))
        .await
        .ok(200);
    assert_eq!(status["stale"], false);
    app.post(&format!("/api/v1/sessions/{sid}/stop"), json!({}))
        .await
        .ok(200);
}

fn repository_state(source: &Path) -> (String, String, String, Vec<String>) {
    let mut files: Vec<String> = std::fs::read_dir(source)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    (
        git(source, &["status", "--porcelain"]),
        git(source, &["rev-parse", "HEAD"]),
        git(source, &["for-each-ref", "--format=%(refname) %(objectname)"]),
        files,
    )
}

// The local executor works in the user's repository itself. A launch admission refuses (the
// repository's `.git` is away) changes nothing there; the environment is broken; its reset removes
// nothing of the repository (a local environment owns no worktree), and a launch works again after it.
async fn a_refused_local_environment_touches_nothing_of_the_repository(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    std::fs::write(source.join("uncommitted.txt"), "the user's work").unwrap();
    let task = app.task(ws, "Local", &[repo]).await;
    let s = app.unstarted_agent(task, "local", "test").await;
    let sid = uuid(&s["id"]);
    assert_eq!(s["workspace_path"], source.display().to_string());
    let before = repository_state(&source);

    let away = source.with_file_name("svc.git-away");
    std::fs::rename(source.join(".git"), &away).unwrap();
    let p = app
        .post(&format!("/api/v1/sessions/{sid}/launch"), json!({}))
        .await
        .problem(409, "workspace_reuse_unsafe");
    std::fs::rename(&away, source.join(".git")).unwrap();
    assert_eq!(app.app_state.ctx.runtime.live_count(), 0, "no agent started");
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(env["status"], "broken");
    assert_eq!(env["broken_category"], p["category"]);
    assert_eq!(repository_state(&source), before, "the refusal touched nothing");

    assert_eq!(reset(&app, task).await["state"], "succeeded");
    assert_eq!(repository_state(&source), before, "nor did the reset");
    assert_eq!(
        std::fs::read_to_string(source.join("uncommitted.txt")).unwrap(),
        "the user's work"
    );
    let relaunched = app
        .post(&format!("/api/v1/sessions/{sid}/launch"), json!({}))
        .await
        .ok(200);
    assert_eq!(relaunched["workspace_path"], source.display().to_string());
    app.post(&format!("/api/v1/sessions/{sid}/stop"), json!({}))
        .await
        .ok(200);
    assert_eq!(repository_state(&source), before);
}
