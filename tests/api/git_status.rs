//! Current git status belongs to the environment (seed 004, I21-I25).
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, git, uuid, wait_until};

both_backends!(
    a_newer_sparse_observation_wins_over_an_older_detailed_one,
    a_completion_supersedes_live_and_earlier_completions,
    concurrent_live_reports_keep_one_live_row,
    deleting_a_session_keeps_the_status,
    refresh_reports_what_git_sees,
    a_finished_turn_is_captured_as_a_completion,
    observations_are_validated_and_scoped,
    a_refresh_of_a_missing_worktree_is_a_typed_409,
);

/// A task with one worktree and two sessions; returns (environment, repository, session a, session b).
async fn shared(app: &TestApp) -> (Uuid, Uuid, Uuid, Uuid) {
    let f = app.task_with_repo("Status").await;
    let repo = f.repository;
    let a = f.session("worktree").await;
    let b = f.session("worktree").await;
    (uuid(&a["task_environment_id"]), repo, uuid(&a["id"]), uuid(&b["id"]))
}

async fn report(app: &TestApp, env: Uuid, body: Value) -> crate::helpers::Reply {
    app.post(&format!("/api/v1/environments/{env}/git-status/observations"), body)
        .await
}

fn at(secs_ago: i64) -> String {
    (chrono::Utc::now() - chrono::Duration::seconds(secs_ago)).to_rfc3339()
}

// I22, the seed's reason for existing: an older detailed sibling capture never supplies files once a
// newer sparse observation exists.
async fn a_newer_sparse_observation_wins_over_an_older_detailed_one(app: TestApp) {
    let (env, repo, a, b) = shared(&app).await;
    report(
        &app,
        env,
        json!({"repository_id": repo, "kind": "completion", "observed_at": at(10), "session_id": a,
        "files": [{"path": "a.txt", "index_status": "unmodified", "worktree_status": "modified"}]}),
    )
    .await
    .ok(201);
    report(
        &app,
        env,
        json!({"repository_id": repo, "kind": "live", "observed_at": at(5), "session_id": b, "files": []}),
    )
    .await
    .ok(201);
    let current = app.get(&format!("/api/v1/environments/{env}/git-status")).await.ok(200);
    assert_eq!(current["items"].as_array().unwrap().len(), 1);
    assert_eq!(current["items"][0]["kind"], "live");
    assert_eq!(
        current["items"][0]["files"],
        json!([]),
        "the newer sparse observation is current"
    );
    // Both sessions see the same status: the identity is the environment's.
    for s in [a, b] {
        assert_eq!(
            app.get(&format!("/api/v1/sessions/{s}/git-status")).await.ok(200)["items"],
            current["items"]
        );
    }
    // An older report changes nothing and emits nothing.
    let events_before = app
        .events()
        .await
        .iter()
        .filter(|e| e.1 == "git_status.updated")
        .count();
    report(
        &app,
        env,
        json!({"repository_id": repo, "kind": "completion", "observed_at": at(30), "session_id": a,
        "files": [{"path": "old.txt", "index_status": "added", "worktree_status": "unmodified"}]}),
    )
    .await
    .ok(201);
    assert_eq!(
        app.get(&format!("/api/v1/environments/{env}/git-status")).await.ok(200)["items"],
        current["items"]
    );
    assert_eq!(
        app.events()
            .await
            .iter()
            .filter(|e| e.1 == "git_status.updated")
            .count(),
        events_before
    );
}

// I23.
async fn a_completion_supersedes_live_and_earlier_completions(app: TestApp) {
    let (env, repo, a, _) = shared(&app).await;
    report(
        &app,
        env,
        json!({"repository_id": repo, "kind": "completion", "observed_at": at(4), "session_id": a}),
    )
    .await
    .ok(201);
    report(
        &app,
        env,
        json!({"repository_id": repo, "kind": "live", "observed_at": at(3)}),
    )
    .await
    .ok(201);
    report(
        &app,
        env,
        json!({"repository_id": repo, "kind": "completion", "observed_at": at(2), "session_id": a, "branch": "x"}),
    )
    .await
    .ok(201);
    assert_eq!(
        app.count("git_status_observations").await,
        1,
        "earlier live and completion rows are gone"
    );
    let current = app.get(&format!("/api/v1/environments/{env}/git-status")).await.ok(200);
    assert_eq!(current["items"][0]["kind"], "completion");
    assert_eq!(current["items"][0]["branch"], "x");
}

// I23: exactly one live row per pair, whatever the interleaving of two sessions' reports.
async fn concurrent_live_reports_keep_one_live_row(app: TestApp) {
    let (env, repo, a, b) = shared(&app).await;
    let base = chrono::Utc::now() - chrono::Duration::seconds(60);
    let bodies: Vec<Value> = (0..20)
        .map(|i| {
            json!({"repository_id": repo, "kind": "live", "session_id": if i % 2 == 0 { a } else { b },
                "observed_at": (base + chrono::Duration::seconds(i)).to_rfc3339(), "ahead": i})
        })
        .collect();
    let url = format!("/api/v1/environments/{env}/git-status/observations");
    let replies = futures_util::future::join_all(bodies.into_iter().map(|b| app.post(&url, b))).await;
    for r in replies {
        r.ok(201);
    }
    assert_eq!(app.count("git_status_observations").await, 1);
    let current = app.get(&format!("/api/v1/environments/{env}/git-status")).await.ok(200);
    assert_eq!(
        current["items"][0]["ahead"], 19,
        "the newest live report is the one kept"
    );
}

