//! `Prefer: respond-async` on session creation answers `202` with the session `preparing`; the task's
//! environment is then materialized in the background, reporting `environment.progress` per repository
//! (fetching, creating_worktree, ready), and the session goes on as a synchronous create would:
//! `created`, launched when `start`, or `failed` with `last_error`.
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{uuid, wait_session};
use crate::both_backends;
use crate::helpers::{Reply, TestApp, worktrees_of};
use crate::inbox::wait_replies;

both_backends!(
    an_async_create_answers_at_once_then_reports_progress_per_repository,
    an_async_create_with_start_launches_and_delivers_the_prompt,
    a_failing_materialization_fails_the_session_with_its_reason,
    the_synchronous_create_reports_progress_too,
    a_preparing_session_left_by_a_stopped_process_is_resumed,
    without_the_preference_the_create_is_synchronous,
    an_async_create_is_refused_at_once_for_an_archived_task,
    a_retried_async_create_returns_the_same_session,
    a_launch_while_preparing_is_refused_and_changes_nothing,
);

async fn create_async(app: &TestApp, task: Uuid, body: Value) -> Reply {
    app.call_with(
        Method::POST,
        &format!("/api/v1/tasks/{task}/sessions"),
        Some(&app.admin),
        Some(body),
        &[("Prefer", "respond-async")],
    )
    .await
}

async fn events(app: &TestApp) -> Vec<Value> {
    app.get("/api/v1/events?after=0&limit=1000").await.ok(200)["events"]
        .as_array()
        .unwrap()
        .clone()
}

/// The stages reported for one repository, in sequence order.
fn stages(events: &[Value], repository: Uuid) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "environment.progress" && e["data"]["repository_id"] == repository.to_string())
        .map(|e| e["data"]["stage"].as_str().unwrap().to_string())
        .collect()
}

fn seq_of(events: &[Value], pred: impl Fn(&Value) -> bool) -> i64 {
    events
        .iter()
        .find(|e| pred(e))
        .map(|e| e["seq"].as_i64().unwrap())
        .expect("the event is there")
}

async fn an_async_create_answers_at_once_then_reports_progress_per_repository(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (api, api_path) = app.repository(ws, "api").await;
    let (web, _) = app.repository(ws, "web").await;
    let task = app.task(ws, "Async", &[api, web]).await;
    let r = create_async(&app, task, json!({"executor_type": "worktree", "start": false})).await;
    let s = r.ok(202);
    assert_eq!(s["state"], "preparing");
    assert_eq!(r.header("preference-applied").as_deref(), Some("respond-async"));
    let id = uuid(&s["id"]);
    assert_eq!(r.header("location"), Some(format!("/api/v1/sessions/{id}")));
    let ready = wait_session(&app, id, "created", |s| s["state"] == "created").await;
    assert!(ready["task_environment_id"].is_string(), "{ready}");
    let all = events(&app).await;
    for repo in [api, web] {
        assert_eq!(
            stages(&all, repo),
            ["fetching", "creating_worktree", "ready"],
            "per repository, in order"
        );
    }
    // The repositories in workspace order, and the session moves on only after both are ready.
    let last_ready = all
        .iter()
        .filter(|e| e["type"] == "environment.progress" && e["data"]["stage"] == "ready")
        .map(|e| e["seq"].as_i64().unwrap())
        .max()
        .unwrap();
    let created = seq_of(&all, |e| {
        e["type"] == "session.state_changed" && e["session_id"] == id.to_string() && e["data"]["state"] == "created"
    });
    let session_created = seq_of(&all, |e| {
        e["type"] == "session.created" && e["session_id"] == id.to_string()
    });
    assert!(
        session_created < last_ready && last_ready < created,
        "{session_created} < {last_ready} < {created}"
    );
    assert_eq!(worktrees_of(&api_path).len(), 2);
    assert_eq!(app.count("task_sessions").await, 1);
}

async fn an_async_create_with_start_launches_and_delivers_the_prompt(app: TestApp) {
    let f = app.task_with_repo("Async start").await;
    let task = f.task;
    let r = create_async(
        &app,
        task,
        json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "hello"}),
    )
    .await;
    let s = r.ok(202);
    assert_eq!(s["state"], "preparing");
    assert_eq!(s["desired_open"], true);
    let id = uuid(&s["id"]);
    wait_session(&app, id, "launched", |s| {
        s["state"] == "idle" || s["state"] == "running"
    })
    .await;
    assert_eq!(wait_replies(&app, id, 1).await, ["hello"], "the first prompt, once");
}

