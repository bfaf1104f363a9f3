//! Cleanup removes exactly the git registration berth recorded for each worktree it removes, never a
//! repository-wide `git worktree prune`: the user's own worktree of the same source repository,
//! missing from disk (an unmounted drive), stays registered through every cleanup path (I13: never
//! what the inventory does not name).
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, git, id_of, uuid, wait_job, worktrees_of};

both_backends!(
    every_cleanup_path_keeps_the_users_missing_worktree,
    a_registration_that_names_another_directory_is_kept_and_reported,
);

const WAIT: Duration = Duration::from_secs(30);

async fn wait_done(app: &TestApp, job: &Value) -> Value {
    let j = wait_job(app, uuid(&job["id"]), WAIT, &["succeeded", "failed"]).await;
    assert_eq!(j["state"], "succeeded", "{j}");
    j
}

/// A task with a materialized worktree of `repo`: (task, worktree path, its admin dir under `.git/worktrees`).
async fn task_with_worktree(
    app: &TestApp,
    ws: Uuid,
    repo: Uuid,
    source: &Path,
    title: &str,
) -> (Uuid, PathBuf, PathBuf) {
    let task = app.task(ws, title, &[repo]).await;
    let s = app.session(task, "worktree").await;
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let id = env["repos"][0]["worktree_id"].as_str().unwrap();
    let admin = source.join(".git/worktrees").join(id);
    assert!(admin.is_dir(), "berth recorded the registration's id");
    (task, PathBuf::from(s["workspace_path"].as_str().unwrap()), admin)
}

/// The user's own worktree, made outside berth, whose directory is then gone: `git worktree prune`
/// would drop it. Returns (its path, its admin dir).
fn users_missing_worktree(app: &TestApp, source: &Path) -> (String, PathBuf) {
    let path = app.scratch.path().canonicalize().unwrap().join("on-a-usb-drive");
    git(
        source,
        &["worktree", "add", "-q", "-b", "user-work", path.to_str().unwrap()],
    );
    std::fs::remove_dir_all(&path).unwrap();
    let listed = git(source, &["worktree", "list", "--porcelain"]);
    assert!(listed.contains("prunable"), "git would prune it: {listed}");
    (path.display().to_string(), source.join(".git/worktrees/on-a-usb-drive"))
}

#[track_caller]
fn assert_users_kept(source: &Path, user: &(String, PathBuf), after: &str) {
    assert!(
        worktrees_of(source).contains(&user.0),
        "{after}: the user's worktree is still listed"
    );
    assert!(user.1.is_dir(), "{after}: and its admin dir is still there");
}

#[track_caller]
fn assert_berths_gone(source: &Path, worktree: &Path, admin: &Path, after: &str) {
    assert!(!worktree.exists(), "{after}: berth's worktree directory is gone");
    assert!(
        !worktrees_of(source).contains(&worktree.display().to_string()),
        "{after}: and its registration"
    );
    assert!(!admin.exists(), "{after}: and its admin dir");
}

