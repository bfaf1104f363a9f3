//! Beyond the seed's scenarios: a normalized file, a mixed one imported twice, failure injection at every
//! step, a launch in an adopted worktree, a write-locked source, and dry runs.
use std::time::Duration;

use berth::entity::{git_status_observation as obs, repository, session_message, task_session as session};
use reqwest::Method;
use sea_orm::sqlx::{Connection, Executor};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;

use super::fixture::*;
use super::{env_of, has, inventory, kandev_with_task, only_owner, p, session_of, succeeded, task_of};
use crate::agents::wait_session;
use crate::helpers::{TestApp, id_of, worktrees_of};

/// A normalized file with two sessions, a transcript and git status.
async fn normalized(app: &TestApp) -> (World, KandevDb, std::path::PathBuf) {
    let w = World::new(app);
    let wt = w.worktree("t1", "feature/a");
    let mut k = kandev_with_task(&w, Gen::Normalized).await;
    k.task_repo("t1", "r1").await;
    k.env("e1", "t1", T2, None).await;
    k.env_repo("er1", "e1", "r1", "", "wt-1", &wt, "feature/a", "active")
        .await;
    k.session("s1", "t1", "COMPLETED", "e1", T2).await;
    k.session("s2", "t1", "IDLE", "e1", T3).await;
    k.message("m1", "s1", "user", "message", "hello", T1).await;
    k.message("m2", "s1", "agent", "message", "hi there", T2).await;
    k.message("m3", "s1", "agent", "tool_call", "ls", T2).await;
    k.snapshot("g-old", "s1", "feature/a", r#"{"old.rs":{"status":"modified"}}"#, T1)
        .await;
    k.snapshot(
        "g-new",
        "s1",
        "feature/a",
        r#"{"src/a.rs":{"status":"modified","staged":true}}"#,
        T3,
    )
    .await;
    let db = k.finish().await;
    (w, db, wt)
}

pub(crate) async fn a_normalized_file_imports_sessions_transcripts_and_git_status(app: TestApp) {
    let (_w, db, wt) = normalized(&app).await;
    let kandev_before = db.contents().await;
    let run = import(&app, &db, "ws", &[], &[]).await;
    succeeded(&run);
    assert!(
        db.contents().await == kandev_before,
        "kandev's database is never written"
    );
    assert_eq!(run.report["generation"], "normalized");
    assert_eq!(
        run.report["imported"],
        json!({"tasks": 1, "environments": 1, "worktrees": 1, "sessions": 2, "observations": 1})
    );
    assert_eq!(run.report["already_imported"], false);
    let e = env_of(&app, "e1").await.unwrap();
    let rows = inventory(&app).await;
    assert_eq!(only_owner(&rows, e.id.into()).worktree_path, p(&wt));
    let (s1, s2) = (session_of(&app, "s1").await, session_of(&app, "s2").await);
    assert_eq!(
        (s1.state, s2.state),
        (session::SessionState::Stopped, session::SessionState::Stopped)
    );
    assert!(
        s2.is_primary && !s1.is_primary,
        "the newest session is the task's one primary"
    );
    // The transcript: the conversation, not the agent's tool calls.
    let msgs = session_message::Entity::find()
        .filter(session_message::Column::SessionId.eq(s1.id))
        .all(app.db())
        .await
        .unwrap();
    let roles: Vec<_> = msgs.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        vec![
            session_message::MessageRole::User,
            session_message::MessageRole::Assistant
        ]
    );
    assert_eq!(msgs[0].content["text"], "hello");
    // Current git status re-keyed through the session's environment; the newest observation only (I22).
    let status = app
        .get(&format!("/api/v1/environments/{}/git-status", e.id))
        .await
        .ok(200);
    let items = status["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{status}");
    assert_eq!(items[0]["branch"], "feature/a");
    assert_eq!(items[0]["session_id"], s1.id.to_string());
    assert_eq!(
        items[0]["files"],
        json!([{"path": "src/a.rs", "index_status": "modified", "worktree_status": "unmodified"}])
    );
    let observed = obs::Entity::find().all(app.db()).await.unwrap();
    assert_eq!(observed[0].imported_from.as_deref(), Some("g-new"));
    // The task reads through the API like any other.
    let t = task_of(&app, "t1").await;
    let view = app.get(&format!("/api/v1/tasks/{}", t.id)).await.ok(200);
    assert_eq!(view["session_count"], 2);
    assert_eq!(view["primary_session_id"], s2.id.to_string());
}

