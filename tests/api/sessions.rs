//! Task-owned environments and sessions (seed 001, seed 000): a task materializes its worktrees once,
//! every session attaches to that environment, and deleting a session never touches the workspace.
use std::path::{Path, PathBuf};

use berth::entity::task_session::SessionState;
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, branch_exists, git, id_of, uuid, wait_until, worktrees_of};

both_backends!(
    two_repositories_materialize_once_and_sessions_share_them,
    deleting_the_only_session_keeps_the_workspace_for_the_next,
    deleting_one_of_two_sessions_leaves_the_other_in_place,
    busy_sessions_cannot_be_deleted,
    deleted_primary_promotes_running_then_recent_then_any,
    primary_can_be_moved,
    local_executor_touches_nothing_on_disk,
    inherit_parent_subtasks_use_the_parents_environment,
    concurrent_first_sessions_materialize_exactly_once,
    failed_materialization_removes_only_its_own_worktrees_and_can_be_retried,
    a_branch_checked_out_elsewhere_fails_cleanly,
    bad_session_requests_create_nothing,
    cleanup_barrier_refuses_new_sessions,
    session_bound_token_reads_its_session_task_and_environment,
    a_live_materializer_makes_others_wait,
    an_abandoned_materialization_is_taken_over_and_its_worktree_adopted,
    incomplete_or_foreign_directories_are_not_adopted,
    compensation_spares_adopted_worktrees,
);

fn path_of(v: &Value) -> PathBuf {
    PathBuf::from(v.as_str().unwrap_or_else(|| panic!("not a path: {v}")))
}

async fn environment(app: &TestApp, task: Uuid) -> Value {
    app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200)
}

/// Everything a session delete must leave alone, for one worktree.
struct WorkspaceFacts {
    dir_exists: bool,
    registered: bool,
    branch: bool,
    marker: Option<String>,
}

fn facts(source: &Path, worktree: &Path, branch: &str) -> WorkspaceFacts {
    WorkspaceFacts {
        dir_exists: worktree.is_dir(),
        registered: worktrees_of(source).contains(&worktree.display().to_string()),
        branch: branch_exists(source, branch),
        marker: std::fs::read_to_string(worktree.join("MARKER.txt")).ok(),
    }
}

// I1, I14, I19: one environment, one worktree per slot, the task root as workspace for two repositories.
async fn two_repositories_materialize_once_and_sessions_share_them(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (api, api_path) = app.repository(ws, "api").await;
    let (web, web_path) = app.repository(ws, "web").await;
    let task = app.task(ws, "Add login", &[api, web]).await;
    let first = app.session(task, "worktree").await;
    assert_eq!(first["state"], "created");
    assert_eq!(first["is_primary"], true);
    let env = environment(&app, task).await;
    assert_eq!(env["status"], "ready");
    assert_eq!(env["executor_type"], "worktree");
    assert_eq!(env["task_id"], task.to_string());
    assert_eq!(first["task_environment_id"], env["id"]);
    let root = path_of(&env["workspace_path"]);
    assert!(
        root.starts_with(&app.config.worktree_root),
        "inside BERTH_WORKTREE_ROOT"
    );
    assert_eq!(
        first["workspace_path"], env["workspace_path"],
        "several repositories: the task root"
    );
    let repos = env["repos"].as_array().unwrap();
    assert_eq!(repos.len(), 2);
    for (row, (id, source, name)) in repos.iter().zip([(api, &api_path, "api"), (web, &web_path, "web")]) {
        assert_eq!(row["repository_id"], id.to_string());
        assert_eq!(row["status"], "active");
        let wt = path_of(&row["worktree_path"]);
        assert_eq!(wt, root.join(name));
        assert_eq!(wt.canonicalize().unwrap(), wt, "paths berth creates are canonical");
        assert!(row["worktree_id"].is_string());
        let branch = row["worktree_branch"].as_str().unwrap();
        assert!(branch.starts_with("berth/add-login-"), "{branch}");
        assert_eq!(git(&wt, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(), branch);
        assert_eq!(worktrees_of(source).len(), 2, "the source and exactly one worktree");
    }
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{task}")).await.ok(200)["primary_session_id"],
        first["id"]
    );

    // A second session attaches: same environment, same workspace, no git preparation.
    let second = app.session(task, "worktree").await;
    assert_eq!(second["task_environment_id"], env["id"]);
    assert_eq!(second["workspace_path"], first["workspace_path"]);
    assert_eq!(second["is_primary"], false);
    assert_eq!(
        environment(&app, task).await["updated_at"],
        env["updated_at"],
        "the environment was not touched"
    );
    assert_eq!(worktrees_of(&api_path).len(), 2);
    assert_eq!(worktrees_of(&web_path).len(), 2);
    assert_eq!(app.count("task_environments").await, 1);
    assert_eq!(app.count("task_environment_repos").await, 2);
    let types: Vec<String> = app.events().await.into_iter().map(|e| e.1).collect();
    assert_eq!(types.iter().filter(|t| *t == "environment.created").count(), 1);
    assert_eq!(types.iter().filter(|t| *t == "environment.ready").count(), 1);
    assert_eq!(types.iter().filter(|t| *t == "session.created").count(), 2);
    let task_view = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_eq!(task_view["session_count"], 2);
    let list = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200);
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
}

