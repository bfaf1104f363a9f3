//! kandev databases built from `docs/kandev-schema.md` (both generations) by the same SQL on SQLite and on
//! PostgreSQL (a fresh database per fixture, dropped with it; kandev renders TIMESTAMP as TIMESTAMPTZ there,
//! as its `dialect.RenderSchema` does), real git repositories and worktrees made with the git CLI, the
//! `berth import kandev` runner, and a dump of berth's database to prove that a refused or failed import
//! changed nothing.
use std::path::{Path, PathBuf};

use sea_orm::sqlx::sqlite::SqliteConnectOptions;
use sea_orm::sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, SqliteConnection};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use serde_json::Value;

use crate::helpers::{Backend, PgDatabase, TestApp, git, git_repo, seen, wait_until_every};

/// The three timestamp forms kandev files hold (§1), oldest to newest.
pub const T1: &str = "2026-08-01 10:00:00+00:00";
pub const T2: &str = "2026-08-02 10:00:00";
pub const T3: &str = "2026-08-03T10:00:00Z";
pub const T4: &str = "2026-08-04 10:00:00.25+00:00";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gen {
    /// Per-session worktree table and flat environment columns; no lifecycle columns.
    Legacy,
    /// Legacy, with lifecycle columns on `task_environment_repos` (a preview build).
    Preview,
    /// Normalized environments plus a stale `task_session_worktrees`.
    Hybrid,
    Normalized,
}

pub fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

enum Conn {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
}

/// A kandev database being filled.
pub struct Kandev {
    conn: Conn,
    db: KandevDb,
    pub generation: Gen,
}

/// A finished kandev database: what `--from` names. A PostgreSQL one is dropped with this.
pub struct KandevDb {
    pub from: String,
    /// The SQLite file; `None` on PostgreSQL.
    pub path: Option<PathBuf>,
    pub pg: Option<PgDatabase>,
}

impl KandevDb {
    /// Everything in it: the SQLite file's bytes, or every row of every PostgreSQL table.
    pub async fn contents(&self) -> Vec<u8> {
        let Some(pg) = &self.pg else {
            return std::fs::read(self.path.as_ref().unwrap()).unwrap();
        };
        let mut conn = PgConnection::connect(&pg.url).await.unwrap();
        let tables: Vec<String> = sea_orm::sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let mut out = Vec::new();
        for t in tables {
            let rows: Vec<String> =
                sea_orm::sqlx::query_scalar(AssertSqlSafe(format!("SELECT to_jsonb(t)::text FROM {t} t ORDER BY 1")))
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
            out.extend(format!("{t}: {rows:?}\n").into_bytes());
        }
        conn.close().await.unwrap();
        out
    }
}