// I21: the status survives its session; provenance becomes null.
async fn deleting_a_session_keeps_the_status(app: TestApp) {
    let (env, repo, a, _) = shared(&app).await;
    report(
        &app,
        env,
        json!({"repository_id": repo, "kind": "completion", "observed_at": at(1), "session_id": a, "branch": "kept"}),
    )
    .await
    .ok(201);
    app.delete(&format!("/api/v1/sessions/{a}")).await.ok(204);
    let current = app.get(&format!("/api/v1/environments/{env}/git-status")).await.ok(200);
    assert_eq!(current["items"][0]["branch"], "kept");
    assert!(current["items"][0]["session_id"].is_null());
}

// Refresh: gix sees untracked, staged, modified and deleted files (ignored ones not), and ahead/behind
// against a local upstream.
async fn refresh_reports_what_git_sees(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    std::fs::write(source.join("other.txt"), "other\n").unwrap();
    std::fs::write(source.join(".gitignore"), "*.log\n").unwrap();
    git(&source, &["add", "."]);
    git(&source, &["commit", "-q", "-m", "more"]);
    let task = app.task(ws, "Refresh", &[repo]).await;
    let s = app.session(task, "worktree").await;
    let env = uuid(&s["task_environment_id"]);
    let wt = std::path::PathBuf::from(s["workspace_path"].as_str().unwrap());
    git(&wt, &["branch", "--set-upstream-to=main"]);
    std::fs::write(wt.join("ahead.txt"), "1").unwrap();
    git(&wt, &["add", "ahead.txt"]);
    git(&wt, &["commit", "-q", "-m", "ahead"]);
    std::fs::write(source.join("behind.txt"), "1").unwrap();
    git(&source, &["add", "behind.txt"]);
    git(&source, &["commit", "-q", "-m", "behind"]);
    std::fs::write(wt.join("README.md"), "changed\n").unwrap();
    std::fs::remove_file(wt.join("other.txt")).unwrap();
    std::fs::write(wt.join("new.txt"), "new").unwrap();
    std::fs::write(wt.join("staged.txt"), "staged").unwrap();
    git(&wt, &["add", "staged.txt"]);
    std::fs::write(wt.join("noise.log"), "ignored").unwrap();
    let index_before = std::fs::read(git(&wt, &["rev-parse", "--git-dir"]).trim().to_string() + "/index").unwrap();

    let r = app
        .post(&format!("/api/v1/environments/{env}/git-status/refresh"), json!({}))
        .await
        .ok(200);
    let st = &r["items"][0];
    assert_eq!(st["kind"], "live");
    assert_eq!(st["repository_id"], repo.to_string());
    assert_eq!(st["task_environment_id"], env.to_string());
    assert!(st["branch"].as_str().unwrap().starts_with("berth/"));
    assert_eq!(st["head_commit"], git(&wt, &["rev-parse", "HEAD"]).trim());
    assert_eq!(st["upstream"], "main");
    assert_eq!((st["ahead"].as_i64(), st["behind"].as_i64()), (Some(1), Some(1)));
    let file = |p: &str| st["files"].as_array().unwrap().iter().find(|f| f["path"] == p).cloned();
    assert_eq!(file("README.md").unwrap()["worktree_status"], "modified");
    assert_eq!(file("other.txt").unwrap()["worktree_status"], "deleted");
    assert_eq!(file("new.txt").unwrap()["worktree_status"], "untracked");
    assert_eq!(file("staged.txt").unwrap()["index_status"], "added");
    assert!(file("noise.log").is_none(), "ignored files are not listed");
    let after = std::fs::read(git(&wt, &["rev-parse", "--git-dir"]).trim().to_string() + "/index").unwrap();
    assert_eq!(index_before, after, "inspection is read-only");
    // I24: the event carries the identity.
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let e = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["type"] == "git_status.updated")
        .unwrap()
        .clone();
    assert_eq!(e["task_environment_id"], env.to_string());
    assert_eq!(e["data"]["repository_id"], repo.to_string());
}

