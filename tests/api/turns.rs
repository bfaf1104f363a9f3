//! A checkpoint per turn. The test agent writes a file in one turn and changes it in the next: each turn
//! is listed with a checkpoint at both ends, its diff is what that turn changed, taking the checkpoints
//! left the worktree's index, the stash and every branch as they were, and deleting the task removes
//! berth's checkpoint refs from the repository.
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_backends;
use crate::fixture::StartedSession;
use crate::helpers::{TestApp, git, id_of, seen_json, wait_job, wait_until};

both_backends!(
    each_turn_has_checkpoints_and_its_own_diff,
    the_real_pi_writes_a_file_and_its_turn_shows_it
);

/// Waits until the session has `n` settled turns with their end checkpoint.
pub(crate) async fn wait_turns(app: &TestApp, session: uuid::Uuid, n: usize) -> Value {
    wait_until(&format!("{n} settled turns"), Duration::from_secs(60), || async {
        let t = app.get(&format!("/api/v1/sessions/{session}/turns")).await.ok(200);
        let items = t["items"].as_array().unwrap();
        let settled = items.len() == n && items.iter().all(|i| !i["end_checkpoint_id"].is_null());
        seen_json(settled, t)
    })
    .await
}

/// What a checkpoint must leave as it was: the worktree's index, the stash, every branch and tag.
pub(crate) fn kept(worktree: &Path) -> (Vec<u8>, String, String) {
    let git_dir = PathBuf::from(git(worktree, &["rev-parse", "--absolute-git-dir"]).trim());
    (
        std::fs::read(git_dir.join("index")).unwrap(),
        git(worktree, &["stash", "list"]),
        git(worktree, &["for-each-ref", "refs/heads", "refs/tags"]),
    )
}

async fn each_turn_has_checkpoints_and_its_own_diff(app: TestApp) {
    let fixture = app.task_with_repo_in("turns", "svc", "Turns").await;
    let (repo_path, task) = (fixture.repo_dir.clone(), fixture.task);
    let StartedSession { id, created: s, .. } = fixture.started_session("test").await;
    let env = s["task_environment_id"].as_str().unwrap().to_string();
    let wt = PathBuf::from(s["workspace_path"].as_str().unwrap());
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

    // Restore: to before the first turn (no notes.txt); refused without consent once the worktree has
    // changed since the last checkpoint; with it, the file goes and so does the change.
    let first_start = items[0]["start_checkpoint_id"].as_str().unwrap().to_string();
    let first_end = items[0]["end_checkpoint_id"].as_str().unwrap().to_string();
    std::fs::write(wt.join("scratch.txt"), "mine\n").unwrap();
    // An ignored file is no checkpoint's business: a restore leaves it alone.
    std::fs::write(repo_path.join(".git/info/exclude"), "build/\n").unwrap();
    std::fs::create_dir_all(wt.join("build")).unwrap();
    std::fs::write(wt.join("build/out.bin"), b"\x00built\xff").unwrap();
    let restore =
        |checkpoint: &str, consent: bool| json!({"checkpoint_id": checkpoint, "discard_worktree_changes": consent});
    app.post(
        &format!("/api/v1/environments/{env}/restore"),
        restore(&first_start, false),
    )
    .await
    .problem(409, "conflict");
    assert!(wt.join("scratch.txt").exists(), "refused, nothing changed");
    app.post(
        &format!("/api/v1/environments/{env}/restore"),
        restore(&uuid::Uuid::now_v7().to_string(), true),
    )
    .await
    .problem(422, "validation_failed");
    let restored = app
        .post(
            &format!("/api/v1/environments/{env}/restore"),
            restore(&first_start, true),
        )
        .await
        .ok(200);
    assert!(restored["new_checkpoint_id"].is_string());
    assert!(
        !wt.join("notes.txt").exists() && !wt.join("scratch.txt").exists(),
        "back to before turn 1"
    );
    assert!(wt.join("README.md").exists());
    assert_eq!(
        std::fs::read(wt.join("build/out.bin")).unwrap(),
        b"\x00built\xff",
        "the ignored file is left alone"
    );
    // No change since that restore: the next one needs no consent.
    app.post(
        &format!("/api/v1/environments/{env}/restore"),
        restore(&first_end, false),
    )
    .await
    .ok(200);
    assert_eq!(
        std::fs::read_to_string(wt.join("notes.txt")).unwrap().trim(),
        "one",
        "as turn 1 left it"
    );
    assert_eq!(
        kept(&wt),
        before,
        "restores leave the index, the stash and the branches as they were"
    );
    let events = app.get("/api/v1/events?types=environment.restored").await.ok(200);
    assert_eq!(events["events"].as_array().unwrap().len(), 2, "{events}");
    // Refused while the agent works.
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "hang"}))
        .await
        .ok(202);
    crate::agents::wait_session(&app, id, "running", |s| s["state"] == "running").await;
    app.post(
        &format!("/api/v1/environments/{env}/restore"),
        restore(&first_start, true),
    )
    .await
    .problem(409, "session_busy");
    app.post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .ok(200);
    crate::agents::wait_session(&app, id, "idle", |s| s["state"] == "idle").await;

    // The checkpoints are kept alive by berth's own refs; the task's delete removes them.
    let prefix = format!("refs/berth/checkpoints/{env}/");
    let refs = git(&repo_path, &["for-each-ref", "--format=%(refname)", &prefix]);
    assert!(
        refs.lines().count() >= 6,
        "two turns, two ends each, and one per restore: {refs}"
    );
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
    wait_job(&app, job, Duration::from_secs(60), &["succeeded"]).await;
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

/// The real Pi, writing a file with its own `write` tool (the suite's model server asks it to): the turn
/// is recorded with both checkpoints, its diff and the environment's show the file, and the worktree's
/// index, the stash and the branches are as they were.
async fn the_real_pi_writes_a_file_and_its_turn_shows_it(app: TestApp) {
    let Some((app, pi)) = crate::pi::with_pi(app, &[]).await else {
        return;
    };
    let s = crate::pi::pi_session(&app).await;
    let id = crate::pi::uuid(&s["id"]);
    let wt = PathBuf::from(s["workspace_path"].as_str().unwrap());
    let before = kept(&wt);
    let ask = "Write the notes file, please.";
    pi.model.reply_to(
        ask,
        crate::model_server::Reply::tool_write(&wt.join("notes.txt").display().to_string(), "from pi\n")
            .then(crate::model_server::Reply::text("I wrote it.")),
    );
    crate::pi::say(&app, id, ask, None).await;
    let turns = wait_turns(&app, id, 1).await;
    assert_eq!(std::fs::read_to_string(wt.join("notes.txt")).unwrap(), "from pi\n");
    let t = &turns["items"][0];
    assert_eq!(
        (t["prompt"].as_str(), t["files_changed"].as_i64()),
        (Some(ask), Some(1)),
        "{t}"
    );
    let diff = app.get(&format!("/api/v1/sessions/{id}/turns/1/diff")).await.ok(200);
    let f = &diff["repositories"][0]["files"][0];
    assert_eq!(
        (f["path"].as_str(), f["status"].as_str()),
        (Some("notes.txt"), Some("added")),
        "{diff}"
    );
    assert!(f["patch"].as_str().unwrap().contains("+from pi"), "{f}");
    let all = app.get(&format!("/api/v1/sessions/{id}/diff")).await.ok(200);
    assert_eq!(all["repositories"][0]["files"][0]["path"], "notes.txt", "{all}");
    assert_eq!(
        kept(&wt),
        before,
        "the index, the stash and the branches are as they were"
    );
}
