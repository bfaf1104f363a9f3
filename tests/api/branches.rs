//! The branch policy (seed 001: only task lifecycle owns cleanup; I11 consent): berth deletes only
//! branches it created, only on task delete, only once the worktree is gone, and only when nothing is
//! lost (merged into the base, or in the upstream) or `delete_branches=true` said so. Branches the user
//! named that already existed are never deleted; archive deletes none. Real git, both databases.
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, assert_no_path, branch_exists, git, uuid, wait_job};

both_backends!(
    a_merged_berth_branch_is_deleted_on_task_delete,
    an_unmerged_branch_is_kept_reported_and_listed,
    an_unmerged_branch_is_deleted_with_consent,
    a_user_named_existing_branch_is_never_deleted,
    archive_deletes_no_branch_and_the_listing_shows_it,
);

const WAIT: Duration = Duration::from_secs(30);

async fn wait_done(app: &TestApp, id: &Value) -> Value {
    let j = wait_job(app, uuid(id), WAIT, &["succeeded", "failed"]).await;
    assert_eq!(j["state"], "succeeded", "the job did not succeed: {j}");
    j
}

/// A task over one new repository, with its worktree materialized; `slot` adds fields to the slot.
async fn task_with_worktree(app: &TestApp, name: &str, slot: Value) -> (Uuid, Uuid, PathBuf, PathBuf, String) {
    let ws = app.workspace(name).await;
    let (repo, source) = app.repository(ws, name).await;
    let mut slot = slot;
    slot["repository_id"] = repo.to_string().into();
    let task = crate::helpers::id_of(
        &app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            serde_json::json!({"title": name, "repositories": [slot]}),
        )
        .await
        .ok(201),
    );
    let s = app.session(task, "worktree").await;
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let branch = env["repos"][0]["worktree_branch"].as_str().unwrap().to_string();
    (
        ws,
        task,
        source,
        PathBuf::from(s["workspace_path"].as_str().unwrap()),
        branch,
    )
}

fn commit_in(worktree: &Path, file: &str) {
    std::fs::write(worktree.join(file), "work\n").unwrap();
    git(worktree, &["add", file]);
    git(worktree, &["commit", "-q", "-m", file]);
}

/// The one decision the answer (or the job) reports for `branch`.
fn decision<'a>(branches: &'a Value, branch: &str) -> &'a Value {
    let all = branches.as_array().unwrap_or_else(|| panic!("no branches: {branches}"));
    let found: Vec<&Value> = all.iter().filter(|b| b["branch"] == branch).collect();
    assert_eq!(found.len(), 1, "one decision for {branch}: {branches}");
    found[0]
}

async fn delete(app: &TestApp, task: Uuid, query: &str) -> (Value, Value) {
    let reply = app.delete(&format!("/api/v1/tasks/{task}{query}")).await;
    assert_no_path(&reply, &app.scratch.path().canonicalize().unwrap());
    let body = reply.ok(202);
    let job = wait_done(app, &body["cleanup_jobs"][0]["id"]).await;
    (body, job)
}

async fn a_merged_berth_branch_is_deleted_on_task_delete(app: TestApp) {
    let (ws, task, source, worktree, branch) = task_with_worktree(&app, "merged", serde_json::json!({})).await;
    assert!(branch.starts_with("berth/"), "{branch}");
    commit_in(&worktree, "done.txt");
    git(&source, &["merge", "-q", "--ff-only", &branch]);
    let (body, job) = delete(&app, task, "").await;
    let d = decision(&body["branches"], &branch);
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (Some("delete"), Some("merged")),
        "{body}"
    );
    let d = decision(&job["resource_snapshot"]["branches"], &branch);
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (Some("delete"), Some("merged")),
        "{job}"
    );
    assert!(!worktree.exists());
    assert!(
        !branch_exists(&source, &branch),
        "a merged berth branch goes with its task"
    );
    // main keeps the work.
    assert!(source.join("done.txt").exists());
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/branches")).await.ok(200);
    assert_eq!(listed["items"], serde_json::json!([]), "{listed}");
}

