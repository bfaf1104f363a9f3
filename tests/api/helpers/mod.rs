//! The test harness: the real app on 127.0.0.1:0 with a fresh database per test (a new SQLite file, or a
//! new PostgreSQL database created from `BERTH_TEST_POSTGRES_URL` and dropped afterwards).
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Once;

use berth::auth::{JwtVerifier, Scope};
use berth::config::Config;
use berth::startup::Application;
use reqwest::{Method, StatusCode};
use sea_orm::sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};
use serde_json::Value;
use tempfile::TempDir;
use uuid::Uuid;

mod git;
mod process;
mod sse;
mod wait;

pub use git::{assert_no_path, branch_exists, git, git_repo, worktrees_of};
pub use process::{code_and_text, openssl};
pub use sse::Sse;
pub use wait::{
    SETTLED, seen, seen_json, wait_job, wait_job_settled, wait_session_within, wait_until, wait_until_every,
};

/// Settings for a berth whose cleanup worker hangs holding the job it claimed (a failpoint), with a
/// one-second lease after which another process rescues the job.
pub const HANGING_WORKER: &[(&str, &str)] = &[
    ("BERTH_CLEANUP_FAILPOINT", "hang_after_claim"),
    ("BERTH_CLEANUP_LEASE_SECS", "1"),
];

pub const SECRET: &str = "test-secret-test-secret-test-secret-0123456789";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Runs each named `async fn(TestApp)` on SQLite and, when `BERTH_TEST_POSTGRES_URL` is set, on PostgreSQL.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use $crate::helpers::{Backend, TestApp};
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name(TestApp::spawn(Backend::Sqlite).await.expect("sqlite is always available")).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if let Some(app) = TestApp::spawn(Backend::Postgres).await {
                        super::$name(app).await;
                    }
                }
            }
        )*
    };
}

/// Two tests, `$sqlite` and `$postgres`, running `async fn $run(Backend)` (a test that spawns its berth
/// itself) with `Backend::Sqlite` and `Backend::Postgres`.
#[macro_export]
macro_rules! backend_tests {
    ($run:ident: $sqlite:ident, $postgres:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $run($crate::helpers::Backend::Sqlite).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            $run($crate::helpers::Backend::Postgres).await;
        }
    };
}

static SQLITE_ONLY_NOTICE: Once = Once::new();

/// The PostgreSQL server URL for tests, or `None` (with a notice written past the test harness's output
/// capture) when it is not configured.
/// An HTTP client for talking to a berth under test. Its idle connections close after 2 s, before
/// actix's 5 s keep-alive closes them from the server side: a request sent on a connection the server
/// is closing at that instant fails with `IncompleteMessage` (seen in CI after a 5 s quiet spell).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_idle_timeout(std::time::Duration::from_secs(2))
        .build()
        .expect("an HTTP client")
}

pub fn postgres_url() -> Option<String> {
    match std::env::var("BERTH_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            SQLITE_ONLY_NOTICE.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "\nnote: BERTH_TEST_POSTGRES_URL is not set: running the SQLite half of the suite only \
                     (PostgreSQL variants pass without running)\n"
                );
            });
            None
        }
    }
}

/// A fresh PostgreSQL database, dropped when this is dropped.
pub struct PgDatabase {
    server_url: String,
    pub name: String,
    pub url: String,
}

impl PgDatabase {
    pub async fn create() -> Option<PgDatabase> {
        let server_url = postgres_url()?;
        let name = format!("berth_test_{}", Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(&server_url)
            .await
            .unwrap_or_else(|e| panic!("BERTH_TEST_POSTGRES_URL is set but PostgreSQL is unreachable: {e}"));
        conn.execute(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .await
            .expect("create test database");
        conn.close().await.ok();
        let mut url = reqwest::Url::parse(&server_url).expect("BERTH_TEST_POSTGRES_URL is a URL");
        url.set_path(&format!("/{name}"));
        Some(PgDatabase {
            server_url,
            name,
            url: url.to_string(),
        })
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let server_url = self.server_url.clone();
        let name = self.name.clone();
        // Drop may run inside a runtime: do the async work on a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = PgConnection::connect(&server_url).await {
                    let _ = conn
                        .execute(AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                        )))
                        .await;
                }
            });
        })
        .join();
    }
}

