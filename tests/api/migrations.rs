//! Migrations fail closed (I35): idempotent, safe when several `berth migrate` run at once, a checked
//! SQLite backup before pending migrations, a newer database refused, a failed migration rolled back.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use migration::MigratorTrait;
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};
use tempfile::TempDir;

use crate::helpers::{PgDatabase, SECRET, scalar};

struct Target {
    env: BTreeMap<String, String>,
    url: String,
    data_dir: TempDir,
    _pg: Option<PgDatabase>,
}

async fn sqlite_target() -> Target {
    let data_dir = TempDir::new().unwrap();
    let url = format!("sqlite://{}?mode=rwc", data_dir.path().join("berth.db").display());
    target(data_dir, url, None)
}

async fn postgres_target() -> Option<Target> {
    let pg = PgDatabase::create().await?;
    let url = pg.url.clone();
    Some(target(TempDir::new().unwrap(), url, Some(pg)))
}

fn target(data_dir: TempDir, url: String, pg: Option<PgDatabase>) -> Target {
    let mut env = BTreeMap::new();
    env.insert("BERTH_DATA_DIR".into(), data_dir.path().display().to_string());
    env.insert("BERTH_DATABASE_URL".into(), url.clone());
    env.insert("BERTH_JWT_SECRET".into(), SECRET.into());
    env.insert("BERTH_BIND".into(), "127.0.0.1:0".into());
    Target {
        env,
        url,
        data_dir,
        _pg: pg,
    }
}

impl Target {
    fn berth(&self, args: &[&str]) -> Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    async fn berth_async(&self, args: &[&str]) -> Output {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.output().await.unwrap()
    }

    async fn db(&self) -> DatabaseConnection {
        Database::connect(&self.url).await.unwrap()
    }