// Seed 001 scenarios 1 and 2; I2, I3: the only session goes, everything physical stays, and the next
// session sees the uncommitted marker.
async fn deleting_the_only_session_keeps_the_workspace_for_the_next(app: TestApp) {
    let f = app.task_with_repo("Fix bug").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    let session = f.session("worktree").await;
    let env_before = environment(&app, task).await;
    let worktree = path_of(&session["workspace_path"]);
    assert_eq!(
        worktree,
        path_of(&env_before["repos"][0]["worktree_path"]),
        "one repository: its worktree"
    );
    let branch = env_before["repos"][0]["worktree_branch"].as_str().unwrap().to_string();
    std::fs::write(worktree.join("MARKER.txt"), "uncommitted work\n").unwrap();
    let status_before = git(&worktree, &["status", "--porcelain"]);
    assert!(status_before.contains("MARKER.txt"));

    app.delete(&format!("/api/v1/sessions/{}", uuid(&session["id"])))
        .await
        .ok(204);

    app.get(&format!("/api/v1/sessions/{}", uuid(&session["id"])))
        .await
        .problem(404, "not_found");
    let task_view = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_eq!(task_view["session_count"], 0);
    assert!(task_view["primary_session_id"].is_null());
    assert_eq!(
        environment(&app, task).await,
        env_before,
        "the environment and its inventory are unchanged"
    );
    let after = facts(&source, &worktree, &branch);
    assert!(
        after.dir_exists && after.registered && after.branch,
        "directory, registration and branch remain"
    );
    assert_eq!(after.marker.as_deref(), Some("uncommitted work\n"));
    assert_eq!(git(&worktree, &["status", "--porcelain"]), status_before);
    assert_eq!(app.count("task_resource_cleanup_jobs").await, 0, "no cleanup job");
    assert_eq!(app.count("task_sessions").await, 0);

    // A replacement session reuses the workspace and sees the marker.
    let next = f.session("worktree").await;
    assert_eq!(next["task_environment_id"], env_before["id"]);
    assert_eq!(next["workspace_path"], session["workspace_path"]);
    assert_eq!(next["is_primary"], true);
    assert_eq!(
        std::fs::read_to_string(path_of(&next["workspace_path"]).join("MARKER.txt")).unwrap(),
        "uncommitted work\n"
    );
    assert_eq!(worktrees_of(&source).len(), 2, "no second worktree");
}

// Seed 001 scenario 3: one of two sessions goes; the other keeps the same directory, and becomes primary.
async fn deleting_one_of_two_sessions_leaves_the_other_in_place(app: TestApp) {
    let fixture = app.task_with_repo("Pair").await;
    let (source, task) = (fixture.repo_dir.clone(), fixture.task);
    let a = fixture.session("worktree").await;
    let b = fixture.session("worktree").await;
    let worktree = path_of(&a["workspace_path"]);
    std::fs::write(worktree.join("MARKER.txt"), "shared\n").unwrap();
    let env = environment(&app, task).await;
    let branch = env["repos"][0]["worktree_branch"].as_str().unwrap().to_string();

    app.delete(&format!("/api/v1/sessions/{}", uuid(&a["id"])))
        .await
        .ok(204);

    let b_after = app.get(&format!("/api/v1/sessions/{}", uuid(&b["id"]))).await.ok(200);
    assert_eq!(b_after["workspace_path"], a["workspace_path"]);
    assert_eq!(b_after["task_environment_id"], env["id"]);
    assert_eq!(
        b_after["is_primary"], true,
        "the deleted primary's role moved to the survivor"
    );
    let f = facts(&source, &worktree, &branch);
    assert!(f.dir_exists && f.registered && f.branch);
    assert_eq!(f.marker.as_deref(), Some("shared\n"));
    assert_eq!(app.count("task_resource_cleanup_jobs").await, 0);
    let types: Vec<String> = app.events().await.into_iter().map(|e| e.1).collect();
    assert!(types.contains(&"session.deleted".to_string()));
    assert!(types.contains(&"session.primary_changed".to_string()));
}

