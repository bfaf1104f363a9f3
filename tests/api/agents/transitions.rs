//! Executor transitions: a launch with another executor gets a fresh environment and forwards nothing, and
//! a failed one leaves the current environment in place.
use std::path::PathBuf;

use serde_json::json;

use super::{uuid, wait_reply};
use crate::both_backends;
use crate::helpers::{TestApp, git, worktrees_of};

both_backends!(
    an_executor_transition_forwards_nothing_and_keeps_the_old_workspace,
    a_failed_transition_leaves_the_current_environment_in_place,
);

// I18: launching with another executor makes a fresh environment for it; nothing of the old one is
// forwarded; the old one is kept, superseded and untouched; the current one changes only after the launch.
async fn an_executor_transition_forwards_nothing_and_keeps_the_old_workspace(app: TestApp) {
    let f = app.task_with_repo("Transition").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    let local = f
        .session_with(json!({"executor_type": "local", "agent_profile": "test", "prompt": "pwd"}))
        .await;
    let local_id = uuid(&local["id"]);
    assert_eq!(wait_reply(&app, local_id, 1).await[0], source.display().to_string());
    app.post(&format!("/api/v1/sessions/{local_id}/stop"), json!({}))
        .await
        .ok(200);
    let old_env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(old_env["executor_type"], "local");
    let before = (
        git(&source, &["status", "--porcelain"]),
        git(&source, &["rev-parse", "HEAD"]),
    );

    let s = f.agent_prompted("test", "pwd").await;
    let id = uuid(&s["id"]);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    assert!(
        worktree.starts_with(&app.config.worktree_root),
        "a fresh worktree, not the old path"
    );
    assert_eq!(wait_reply(&app, id, 1).await[0], worktree.display().to_string());
    let new_env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_ne!(new_env["id"], old_env["id"]);
    assert_eq!(new_env["executor_type"], "worktree");
    assert_eq!(new_env["status"], "ready");
    assert!(new_env["repos"][0]["worktree_id"].is_string());
    assert_ne!(
        new_env["repos"][0]["id"], old_env["repos"][0]["id"],
        "no inventory row forwarded"
    );
    assert_eq!(s["task_environment_id"], new_env["id"]);
    assert_ne!(s["execution_id"], local["execution_id"]);
    let kept = app
        .get(&format!("/api/v1/environments/{}", uuid(&old_env["id"])))
        .await
        .ok(200);
    assert_eq!(kept["status"], "superseded", "recorded for diagnostics");
    assert_eq!(kept["repos"], old_env["repos"], "its inventory untouched");
    assert_eq!(
        (
            git(&source, &["status", "--porcelain"]),
            git(&source, &["rev-parse", "HEAD"])
        ),
        before,
        "the source is untouched"
    );
    assert_eq!(app.count("tasks").await, 1, "no second task");
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

async fn a_failed_transition_leaves_the_current_environment_in_place(app: TestApp) {
    let f = app.task_with_repo("No switch").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    f.session("worktree").await;
    let current = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    // A local launch whose agent cannot start: the candidate fails, the worktree environment stays current.
    app.post(
        &format!("/api/v1/tasks/{task}/sessions"),
        json!({"executor_type": "local", "agent_profile": "missing"}),
    )
    .await
    .problem(409, "conflict");
    let still = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(still["id"], current["id"]);
    assert_eq!(still["status"], "ready");
    assert_eq!(worktrees_of(&source).len(), 2);
    // It still works: a worktree session attaches to it.
    assert_eq!(f.session("worktree").await["task_environment_id"], current["id"]);
}