impl Kandev {
    /// On the backend the test's berth runs on: a file in `dir`, or a fresh PostgreSQL database.
    pub async fn create(w: &World, dir: &Path, generation: Gen) -> Kandev {
        let (mut conn, db) = match w.backend {
            Backend::Sqlite => {
                std::fs::create_dir_all(dir).unwrap();
                let path = dir.join("kandev.db");
                let opts = SqliteConnectOptions::new().filename(&path).create_if_missing(true);
                let conn = SqliteConnection::connect_with(&opts).await.unwrap();
                let from = path.display().to_string();
                (
                    Conn::Sqlite(conn),
                    KandevDb {
                        from,
                        path: Some(path),
                        pg: None,
                    },
                )
            }
            Backend::Postgres => {
                let pg = PgDatabase::create()
                    .await
                    .expect("a PostgreSQL run has BERTH_TEST_POSTGRES_URL");
                let mut conn = PgConnection::connect(&pg.url)
                    .await
                    .unwrap_or_else(|e| panic!("BERTH_TEST_POSTGRES_URL is set but PostgreSQL is unreachable: {e}"));
                // kandev writes UTC; a zone-less literal is read as such.
                conn.execute("SET TIME ZONE 'UTC'").await.unwrap();
                let from = pg.url.clone();
                (
                    Conn::Postgres(conn),
                    KandevDb {
                        from,
                        path: None,
                        pg: Some(pg),
                    },
                )
            }
        };
        let flat = matches!(generation, Gen::Legacy | Gen::Preview);
        let lifecycle = generation != Gen::Legacy;
        let legacy_table = generation != Gen::Normalized;
        let mut ddl = vec![
            "CREATE TABLE kandev_meta (key TEXT PRIMARY KEY, value TEXT)".into(),
            "INSERT INTO kandev_meta VALUES ('kandev_version', 'v0.85.0')".into(),
            "CREATE TABLE workspaces (id TEXT PRIMARY KEY, name TEXT NOT NULL, task_prefix TEXT DEFAULT 'KAN', \
             created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL)"
                .into(),
            "CREATE TABLE repositories (id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL, name TEXT NOT NULL, \
             source_type TEXT NOT NULL DEFAULT 'local', local_path TEXT DEFAULT '', default_branch TEXT DEFAULT '', \
             created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL, deleted_at TIMESTAMP)"
                .into(),
            "CREATE TABLE tasks (id TEXT PRIMARY KEY, workspace_id TEXT NOT NULL, title TEXT NOT NULL, \
             description TEXT DEFAULT '', state TEXT DEFAULT 'TODO', metadata TEXT DEFAULT '{}', \
             parent_id TEXT DEFAULT '', is_ephemeral INTEGER DEFAULT 0, archived_at TIMESTAMP, \
             identifier TEXT DEFAULT '', created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL)"
                .into(),
            "CREATE TABLE task_repositories (id TEXT PRIMARY KEY, task_id TEXT NOT NULL, repository_id TEXT NOT NULL, \
             base_branch TEXT DEFAULT '', checkout_branch TEXT DEFAULT '', position INTEGER DEFAULT 0, \
             metadata TEXT DEFAULT '{}', created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL)"
                .into(),
            "CREATE TABLE executors (id TEXT PRIMARY KEY, name TEXT NOT NULL DEFAULT '', type TEXT NOT NULL, \
             is_system INTEGER DEFAULT 0)"
                .into(),
            "INSERT INTO executors (id, name, type, is_system) VALUES ('exec-worktree', 'Worktree', 'worktree', 1), \
             ('exec-local', 'Local', 'local', 1)"
                .into(),
            format!(
                "CREATE TABLE task_environments (id TEXT PRIMARY KEY, task_id TEXT NOT NULL, {} \
                 executor_type TEXT NOT NULL DEFAULT '', executor_id TEXT DEFAULT '', status TEXT NOT NULL DEFAULT 'creating', \
                 workspace_path TEXT DEFAULT '', task_dir_name TEXT DEFAULT '', \
                 created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL)",
                if flat {
                    "repository_id TEXT DEFAULT '', worktree_id TEXT DEFAULT '', worktree_path TEXT DEFAULT '', \
                     worktree_branch TEXT DEFAULT '',"
                } else {
                    ""
                }
            ),
            format!(
                "CREATE TABLE task_environment_repos (id TEXT PRIMARY KEY, task_environment_id TEXT NOT NULL, \
                 repository_id TEXT NOT NULL, branch_slug TEXT NOT NULL DEFAULT '', worktree_id TEXT DEFAULT '', \
                 worktree_path TEXT DEFAULT '', worktree_branch TEXT DEFAULT '', position INTEGER DEFAULT 0, \
                 error_message TEXT DEFAULT '', {} created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL, \
                 UNIQUE (task_environment_id, repository_id, branch_slug))",
                if lifecycle {
                    "status TEXT NOT NULL DEFAULT 'active', merged_at TIMESTAMP, deleted_at TIMESTAMP,"
                } else {
                    ""
                }
            ),
            "CREATE TABLE task_sessions (id TEXT PRIMARY KEY, task_id TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'CREATED', \
             task_environment_id TEXT DEFAULT '', executor_id TEXT DEFAULT '', repository_id TEXT DEFAULT '', \
             workspace_path TEXT DEFAULT '', name TEXT DEFAULT '', is_primary INTEGER DEFAULT 0, \
             metadata TEXT DEFAULT '{}', started_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL, \
             completed_at TIMESTAMP)"
                .into(),
            "CREATE TABLE task_session_turns (id TEXT PRIMARY KEY, task_session_id TEXT NOT NULL, task_id TEXT, \
             started_at TIMESTAMP NOT NULL, completed_at TIMESTAMP, metadata TEXT DEFAULT '{}', \
             created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL)"
                .into(),
            "CREATE TABLE task_session_messages (id TEXT PRIMARY KEY, task_session_id TEXT NOT NULL, task_id TEXT, \
             turn_id TEXT NOT NULL, author_type TEXT NOT NULL, author_id TEXT DEFAULT '', content TEXT NOT NULL, \
             type TEXT NOT NULL DEFAULT 'message', requests_input INTEGER DEFAULT 0, metadata TEXT DEFAULT '{}', \
             created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)"
                .into(),
            "CREATE TABLE task_session_git_snapshots (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, \
             snapshot_type TEXT NOT NULL, branch TEXT NOT NULL, remote_branch TEXT DEFAULT '', head_commit TEXT DEFAULT '', \
             base_commit TEXT DEFAULT '', ahead INTEGER DEFAULT 0, behind INTEGER DEFAULT 0, files TEXT DEFAULT '{}', \
             triggered_by TEXT DEFAULT '', metadata TEXT DEFAULT '{}', created_at TIMESTAMP NOT NULL)"
                .into(),
            "CREATE TABLE task_resource_cleanup_jobs (id TEXT PRIMARY KEY, operation_id TEXT UNIQUE NOT NULL, \
             task_id TEXT NOT NULL, trigger TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending', \
             resource_snapshot TEXT NOT NULL DEFAULT '{}', attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at TIMESTAMP, \
             last_error TEXT NOT NULL DEFAULT '', created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL, \
             completed_at TIMESTAMP)"
                .into(),
            format!("INSERT INTO workspaces VALUES ('kws', 'Default Workspace', 'KAN', {}, {})", q(T1), q(T1)),
        ];
        if legacy_table {
            ddl.push(
                "CREATE TABLE task_session_worktrees (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, \
                 worktree_id TEXT NOT NULL, repository_id TEXT NOT NULL, branch_slug TEXT NOT NULL DEFAULT '', \
                 position INTEGER DEFAULT 0, worktree_path TEXT DEFAULT '', worktree_branch TEXT DEFAULT '', \
                 status TEXT NOT NULL DEFAULT 'active', created_at TIMESTAMP NOT NULL, updated_at TIMESTAMP NOT NULL, \
                 merged_at TIMESTAMP, deleted_at TIMESTAMP, UNIQUE (session_id, worktree_id))"
                    .into(),
            );
        }
        match &mut conn {
            Conn::Sqlite(c) => {
                c.execute("PRAGMA journal_mode = WAL").await.unwrap();
            }
            Conn::Postgres(_) => {
                // kandev's `dialect.RenderSchema`: every TIMESTAMP column is TIMESTAMPTZ on PostgreSQL.
                for sql in &mut ddl {
                    *sql = sql.replace(" TIMESTAMP", " TIMESTAMPTZ");
                }
            }
        }
        let mut k = Kandev { conn, db, generation };
        for sql in ddl {
            k.exec(sql).await;
        }
        k
    }