// I4: refused while starting, running, recovering or stopping; nothing is deleted.
async fn busy_sessions_cannot_be_deleted(app: TestApp) {
    let f = app.task_with_repo("Busy").await;
    let task = f.task;
    let s = uuid(&f.session("worktree").await["id"]);
    for state in [
        SessionState::Starting,
        SessionState::Running,
        SessionState::Recovering,
        SessionState::Stopping,
    ] {
        app.set_session_state(s, state, None).await;
        let r = app.delete(&format!("/api/v1/sessions/{s}")).await;
        let body = r.problem(409, "session_busy");
        assert_eq!(body["action"], "stop_session");
        assert_eq!(app.count("task_sessions").await, 1, "{state:?}: the session remains");
    }
    // Deleting needs `sessions:delete` and nothing else; other scopes do not grant it.
    let writer = app.token("sessions:write sessions:read tasks:delete tasks:archive");
    app.set_session_state(s, SessionState::Stopped, None).await;
    app.call(Method::DELETE, &format!("/api/v1/sessions/{s}"), Some(&writer), None)
        .await
        .problem(403, "insufficient_scope");
    let deleter = app.token("sessions:delete");
    app.call(Method::DELETE, &format!("/api/v1/sessions/{s}"), Some(&deleter), None)
        .await
        .ok(204);
    // sessions:delete grants nothing for the task.
    app.call(
        Method::PATCH,
        &format!("/api/v1/tasks/{task}"),
        Some(&deleter),
        Some(json!({"title": "x"})),
    )
    .await
    .problem(403, "insufficient_scope");
}

// I4: promotion prefers a running session, then the most recently active non-terminal one, then any.
async fn deleted_primary_promotes_running_then_recent_then_any(app: TestApp) {
    let f = app.task_with_repo("Promote").await;
    let task = f.task;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(uuid(&f.session("worktree").await["id"]));
    }
    let t0 = chrono::Utc::now();
    let ago = |mins: i64| Some(t0 - chrono::Duration::minutes(mins));
    // ids[0] primary. ids[1] stopped, the most recent. ids[2] idle. ids[3] running, the oldest.
    // ids[4] created, older than ids[2].
    app.set_session_state(ids[1], SessionState::Stopped, ago(1)).await;
    app.set_session_state(ids[2], SessionState::Idle, ago(5)).await;
    app.set_session_state(ids[3], SessionState::Running, ago(60)).await;
    app.set_session_state(ids[4], SessionState::Created, ago(10)).await;
    let primary = || async { app.get(&format!("/api/v1/tasks/{task}")).await.ok(200)["primary_session_id"].clone() };

    app.delete(&format!("/api/v1/sessions/{}", ids[0])).await.ok(204);
    assert_eq!(
        primary().await,
        json!(ids[3].to_string()),
        "a running one first, however old"
    );

    app.set_session_state(ids[3], SessionState::Stopped, ago(60)).await;
    app.delete(&format!("/api/v1/sessions/{}", ids[3])).await.ok(204);
    assert_eq!(
        primary().await,
        json!(ids[2].to_string()),
        "then the most recent non-terminal, not a more recent stopped one"
    );

    app.set_session_state(ids[4], SessionState::Failed, ago(10)).await;
    app.set_session_state(ids[2], SessionState::Stopped, ago(5)).await;
    app.delete(&format!("/api/v1/sessions/{}", ids[2])).await.ok(204);
    assert_eq!(
        primary().await,
        json!(ids[1].to_string()),
        "then any: the most recently active"
    );
}

async fn primary_can_be_moved(app: TestApp) {
    let f = app.task_with_repo("Primary").await;
    let task = f.task;
    let a = uuid(&f.session("worktree").await["id"]);
    let b = uuid(&f.session("worktree").await["id"]);
    let moved = app
        .post(&format!("/api/v1/sessions/{b}/primary"), json!({}))
        .await
        .ok(200);
    assert_eq!(moved["is_primary"], true);
    assert_eq!(
        app.get(&format!("/api/v1/sessions/{a}")).await.ok(200)["is_primary"],
        false
    );
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{task}")).await.ok(200)["primary_session_id"],
        b.to_string()
    );
    // Idempotent.
    app.post(&format!("/api/v1/sessions/{b}/primary"), json!({}))
        .await
        .ok(200);
    let changes = app
        .events()
        .await
        .into_iter()
        .filter(|e| e.1 == "session.primary_changed")
        .count();
    assert_eq!(changes, 1);
}