async fn an_unmerged_branch_is_kept_reported_and_listed(app: TestApp) {
    let (ws, task, source, worktree, branch) = task_with_worktree(&app, "unmerged", serde_json::json!({})).await;
    commit_in(&worktree, "wip.txt");
    let (body, job) = delete(&app, task, "").await;
    let d = decision(&body["branches"], &branch);
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (Some("keep"), Some("not_merged")),
        "{body}"
    );
    let d = decision(&job["resource_snapshot"]["branches"], &branch);
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (Some("keep"), Some("not_merged")),
        "{job}"
    );
    assert!(!worktree.exists(), "the worktree goes");
    assert!(branch_exists(&source, &branch), "the unmerged commit stays reachable");
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/branches")).await.ok(200);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["branch"], branch.as_str());
    assert_eq!(items[0]["task_id"], Value::Null, "the task is gone");
    assert_eq!(items[0]["merged"], false);
    // Once merged, the listing says so (deleting it would lose nothing).
    git(&source, &["merge", "-q", "--ff-only", &branch]);
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/branches")).await.ok(200);
    assert_eq!(listed["items"][0]["merged"], true, "{listed}");
    // A token for another workspace sees nothing (I33).
    let other = app.token_for("tasks:read", Some(vec![Uuid::now_v7()]), None);
    let r = app
        .call(
            reqwest::Method::GET,
            &format!("/api/v1/workspaces/{ws}/branches"),
            Some(&other),
            None,
        )
        .await;
    r.problem(404, "not_found");
}

async fn an_unmerged_branch_is_deleted_with_consent(app: TestApp) {
    let (_, task, source, worktree, branch) = task_with_worktree(&app, "consent", serde_json::json!({})).await;
    commit_in(&worktree, "throwaway.txt");
    let (body, job) = delete(&app, task, "?delete_branches=true").await;
    let d = decision(&body["branches"], &branch);
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (Some("delete"), Some("consented")),
        "{body}"
    );
    assert_eq!(
        job["resource_snapshot"]["delete_branches"], true,
        "the consent is recorded: {job}"
    );
    let d = decision(&job["resource_snapshot"]["branches"], &branch);
    assert_eq!(d["action"], "delete", "{job}");
    assert!(!branch_exists(&source, &branch));
}

async fn a_user_named_existing_branch_is_never_deleted(app: TestApp) {
    let ws = app.workspace("named").await;
    let (repo, source) = app.repository(ws, "named").await;
    git(&source, &["branch", "feature/mine"]);
    let task = crate::helpers::id_of(
        &app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            serde_json::json!({"title": "named", "repositories": [{"repository_id": repo, "branch": "feature/mine"}]}),
        )
        .await
        .ok(201),
    );
    let s = app.session(task, "worktree").await;
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    commit_in(&worktree, "mine.txt");
    let (body, job) = delete(&app, task, "?delete_branches=true").await;
    let d = decision(&body["branches"], "feature/mine");
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (Some("keep"), Some("user_named")),
        "{body}"
    );
    let d = decision(&job["resource_snapshot"]["branches"], "feature/mine");
    assert_eq!(
        (d["action"].as_str(), d["reason"].as_str()),
        (Some("keep"), Some("user_named")),
        "{job}"
    );
    assert!(
        branch_exists(&source, "feature/mine"),
        "the user's branch stays, consent or not"
    );
    // It is not berth's: not listed.
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/branches")).await.ok(200);
    assert_eq!(listed["items"], serde_json::json!([]), "{listed}");
}

async fn archive_deletes_no_branch_and_the_listing_shows_it(app: TestApp) {
    let (ws, task, source, worktree, branch) = task_with_worktree(&app, "archived", serde_json::json!({})).await;
    // Merged (no commits of its own) and still kept: archive never deletes a branch.
    let body = app
        .post(&format!("/api/v1/tasks/{task}/archive"), serde_json::json!({}))
        .await
        .ok(202);
    let job = wait_done(&app, &body["cleanup_jobs"][0]["id"]).await;
    assert_eq!(job["resource_snapshot"]["branches"], serde_json::json!([]), "{job}");
    assert!(!worktree.exists());
    assert!(branch_exists(&source, &branch), "archive keeps the branch");
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/branches")).await.ok(200);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["task_id"], task.to_string().as_str());
    assert_eq!(items[0]["merged"], true);
}