    pub async fn exec(&mut self, sql: String) {
        let out = match &mut self.conn {
            Conn::Sqlite(c) => c.execute(AssertSqlSafe(sql.clone())).await.map(|_| ()),
            Conn::Postgres(c) => c.execute(AssertSqlSafe(sql.clone())).await.map(|_| ()),
        };
        out.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub async fn repo(&mut self, id: &str, name: &str, path: &Path) {
        self.exec(format!(
            "INSERT INTO repositories (id, workspace_id, name, local_path, default_branch, created_at, updated_at) \
             VALUES ({}, 'kws', {}, {}, 'main', {}, {})",
            q(id),
            q(name),
            q(&path.display().to_string()),
            q(T1),
            q(T1)
        ))
        .await;
    }

    pub async fn task(&mut self, id: &str, title: &str) {
        self.task_with(id, title, "", "{}").await;
    }

    pub async fn task_with(&mut self, id: &str, title: &str, parent: &str, metadata: &str) {
        self.exec(format!(
            "INSERT INTO tasks (id, workspace_id, title, parent_id, metadata, created_at, updated_at) \
             VALUES ({}, 'kws', {}, {}, {}, {}, {})",
            q(id),
            q(title),
            q(parent),
            q(metadata),
            q(T1),
            q(T2)
        ))
        .await;
    }

    pub async fn task_repo(&mut self, task: &str, repo: &str) {
        self.exec(format!(
            "INSERT INTO task_repositories (id, task_id, repository_id, base_branch, created_at, updated_at) \
             VALUES ({}, {}, {}, 'main', {}, {})",
            q(&format!("tr-{task}-{repo}")),
            q(task),
            q(repo),
            q(T1),
            q(T1)
        ))
        .await;
    }

    /// An environment; `flat` = (repository, worktree id, path, branch), only in a legacy file.
    pub async fn env(&mut self, id: &str, task: &str, updated: &str, flat: Option<(&str, &str, &Path, &str)>) {
        let (cols, vals) = match flat {
            Some((repo, wt, path, branch)) => {
                assert!(
                    matches!(self.generation, Gen::Legacy | Gen::Preview),
                    "flat columns are legacy"
                );
                (
                    ", repository_id, worktree_id, worktree_path, worktree_branch",
                    format!(
                        ", {}, {}, {}, {}",
                        q(repo),
                        q(wt),
                        q(&path.display().to_string()),
                        q(branch)
                    ),
                )
            }
            None => ("", String::new()),
        };
        self.exec(format!(
            "INSERT INTO task_environments (id, task_id, executor_type, executor_id, status, created_at, updated_at{cols}) \
             VALUES ({}, {}, 'worktree', 'exec-worktree', 'ready', {}, {}{vals})",
            q(id),
            q(task),
            q(T1),
            q(updated)
        ))
        .await;
    }

    /// A canonical inventory row; `status` is written only where the file has lifecycle columns.
    #[allow(clippy::too_many_arguments)]
    pub async fn env_repo(
        &mut self,
        id: &str,
        env: &str,
        repo: &str,
        slug: &str,
        wt: &str,
        path: &Path,
        branch: &str,
        status: &str,
    ) {
        let (cols, vals) = if self.generation == Gen::Legacy {
            assert_eq!(status, "active", "a legacy file has no lifecycle columns");
            ("", String::new())
        } else {
            (", status", format!(", {}", q(status)))
        };
        self.exec(format!(
            "INSERT INTO task_environment_repos (id, task_environment_id, repository_id, branch_slug, worktree_id, \
             worktree_path, worktree_branch, created_at, updated_at{cols}) VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {}{vals})",
            q(id),
            q(env),
            q(repo),
            q(slug),
            q(wt),
            q(&path.display().to_string()),
            q(branch),
            q(T1),
            q(T3)
        ))
        .await;
    }

    pub async fn session(&mut self, id: &str, task: &str, state: &str, env: &str, updated: &str) {
        self.exec(format!(
            "INSERT INTO task_sessions (id, task_id, state, task_environment_id, executor_id, name, started_at, updated_at) \
             VALUES ({}, {}, {}, {}, 'exec-worktree', {}, {}, {})",
            q(id),
            q(task),
            q(state),
            q(env),
            q(&format!("session {id}")),
            q(T1),
            q(updated)
        ))
        .await;
    }

    /// A `task_session_worktrees` row.
    #[allow(clippy::too_many_arguments)]
    pub async fn session_worktree(
        &mut self,
        id: &str,
        session: &str,
        wt: &str,
        repo: &str,
        slug: &str,
        path: &Path,
        branch: &str,
        status: &str,
        updated: &str,
    ) {
        self.exec(format!(
            "INSERT INTO task_session_worktrees (id, session_id, worktree_id, repository_id, branch_slug, worktree_path, \
             worktree_branch, status, created_at, updated_at) VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {}, {})",
            q(id),
            q(session),
            q(wt),
            q(repo),
            q(slug),
            q(&path.display().to_string()),
            q(branch),
            q(status),
            q(T1),
            q(updated)
        ))
        .await;
    }

    pub async fn message(&mut self, id: &str, session: &str, author: &str, kind: &str, content: &str, at: &str) {
        self.exec(format!(
            "INSERT INTO task_session_messages (id, task_session_id, turn_id, author_type, content, type, created_at) \
             VALUES ({}, {}, 'turn-1', {}, {}, {}, {})",
            q(id),
            q(session),
            q(author),
            q(content),
            q(kind),
            q(at)
        ))
        .await;
    }

    pub async fn snapshot(&mut self, id: &str, session: &str, branch: &str, files: &str, at: &str) {
        self.exec(format!(
            "INSERT INTO task_session_git_snapshots (id, session_id, snapshot_type, branch, head_commit, ahead, files, \
             triggered_by, created_at) VALUES ({}, {}, 'status_update', {}, 'abc123', 2, {}, 'live_monitor', {})",
            q(id),
            q(session),
            q(branch),
            q(files),
            q(at)
        ))
        .await;
    }

    pub async fn job(&mut self, id: &str, task: &str, trigger: &str) {
        self.job_with(id, task, trigger, "pending", "{}").await;
    }

    /// A cleanup job in `state` with kandev's `resource_snapshot` (JSON text).
    pub async fn job_with(&mut self, id: &str, task: &str, trigger: &str, state: &str, snapshot: &str) {
        let error = if state == "failed" { "worktree is locked" } else { "" };
        self.exec(format!(
            "INSERT INTO task_resource_cleanup_jobs (id, operation_id, task_id, trigger, state, resource_snapshot, \
             attempts, last_error, created_at, updated_at) VALUES ({}, {}, {}, {}, {}, {}, 1, {}, {}, {})",
            q(id),
            q(&format!("{trigger}:{task}:{id}")),
            q(task),
            q(trigger),
            q(state),
            q(snapshot),
            q(error),
            q(T3),
            q(T3)
        ))
        .await;
    }

    /// Archives a task as kandev does (`archived_at`).
    pub async fn archive(&mut self, task: &str) {
        self.exec(format!(
            "UPDATE tasks SET archived_at = {} WHERE id = {}",
            q(T3),
            q(task)
        ))
        .await;
    }

    /// Closes the writer (on SQLite the WAL is checkpointed into the file): the fixture is complete.
    pub async fn finish(self) -> KandevDb {
        match self.conn {
            Conn::Sqlite(c) => c.close().await.unwrap(),
            Conn::Postgres(c) => c.close().await.unwrap(),
        }
        self.db
    }
}

/// A source repository and kandev's home, with real worktrees laid out as kandev does
/// (`<home>/tasks/<task dir>/<repository>`).
pub struct World {
    pub home: PathBuf,
    pub repo: PathBuf,
    /// Where kandev's database lives: on the backend the test's berth runs on.
    pub backend: Backend,
}

impl World {
    pub fn new(app: &TestApp) -> World {
        let root = app.scratch.path().canonicalize().unwrap();
        World {
            repo: git_repo(&root.join("src").join("proj"), "main"),
            home: root.join("kandev"),
            backend: app.backend,
        }
    }