// The local executor runs in the registered repository: no worktree, nothing created or removed.
async fn local_executor_touches_nothing_on_disk(app: TestApp) {
    let f = app.task_with_repo("Local").await;
    let (ws, repo, source, task) = (f.workspace, f.repository, f.repo_dir.clone(), f.task);
    let before = (
        worktrees_of(&source),
        git(&source, &["status", "--porcelain"]),
        git(&source, &["branch", "--list"]),
    );
    let s = f.session("local").await;
    let env = environment(&app, task).await;
    assert_eq!(env["executor_type"], "local");
    assert_eq!(path_of(&env["workspace_path"]), source);
    assert_eq!(s["workspace_path"], env["workspace_path"]);
    assert!(env["repos"][0]["worktree_id"].is_null());
    assert!(
        env["repos"][0]["worktree_path"].is_null(),
        "no worktree: nothing berth could ever remove"
    );
    app.delete(&format!("/api/v1/sessions/{}", uuid(&s["id"])))
        .await
        .ok(204);
    let after = (
        worktrees_of(&source),
        git(&source, &["status", "--porcelain"]),
        git(&source, &["branch", "--list"]),
    );
    assert_eq!(before, after);
    assert_eq!(
        std::fs::read_dir(&app.config.worktree_root).unwrap().count(),
        0,
        "nothing under the worktree root"
    );
    // Several repositories have no one directory to run in: unsupported, with the action to take.
    let (other, _) = app.repository(ws, "other").await;
    let multi = app.task(ws, "Multi", &[repo, other]).await;
    let body = app
        .post(
            &format!("/api/v1/tasks/{multi}/sessions"),
            json!({"executor_type": "local"}),
        )
        .await
        .problem(409, "workspace_reuse_unsupported");
    assert_eq!(body["action"], "choose_executor");
    assert_eq!(body["retryable"], false);
    // A worktree session attaches to the current (local) environment; its launch would transition (I18).
    let attached = f
        .session_with(json!({"executor_type": "worktree", "start": false}))
        .await;
    assert_eq!(attached["task_environment_id"], env["id"]);
    assert_eq!(
        std::fs::read_dir(&app.config.worktree_root).unwrap().count(),
        0,
        "nothing materialized before a launch"
    );
}

// An inherit_parent subtask attaches to its parent's environment and never gets one of its own.
async fn inherit_parent_subtasks_use_the_parents_environment(app: TestApp) {
    let f = app.task_with_repo("Parent").await;
    let (ws, source, parent) = (f.workspace, f.repo_dir.clone(), f.task);
    let child = app.subtask(ws, parent, "Child").await;
    // The child's first session materializes the parent's environment, owned by the parent.
    let cs = app.session(child, "worktree").await;
    let env = environment(&app, parent).await;
    assert_eq!(env["task_id"], parent.to_string());
    assert_eq!(cs["task_environment_id"], env["id"]);
    assert_eq!(cs["task_id"], child.to_string());
    assert_eq!(
        environment(&app, child).await,
        env,
        "the child's environment is its parent's"
    );
    let ps = f.session("worktree").await;
    assert_eq!(ps["task_environment_id"], env["id"]);
    assert_eq!(ps["workspace_path"], cs["workspace_path"]);
    assert_eq!(ps["is_primary"], true, "primary is per task");
    assert_eq!(cs["is_primary"], true);
    assert_eq!(app.count("task_environments").await, 1);
    assert_eq!(worktrees_of(&source).len(), 2);
}

// I14: several first sessions race; exactly one materializes, the rest wait or attach; never two worktrees.
async fn concurrent_first_sessions_materialize_exactly_once(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (a, a_path) = app.repository(ws, "a").await;
    let (b, b_path) = app.repository(ws, "b").await;
    let task = app.task(ws, "Race", &[a, b]).await;
    let url = format!("/api/v1/tasks/{task}/sessions");
    let body = json!({"executor_type": "worktree"});
    let replies = futures_util::future::join_all((0..8).map(|_| app.post(&url, body.clone()))).await;
    let mut created = Vec::new();
    for r in &replies {
        match r.status.as_u16() {
            201 => created.push(r.json()),
            409 => {
                let p = r.problem(409, "workspace_preparing");
                assert_eq!(p["retryable"], true);
                assert_eq!(p["retry_after_ms"], 1000);
            }
            other => panic!("unexpected {other}: {}", r.text),
        }
    }
    assert!(!created.is_empty(), "the materializer got its session");
    let env = environment(&app, task).await;
    for s in &created {
        assert_eq!(s["task_environment_id"], env["id"]);
    }
    assert_eq!(app.count("task_environments").await, 1);
    assert_eq!(
        app.count("task_environment_repos").await,
        2,
        "a complete inventory, once"
    );
    assert_eq!(worktrees_of(&a_path).len(), 2, "never two worktrees for one slot");
    assert_eq!(worktrees_of(&b_path).len(), 2);
    assert_eq!(
        app.events().await.iter().filter(|e| e.1 == "environment.ready").count(),
        1
    );
    // Once ready, everyone attaches.
    app.post(&url, body).await.ok(201);
    assert_eq!(app.count("task_sessions").await as usize, created.len() + 1);
    let primaries = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200)["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["is_primary"] == true)
        .count();
    assert_eq!(primaries, 1);
}