// Seed 004: when an agent finishes a turn, berth captures a completion observation itself.
async fn a_finished_turn_is_captured_as_a_completion(app: TestApp) {
    let fixture = app.task_with_repo("Turn").await;
    let s = fixture.agent_prompted("test", "write made.txt by agent").await;
    let env = uuid(&s["task_environment_id"]);
    let session_id = uuid(&s["id"]);
    // The capture itself, as stored: a completion with the session as provenance.
    let captured = wait_until("a completion capture", Duration::from_secs(20), || async {
        use berth::entity::git_status_observation as obs;
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        let found = obs::Entity::find()
            .filter(obs::Column::Kind.eq("completion"))
            .filter(obs::Column::SessionId.eq(session_id))
            .one(app.db())
            .await
            .unwrap();
        found.ok_or_else(|| "none".to_string())
    })
    .await;
    assert_eq!(captured.task_environment_id, env);
    let status = json!({"items": [{"files": captured.files}]});
    let files = status["items"][0]["files"].as_array().unwrap();
    assert!(
        files
            .iter()
            .any(|f| f["path"] == "made.txt" && f["worktree_status"] == "untracked"),
        "{status}"
    );
    app.post(&format!("/api/v1/sessions/{}/stop", uuid(&s["id"])), json!({}))
        .await
        .ok(200);
}

async fn observations_are_validated_and_scoped(app: TestApp) {
    let (env, repo, a, _) = shared(&app).await;
    let fixture = app.task_with_repo_in("ws2", "other", "Other").await;
    let repo2 = fixture.repository;
    let other = fixture.session("worktree").await;
    let env2 = uuid(&other["task_environment_id"]);
    let ok = |extra: Value| {
        let mut b = json!({"repository_id": repo, "kind": "live", "observed_at": at(1)});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    report(&app, env, ok(json!({"repository_id": repo2})))
        .await
        .problem(422, "validation_failed");
    report(
        &app,
        env,
        ok(json!({"observed_at": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339()})),
    )
    .await
    .problem(422, "validation_failed");
    report(&app, env, ok(json!({"kind": "archive"})))
        .await
        .problem(422, "validation_failed");
    report(&app, env, ok(json!({"session_id": uuid(&other["id"])})))
        .await
        .problem(422, "validation_failed");
    let many: Vec<Value> = (0..2001)
        .map(|i| json!({"path": format!("f{i}"), "index_status": "added", "worktree_status": "unmodified"}))
        .collect();
    report(&app, env, ok(json!({"files": many})))
        .await
        .problem(422, "validation_failed");
    assert_eq!(app.count("git_status_observations").await, 0, "nothing stored");
    // An agent's token reports for its own environment only.
    let agent = app.token_for("sessions:write tasks:read", None, Some(a));
    let url = |e: Uuid| format!("/api/v1/environments/{e}/git-status/observations");
    app.call(
        Method::POST,
        &url(env2),
        Some(&agent),
        Some(json!({"repository_id": repo2, "kind": "live", "observed_at": at(1)})),
    )
    .await
    .problem(404, "not_found");
    app.call(
        Method::POST,
        &url(env),
        Some(&agent),
        Some(ok(json!({"session_id": a}))),
    )
    .await
    .ok(201);
}

// A refresh on a worktree that is gone (or no longer a git worktree) answers a typed 409 that says to
// reset the environment, never a 500, and the environment says so too: `broken` with the category, one
// `environment.broken`, its git status stale (never `ready` over a worktree that is not there). What was
// observed before stays readable, the source repository is untouched.
async fn a_refresh_of_a_missing_worktree_is_a_typed_409(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    for (name, category) in [("Unlinked", "not_a_git_worktree"), ("Gone", "workspace_missing")] {
        let task = app.task(ws, name, &[repo]).await;
        let s = app.session(task, "worktree").await;
        let env = uuid(&s["task_environment_id"]);
        let wt = std::path::PathBuf::from(s["workspace_path"].as_str().unwrap());
        let refresh = format!("/api/v1/environments/{env}/git-status/refresh");
        app.post(&refresh, json!({})).await.ok(200);
        if category == "not_a_git_worktree" {
            // Its `.git` file is gone, the directory is still there.
            std::fs::remove_file(wt.join(".git")).unwrap();
        } else {
            std::fs::remove_dir_all(&wt).unwrap();
        }
        let p = app
            .post(&refresh, json!({}))
            .await
            .problem(409, "workspace_reuse_unsafe");
        assert_eq!(p["category"], category);
        assert_eq!(p["action"], "reset_environment");
        crate::helpers::assert_no_path(&app.post(&refresh, json!({})).await, &wt);

        let e = app.get(&format!("/api/v1/environments/{env}")).await.ok(200);
        assert_eq!(e["status"], "broken", "{e}");
        assert_eq!(e["broken_category"], category);
        let broken = app
            .get(&format!("/api/v1/events?task_id={task}&types=environment.broken"))
            .await
            .ok(200);
        assert_eq!(broken["events"].as_array().unwrap().len(), 1, "{broken}");
        let current = app.get(&format!("/api/v1/environments/{env}/git-status")).await.ok(200);
        assert_eq!(current["stale"], true, "{current}");
        assert_eq!(
            current["items"].as_array().unwrap().len(),
            1,
            "the last observation stays readable"
        );
    }
    assert!(source.join(".git").is_dir(), "the source repository is untouched");
    assert_eq!(git(&source, &["status", "--porcelain"]).trim(), "");
}