pub struct TestApp {
    pub backend: Backend,
    pub base: String,
    pub client: reqwest::Client,
    /// A token with the `admin` scope.
    pub admin: String,
    pub app_state: actix_web::web::Data<berth::api::AppState>,
    pub config: Config,
    pub env: BTreeMap<String, String>,
    handle: actix_web::dev::ServerHandle,
    background: Vec<tokio::task::AbortHandle>,
    // Dropped after the server handle is told to stop.
    _pg: Option<PgDatabase>,
    _data_dir: TempDir,
    /// Scratch space for git repositories and other test files.
    pub scratch: TempDir,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
    }
    /// Asserts a problem+json answer with this status and code, and returns it.
    #[track_caller]
    pub fn problem(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.text);
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("application/problem+json"),
            "body: {}",
            self.text
        );
        let body = self.json();
        assert_eq!(body["code"], code, "body: {}", self.text);
        assert_eq!(body["status"], status);
        body
    }
    #[track_caller]
    pub fn ok(&self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.text);
        if self.text.is_empty() { Value::Null } else { self.json() }
    }
}

impl TestApp {
    pub async fn spawn(backend: Backend) -> Option<TestApp> {
        TestApp::spawn_with(backend, &[]).await
    }

    /// Spawns the app with extra `BERTH_*` settings (`{scratch}` in a value is replaced by the scratch dir).
    pub async fn spawn_with(backend: Backend, extra: &[(&str, &str)]) -> Option<TestApp> {
        TestApp::spawn_with_profiles(backend, extra, Vec::new()).await
    }