// A repository that vanished mid-way: the environment is failed with the reason on that repository, the
// worktree this attempt made for the other repository is removed (and nothing else), and a later session
// retries into a fresh environment.
async fn failed_materialization_removes_only_its_own_worktrees_and_can_be_retried(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (a, a_path) = app.repository(ws, "a").await;
    let (b, b_path) = app.repository(ws, "b").await;
    // Someone's own worktree of `a`, outside berth: it must survive the compensation.
    let theirs = app.scratch.path().canonicalize().unwrap().join("their-wt");
    git(
        &a_path,
        &["worktree", "add", "-q", "-b", "theirs", theirs.to_str().unwrap()],
    );
    std::fs::write(theirs.join("keep.txt"), "mine").unwrap();
    let task = app.task(ws, "Vanish", &[a, b]).await;
    let hidden = b_path.with_file_name("b-moved-away");
    std::fs::rename(&b_path, &hidden).unwrap();

    let r = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree"}),
        )
        .await;
    let problem = r.problem(409, "conflict");
    crate::helpers::assert_no_path(&r, app.scratch.path());
    let failed_env = uuid(&problem["task_environment_id"]);
    let env = app.get(&format!("/api/v1/environments/{failed_env}")).await.ok(200);
    assert_eq!(env["status"], "failed");
    let rows = env["repos"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["repository_id"], b.to_string());
    assert_eq!(rows[0]["status"], "failed");
    assert!(
        rows[0]["error_message"].as_str().unwrap().contains("missing"),
        "{}",
        rows[0]
    );
    assert_eq!(
        worktrees_of(&a_path),
        vec![a_path.display().to_string(), theirs.display().to_string()],
        "only this attempt's worktree went"
    );
    assert_eq!(std::fs::read_to_string(theirs.join("keep.txt")).unwrap(), "mine");
    assert_eq!(app.count("task_sessions").await, 0);

    std::fs::rename(&hidden, &b_path).unwrap();
    let s = app.session(task, "worktree").await;
    let fresh = environment(&app, task).await;
    assert_ne!(fresh["id"], env["id"]);
    assert_eq!(fresh["status"], "ready");
    assert_eq!(s["task_environment_id"], fresh["id"]);
    assert_eq!(
        app.get(&format!("/api/v1/environments/{failed_env}")).await.ok(200)["status"],
        "superseded",
        "kept for diagnostics"
    );
    assert_eq!(worktrees_of(&a_path).len(), 3);
    assert_eq!(worktrees_of(&b_path).len(), 2);
}

