//! Git mutations on one source repository never trip over each other: berth serializes its own per
//! repository and retries git's lock contention, so concurrent tasks on one repository are normal.
//! Creation racing deletion keeps I7 and I14: every create gets its worktree, every delete removes
//! exactly its own.
use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, git, id_of, uuid, wait_job, worktrees_of};

both_backends!(
    twenty_creates_and_twenty_deletes_on_one_repository_at_once,
    a_lock_held_by_another_process_is_waited_out,
);

const WAIT: Duration = Duration::from_secs(60);
const N: usize = 20;

async fn wait_succeeded(app: &TestApp, id: Uuid) {
    let j = wait_job(app, id, WAIT, &["succeeded", "failed"]).await;
    assert_eq!(j["state"], "succeeded", "{j}");
}

async fn twenty_creates_and_twenty_deletes_on_one_repository_at_once(app: TestApp) {
    // More git processes at once than the default cap of 4, so that overlapping mutations would meet
    // (with the old unserialized calls and repository-wide prune, most runs failed a create). Under this
    // load a delete's prepared job can outlive the tests' 1 s reconcile grace (a retryable 409 that is
    // not git's): give it room, as the default 60 s does.
    let backend = app.backend;
    drop(app);
    let settings = [
        ("BERTH_GIT_MAX_CONCURRENT", "16"),
        ("BERTH_CLEANUP_PREPARED_GRACE_SECS", "30"),
    ];
    let Some(app) = TestApp::spawn_with(backend, &settings).await else {
        return;
    };
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let mut doomed = Vec::new();
    for i in 0..N {
        let task = app.task(ws, &format!("old {i}"), &[repo]).await;
        let s = app.session(task, "worktree").await;
        doomed.push((task, PathBuf::from(s["workspace_path"].as_str().unwrap())));
    }
    let mut fresh = Vec::new();
    for i in 0..N {
        fresh.push(app.task(ws, &format!("new {i}"), &[repo]).await);
    }
    assert_eq!(worktrees_of(&source).len(), N + 1);

    let create_urls: Vec<String> = fresh.iter().map(|t| format!("/api/v1/tasks/{t}/sessions")).collect();
    let delete_urls: Vec<String> = doomed
        .iter()
        .map(|(t, _)| format!("/api/v1/tasks/{t}?discard_worktree_changes=true"))
        .collect();
    let creates = create_urls
        .iter()
        .map(|url| app.post(url, json!({"executor_type": "worktree", "start": false})));
    let deletes = delete_urls
        .iter()
        .map(|url| app.call(Method::DELETE, url, Some(&app.admin), None));
    let (created, deleted) = tokio::join!(
        futures_util::future::join_all(creates),
        futures_util::future::join_all(deletes)
    );
    let mut expected = vec![source.display().to_string()];
    for c in &created {
        expected.push(c.ok(201)["workspace_path"].as_str().unwrap().to_string());
    }
    for d in &deleted {
        wait_succeeded(&app, uuid(&d.ok(202)["cleanup_jobs"][0]["id"])).await;
    }
    for (_, worktree) in &doomed {
        assert!(!worktree.exists(), "a deleted task's worktree is gone");
    }
    let mut listed = worktrees_of(&source);
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected, "exactly the new tasks' worktrees are registered");
    for t in &fresh {
        let env = app.get(&format!("/api/v1/tasks/{t}/environment")).await.ok(200);
        assert_eq!(env["status"], "ready", "{env}");
    }
}

// Another process (the user's git, or a replica) holds the repository's ref lock for a while: berth
// waits it out with backoff instead of failing the create.
async fn a_lock_held_by_another_process_is_waited_out(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = id_of(
        &app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "locked", "repositories": [{"repository_id": repo, "branch": "feature/locked"}]}),
        )
        .await
        .ok(201),
    );
    // `git worktree add -b feature/locked` must create this lock file; git fails while it exists.
    let lock = source.join(".git/refs/heads/feature/locked.lock");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    std::fs::write(&lock, "").unwrap();
    let release = {
        let lock = lock.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            std::fs::remove_file(lock).unwrap();
        })
    };
    let s = app.session(task, "worktree").await;
    release.await.unwrap();
    let worktree = s["workspace_path"].as_str().unwrap();
    assert!(worktrees_of(&source).contains(&worktree.to_string()));
    assert_eq!(
        git(std::path::Path::new(worktree), &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "feature/locked"
    );
}