    /// kandev's database at its usual place (`<home>/data`), or a PostgreSQL one.
    pub async fn kandev(&self, generation: Gen) -> Kandev {
        Kandev::create(self, &self.db_dir(), generation).await
    }

    /// Another source repository.
    pub fn second_repo(&self, name: &str) -> PathBuf {
        git_repo(&self.home.parent().unwrap().join("src").join(name), "main")
    }

    /// `git worktree add -b <branch>` of `repo` at `<home>/tasks/<dir>/<repo name>`; returns its path.
    pub fn worktree_of(&self, repo: &Path, dir: &str, branch: &str) -> PathBuf {
        let path = self.home.join("tasks").join(dir).join(repo.file_name().unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        git(
            repo,
            &["worktree", "add", "-q", "-b", branch, &path.display().to_string()],
        );
        path.canonicalize().unwrap()
    }

    pub fn worktree(&self, dir: &str, branch: &str) -> PathBuf {
        self.worktree_of(&self.repo, dir, branch)
    }

    pub fn db_dir(&self) -> PathBuf {
        self.home.join("data")
    }
}

pub struct Run {
    pub code: i32,
    pub report: Value,
    pub stderr: String,
}

/// Runs `berth import kandev --json` against the app's database (a separate process, like a user's).
pub async fn import(app: &TestApp, db: &KandevDb, workspace: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.args([
        "import",
        "kandev",
        "--from",
        &db.from,
        "--workspace",
        workspace,
        "--json",
    ]);
    cmd.args(extra);
    for (k, v) in &app.env {
        cmd.env(k, v);
    }
    cmd.env_remove("BERTH_IMPORT_FAIL_AT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}\n{stderr}"));
    Run {
        code: out.status.code().unwrap_or(-1),
        report,
        stderr,
    }
}

/// berth's database as data: every row of every table (both backends), and on SQLite the file's bytes
/// after a checkpoint, so "unchanged" means byte for byte there.
pub async fn dump(app: &TestApp) -> (Vec<String>, Option<Vec<u8>>) {
    let db = app.db();
    let backend = db.get_database_backend();
    let raw = |sql: String| Statement::from_string(backend, sql);
    if backend == DbBackend::Postgres {
        // An import commits its events outside any request, so the running server's sequencer stamps
        // them a moment later. A snapshot taken before that would differ from one taken after in
        // nothing but `seq`: wait until every committed event is stamped.
        let (within, every) = (std::time::Duration::from_secs(20), std::time::Duration::from_millis(10));
        wait_until_every("every committed event to be stamped", within, every, || async {
            let pending = db
                .query_one_raw(raw("SELECT EXISTS (SELECT 1 FROM events WHERE seq IS NULL) AS n".into()))
                .await
                .unwrap()
                .unwrap()
                .try_get::<bool>("", "n")
                .unwrap();
            seen(!pending, "unstamped events")
        })
        .await;
    }
    let tables: Vec<String> = match backend {
        DbBackend::Sqlite => db
            .query_all_raw(raw(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name".into(),
            ))
            .await
            .unwrap(),
        _ => db
            .query_all_raw(raw(
                "SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename".into(),
            ))
            .await
            .unwrap(),
    }
    .iter()
    .map(|r| r.try_get::<String>("", "name").unwrap())
    .collect();
    let mut rows = Vec::new();
    // Not berth's data: a running instance renews its lease row whatever an import does.
    for t in tables.into_iter().filter(|t| t != "instances") {
        let sql = match backend {
            DbBackend::Sqlite => {
                let cols: Vec<String> = db
                    .query_all_raw(raw(format!("SELECT name FROM pragma_table_info('{t}')")))
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.try_get::<String>("", "name").unwrap())
                    .collect();
                // quote(): uuids are BLOBs on SQLite, which JSON cannot hold.
                let list = cols
                    .iter()
                    .map(|c| format!("quote(\"{c}\")"))
                    .collect::<Vec<_>>()
                    .join(", ");
                format!("SELECT json_array({list}) AS row FROM \"{t}\" ORDER BY 1")
            }
            _ => format!("SELECT row_to_json(x)::text AS row FROM \"{t}\" x ORDER BY 1"),
        };
        for r in db.query_all_raw(raw(sql)).await.unwrap() {
            rows.push(format!("{t}: {}", r.try_get::<String>("", "row").unwrap()));
        }
    }
    let bytes = if backend == DbBackend::Sqlite {
        db.execute_unprepared("PRAGMA wal_checkpoint(TRUNCATE)").await.unwrap();
        Some(std::fs::read(app.config.data_dir.join("berth.db")).unwrap())
    } else {
        None
    };
    (rows, bytes)
}

/// Asserts that berth's database is exactly as in `before`.
#[track_caller]
pub fn assert_unchanged(before: &(Vec<String>, Option<Vec<u8>>), after: &(Vec<String>, Option<Vec<u8>>)) {
    assert_eq!(before.0, after.0, "berth's rows changed");
    assert!(before.1 == after.1, "berth's SQLite file changed");
}