pub(crate) async fn a_mixed_file_imports_everything_once(app: TestApp) {
    let w = World::new(&app);
    let (c1, f1, s1) = (
        w.worktree("c", "feature/c"),
        w.worktree("f", "feature/f"),
        w.worktree("s", "feature/s"),
    );
    let mut k = w.kandev(Gen::Legacy).await;
    k.repo("r1", "proj", &w.repo).await;
    k.repo("r-gone", "gone", std::path::Path::new("/nonexistent/kandev/gone"))
        .await;
    k.task("t-canon", "Canonical").await;
    k.env("e-c", "t-canon", T2, None).await;
    k.env_repo("er-c", "e-c", "r1", "", "wt-c", &c1, "feature/c", "active")
        .await;
    k.session("sc", "t-canon", "COMPLETED", "e-c", T2).await;
    k.task("t-flat", "Flat").await;
    k.env("e-f", "t-flat", T2, Some(("r1", "wt-f", &f1, "feature/f"))).await;
    k.session("sf", "t-flat", "RUNNING", "e-f", T3).await;
    k.session_worktree("sw-f", "sf", "wt-f", "r1", "", &f1, "feature/f", "active", T3)
        .await;
    k.session_worktree("sw-del", "sf", "wt-x", "r1", "", &f1, "feature/x", "deleted", T3)
        .await;
    k.task_with(
        "t-child",
        "Child",
        "t-flat",
        r#"{"workspace":{"mode":"inherit_parent"}}"#,
    )
    .await;
    k.session("sb", "t-child", "IDLE", "e-f", T4).await;
    k.task("t-sess", "Sessions only").await;
    k.session("ss", "t-sess", "IDLE", "", T3).await;
    k.session_worktree("sw-s", "ss", "wt-s", "r1", "", &s1, "feature/s", "active", T3)
        .await;
    k.task("t-none", "No repository on disk").await;
    k.task_repo("t-none", "r-gone").await;
    k.job("j-sd", "t-flat", "session_delete").await;
    k.job("j-ar", "t-canon", "archive").await;
    let db = k.finish().await;

    let run = import(&app, &db, "ws", &[], &[]).await;
    succeeded(&run);
    assert_eq!(
        run.report["imported"],
        json!({"tasks": 5, "environments": 3, "worktrees": 3, "sessions": 4, "observations": 0})
    );
    has(&run.report, "history", "session_delete_job_dropped", "j-sd");
    // t-canon is not archived: kandev would cancel its archive job, and so nothing is carried.
    has(&run.report, "history", "cleanup_job_reason_gone", "j-ar");
    has(&run.report, "history", "session_worktree_deleted", "sw-del");
    let gone = repository::Entity::find()
        .filter(repository::Column::ImportedFrom.eq("r-gone"))
        .one(app.db())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(gone.status, repository::RepositoryStatus::Missing, "kept, not dropped");
    let ws: uuid::Uuid = run.report["workspace_id"].as_str().unwrap().parse().unwrap();
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/repositories")).await.ok(200);
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed}");
    let slots = app
        .get(&format!("/api/v1/tasks/{}", task_of(&app, "t-none").await.id))
        .await
        .ok(200);
    assert_eq!(slots["repositories"][0]["repository_id"], gone.id.to_string());
    assert_eq!(
        session_of(&app, "sb").await.task_environment_id,
        Some(env_of(&app, "e-f").await.unwrap().id)
    );
    assert!(env_of(&app, "task:t-sess").await.is_some());

    // A second import of the same file imports nothing and says so.
    let before = dump(&app).await;
    let again = import(&app, &db, "ws", &[], &[]).await;
    succeeded(&again);
    assert_eq!(again.report["already_imported"], true, "{}", again.report);
    assert_eq!(
        again.report["imported"],
        json!({"tasks": 0, "environments": 0, "worktrees": 0, "sessions": 0, "observations": 0})
    );
    assert_unchanged(&before, &dump(&app).await);
}

/// berth already holds a workspace with a repository: "unchanged" then compares real rows.
async fn other_workspace(app: &TestApp) {
    let ws = app.workspace("other").await;
    app.repository(ws, "already-here").await;
}

const STEPS: [&str; 11] = [
    "after_read",
    "after_workspaces",
    "after_repositories",
    "after_tasks",
    "after_environments",
    "after_environment_repos",
    "after_sessions",
    "after_messages",
    "after_observations",
    "after_cleanup_jobs",
    "before_commit",
];

pub(crate) async fn every_failure_point_leaves_berth_unchanged(app: TestApp) {
    other_workspace(&app).await;
    let (_w, db, _) = normalized(&app).await;
    let before = dump(&app).await;
    for step in STEPS {
        let run = import(&app, &db, "ws", &[], &[("BERTH_IMPORT_FAIL_AT", step)]).await;
        assert_eq!(run.code, 1, "{step}: {}", run.report);
        let e = has(&run.report, "refused", "import_failed", "");
        assert!(e["message"].as_str().unwrap().contains(step), "{e}");
        assert_unchanged(&before, &dump(&app).await);
    }
    succeeded(&import(&app, &db, "ws", &[], &[]).await);
    assert_eq!(app.count("tasks").await, 1);
}