    fn backups(&self) -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(self.data_dir.path().join("backups"))
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn exec(db: &DatabaseConnection, sql: &str) {
    db.execute_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap();
}

async fn idempotent(t: Target) {
    let first = t.berth(&["migrate"]);
    assert!(first.status.success(), "{}", stderr(&first));
    let all = migration::Migrator::migrations().len();
    assert!(
        stdout(&first).starts_with(&format!("applied {all} migration")),
        "{}",
        stdout(&first)
    );
    let second = t.berth(&["migrate"]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(stdout(&second).trim(), "schema is up to date");
    let db = t.db().await;
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM seaql_migrations").await,
        migration::Migrator::migrations().len() as i64
    );
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM workspaces").await, 0);
}

#[tokio::test]
async fn sqlite_migrate_is_idempotent() {
    idempotent(sqlite_target().await).await;
}

#[tokio::test]
async fn postgres_migrate_is_idempotent() {
    if let Some(t) = postgres_target().await {
        idempotent(t).await;
    }
}

/// I35: the SQLite backup is taken, checked, and holds the database as it was before migrating.
#[tokio::test]
async fn sqlite_backup_is_taken_before_pending_migrations() {
    let t = sqlite_target().await;
    let out = t.berth(&["migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let backups = t.backups();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert!(stdout(&out).contains("backup taken before migrating"));
    let backup = Database::connect(format!("sqlite://{}?mode=ro", backups[0].display()))
        .await
        .unwrap();
    let row = backup
        .query_one_raw(Statement::from_string(
            backup.get_database_backend(),
            "PRAGMA integrity_check",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.try_get_by_index::<String>(0).unwrap(), "ok");
    assert_eq!(
        scalar(&backup, "SELECT COUNT(*) FROM sqlite_master WHERE name = 'workspaces'").await,
        0,
        "taken before the schema"
    );
    // Nothing pending: no new backup.
    assert!(t.berth(&["migrate"]).status.success());
    assert_eq!(t.backups().len(), 1);
}

/// I35: a migration that fails part-way rolls back whole: nothing of it remains, the data stays, and on
/// SQLite a backup was taken first.
async fn failed_migration_rolls_back(t: Target, sqlite: bool) {
    let db = t.db().await;
    // Data that must survive, and an obstacle that the migration meets only after creating many tables.
    exec(&db, "CREATE TABLE keep_me (n INTEGER)").await;
    exec(&db, "INSERT INTO keep_me (n) VALUES (42)").await;
    exec(&db, "CREATE TABLE event_sequence (obstacle INTEGER)").await;
    let out = t.berth(&["migrate"]);
    assert!(!out.status.success(), "the migration should have failed");
    assert!(stderr(&out).contains("rolled back"), "{}", stderr(&out));
    let table_count = |name: &str| {
        let sql = if sqlite {
            format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{name}'")
        } else {
            format!(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = '{name}'"
            )
        };
        let db = db.clone();
        async move { scalar(&db, &sql).await }
    };
    assert_eq!(
        table_count("workspaces").await,
        0,
        "tables created before the failure were rolled back"
    );
    assert_eq!(table_count("tasks").await, 0);
    assert_eq!(table_count("seaql_migrations").await, 0, "nothing recorded as applied");
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM keep_me").await, 1, "data survives");
    if sqlite {
        assert_eq!(t.backups().len(), 1, "a backup was taken before the failed attempt");
    }
    // Without the obstacle, it applies.
    exec(&db, "DROP TABLE event_sequence").await;
    let out = t.berth(&["migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test]
async fn sqlite_failed_migration_rolls_back() {
    failed_migration_rolls_back(sqlite_target().await, true).await;
}

#[tokio::test]
async fn postgres_failed_migration_rolls_back() {
    if let Some(t) = postgres_target().await {
        failed_migration_rolls_back(t, false).await;
    }
}

/// A database migrated by a newer berth is refused by `migrate` and by `serve`, and left unchanged.
async fn newer_database_is_refused(t: Target) {
    assert!(t.berth(&["migrate"]).status.success());
    let db = t.db().await;
    exec(
        &db,
        "INSERT INTO seaql_migrations (version, applied_at) VALUES ('m29990101_000001_from_the_future', 0)",
    )
    .await;
    for cmd in ["migrate", "serve"] {
        let out = t.berth(&[cmd]);
        assert!(!out.status.success(), "{cmd} should refuse");
        assert!(stderr(&out).contains("newer berth"), "{cmd}: {}", stderr(&out));
    }
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM seaql_migrations").await,
        migration::Migrator::migrations().len() as i64 + 1
    );
}

#[tokio::test]
async fn sqlite_newer_database_is_refused() {
    newer_database_is_refused(sqlite_target().await).await;
}

#[tokio::test]
async fn postgres_newer_database_is_refused() {
    if let Some(t) = postgres_target().await {
        newer_database_is_refused(t).await;
    }
}

/// Several `berth migrate` at once on a fresh database: all succeed, exactly one applies.
async fn concurrent_migrations(t: Target) {
    let runs: Vec<_> = (0..6).map(|_| t.berth_async(&["migrate"])).collect();
    let outs = futures_util::future::join_all(runs).await;
    for o in &outs {
        assert!(o.status.success(), "a concurrent migrate failed: {}", stderr(o));
    }
    let applied = outs.iter().filter(|o| stdout(o).starts_with("applied")).count();
    assert_eq!(applied, 1, "{:?}", outs.iter().map(stdout).collect::<Vec<_>>());
    let db = t.db().await;
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM seaql_migrations").await,
        migration::Migrator::migrations().len() as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_migrate_processes_all_succeed() {
    if let Some(t) = postgres_target().await {
        concurrent_migrations(t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_concurrent_migrate_processes_all_succeed() {
    concurrent_migrations(sqlite_target().await).await;
}

#[test]
fn only_the_newest_two_backups_are_kept() {
    let dir = TempDir::new().unwrap();
    for stamp in [
        "20260101T000000Z",
        "20260201T000000Z",
        "20260301T000000Z",
        "20260401T000000Z",
    ] {
        std::fs::write(dir.path().join(format!("berth-{stamp}-before-m1.db")), b"x").unwrap();
    }
    std::fs::write(dir.path().join("unrelated.txt"), b"keep").unwrap();
    berth::store::migrate::prune_backups(dir.path());
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        vec![
            "berth-20260301T000000Z-before-m1.db",
            "berth-20260401T000000Z-before-m1.db",
            "unrelated.txt"
        ]
    );
    let _ = Path::new("");
}

/// m20261202_000006 widens `task_sessions.state` to admit `preparing`. On SQLite that rewrites the
/// stored table definition in place (no table rebuild), so a database with sessions keeps every session
/// and everything that references one (a rebuild with foreign keys on would have cascaded into their
/// messages), the CHECK still refuses unknown states, and the foreign keys still hold.
async fn widening_session_states_keeps_sessions_and_their_history(t: Target) {
    let db = t.db().await;
    migration::Migrator::up(&db, Some(4)).await.unwrap();
    let at = "'2026-11-30T00:00:00Z'";
    exec(&db, &format!("INSERT INTO workspaces (id, name, status, created_at, updated_at) VALUES ('00000000-0000-7000-8000-000000000001', 'ws', 'active', {at}, {at})")).await;
    exec(&db, &format!("INSERT INTO tasks (id, workspace_id, title, slug, description, kind, workspace_mode, last_activity_at, created_at, updated_at) VALUES ('00000000-0000-7000-8000-000000000002', '00000000-0000-7000-8000-000000000001', 't', 't', '', 'standard', 'new_workspace', {at}, {at}, {at})")).await;
    exec(&db, &format!("INSERT INTO task_sessions (id, task_id, name, executor_type, state, is_primary, desired_open, last_activity_at, created_at, updated_at) VALUES ('00000000-0000-7000-8000-000000000003', '00000000-0000-7000-8000-000000000002', '', 'worktree', 'idle', TRUE, FALSE, {at}, {at}, {at})")).await;
    exec(&db, &format!("INSERT INTO session_messages (session_id, role, content, created_at) VALUES ('00000000-0000-7000-8000-000000000003', 'user', '{{}}', {at})")).await;
    exec(&db, &format!("INSERT INTO session_inbox (id, session_id, text, delivery, state, created_at, updated_at) VALUES ('00000000-0000-7000-8000-000000000004', '00000000-0000-7000-8000-000000000003', 'hi', 'auto', 'delivered', {at}, {at})")).await;
    drop(db);
    let out = t.berth(&["migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let db = t.db().await;
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM task_sessions").await, 1);
    assert_eq!(
        scalar(&db, "SELECT COUNT(*) FROM session_messages").await,
        1,
        "no cascade"
    );
    assert_eq!(scalar(&db, "SELECT COUNT(*) FROM session_inbox").await, 1, "no cascade");
    exec(&db, "UPDATE task_sessions SET state = 'preparing'").await;
    let bogus = db
        .execute_raw(Statement::from_string(
            db.get_database_backend(),
            "UPDATE task_sessions SET state = 'bogus'",
        ))
        .await;
    assert!(bogus.is_err(), "the CHECK still refuses unknown states");
    let orphan = db
        .execute_raw(Statement::from_string(
            db.get_database_backend(),
            format!("INSERT INTO session_messages (session_id, role, content, created_at) VALUES ('00000000-0000-7000-8000-00000000dead', 'user', '{{}}', {at})"),
        ))
        .await;
    assert!(orphan.is_err(), "foreign keys to task_sessions still hold");
    // And back (through the migrations after it too): down turns `preparing` into `failed` and restores
    // the narrower CHECK.
    let from_widening = migration::Migrator::migrations().len() as u32 - 5;
    migration::Migrator::down(&db, Some(from_widening)).await.unwrap();
    let failed = scalar(&db, "SELECT COUNT(*) FROM task_sessions WHERE state = 'failed'").await;
    assert_eq!(failed, 1);
}

#[tokio::test]
async fn sqlite_widening_session_states_keeps_sessions_and_their_history() {
    widening_session_states_keeps_sessions_and_their_history(sqlite_target().await).await;
}

#[tokio::test]
async fn postgres_widening_session_states_keeps_sessions_and_their_history() {
    if let Some(t) = postgres_target().await {
        widening_session_states_keeps_sessions_and_their_history(t).await;
    }
}