// A branch git refuses (checked out in the source): a clear failure, nothing left on disk, source intact.
async fn a_branch_checked_out_elsewhere_fails_cleanly(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = id_of(
        &app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "Main", "repositories": [{"repository_id": repo, "branch": "main"}]}),
        )
        .await
        .ok(201),
    );
    let head = git(&source, &["rev-parse", "HEAD"]);
    let r = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree"}),
        )
        .await;
    let p = r.problem(409, "conflict");
    assert!(!r.text.contains("refs/heads") && !r.text.contains(&source.display().to_string()));
    assert!(!r.text.contains("main"), "the branch name does not leak: {}", r.text);
    let env = app
        .get(&format!("/api/v1/environments/{}", uuid(&p["task_environment_id"])))
        .await
        .ok(200);
    assert_eq!(env["status"], "failed");
    assert!(
        env["repos"][0]["error_message"]
            .as_str()
            .unwrap()
            .contains("worktree add")
    );
    assert_eq!(worktrees_of(&source), vec![source.display().to_string()]);
    assert_eq!(git(&source, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(&source, &["status", "--porcelain"]), "");
    let leftovers: Vec<_> = walk(&app.config.worktree_root);
    assert!(
        leftovers
            .iter()
            .all(|p| p.is_dir() && std::fs::read_dir(p).unwrap().count() == 0),
        "only an empty task dir may remain: {leftovers:?}"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

async fn bad_session_requests_create_nothing(app: TestApp) {
    let f = app.task_with_repo("Bad").await;
    let (ws, task) = (f.workspace, f.task);
    let bare = app.task(ws, "No repos", &[]).await;
    let url = format!("/api/v1/tasks/{task}/sessions");
    app.post(&url, json!({"executor_type": "docker"}))
        .await
        .problem(422, "validation_failed");
    app.post(&url, json!({})).await.problem(422, "validation_failed");
    app.post(&url, json!({"executor_type": "worktree", "agent_profile": "nope"}))
        .await
        .problem(422, "validation_failed");
    app.post(&url, json!({"executor_type": "worktree", "prompt": "do it"}))
        .await
        .problem(422, "validation_failed");
    app.post(&url, json!({"executor_type": "worktree", "colour": "red"}))
        .await
        .problem(400, "validation_failed");
    app.post(
        &format!("/api/v1/tasks/{bare}/sessions"),
        json!({"executor_type": "worktree"}),
    )
    .await
    .problem(422, "validation_failed");
    app.post(
        &format!("/api/v1/tasks/{}/sessions", Uuid::now_v7()),
        json!({"executor_type": "worktree"}),
    )
    .await
    .problem(404, "not_found");
    // An archived task accepts no session.
    {
        use berth::entity::task as t;
        use sea_orm::{ActiveValue::Set, EntityTrait};
        t::Entity::update(t::ActiveModel {
            id: Set(task.into()),
            archived_at: Set(Some(chrono::Utc::now())),
            ..Default::default()
        })
        .exec(app.db())
        .await
        .unwrap();
    }
    app.post(&url, json!({"executor_type": "worktree"}))
        .await
        .problem(409, "task_archived");
    assert_eq!(app.count("task_sessions").await, 0);
    assert_eq!(app.count("task_environments").await, 0);
    assert_eq!(
        std::fs::read_dir(&app.config.worktree_root).unwrap().count(),
        0,
        "nothing on disk"
    );
}

// I7: while a cleanup job holds the barrier, no session or environment is created.
async fn cleanup_barrier_refuses_new_sessions(app: TestApp) {
    use berth::entity::cleanup_job as job;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let f = app.task_with_repo("Barrier").await;
    let (ws, task) = (f.workspace, f.task);
    let now = chrono::Utc::now();
    job::Entity::insert(job::ActiveModel {
        id: Set(berth::ids::CleanupJobId::now_v7()),
        operation_id: Set(berth::ids::OperationId::now_v7()),
        task_id: Set(task.into()),
        workspace_id: Set(ws.into()),
        task_environment_id: Set(None),
        trigger: Set(job::CleanupTrigger::Archive),
        state: Set(job::CleanupJobState::Pending),
        attempts: Set(0),
        max_attempts: Set(8),
        next_attempt_at: Set(Some(now)),
        last_error: Set(None),
        resource_snapshot: Set(json!({})),
        // Another node's job: this server's workers must not run (and finish) it before the request.
        node_id: Set("elsewhere".into()),
        lease_owner: Set(None),
        lease_expires_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        completed_at: Set(None),
        actor_sub: Set(None),
        actor_session_id: Set(None),
    })
    .exec_without_returning(app.db())
    .await
    .unwrap();
    app.post(
        &format!("/api/v1/tasks/{task}/sessions"),
        json!({"executor_type": "worktree"}),
    )
    .await
    .problem(409, "task_cleanup_in_progress");
    assert_eq!(app.count("task_environments").await, 0);
    assert_eq!(app.count("task_sessions").await, 0);
    assert_eq!(std::fs::read_dir(&app.config.worktree_root).unwrap().count(), 0);
}

// I33: an agent's token acts on its session and reads its task and environment; nothing else.
async fn session_bound_token_reads_its_session_task_and_environment(app: TestApp) {
    let f = app.task_with_repo("Mine").await;
    let (ws, repo, task) = (f.workspace, f.repository, f.task);
    let other_task = app.task(ws, "Other", &[repo]).await;
    let mine = f.session("worktree").await;
    let sibling = f.session("worktree").await;
    let theirs = app.session(other_task, "worktree").await;
    let env = uuid(&mine["task_environment_id"]);
    let other_env = uuid(&theirs["task_environment_id"]);
    let token = app.token_for("sessions:read tasks:read sessions:write", None, Some(uuid(&mine["id"])));
    let t = Some(token.as_str());
    let app = &app;
    let get = |path: String| async move { app.call(Method::GET, &path, t, None).await };
    assert_eq!(
        get(format!("/api/v1/sessions/{}", uuid(&mine["id"]))).await.ok(200)["id"],
        mine["id"]
    );
    assert_eq!(
        get(format!("/api/v1/tasks/{task}")).await.ok(200)["id"],
        task.to_string()
    );
    assert_eq!(
        get(format!("/api/v1/environments/{env}")).await.ok(200)["id"],
        env.to_string()
    );
    get(format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    get(format!("/api/v1/sessions/{}", uuid(&sibling["id"])))
        .await
        .problem(404, "not_found");
    get(format!("/api/v1/sessions/{}", uuid(&theirs["id"])))
        .await
        .problem(404, "not_found");
    get(format!("/api/v1/tasks/{other_task}"))
        .await
        .problem(404, "not_found");
    get(format!("/api/v1/environments/{other_env}"))
        .await
        .problem(404, "not_found");
    get(format!("/api/v1/tasks/{task}/sessions"))
        .await
        .problem(403, "insufficient_scope");
    app.call(
        Method::POST,
        &format!("/api/v1/tasks/{task}/sessions"),
        t,
        Some(json!({"executor_type": "worktree"})),
    )
    .await
    .problem(403, "insufficient_scope");
    app.call(
        Method::POST,
        &format!("/api/v1/sessions/{}/primary", uuid(&sibling["id"])),
        t,
        Some(json!({})),
    )
    .await
    // Which session leads the task is never an agent's call, whichever session it names (so the answer
    // says nothing of the sibling's existence).
    .problem(403, "insufficient_scope");
}

async fn insert_creating(app: &TestApp, task: Uuid, updated_at: chrono::DateTime<chrono::Utc>) -> Uuid {
    use berth::entity::task_environment as env;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let id = Uuid::now_v7();
    env::Entity::insert(env::ActiveModel {
        id: Set(id.into()),
        task_id: Set(task.into()),
        executor_type: Set(env::ExecutorType::Worktree),
        status: Set(env::EnvironmentStatus::Creating),
        workspace_path: Set(None),
        node_id: Set(app.config.node_id.clone()),
        ownership_generation: Set(1),
        materializer_id: Set(Some(berth::ids::InstanceId::now_v7())),
        error_message: Set(None),
        created_at: Set(updated_at),
        updated_at: Set(updated_at),
        superseded_at: Set(None),
        row_version: Set(1),
        broken_category: Set(None),
        imported_from: Set(None),
    })
    .exec_without_returning(app.db())
    .await
    .unwrap();
    id
}

/// A first session, retried as clients do while another materializer prepares the workspace.
async fn session_retrying_while_preparing(app: &TestApp, task: Uuid) -> Value {
    let within = std::time::Duration::from_secs(20);
    wait_until("the workspace to be ready", within, || async {
        let r = app
            .post(
                &format!("/api/v1/tasks/{task}/sessions"),
                json!({"executor_type": "worktree", "start": false}),
            )
            .await;
        if r.status.as_u16() != 409 || r.json()["code"] != "workspace_preparing" {
            return Ok(r.ok(201));
        }
        Err(r.text)
    })
    .await
}

/// Where berth puts a task's worktree for a repository (the same function berth uses).
fn slot_dir(app: &TestApp, title: &str, task: Uuid, repo_name: &str) -> PathBuf {
    app.config
        .worktree_root
        .join(berth::executor::task_dir_name(title, task.into()))
        .join(repo_name)
}

// I14: while a materializer holds a fresh lease, every other first session is told to retry.
async fn a_live_materializer_makes_others_wait(app: TestApp) {
    let f = app.task_with_repo("Waiting").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    insert_creating(&app, task, chrono::Utc::now()).await;
    let url = format!("/api/v1/tasks/{task}/sessions");
    let replies =
        futures_util::future::join_all((0..4).map(|_| app.post(&url, json!({"executor_type": "worktree"})))).await;
    for r in replies {
        r.problem(409, "workspace_preparing");
    }
    assert_eq!(worktrees_of(&source).len(), 1, "nobody else created anything");
    assert_eq!(app.count("task_sessions").await, 0);
}

// A materializer that died (its lease expired) is taken over; the worktree it had already made is
// adopted, not duplicated or removed.
async fn an_abandoned_materialization_is_taken_over_and_its_worktree_adopted(app: TestApp) {
    let f = app.task_with_repo("Abandoned").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    // What the dead attempt had made: the slot's worktree on the task's branch, with a file in it. Made
    // before its stale row exists: the server's sweep may take the row over as soon as it is inserted.
    let dir = slot_dir(&app, "Abandoned", task, "svc");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let branch = format!("berth/{}", berth::executor::task_dir_name("Abandoned", task.into()));
    git(
        &source,
        &["worktree", "add", "-q", "-b", &branch, dir.to_str().unwrap(), "main"],
    );
    std::fs::write(dir.join("MARKER.txt"), "made before the crash").unwrap();
    let stale = insert_creating(&app, task, chrono::Utc::now() - chrono::Duration::hours(1)).await;

    // Whoever takes the stale row over, this request or the sweep, adopts the worktree; while the sweep
    // holds it, the request is told to retry.
    let s = session_retrying_while_preparing(&app, task).await;
    assert_eq!(path_of(&s["workspace_path"]), dir);
    assert_eq!(
        std::fs::read_to_string(dir.join("MARKER.txt")).unwrap(),
        "made before the crash"
    );
    assert_eq!(worktrees_of(&source).len(), 2, "adopted, not duplicated");
    assert_eq!(
        app.get(&format!("/api/v1/environments/{stale}")).await.ok(200)["status"],
        "superseded"
    );
}

// A directory in the slot's place that git did not finish (locked "initializing"), or that belongs to
// another repository, is never adopted, and never removed.
async fn incomplete_or_foreign_directories_are_not_adopted(app: TestApp) {
    let f = app.task_with_repo("Locked").await;
    let (ws, repo, source, task) = (f.workspace, f.repository, f.repo_dir.clone(), f.task);
    let dir = slot_dir(&app, "Locked", task, "svc");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let branch = format!("berth/{}", berth::executor::task_dir_name("Locked", task.into()));
    git(
        &source,
        &["worktree", "add", "-q", "-b", &branch, dir.to_str().unwrap(), "main"],
    );
    let id = git(&dir, &["rev-parse", "--git-dir"]);
    let admin = PathBuf::from(id.trim());
    std::fs::write(admin.join("locked"), "initializing").unwrap();
    std::fs::write(dir.join("MARKER.txt"), "keep").unwrap();
    let r = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree"}),
        )
        .await;
    let p = r.problem(409, "conflict");
    let env = app
        .get(&format!("/api/v1/environments/{}", uuid(&p["task_environment_id"])))
        .await
        .ok(200);
    assert!(
        env["repos"][0]["error_message"].as_str().unwrap().contains("locked"),
        "{env}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("MARKER.txt")).unwrap(),
        "keep",
        "never removed"
    );
    assert!(worktrees_of(&source).contains(&dir.display().to_string()));

    // A plain directory in the slot's place: refused, untouched.
    let other = app.task(ws, "Plain", &[repo]).await;
    let plain = slot_dir(&app, "Plain", other, "svc");
    std::fs::create_dir_all(&plain).unwrap();
    std::fs::write(plain.join("notes.txt"), "mine").unwrap();
    app.post(
        &format!("/api/v1/tasks/{other}/sessions"),
        json!({"executor_type": "worktree"}),
    )
    .await
    .problem(409, "conflict");
    assert_eq!(std::fs::read_to_string(plain.join("notes.txt")).unwrap(), "mine");
}

// Compensation removes only what the failing attempt created: a slot worktree it adopted stays.
async fn compensation_spares_adopted_worktrees(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (a, a_path) = app.repository(ws, "a").await;
    let (b, b_path) = app.repository(ws, "b").await;
    let task = app.task(ws, "Spare", &[a, b]).await;
    let dir = slot_dir(&app, "Spare", task, "a");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    let branch = format!("berth/{}", berth::executor::task_dir_name("Spare", task.into()));
    git(
        &a_path,
        &["worktree", "add", "-q", "-b", &branch, dir.to_str().unwrap(), "main"],
    );
    std::fs::write(dir.join("MARKER.txt"), "earlier work").unwrap();
    let hidden = b_path.with_file_name("b-away");
    std::fs::rename(&b_path, &hidden).unwrap();
    app.post(
        &format!("/api/v1/tasks/{task}/sessions"),
        json!({"executor_type": "worktree"}),
    )
    .await
    .problem(409, "conflict");
    assert_eq!(std::fs::read_to_string(dir.join("MARKER.txt")).unwrap(), "earlier work");
    assert!(
        worktrees_of(&a_path).contains(&dir.display().to_string()),
        "the adopted worktree was not removed"
    );
    std::fs::rename(&hidden, &b_path).unwrap();
    let s = app.session(task, "worktree").await;
    assert_eq!(
        std::fs::read_to_string(path_of(&s["workspace_path"]).join("a/MARKER.txt")).unwrap(),
        "earlier work"
    );
}