// I15, I2: a session of an imported task launches through admission in the adopted worktree, and deleting
// it leaves that worktree, its registration and its files in place.
pub(crate) async fn an_imported_session_launches_in_the_adopted_worktree(app: TestApp) {
    let (w, db, wt) = normalized(&app).await;
    std::fs::write(wt.join("marker.txt"), "uncommitted\n").unwrap();
    succeeded(&import(&app, &db, "ws", &[], &[]).await);
    let t = task_of(&app, "t1").await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{}/sessions", t.id),
            json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "pwd"}),
        )
        .await
        .ok(201);
    assert_eq!(s["workspace_path"], wt.display().to_string(), "{s}");
    assert_eq!(
        s["task_environment_id"],
        env_of(&app, "e1").await.unwrap().id.to_string()
    );
    let id = id_of(&s);
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let exec: uuid::Uuid = s["execution_id"].as_str().unwrap().parse().unwrap();
    let exec = berth::entity::agent_execution::Entity::find_by_id(exec)
        .one(app.db())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        exec.workspace_path,
        wt.display().to_string(),
        "the agent ran in the adopted worktree"
    );
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
    wait_session(&app, id, "stopped", |s| s["state"] == "stopped").await;
    app.call(
        Method::DELETE,
        &format!("/api/v1/sessions/{id}"),
        Some(&app.admin),
        None,
    )
    .await
    .ok(204);
    // An imported session is deleted the same way: its conversation only.
    let imported = session_of(&app, "s1").await;
    app.call(
        Method::DELETE,
        &format!("/api/v1/sessions/{}", imported.id),
        Some(&app.admin),
        None,
    )
    .await
    .ok(204);
    assert_eq!(std::fs::read_to_string(wt.join("marker.txt")).unwrap(), "uncommitted\n");
    assert!(worktrees_of(&w.repo).contains(&wt.display().to_string()));
    assert_eq!(app.count("task_resource_cleanup_jobs").await, 0);
    assert_eq!(inventory(&app).await.len(), 1, "the inventory row stays the task's");
}

pub(crate) async fn a_write_locked_kandev_database_is_refused(app: TestApp) {
    other_workspace(&app).await;
    let (_w, db, _) = normalized(&app).await;
    // A write in progress: SQLite's write lock, or a PostgreSQL transaction that wrote.
    let writer = Writer::begin(&db).await;
    let before = dump(&app).await;
    let run = import(&app, &db, "ws", &[], &[]).await;
    assert_eq!(run.code, 1, "{}", run.report);
    let e = has(&run.report, "refused", "database_write_locked", "");
    assert!(e["message"].as_str().unwrap().contains("another process"), "{e}");
    assert!(
        run.stderr.contains("being written by another process"),
        "{}",
        run.stderr
    );
    assert_unchanged(&before, &dump(&app).await);
    writer.rollback().await;
    // Once the writer is gone, the same database imports.
    tokio::time::timeout(Duration::from_secs(60), async {
        succeeded(&import(&app, &db, "ws", &[], &[]).await)
    })
    .await
    .unwrap();
}

/// Another process writing kandev's database.
enum Writer {
    Sqlite(sea_orm::sqlx::SqliteConnection),
    Postgres(sea_orm::sqlx::PgConnection),
}

impl Writer {
    async fn begin(db: &KandevDb) -> Writer {
        if let Some(pg) = &db.pg {
            let mut c = sea_orm::sqlx::PgConnection::connect(&pg.url).await.unwrap();
            c.execute("BEGIN").await.unwrap();
            c.execute("UPDATE kandev_meta SET value = value").await.unwrap();
            return Writer::Postgres(c);
        }
        let opts = sea_orm::sqlx::sqlite::SqliteConnectOptions::new().filename(db.path.as_ref().unwrap());
        let mut c = sea_orm::sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
        c.execute("BEGIN IMMEDIATE").await.unwrap();
        Writer::Sqlite(c)
    }

    async fn rollback(self) {
        match self {
            Writer::Sqlite(mut c) => {
                c.execute("ROLLBACK").await.unwrap();
                c.close().await.unwrap();
            }
            Writer::Postgres(mut c) => {
                c.execute("ROLLBACK").await.unwrap();
                c.close().await.unwrap();
            }
        }
    }
}

pub(crate) async fn a_dry_run_changes_nothing(app: TestApp) {
    other_workspace(&app).await;
    let (w, db, _) = normalized(&app).await;
    let before = dump(&app).await;
    let run = import(&app, &db, "ws", &["--dry-run"], &[]).await;
    succeeded(&run);
    assert_eq!(run.report["dry_run"], true);
    assert_eq!(run.report["imported"]["tasks"], 1);
    assert_eq!(run.report["imported"]["sessions"], 2);
    assert_unchanged(&before, &dump(&app).await);
    // A dry run of a file that would be refused reports it, and still changes nothing.
    let lost = w.worktree("lost", "feature/lost");
    let mut k = Kandev::create(&w, &w.home.join("other"), Gen::Legacy).await;
    k.repo("r1", "proj", &w.repo).await;
    k.session_worktree(
        "sw-orphan",
        "gone",
        "wt-lost",
        "r1",
        "",
        &lost,
        "feature/lost",
        "active",
        T4,
    )
    .await;
    let other = k.finish().await;
    let run = import(&app, &other, "ws", &["--dry-run"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.report);
    has(&run.report, "refused", "orphan_without_owner", "sw-orphan");
    assert_unchanged(&before, &dump(&app).await);
}