async fn every_cleanup_path_keeps_the_users_missing_worktree(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let user = users_missing_worktree(&app, &source);

    // Session delete removes no worktree and runs no git at all (seed 001).
    let (task, worktree, admin) = task_with_worktree(&app, ws, repo, &source, "session delete").await;
    let s = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200)["items"][0]["id"].clone();
    app.delete(&format!("/api/v1/sessions/{}", uuid(&s))).await.ok(204);
    assert!(worktree.is_dir() && admin.is_dir(), "the task keeps its worktree");
    assert_users_kept(&source, &user, "session delete");

    // Archive, with the worktree present: `git worktree remove` of that path.
    let r = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    wait_done(&app, &r["cleanup_jobs"][0]).await;
    assert_berths_gone(&source, &worktree, &admin, "archive");
    assert_users_kept(&source, &user, "archive");

    // Delete, with berth's worktree directory already gone too: only its recorded registration goes.
    let (task, worktree, admin) = task_with_worktree(&app, ws, repo, &source, "task delete").await;
    std::fs::remove_dir_all(&worktree).unwrap();
    let r = app.delete(&format!("/api/v1/tasks/{task}")).await.ok(202);
    let j = wait_done(&app, &r["cleanup_jobs"][0]).await;
    assert!(j["last_error"].is_null(), "nothing kept: {j}");
    assert_berths_gone(&source, &worktree, &admin, "task delete");
    assert_users_kept(&source, &user, "task delete");

    // Environment reset, worktree present and then missing.
    let (task, worktree, admin) = task_with_worktree(&app, ws, repo, &source, "reset").await;
    let r = app
        .post(&format!("/api/v1/tasks/{task}/environment/reset"), json!({}))
        .await
        .ok(202);
    wait_done(&app, &r["cleanup_job"]).await;
    assert_berths_gone(&source, &worktree, &admin, "environment reset");
    assert_users_kept(&source, &user, "environment reset");
    let again = app.session(task, "worktree").await;
    let worktree = PathBuf::from(again["workspace_path"].as_str().unwrap());
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let admin = source
        .join(".git/worktrees")
        .join(env["repos"][0]["worktree_id"].as_str().unwrap());
    std::fs::remove_dir_all(&worktree).unwrap();
    let r = app
        .post(&format!("/api/v1/tasks/{task}/environment/reset"), json!({}))
        .await
        .ok(202);
    wait_done(&app, &r["cleanup_job"]).await;
    assert_berths_gone(&source, &worktree, &admin, "environment reset of a missing worktree");
    assert_users_kept(&source, &user, "environment reset of a missing worktree");

    // Workspace delete (the same source repository registered in a second workspace), one worktree
    // present and one missing.
    let other = app.workspace("doomed").await;
    let r = app
        .post(
            &format!("/api/v1/workspaces/{other}/repositories"),
            json!({"path": source}),
        )
        .await;
    let repo2 = id_of(&r.ok(201));
    let (_, present, present_admin) = task_with_worktree(&app, other, repo2, &source, "present").await;
    let (_, missing, missing_admin) = task_with_worktree(&app, other, repo2, &source, "missing").await;
    std::fs::remove_dir_all(&missing).unwrap();
    let r = app
        .delete(&format!("/api/v1/workspaces/{other}?confirm_name=doomed"))
        .await
        .ok(202);
    for j in r["cleanup_jobs"].as_array().unwrap() {
        wait_done(&app, j).await;
    }
    assert_berths_gone(&source, &present, &present_admin, "workspace delete");
    assert_berths_gone(&source, &missing, &missing_admin, "workspace delete");
    assert_users_kept(&source, &user, "workspace delete");

    // What is left: the source repository and the user's worktree.
    let mut left = worktrees_of(&source);
    left.sort();
    let mut expected = vec![source.display().to_string(), user.0.clone()];
    expected.sort();
    assert_eq!(left, expected);
}

// A recorded id whose admin dir's `gitdir` names another directory (git reused the name for someone
// else's worktree) is not berth's: it is left, and the job says so.
async fn a_registration_that_names_another_directory_is_kept_and_reported(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let (task, worktree, admin) = task_with_worktree(&app, ws, repo, &source, "reused id").await;
    std::fs::remove_dir_all(&worktree).unwrap();
    let elsewhere = app.scratch.path().canonicalize().unwrap().join("someone-elses");
    std::fs::write(admin.join("gitdir"), format!("{}/.git\n", elsewhere.display())).unwrap();
    let r = app.delete(&format!("/api/v1/tasks/{task}")).await.ok(202);
    let j = wait_done(&app, &r["cleanup_jobs"][0]).await;
    let report = j["last_error"].as_str().unwrap_or_else(|| panic!("reported: {j}"));
    assert!(report.contains("kept the registration"), "{report}");
    assert!(
        !report.contains(&elsewhere.display().to_string()),
        "without the path (I34): {report}"
    );
    assert!(admin.is_dir(), "the registration is left");
    assert!(worktrees_of(&source).contains(&elsewhere.display().to_string()));
}
