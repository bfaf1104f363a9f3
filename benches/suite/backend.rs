//! One backend, end to end.
use super::*;

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) url: String,
}

impl Server {
    pub(crate) fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub(crate) fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The release berth serving in its own process with `config_file` (on a fresh PostgreSQL database when
/// `pg_server` is given), ready, and an admin token for it.
pub(crate) struct Served {
    pub(crate) server: Server,
    pub(crate) pid: u32,
    pub(crate) http: reqwest::Client,
    pub(crate) token: String,
    pg_db: Option<(DatabaseConnection, String)>,
}

impl Served {
    pub(crate) async fn start(scratch: &Path, config_file: &Path, pg_server: &Option<String>, node: &str) -> Served {
        let mut env = BTreeMap::new();
        env.insert("BERTH_DATA_DIR".to_string(), scratch.join("data").display().to_string());
        env.insert("BERTH_JWT_SECRET".to_string(), SECRET.to_string());
        env.insert(
            "BERTH_WORKTREE_ROOT".to_string(),
            scratch.join("worktrees").display().to_string(),
        );
        env.insert(
            "BERTH_REPO_ROOTS".to_string(),
            scratch.join("repos").display().to_string(),
        );
        env.insert("BERTH_CONFIG".to_string(), config_file.display().to_string());
        let mut pg_db = None;
        if let Some(server) = pg_server {
            let name = format!("berth_bench_{}", Uuid::new_v4().simple());
            let admin = sea_orm::Database::connect(server.as_str()).await.unwrap();
            exec(&admin, &format!("CREATE DATABASE \"{name}\"")).await;
            let mut url = reqwest::Url::parse(server).unwrap();
            url.set_path(&format!("/{name}"));
            env.insert("BERTH_DATABASE_URL".to_string(), url.to_string());
            pg_db = Some((admin, name));
        }
        let port = free_port();
        env.insert("BERTH_BIND".to_string(), format!("127.0.0.1:{port}"));
        let log = std::fs::File::create(scratch.join("server.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .arg("serve")
            .envs(&env)
            .env("BERTH_NODE_ID", node)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let pid = server.child.id();
        let http = reqwest::Client::new();
        wait_ready(&http, &server.url).await;
        let verifier = berth::auth::JwtVerifier::from_config(&berth::config::Config::load(&env).unwrap()).unwrap();
        let token = verifier
            .mint(
                "bench",
                &[berth::auth::Scope::Admin],
                None,
                None,
                Duration::from_secs(7200),
            )
            .unwrap();
        Served {
            server,
            pid,
            http,
            token,
            pg_db,
        }
    }

    /// A scratch directory with a repository (`repos/svc`) and a config whose one profile, `test`, is
    /// `berth-test-agent`, and the release berth serving it: (the directory's guard, its path, the
    /// repository, the server).
    pub(crate) async fn with_test_agent(
        pg_server: &Option<String>,
        node: &str,
    ) -> (tempfile::TempDir, PathBuf, PathBuf, Served) {
        let dir = tempfile::TempDir::new().unwrap();
        let scratch = dir.path().canonicalize().unwrap();
        for d in ["data", "worktrees", "repos"] {
            std::fs::create_dir_all(scratch.join(d)).unwrap();
        }
        let source = scratch.join("repos/svc");
        git_init(&source);
        let config_file = scratch.join("berth.toml");
        std::fs::write(
            &config_file,
            format!(
                "[agents.test]\ncommand = \"{}\"\n",
                env!("CARGO_BIN_EXE_berth-test-agent")
            ),
        )
        .unwrap();
        let served = Served::start(&scratch, &config_file, pg_server, node).await;
        (dir, scratch, source, served)
    }

    /// Stops the server and drops its database.
    pub(crate) async fn stop(self) {
        let Served { server, pg_db, .. } = self;
        drop(server);
        if let Some((admin, name)) = pg_db {
            tokio::time::sleep(Duration::from_millis(200)).await;
            exec(&admin, &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
        }
    }
}

pub(crate) struct Bench {
    pub(crate) backend: &'static str,
    pub(crate) server: Server,
    pub(crate) http: reqwest::Client,
    pub(crate) token: String,
    pub(crate) ctx: Ctx,
    pub(crate) principal: UnboundPrincipal,
    pub(crate) scratch: PathBuf,
    pub(crate) workspace: WorkspaceId,
    pub(crate) repository: RepositoryId,
    /// A task with a ready environment and one session: what the reads and cycles use.
    pub(crate) task: TaskId,
    pub(crate) session: SessionId,
}

/// `claims_only`: set up, then only the claim rows (`cargo bench --bench suite -- claims`).
pub(crate) async fn run_backend(
    table: &mut Table,
    backend: &'static str,
    pg_server: Option<String>,
    only: Option<&str>,
) {
    eprintln!("\n== {backend}");
    let dir = tempfile::TempDir::new().unwrap();
    let scratch = dir.path().canonicalize().unwrap();
    for d in ["data", "worktrees", "repos"] {
        std::fs::create_dir_all(scratch.join(d)).unwrap();
    }
    let source = scratch.join("repos/svc");
    git_init(&source);
    let mut env = BTreeMap::new();
    env.insert("BERTH_DATA_DIR".to_string(), scratch.join("data").display().to_string());
    env.insert("BERTH_JWT_SECRET".to_string(), SECRET.to_string());
    env.insert(
        "BERTH_WORKTREE_ROOT".to_string(),
        scratch.join("worktrees").display().to_string(),
    );
    env.insert(
        "BERTH_REPO_ROOTS".to_string(),
        scratch.join("repos").display().to_string(),
    );
    let mut pg_db = None;
    if let Some(server) = &pg_server {
        let name = format!("berth_bench_{}", Uuid::new_v4().simple());
        let admin = sea_orm::Database::connect(server.as_str()).await.unwrap();
        exec(&admin, &format!("CREATE DATABASE \"{name}\"")).await;
        let mut url = reqwest::Url::parse(server).unwrap();
        url.set_path(&format!("/{name}"));
        env.insert("BERTH_DATABASE_URL".to_string(), url.to_string());
        pg_db = Some((admin, name));
    }

    // The server under test: the release binary, its own process, default settings otherwise.
    let port = free_port();
    let log = std::fs::File::create(scratch.join("server.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("serve")
        .envs(&env)
        .env("BERTH_BIND", format!("127.0.0.1:{port}"))
        .env("BERTH_NODE_ID", "bench-server")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::new();
    wait_ready(&http, &server.url).await;

    // The bare side: this process, the same database, a pool of the same size, its own node id.
    let mut local = env.clone();
    local.insert("BERTH_BIND".into(), "127.0.0.1:0".into());
    local.insert("BERTH_NODE_ID".into(), "bench-bare".into());
    local.insert("BERTH_CLEANUP_WORKERS".into(), "0".into());
    local.insert("BERTH_CLEANUP_POLL_MS".into(), "20".into());
    let config = berth::config::Config::load(&local).unwrap();
    let app = berth::startup::Application::build(config).await.unwrap();
    let ctx = app.state.ctx.clone();
    let verifier = app.state.verifier.clone();
    let token = verifier
        .mint(
            "bench",
            &[berth::auth::Scope::Admin],
            None,
            None,
            Duration::from_secs(7200),
        )
        .unwrap();
    let principal = verifier.verify(&token).unwrap().unbound().unwrap();

    let idle_rss = server.rss_kib();
    let mut b = Bench {
        backend,
        server,
        http,
        token,
        ctx,
        principal,
        scratch: scratch.clone(),
        workspace: Uuid::nil().into(),
        repository: Uuid::nil().into(),
        task: Uuid::nil().into(),
        session: Uuid::nil().into(),
    };
    b.workspace = id_of(&b.post("/api/v1/workspaces", json!({"name": "bench"}), 201).await).into();
    b.repository = id_of(
        &b.post(
            &format!("/api/v1/workspaces/{}/repositories", b.workspace),
            json!({"path": source.display().to_string()}),
            201,
        )
        .await,
    )
    .into();

    if only == Some("claims") {
        claims(&b, table).await;
    } else if only == Some("webhooks") {
        webhooks(&b, table).await;
    } else if only == Some("materialize") {
        materialize(&mut b, table, &source).await;
    } else if only == Some("reads") {
        materialize(&mut b, table, &source).await;
        fill_tasks(&b, 1_000).await;
        load(&b, table, "1,000 tasks", false).await;
        load(&b, table, "1,000 tasks, second run", false).await;
    } else {
        materialize(&mut b, table, &source).await;
        fill_tasks(&b, 1_000).await;
        load(&b, table, "1,000 tasks", true).await;
        let rss_first = b.server.rss_kib();
        load(&b, table, "1,000 tasks, second run", false).await;
        let rss_second = b.server.rss_kib();
        let growth = rss_second as f64 / rss_first.max(1) as f64;
        table.add(
            backend,
            "server resident memory: idle / after load / after an identical second load",
            format!("{} / {} / {} MiB", idle_rss / 1024, rss_first / 1024, rss_second / 1024),
            "-".into(),
            format!("{growth:.2} (second / first)"),
            "no growth across the second run (<= 1.10)",
            Some(growth <= 1.10),
        );
        let big = env_usize("BERTH_BENCH_GROWTH", 100_000);
        fill_tasks(&b, big).await;
        load(&b, table, &format!("{big} tasks"), false).await;
        claims(&b, table).await;
        git_status(&b, table).await;
        webhooks(&b, table).await;
    }

    drop(b);
    for h in app.background() {
        h.abort();
    }
    if let Some((admin, name)) = pg_db {
        tokio::time::sleep(Duration::from_millis(200)).await;
        exec(&admin, &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await;
    }
}

impl Bench {
    pub(crate) async fn post(&self, path: &str, body: Value, expect: u16) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.server.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, expect, "POST {path}: {v}");
        v
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.server.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().await.unwrap()
    }
}