async fn a_failing_materialization_fails_the_session_with_its_reason(app: TestApp) {
    let f = app.task_with_repo("Doomed").await;
    let (repo, repo_path, task) = (f.repository, f.repo_dir.clone(), f.task);
    // The source repository is gone: its branch cannot be created.
    std::fs::rename(&repo_path, repo_path.with_file_name("svc-gone")).unwrap();
    let s = create_async(&app, task, json!({"executor_type": "worktree", "start": false}))
        .await
        .ok(202);
    let id = uuid(&s["id"]);
    let failed = wait_session(&app, id, "failed", |s| s["state"] == "failed").await;
    let error = failed["last_error"].to_string();
    assert!(error.contains("materialization_failed"), "{failed}");
    assert!(error.contains("svc"), "names the repository: {failed}");
    assert!(!error.contains(&repo_path.display().to_string()), "no path: {failed}");
    let all = events(&app).await;
    assert_eq!(stages(&all, repo), ["fetching"], "no further stage");
    assert!(all.iter().any(|e| e["type"] == "environment.failed"));
}

async fn the_synchronous_create_reports_progress_too(app: TestApp) {
    let f = app.task_with_repo("Sync").await;
    let repo = f.repository;
    f.session("worktree").await;
    assert_eq!(
        stages(&events(&app).await, repo),
        ["fetching", "creating_worktree", "ready"]
    );
}

/// Puts the session back in `preparing` without an environment, as a process that stopped right after
/// recording it would leave it.
async fn back_to_preparing(app: &TestApp, id: Uuid) {
    use berth::entity::task_session as s;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    s::Entity::update(s::ActiveModel {
        id: Set(id.into()),
        state: Set(s::SessionState::Preparing),
        task_environment_id: Set(None),
        ..Default::default()
    })
    .exec(app.db())
    .await
    .unwrap();
}

/// A restart while `preparing` resumes the preparation (`resume_preparing` runs at startup).
async fn a_preparing_session_left_by_a_stopped_process_is_resumed(app: TestApp) {
    let f = app.task_with_repo("Resume").await;
    let created = f.session("worktree").await;
    let id = uuid(&created["id"]);
    // As a process that stopped right after recording the session would leave it.
    back_to_preparing(&app, id).await;
    let resumed = berth::domain::sessions::resume_preparing(&app.app_state.ctx)
        .await
        .unwrap();
    assert_eq!(resumed, 1);
    let s = wait_session(&app, id, "created", |s| s["state"] == "created").await;
    assert_eq!(
        s["task_environment_id"], created["task_environment_id"],
        "the same environment"
    );
}

async fn without_the_preference_the_create_is_synchronous(app: TestApp) {
    let f = app.task_with_repo("Plain").await;
    let task = f.task;
    let r = app
        .call_with(
            Method::POST,
            &format!("/api/v1/tasks/{task}/sessions"),
            Some(&app.admin),
            Some(json!({"executor_type": "worktree", "start": false})),
            &[("Prefer", "return=minimal")],
        )
        .await;
    assert_eq!(r.ok(201)["state"], "created");
    assert_eq!(r.header("preference-applied"), None);
}

/// The rules of a synchronous create hold before anything is recorded: an archived task (or one under a
/// cleanup barrier, I7) refuses at once and no session row is written.
async fn an_async_create_is_refused_at_once_for_an_archived_task(app: TestApp) {
    let f = app.task_with_repo("Archived").await;
    let task = f.task;
    let archive = app.post(&format!("/api/v1/tasks/{task}/archive"), json!({})).await;
    assert!(archive.status.is_success(), "{}", archive.text);
    create_async(&app, task, json!({"executor_type": "worktree", "start": false}))
        .await
        .problem(409, "task_archived");
    assert_eq!(app.count("task_sessions").await, 0);
}

async fn a_retried_async_create_returns_the_same_session(app: TestApp) {
    let f = app.task_with_repo("Retried").await;
    let (repo_path, task) = (f.repo_dir.clone(), f.task);
    let path = format!("/api/v1/tasks/{task}/sessions");
    let send = || {
        app.call_with(
            Method::POST,
            &path,
            Some(&app.admin),
            Some(json!({"executor_type": "worktree", "start": false})),
            &[("Prefer", "respond-async"), ("Idempotency-Key", "async-1")],
        )
    };
    let first = send().await;
    let id = uuid(&first.ok(202)["id"]);
    wait_session(&app, id, "created", |s| s["state"] == "created").await;
    let again = send().await;
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(again.text, first.text, "the first answer, as given");
    assert_eq!(app.count("task_sessions").await, 1);
    assert_eq!(worktrees_of(&repo_path).len(), 2);
}

async fn a_launch_while_preparing_is_refused_and_changes_nothing(app: TestApp) {
    let f = app.task_with_repo("Early").await;
    let id = uuid(&f.session("worktree").await["id"]);
    back_to_preparing(&app, id).await;
    let r = app.post(&format!("/api/v1/sessions/{id}/launch"), json!({})).await;
    let p = r.problem(409, "workspace_preparing");
    assert_eq!(p["retryable"], true);
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(s["state"], "preparing", "not failed by the early launch: {s}");
}
