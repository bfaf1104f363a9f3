//! Issue 40 item 2: a checkpoint per turn. The test agent writes a file in one turn and changes it in the
//! next: each turn is listed with a checkpoint at both ends, its diff is what that turn changed, taking
//! the checkpoints left the worktree's index, the stash and every branch as they were, and deleting the
//! task removes berth's checkpoint refs from the repository.
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_backends;
use crate::helpers::{TestApp, git, id_of};

both_backends!(each_turn_has_checkpoints_and_its_own_diff);

/// Waits until the session has `n` settled turns with their end checkpoint.
async fn wait_turns(app: &TestApp, session: uuid::Uuid, n: usize) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let t = app.get(&format!("/api/v1/sessions/{session}/turns")).await.ok(200);
        let items = t["items"].as_array().unwrap();
        if items.len() == n && items.iter().all(|i| !i["end_checkpoint_id"].is_null()) {
            return t;
        }
        assert!(tokio::time::Instant::now() < deadline, "never {n} settled turns: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a checkpoint must leave as it was: the worktree's index, the stash, every branch and tag.
fn kept(worktree: &Path) -> (Vec<u8>, String, String) {
    let git_dir = PathBuf::from(git(worktree, &["rev-parse", "--absolute-git-dir"]).trim());
    (
        std::fs::read(git_dir.join("index")).unwrap(),
        git(worktree, &["stash", "list"]),
        git(worktree, &["for-each-ref", "refs/heads", "refs/tags"]),
    )
}

async fn each_turn_has_checkpoints_and_its_own_diff(app: TestApp) {
    let ws = app.workspace("turns").await;
    let (repo, repo_path) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Turns", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = id_of(&s);
    let env = s["task_environment_id"].as_str().unwrap().to_string();
    let wt = PathBuf::from(s["workspace_path"].as_str().unwrap());
    crate::agents::wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let before = kept(&wt);

    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "write notes.txt one"}),
    )
    .await
    .ok(202);
    wait_turns(&app, id, 1).await;
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "write notes.txt two"}),
    )
    .await
    .ok(202);
    let turns = wait_turns(&app, id, 2).await;
    assert_eq!(std::fs::read_to_string(wt.join("notes.txt")).unwrap().trim(), "two");
    let items = turns["items"].as_array().unwrap();
    assert_eq!(items[0]["number"], 1);
    assert_eq!(items[0]["prompt"], "write notes.txt one");
    assert_eq!(items[1]["number"], 2);
    for t in items {
        assert!(
            t["start_checkpoint_id"].is_string() && t["settled_at"].is_string(),
            "{t}"
        );
        assert_eq!(t["files_changed"], 1, "{t}");
    }
    assert_eq!(
        kept(&wt),
        before,
        "the checkpoints left the index, the stash and the branches as they were"
    );

    // Each turn's diff is what that turn changed.
    let first = app.get(&format!("/api/v1/sessions/{id}/turns/1/diff")).await.ok(200);
    assert_eq!(first["scope"], "turn");
    let f = &first["repositories"][0]["files"][0];
    assert_eq!(
        (f["path"].as_str(), f["status"].as_str()),
        (Some("notes.txt"), Some("added")),
        "{first}"
    );
    assert!(f["patch"].as_str().unwrap().contains("+one"), "{f}");
    let second = app.get(&format!("/api/v1/sessions/{id}/turns/2/diff")).await.ok(200);
    let f = &second["repositories"][0]["files"][0];
    assert_eq!(f["status"], "modified", "{second}");
    let patch = f["patch"].as_str().unwrap();
    assert!(patch.contains("-one") && patch.contains("+two"), "{patch}");
    assert_eq!(second["total_files"], 1);
    app.get(&format!("/api/v1/sessions/{id}/turns/3/diff"))
        .await
        .problem(404, "not_found");

    // The checkpoints are kept alive by berth's own refs; the task's delete removes them.
    let prefix = format!("refs/berth/checkpoints/{env}/");
    let refs = git(&repo_path, &["for-each-ref", "--format=%(refname)", &prefix]);
    assert_eq!(refs.lines().count(), 4, "two turns, two ends each: {refs}");
    let jobs = app
        .call(
            reqwest::Method::DELETE,
            &format!("/api/v1/tasks/{task}?discard_worktree_changes=true"),
            Some(&app.admin),
            None,
        )
        .await
        .ok(202);
    let job = id_of(&jobs["cleanup_jobs"][0]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let j = app.get(&format!("/api/v1/cleanup-jobs/{job}")).await.ok(200);
        if j["state"] == "succeeded" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the delete's job never ran: {j}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refs = git(&repo_path, &["for-each-ref", "--format=%(refname)", &prefix]);
    assert!(
        refs.trim().is_empty(),
        "the checkpoint refs went with the environment: {refs}"
    );
    assert!(
        !git(&repo_path, &["for-each-ref", "--format=%(refname)", "refs/heads"])
            .trim()
            .is_empty(),
        "and nothing else"
    );
}