    /// `spawn_with`, plus these agent profiles in the configuration (the real-Pi tests add a `pi` one).
    pub async fn spawn_with_profiles(
        backend: Backend,
        extra: &[(&str, &str)],
        profiles: Vec<(String, berth::config::AgentProfile)>,
    ) -> Option<TestApp> {
        let pg = match backend {
            Backend::Postgres => Some(PgDatabase::create().await?),
            Backend::Sqlite => None,
        };
        let data_dir = TempDir::new().unwrap();
        let scratch = TempDir::new().unwrap();
        let scratch_path = scratch.path().canonicalize().unwrap();
        let mut env = BTreeMap::new();
        env.insert("BERTH_DATA_DIR".to_string(), data_dir.path().display().to_string());
        env.insert("BERTH_BIND".to_string(), "127.0.0.1:0".to_string());
        env.insert("BERTH_JWT_SECRET".to_string(), SECRET.to_string());
        env.insert("BERTH_DB_MAX_CONNECTIONS".to_string(), "5".to_string());
        if let Some(pg) = &pg {
            env.insert("BERTH_DATABASE_URL".to_string(), pg.url.clone());
        }
        for (k, v) in extra {
            env.insert(
                k.to_string(),
                v.replace("{scratch}", &scratch_path.display().to_string()),
            );
        }
        env.entry("BERTH_AGENT_STOP_GRACE_MS".to_string())
            .or_insert_with(|| "300".to_string());
        // Cleanup runs in milliseconds in tests.
        env.entry("BERTH_CLEANUP_POLL_MS".to_string())
            .or_insert_with(|| "50".to_string());
        env.entry("BERTH_CLEANUP_RETRY_DELAYS_SECS".to_string())
            .or_insert_with(|| "0.05".to_string());
        env.entry("BERTH_CLEANUP_PREPARED_GRACE_SECS".to_string())
            .or_insert_with(|| "1".to_string());
        env.entry("BERTH_AGENT_TERM_GRACE_MS".to_string())
            .or_insert_with(|| "300".to_string());
        let mut config = Config::load(&env).expect("test config");
        // The failpoint is no setting: the harness alone sets it, from its own key.
        config.cleanup_failpoint = env.get("BERTH_CLEANUP_FAILPOINT").cloned();
        // Agent profiles come from the config file only; tests add them to the loaded configuration.
        let agent = env!("CARGO_BIN_EXE_berth-test-agent").to_string();
        let profile = |args: &[&str]| berth::config::AgentProfile {
            command: agent.clone(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: [("BERTH_TEST_SECRET".to_string(), "s3cret-value".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        config.agents.insert("test".into(), profile(&[]));
        // The test agent keeping a conversation file as Pi does (`--session`), with berth's Pi protocol.
        config.agents.insert(
            "fakepi".into(),
            berth::config::AgentProfile {
                protocol: berth::config::AgentProtocol::Pi,
                env: [("TEST_AGENT_SESSION_NAME".to_string(), "fake pi work".to_string())]
                    .into_iter()
                    .collect(),
                ..profile(&[])
            },
        );
        config
            .agents
            .insert("stubborn".into(), profile(&["--ignore-abort", "--ignore-term"]));
        config.agents.insert(
            "missing".into(),
            berth::config::AgentProfile {
                command: "/nonexistent/agent-binary".into(),
                ..Default::default()
            },
        );
        config.agents.extend(profiles);
        berth::telemetry::init_for_tests();
        let app = Application::build(config.clone()).await.expect("the app starts");
        let base = format!("http://127.0.0.1:{}", app.port());
        let handle = app.handle();
        let background = app.background();
        let app_state = app.state.clone();
        tokio::spawn(app.run_until_stopped());
        // With a public key berth verifies but cannot mint; such tests sign their own tokens.
        let admin = match config.jwt_key {
            berth::config::JwtKey::Secret { .. } => mint(&config, "admin", "admin", None, None),
            _ => String::new(),
        };
        Some(TestApp {
            backend,
            base,
            client: client(),
            admin,
            app_state,
            config,
            env,
            handle,
            background,
            _pg: pg,
            _data_dir: data_dir,
            scratch,
        })
    }

    /// Drops this app and spawns another on the same backend with extra `BERTH_*` settings, as
    /// [`Self::spawn_with`] does (for a test that needs settings of its own).
    pub async fn respawn_with(self, extra: &[(&str, &str)]) -> Option<TestApp> {
        let backend = self.backend;
        drop(self);
        TestApp::spawn_with(backend, extra).await
    }

    /// Stops the in-process server's background tasks (event tailer and sequencer, workers), for a test
    /// whose berth processes of its own are to do that work on this database.
    pub fn stop_background(&self) {
        for task in &self.background {
            task.abort();
        }
    }

    pub fn db(&self) -> &sea_orm::DatabaseConnection {
        &self.app_state.ctx.db.conn
    }

    pub fn token(&self, scope: &str) -> String {
        mint(&self.config, "tester", scope, None, None)
    }

    pub fn token_for(&self, scope: &str, workspaces: Option<Vec<Uuid>>, session: Option<Uuid>) -> String {
        mint(&self.config, "tester", scope, workspaces, session)
    }

    pub async fn call(&self, method: Method, path: &str, token: Option<&str>, body: Option<Value>) -> Reply {
        self.call_with(method, path, token, body, &[]).await
    }

    /// `call` with extra request headers (`Idempotency-Key`, `If-Match`, `Origin`, `Prefer`, ...).
    pub async fn call_with(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut req = self.client.request(method, format!("{}{}", self.base, path));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("request");
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        Reply { status, headers, text }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, Some(&self.admin), None).await
    }
    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.call(Method::POST, path, Some(&self.admin), Some(body)).await
    }
    pub async fn patch(&self, path: &str, body: Value) -> Reply {
        self.call(Method::PATCH, path, Some(&self.admin), Some(body)).await
    }
    pub async fn delete(&self, path: &str) -> Reply {
        self.call(Method::DELETE, path, Some(&self.admin), None).await
    }
    pub async fn put(&self, path: &str, body: Value) -> Reply {
        self.call(Method::PUT, path, Some(&self.admin), Some(body)).await
    }

    /// Creates a workspace and returns its id.
    pub async fn workspace(&self, name: &str) -> Uuid {
        let r = self
            .post("/api/v1/workspaces", serde_json::json!({ "name": name }))
            .await;
        id_of(&r.ok(201))
    }

    /// Makes a git repository with one commit under the scratch dir and registers it.
    pub async fn repository(&self, workspace: Uuid, name: &str) -> (Uuid, PathBuf) {
        let path = git_repo(&self.scratch.path().join(name), "main");
        let r = self
            .post(
                &format!("/api/v1/workspaces/{workspace}/repositories"),
                serde_json::json!({ "path": path }),
            )
            .await;
        (id_of(&r.ok(201)), path)
    }

    /// Number of rows in `table` (for asserting that nothing was written).
    pub async fn count(&self, table: &str) -> i64 {
        scalar(self.db(), &format!("SELECT COUNT(*) FROM {table}")).await
    }

    /// The events table as clients see it, oldest first: every event committed before the call, each
    /// once it has its `seq`. On PostgreSQL a committed event is unstamped (`seq` null) until the
    /// sequencer stamps it, so this waits, with a deadline, for the ones committed so far, and never
    /// reads an unstamped row (the entity's `seq` is not optional). On SQLite every committed event
    /// already has its `seq` (and no `id`: nothing to wait for).
    pub async fn event_rows(&self) -> Vec<berth::entity::event::Model> {
        use berth::entity::event::{Column, Entity};
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
        let newest = scalar(self.db(), "SELECT COALESCE(MAX(id), 0) FROM events").await;
        let unstamped = format!("SELECT COUNT(*) FROM events WHERE seq IS NULL AND id <= {newest}");
        let (within, every) = (std::time::Duration::from_secs(30), std::time::Duration::from_millis(10));
        wait_until_every("the committed events to be stamped", within, every, || async {
            let left = scalar(self.db(), &unstamped).await;
            seen(left == 0, left)
        })
        .await;
        Entity::find()
            .filter(Column::Seq.is_not_null())
            .order_by_asc(Column::Seq)
            .all(self.db())
            .await
            .unwrap()
    }

    /// [`Self::event_rows`] as (seq, type, task).
    pub async fn events(&self) -> Vec<(i64, String, Option<Uuid>)> {
        self.event_rows()
            .await
            .into_iter()
            .map(|e| (e.seq, e.event_type.as_str().to_string(), e.task_id.map(Into::into)))
            .collect()
    }
}

impl TestApp {
    /// Stops this berth's HTTP server and background workers (its agents are the runtime's `stop_all`), as
    /// a test that restarts berth on the same data dir and database does first.
    pub fn stop_server(&self) {
        for task in &self.background {
            task.abort();
        }
        std::mem::drop(self.handle.clone().stop(false));
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Stop the workers and the server before the database is dropped.
        self.stop_server();
    }
}

pub fn mint(config: &Config, sub: &str, scope: &str, workspaces: Option<Vec<Uuid>>, session: Option<Uuid>) -> String {
    let scopes: Vec<Scope> = scope.split_whitespace().map(|s| s.parse().unwrap()).collect();
    JwtVerifier::from_config(config)
        .unwrap()
        .mint(
            sub,
            &scopes,
            workspaces.map(|w| w.into_iter().map(Into::into).collect()),
            session.map(Into::into),
            std::time::Duration::from_secs(3600),
        )
        .unwrap()
}

/// A JSON string that is a UUID.
pub fn uuid(v: &Value) -> Uuid {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string: {v}"))
        .parse()
        .unwrap()
}

pub fn id_of(v: &Value) -> Uuid {
    v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {v}"))
        .parse()
        .unwrap()
}

impl TestApp {
    /// Creates a task over the given repositories and returns its id.
    pub async fn task(&self, workspace: Uuid, title: &str, repos: &[Uuid]) -> Uuid {
        let repos: Vec<Value> = repos
            .iter()
            .map(|r| serde_json::json!({ "repository_id": r }))
            .collect();
        let r = self
            .post(
                &format!("/api/v1/workspaces/{workspace}/tasks"),
                serde_json::json!({"title": title, "repositories": repos}),
            )
            .await;
        id_of(&r.ok(201))
    }

    /// Starts a session on a task (201 expected) and returns it.
    pub async fn session(&self, task: Uuid, executor: &str) -> Value {
        self.post(
            &format!("/api/v1/tasks/{task}/sessions"),
            serde_json::json!({"executor_type": executor, "start": false}),
        )
        .await
        .ok(201)
    }

    /// Puts a session in a state directly, as an agent runtime would (the runtime arrives later).
    pub async fn set_session_state(
        &self,
        id: Uuid,
        state: berth::entity::task_session::SessionState,
        activity: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        use berth::entity::task_session as s;
        use sea_orm::{ActiveValue::Set, EntityTrait};
        let mut am = s::ActiveModel {
            id: Set(id.into()),
            state: Set(state),
            ..Default::default()
        };
        if let Some(at) = activity {
            am.last_activity_at = Set(at);
        }
        s::Entity::update(am).exec(self.db()).await.unwrap();
    }
}

/// The first column of the first row of `sql`, an integer (a count, a maximum).
pub async fn scalar(db: &sea_orm::DatabaseConnection, sql: &str) -> i64 {
    use sea_orm::{ConnectionTrait, Statement};
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index(0).unwrap()
}
