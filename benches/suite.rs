//! berth against the bare work it wraps (issue 9), measured side by side in one run on SQLite and, when
//! `BERTH_BENCH_POSTGRES_URL` is set, on PostgreSQL (a fresh database there, dropped afterwards).
//!
//! `benches/run.sh` is the one command (it installs `wrk`, then runs `cargo bench --bench suite`). The
//! server under load is the release `berth` binary in its own process, so its resident memory is its own.
//! The bare comparisons run in this process on a pool of the same size against the same database: the
//! domain functions the handlers call (the same SELECTs and transactions, events included, without HTTP,
//! auth and JSON), a claim loop with the claim's SQL and no job logic, `git worktree add`, and spawning
//! `git rev-parse`. Admission uses criterion. Results: stdout and `target/bench-results.md`.
//!
//! Knobs: `BERTH_BENCH_SECS` (each throughput window, default 8), `BERTH_BENCH_SKIP_SQLITE`,
//! `BERTH_BENCH_GROWTH` (largest task count, default 100000), `BERTH_BENCH_JOBS` (default 10000).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use berth::auth::Principal;
use berth::domain::Ctx;
use berth::entity::{cleanup_job as job, git_status_observation as obs, task};
use sea_orm::{ActiveValue::Set, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, Statement};
use serde_json::{Value, json};
use uuid::Uuid;

const SECRET: &str = "bench-secret-bench-secret-bench-secret-0123";
const READ_CONNECTIONS: usize = 64;
const CYCLE_CLIENTS: usize = 16;
const MATERIALIZE_ROUNDS: usize = 20;
const REPLAY_EVENTS: usize = 10_000;
const FANOUT_EVENTS: usize = 1_000;
const SUBSCRIBERS: usize = 200;
const STATUS_SIZES: [usize; 3] = [10, 10_000, 1_000_000];
const STATUS_READS: usize = 300;

/// One line of the results table.
struct Row {
    backend: String,
    what: String,
    berth: String,
    bare: String,
    ratio: String,
    target: String,
    met: Option<bool>,
}

#[derive(Default)]
struct Table(Vec<Row>);

impl Table {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        backend: &str,
        what: &str,
        berth: String,
        bare: String,
        ratio: String,
        target: &str,
        met: Option<bool>,
    ) {
        let row = Row {
            backend: backend.into(),
            what: what.into(),
            berth,
            bare,
            ratio,
            target: target.into(),
            met,
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.backend,
            row.what,
            row.berth,
            row.bare,
            row.ratio,
            row.target,
            verdict(row.met)
        );
        self.0.push(row);
    }

    fn markdown(&self) -> String {
        let mut s = String::from(
            "| backend | what | berth | bare | ratio | target | met |\n| --- | --- | --- | --- | --- | --- | --- |\n",
        );
        for r in &self.0 {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.backend,
                r.what,
                r.berth,
                r.bare,
                r.ratio,
                r.target,
                verdict(r.met)
            );
        }
        s
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "reported",
    }
}

fn secs() -> u64 {
    std::env::var("BERTH_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut table = Table::default();
    println!("| backend | what | berth | bare | ratio | target | met |\n| --- | --- | --- | --- | --- | --- | --- |");
    admission(&mut table);
    rt.block_on(async {
        if std::env::var("BERTH_BENCH_SKIP_SQLITE").is_err() {
            run_backend(&mut table, "sqlite", None).await;
        }
        match std::env::var("BERTH_BENCH_POSTGRES_URL") {
            Ok(url) => run_backend(&mut table, "postgres", Some(url)).await,
            Err(_) => eprintln!("BERTH_BENCH_POSTGRES_URL is not set: SQLite only"),
        }
    });
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let out = target.join("bench-results.md");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(&out, table.markdown()).unwrap();
    eprintln!("\nresults written to {}", out.display());
}

// ---------------------------------------------------------------------------------------------------
// Admission (criterion): in-process gix against spawning git.

fn admission(table: &mut Table) {
    use berth::entity::task_environment::ExecutorType;
    use berth::executor::admission::{Candidate, Row as InvRow, Slot, admit};
    let dir = tempfile::TempDir::new().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let task_root = root.join("worktrees/task");
    let mut slots = Vec::new();
    let mut rows = Vec::new();
    for name in ["api", "web", "lib"] {
        let source = root.join(name);
        git_init(&source);
        let wt = task_root.join(name);
        git(
            &source,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                &format!("berth/{name}"),
                wt.to_str().unwrap(),
            ],
        );
        let repo_info = berth::git::inspect_worktree(&source).unwrap();
        let wt_info = berth::git::inspect_worktree(&wt).unwrap();
        let id = Uuid::now_v7();
        slots.push(Slot {
            repository_id: id,
            branch_slug: name.into(),
            common_git_dir: repo_info.common_git_dir,
            source_path: source,
        });
        rows.push(InvRow {
            repository_id: id,
            branch_slug: name.into(),
            worktree_path: Some(wt),
            worktree_id: wt_info.worktree_id,
        });
    }
    let candidate = Candidate {
        environment_id: Uuid::now_v7(),
        executor: ExecutorType::Worktree,
        ready: true,
        task_root: &task_root,
        slots: &slots,
        rows: &rows,
    };
    assert!(
        admit(&candidate, ExecutorType::Worktree).is_ok(),
        "the bench environment is admissible"
    );
    let mut c = criterion::Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .without_plots();
    c.bench_function("admission_gix_3_repositories", |b| {
        b.iter(|| admit(&candidate, ExecutorType::Worktree).unwrap())
    });
    c.bench_function("admission_spawn_git_rev_parse_3_repositories", |b| {
        b.iter(|| {
            for r in &rows {
                let out = Command::new("git")
                    .arg("-C")
                    .arg(r.worktree_path.as_ref().unwrap())
                    .args(["rev-parse", "--git-common-dir", "--show-toplevel"])
                    .output()
                    .unwrap();
                assert!(out.status.success());
            }
        })
    });
    let ours = criterion_median("admission_gix_3_repositories");
    let bare = criterion_median("admission_spawn_git_rev_parse_3_repositories");
    let speedup = bare.as_secs_f64() / ours.as_secs_f64();
    table.add(
        "-",
        "launch admission, 3 repositories (criterion median)",
        fmt_d(ours),
        format!("{} (spawn git rev-parse x3)", fmt_d(bare)),
        format!("{speedup:.1}x faster"),
        ">= 10x faster",
        Some(speedup >= 10.0),
    );
}

/// Criterion's median estimate for a benchmark it just ran.
fn criterion_median(id: &str) -> Duration {
    let base = std::env::var("CRITERION_HOME").map(PathBuf::from).unwrap_or_else(|_| {
        std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("criterion")
    });
    let path = base.join(id).join("new/estimates.json");
    let v: Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap();
    Duration::from_nanos(v["median"]["point_estimate"].as_f64().unwrap() as u64)
}

// ---------------------------------------------------------------------------------------------------
// One backend, end to end.

struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn rss_kib(&self) -> u64 {
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

struct Bench {
    backend: &'static str,
    server: Server,
    http: reqwest::Client,
    token: String,
    ctx: Ctx,
    principal: Principal,
    scratch: PathBuf,
    workspace: Uuid,
    repository: Uuid,
    /// A task with a ready environment and one session: what the reads and cycles use.
    task: Uuid,
    session: Uuid,
}

async fn run_backend(table: &mut Table, backend: &'static str, pg_server: Option<String>) {
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
    let principal = verifier.verify(&token).unwrap();

    let idle_rss = server.rss_kib();
    let mut b = Bench {
        backend,
        server,
        http,
        token,
        ctx,
        principal,
        scratch: scratch.clone(),
        workspace: Uuid::nil(),
        repository: Uuid::nil(),
        task: Uuid::nil(),
        session: Uuid::nil(),
    };
    b.workspace = id_of(&b.post("/api/v1/workspaces", json!({"name": "bench"}), 201).await);
    b.repository = id_of(
        &b.post(
            &format!("/api/v1/workspaces/{}/repositories", b.workspace),
            json!({"path": source.display().to_string()}),
            201,
        )
        .await,
    );

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
    async fn post(&self, path: &str, body: Value, expect: u16) -> Value {
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

    async fn get(&self, path: &str) -> Value {
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

// ---------------------------------------------------------------------------------------------------
// Materialization: the API's first session of a task against the `git worktree add` it runs.

async fn materialize(b: &mut Bench, table: &mut Table, source: &Path) {
    let mut api = Vec::new();
    let mut bare = Vec::new();
    for i in 0..MATERIALIZE_ROUNDS {
        let task = id_of(
            &b.post(
                &format!("/api/v1/workspaces/{}/tasks", b.workspace),
                json!({"title": format!("materialize {i}"), "repositories": [{"repository_id": b.repository}]}),
                201,
            )
            .await,
        );
        let t = Instant::now();
        let s = b
            .post(
                &format!("/api/v1/tasks/{task}/sessions"),
                json!({"executor_type": "worktree", "start": false}),
                201,
            )
            .await;
        api.push(t.elapsed());
        if i == 0 {
            b.task = task;
            b.session = id_of(&s);
        }
        let path = b.scratch.join(format!("bare/{i}"));
        let t = Instant::now();
        let out = Command::new("git")
            .arg("-C")
            .arg(source)
            .args(["worktree", "add", "-q", "-b", &format!("bare/{i}")])
            .arg(&path)
            .output()
            .unwrap();
        bare.push(t.elapsed());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (api, bare) = (median(&mut api), median(&mut bare));
    let ratio = api.as_secs_f64() / bare.as_secs_f64();
    table.add(
        b.backend,
        "materialize a 1-repository environment (first session, median of 20)",
        fmt_d(api),
        format!("{} (git worktree add)", fmt_d(bare)),
        format!("{ratio:.2}x"),
        "<= 1.3x",
        Some(ratio <= 1.3),
    );
}

/// Tops the workspace up to `n` tasks (rows inserted directly: the size is what matters).
async fn fill_tasks(b: &Bench, n: usize) {
    let conn = &b.ctx.db.conn;
    let have = task::Entity::find().count(conn).await.unwrap() as usize;
    let now = chrono::Utc::now();
    let mut i = have;
    while i < n {
        let end = (i + 1000).min(n);
        let rows = (i..end).map(|k| task::ActiveModel {
            id: Set(Uuid::now_v7()),
            workspace_id: Set(b.workspace),
            parent_task_id: Set(None),
            title: Set(format!("filler {k}")),
            slug: Set(format!("filler-{k}")),
            description: Set(String::new()),
            kind: Set(task::TaskKind::Standard),
            workspace_mode: Set(task::WorkspaceMode::NewWorkspace),
            archived_at: Set(None),
            last_activity_at: Set(now),
            created_at: Set(now),
            updated_at: Set(now),
        });
        task::Entity::insert_many(rows)
            .exec_without_returning(conn)
            .await
            .unwrap();
        i = end;
    }
    analyze(conn).await;
}

async fn analyze(conn: &DatabaseConnection) {
    exec(conn, "ANALYZE").await;
}

// ---------------------------------------------------------------------------------------------------
// Reads, session cycles, replay and fan-out, at one database size.

async fn load(b: &Bench, table: &mut Table, size: &str, events: bool) {
    let secs = secs();
    for (name, path) in [
        ("GET /api/v1/tasks/{id}", format!("/api/v1/tasks/{}", b.task)),
        ("GET /api/v1/sessions/{id}", format!("/api/v1/sessions/{}", b.session)),
    ] {
        let w = wrk(b, &path, READ_CONNECTIONS, secs, None);
        assert_eq!(w.failures, 0, "{name}: {} failed responses", w.failures);
        let bare = {
            let (ctx, p, task, session) = (b.ctx.clone(), b.principal.clone(), b.task, b.session);
            let is_task = name.contains("tasks");
            concurrent(READ_CONNECTIONS, secs, move || {
                let (ctx, p) = (ctx.clone(), p.clone());
                async move {
                    if is_task {
                        berth::domain::tasks::get(&ctx, &p, task).await.unwrap();
                    } else {
                        berth::domain::sessions::get(&ctx, &p, session).await.unwrap();
                    }
                }
            })
            .await
        };
        let ratio = w.rate / bare.rate;
        table.add(
            b.backend,
            &format!("{name}, 64 connections, {size}"),
            format!("{:.0}/s, p99 {}", w.rate, w.p99),
            format!("{:.0}/s, p99 {} (domain SELECTs)", bare.rate, fmt_d(bare.p99)),
            format!("{:.0}%", ratio * 100.0),
            ">= 50% of bare",
            Some(ratio >= 0.5),
        );
    }

    let script = b.scratch.join("cycle.lua");
    std::fs::write(&script, CYCLE_LUA).unwrap();
    let w = wrk(
        b,
        &format!("/api/v1/tasks/{}/sessions", b.task),
        CYCLE_CLIENTS,
        secs,
        Some(&script),
    );
    assert_eq!(
        w.failures, 0,
        "session cycles: {} failed responses\n{}",
        w.failures, w.raw
    );
    let bare = {
        let (ctx, p, task) = (b.ctx.clone(), b.principal.clone(), b.task);
        concurrent(CYCLE_CLIENTS, secs, move || {
            let (ctx, p) = (ctx.clone(), p.clone());
            async move {
                let s = berth::domain::sessions::create(
                    &ctx,
                    &p,
                    task,
                    berth::domain::sessions::NewSession {
                        executor_type: berth::entity::task_environment::ExecutorType::Worktree,
                        agent_profile: None,
                        name: None,
                        prompt: None,
                        start: Some(false),
                    },
                )
                .await
                .unwrap();
                berth::domain::sessions::delete(&ctx, &p, s.session.id).await.unwrap();
            }
        })
        .await
    };
    let ratio = w.cycles_rate / bare.rate;
    table.add(
        b.backend,
        &format!("session create + delete cycle, 16 clients, {size}"),
        format!("{:.0} cycles/s", w.cycles_rate),
        format!("{:.0} cycles/s (domain transactions, events included)", bare.rate),
        format!("{:.0}%", ratio * 100.0),
        ">= 40% of bare",
        Some(ratio >= 0.4),
    );

    if events {
        replay(b, table).await;
        fanout(b, table).await;
    }
}

struct Throughput {
    rate: f64,
    p99: Duration,
}

/// Runs `op` from `n` tasks for `secs` seconds; rate per second and p99 latency.
async fn concurrent<F, Fut>(n: usize, secs: u64, op: F) -> Throughput
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (op, stop, done) = (op.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    op().await;
                    lat.push(t.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
                lat
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    all.sort();
    Throughput {
        rate: all.len() as f64 / elapsed.as_secs_f64(),
        p99: all.get(all.len() * 99 / 100).copied().unwrap_or_default(),
    }
}

/// wrk's cycle script: a session create, then (on any of the thread's connections) its delete.
const CYCLE_LUA: &str = r#"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  token = args[1]
  pending = {}
  creates, deletes, failures = 0, 0, 0
end
function request()
  local headers = { ["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json" }
  local id = table.remove(pending)
  if id then return wrk.format("DELETE", "/api/v1/sessions/" .. id, headers) end
  return wrk.format("POST", nil, headers, '{"executor_type":"worktree","start":false}')
end
function response(status, headers, body)
  if status == 201 then
    creates = creates + 1
    table.insert(pending, string.match(body, '"id":"([^"]+)"'))
  elseif status == 204 then
    deletes = deletes + 1
  else
    failures = failures + 1
  end
end
function done(summary, latency, requests)
  local c, d, f = 0, 0, 0
  for _, t in ipairs(threads) do c = c + t:get("creates"); d = d + t:get("deletes"); f = f + t:get("failures") end
  io.write(string.format("cycles creates=%d deletes=%d failures=%d\n", c, d, f))
end
"#;

struct Wrk {
    rate: f64,
    p99: String,
    failures: u64,
    cycles_rate: f64,
    raw: String,
}

fn wrk(b: &Bench, path: &str, connections: usize, secs: u64, script: Option<&Path>) -> Wrk {
    let mut cmd = Command::new("wrk");
    cmd.args(["-t2", &format!("-c{connections}"), &format!("-d{secs}s"), "--latency"]);
    match script {
        Some(s) => {
            cmd.arg("-s").arg(s);
            cmd.arg(format!("{}{path}", b.server.url)).arg("--").arg(&b.token);
        }
        None => {
            cmd.args(["-H", &format!("Authorization: Bearer {}", b.token)]);
            cmd.arg(format!("{}{path}", b.server.url));
        }
    }
    let out = cmd.output().expect("wrk is installed (benches/run.sh installs it)");
    let raw = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "wrk failed: {raw}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |prefix: &str| {
        raw.lines()
            .find_map(|l| l.trim().strip_prefix(prefix).map(|v| v.trim().to_string()))
    };
    let rate: f64 = field("Requests/sec:").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let p99 = field("99%").unwrap_or_default();
    let mut failures: u64 = field("Non-2xx or 3xx responses:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut cycles_rate = 0.0;
    if let Some(line) = raw.lines().find(|l| l.starts_with("cycles ")) {
        let get = |k: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        failures += get("failures=");
        cycles_rate = get("deletes=") as f64 / secs as f64;
    }
    // Socket errors (connect, read, write, timeout) count as failures too.
    if let Some(errors) = field("Socket errors:") {
        failures += errors
            .split(',')
            .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Wrk {
        rate,
        p99,
        failures,
        cycles_rate,
        raw,
    }
}

/// Replay of 10,000 events through `GET /events` pages, against writing them (one transaction each).
async fn replay(b: &Bench, table: &mut Table) {
    let latest = b.get("/api/v1/events?limit=1").await["latest_seq"].as_i64().unwrap();
    let t = Instant::now();
    for i in 0..REPLAY_EVENTS {
        let txn = b.ctx.db.begin_write().await.unwrap();
        berth::events::append(
            &txn,
            b.ctx.instance_id,
            "task.updated",
            berth::events::Subject::task(b.workspace, b.task),
            json!({"id": b.task, "title": "bench", "n": i}),
        )
        .await
        .unwrap();
        txn.commit().await.unwrap();
    }
    let write = t.elapsed();
    let t = Instant::now();
    let mut after = latest;
    let mut got = 0;
    while got < REPLAY_EVENTS {
        let page = b.get(&format!("/api/v1/events?after={after}&limit=1000")).await;
        let events = page["events"].as_array().unwrap();
        assert!(!events.is_empty(), "replay ended early at {got}");
        got += events.len();
        after = events.last().unwrap()["seq"].as_i64().unwrap();
    }
    let read = t.elapsed();
    let rate = got as f64 / read.as_secs_f64();
    let write_rate = REPLAY_EVENTS as f64 / write.as_secs_f64();
    table.add(
        b.backend,
        "event replay of 10,000 events (pages of 1,000 over HTTP)",
        format!("{rate:.0} events/s"),
        format!("{write_rate:.0} events/s written (one transaction each)"),
        format!("{:.1}x the write rate", rate / write_rate),
        ">= 50,000 events/s",
        Some(rate >= 50_000.0),
    );
}

/// 200 SSE subscribers, 1,000 events written through the API (PATCH task), every subscriber gets all.
async fn fanout(b: &Bench, table: &mut Table) {
    let latest = b.get("/api/v1/events?limit=1").await["latest_seq"].as_i64().unwrap();
    let ready = Arc::new(tokio::sync::Semaphore::new(0));
    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            let (http, url, token, ready) = (
                reqwest::Client::new(),
                format!("{}/api/v1/events/stream?after={latest}", b.server.url),
                b.token.clone(),
                ready.clone(),
            );
            let task = b.task.to_string();
            tokio::spawn(async move {
                let mut r = http.get(url).bearer_auth(token).send().await.unwrap();
                assert!(r.status().is_success());
                let (mut buf, mut got, mut resets) = (String::new(), 0usize, 0usize);
                let deadline = Instant::now() + Duration::from_secs(300);
                while got < FANOUT_EVENTS && Instant::now() < deadline {
                    let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(30), r.chunk()).await else {
                        break;
                    };
                    buf.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = buf.find("\n\n") {
                        let frame: String = buf.drain(..end + 2).collect();
                        if frame.contains("event: ready") {
                            ready.add_permits(1);
                        } else if frame.contains("event: reset") {
                            resets += 1;
                        } else if frame.contains("\"task.updated\"") && frame.contains(&task) {
                            got += 1;
                        }
                    }
                }
                (got, resets, Instant::now())
            })
        })
        .collect();
    let all_ready = ready.acquire_many(SUBSCRIBERS as u32);
    tokio::time::timeout(Duration::from_secs(120), all_ready)
        .await
        .expect("every subscriber is live within 2 minutes")
        .unwrap()
        .forget();
    let start = Instant::now();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (http, url, token) = (
                b.http.clone(),
                format!("{}/api/v1/tasks/{}", b.server.url, b.task),
                b.token.clone(),
            );
            tokio::spawn(async move {
                for i in (w..FANOUT_EVENTS).step_by(4) {
                    let r = http
                        .patch(&url)
                        .bearer_auth(&token)
                        .json(&json!({"description": format!("update {i}")}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let written = start.elapsed();
    let (mut complete, mut resets, mut last) = (0, 0, start);
    for s in subscribers {
        let (got, r, at) = s.await.unwrap();
        complete += usize::from(got == FANOUT_EVENTS);
        resets += r;
        last = last.max(at);
    }
    let delivered = last - start;
    let ok = complete == SUBSCRIBERS && resets == 0;
    table.add(
        b.backend,
        "SSE fan-out: 1,000 events (PATCH task) to 200 subscribers",
        format!(
            "all delivered {} after the first write; {complete}/200 complete, {resets} resets",
            fmt_d(delivered)
        ),
        format!("{} to write them (4 writers)", fmt_d(written)),
        format!("{:.2}x the write time", delivered.as_secs_f64() / written.as_secs_f64()),
        "every subscriber gets all 1,000, none reset",
        Some(ok),
    );
}

// ---------------------------------------------------------------------------------------------------
// Cleanup claims: the workers on no-op jobs against a bare claim loop of the same SQL.

async fn claims(b: &Bench, table: &mut Table) {
    let n = env_usize("BERTH_BENCH_JOBS", 10_000);
    for workers in [1usize, 4] {
        insert_jobs(b, n).await;
        let t = Instant::now();
        let handles: Vec<_> = (0..workers)
            .map(|i| tokio::spawn(berth::worker::cleanup::run(b.ctx.clone(), i)).abort_handle())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(1800);
        loop {
            let done = count(&b.ctx.db.conn, "SELECT COUNT(*) AS n FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare' AND state = 'succeeded'").await;
            if done as usize == n {
                break;
            }
            assert!(Instant::now() < deadline, "claims did not finish: {done}/{n}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ours = t.elapsed();
        handles.iter().for_each(|h| h.abort());
        let twice = count(
            &b.ctx.db.conn,
            "SELECT COUNT(*) AS n FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare' AND attempts <> 1",
        )
        .await;
        exec(
            &b.ctx.db.conn,
            "DELETE FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare'",
        )
        .await;

        insert_jobs(b, n).await;
        let t = Instant::now();
        let loops: Vec<_> = (0..workers)
            .map(|_| {
                let ctx = b.ctx.clone();
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    while let Some(id) = bare_claim(&ctx).await {
                        got.push(id);
                    }
                    got
                })
            })
            .collect();
        let mut ids = Vec::new();
        for l in loops {
            ids.extend(l.await.unwrap());
        }
        let bare = t.elapsed();
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), n);
        exec(
            &b.ctx.db.conn,
            "DELETE FROM task_resource_cleanup_jobs WHERE node_id = 'bench-bare'",
        )
        .await;

        let (ours_rate, bare_rate) = (n as f64 / ours.as_secs_f64(), n as f64 / bare.as_secs_f64());
        let ratio = ours_rate / bare_rate;
        table.add(
            b.backend,
            &format!("cleanup claims, {n} no-op jobs, {workers} worker(s)"),
            format!("{ours_rate:.0} jobs/s (claim, run, record); claimed twice: {twice}"),
            format!(
                "{bare_rate:.0} claims/s (same SQL, no job logic); claimed twice: {}",
                ids.len() - unique.len()
            ),
            format!("{:.0}%", ratio * 100.0),
            ">= 50% of bare, none twice",
            Some(ratio >= 0.5 && twice == 0 && ids.len() == unique.len()),
        );
    }
}

async fn insert_jobs(b: &Bench, n: usize) {
    let now = chrono::Utc::now() - chrono::Duration::seconds(1);
    let snapshot = json!({"task_id": Uuid::nil(), "workspace_id": b.workspace, "environment": null, "sessions": [], "discard_worktree_changes": false, "keep_branches": true});
    let mut i = 0;
    while i < n {
        let end = (i + 500).min(n);
        let rows = (i..end).map(|_| job::ActiveModel {
            id: Set(Uuid::now_v7()),
            operation_id: Set(Uuid::now_v7()),
            task_id: Set(Uuid::now_v7()),
            workspace_id: Set(b.workspace),
            task_environment_id: Set(None),
            trigger: Set(job::CleanupTrigger::Delete),
            state: Set(job::CleanupJobState::Pending),
            attempts: Set(0),
            max_attempts: Set(8),
            next_attempt_at: Set(Some(now)),
            last_error: Set(None),
            resource_snapshot: Set(snapshot.clone()),
            node_id: Set("bench-bare".into()),
            lease_owner: Set(None),
            lease_expires_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            completed_at: Set(None),
        });
        job::Entity::insert_many(rows)
            .exec_without_returning(&b.ctx.db.conn)
            .await
            .unwrap();
        i = end;
    }
    analyze(&b.ctx.db.conn).await;
}

/// The claim's SQL (the same `next_claimable` queries and update as `worker::cleanup::claim`), nothing else.
async fn bare_claim(ctx: &Ctx) -> Option<Uuid> {
    let now = chrono::Utc::now();
    let txn = ctx.db.begin_write().await.unwrap();
    let found = berth::worker::cleanup::next_claimable(&txn, "bench-bare", now)
        .await
        .unwrap()?;
    job::Entity::update(job::ActiveModel {
        id: Set(found.id),
        state: Set(job::CleanupJobState::Succeeded),
        attempts: Set(found.attempts + 1),
        lease_owner: Set(Some("bare".into())),
        lease_expires_at: Set(Some(now)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(&txn)
    .await
    .unwrap();
    txn.commit().await.unwrap();
    Some(found.id)
}

// ---------------------------------------------------------------------------------------------------
// Current git status against the size of the observation history.

async fn git_status(b: &Bench, table: &mut Table) {
    let env: Value = b.get(&format!("/api/v1/tasks/{}/environment", b.task)).await;
    let env_id: Uuid = env["id"].as_str().unwrap().parse().unwrap();
    let conn = &b.ctx.db.conn;
    let mut stored = 0;
    let mut base = None;
    for size in STATUS_SIZES {
        insert_observations(conn, env_id, b.repository, stored, size).await;
        stored = size;
        analyze(conn).await;
        let mut times = Vec::with_capacity(STATUS_READS);
        for _ in 0..STATUS_READS {
            let t = Instant::now();
            let current = berth::domain::git_status::read_current_on(conn, env_id, vec![b.repository])
                .await
                .unwrap();
            times.push(t.elapsed());
            assert_eq!(current.len(), 1);
        }
        times.sort();
        let (med, p99) = (times[STATUS_READS / 2], times[STATUS_READS * 99 / 100]);
        let base = *base.get_or_insert(med);
        let ratio = med.as_secs_f64() / base.as_secs_f64();
        table.add(
            b.backend,
            &format!("current git status read, {size} stored observations"),
            format!("median {}, p99 {}", fmt_d(med), fmt_d(p99)),
            "the 10-observation read".into(),
            format!("{ratio:.2}x"),
            "1M within 2x of 10",
            (size == 1_000_000).then_some(ratio <= 2.0),
        );
    }
}

async fn insert_observations(conn: &DatabaseConnection, env_id: Uuid, repo: Uuid, from: usize, to: usize) {
    let start = chrono::Utc::now() - chrono::Duration::days(30);
    let files = json!([{"path": "src/main.rs", "index_status": "unmodified", "worktree_status": "modified"}]);
    let mut i = from;
    while i < to {
        let end = (i + 1000).min(to);
        let rows = (i..end).map(|n| obs::ActiveModel {
            id: Set(Uuid::now_v7()),
            task_environment_id: Set(env_id),
            repository_id: Set(repo),
            session_id: Set(None),
            kind: Set("archive".into()),
            observed_at: Set(start + chrono::Duration::milliseconds(n as i64)),
            branch: Set(Some("berth/bench".into())),
            head_commit: Set(None),
            upstream: Set(None),
            ahead: Set(0),
            behind: Set(0),
            files: Set(files.clone()),
            created_at: Set(start),
        });
        obs::Entity::insert_many(rows)
            .exec_without_returning(conn)
            .await
            .unwrap();
        i = end;
    }
}

// ---------------------------------------------------------------------------------------------------
// Small things.

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn git_init(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), "bench\n").unwrap();
    git(dir, &["add", "."]);
    git(
        dir,
        &[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            "commit",
            "-q",
            "-m",
            "init",
        ],
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_ready(http: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = http.get(format!("{url}/readyz")).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "the server did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn exec(conn: &DatabaseConnection, sql: &str) {
    conn.execute_raw(Statement::from_string(conn.get_database_backend(), sql.to_string()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn count(conn: &DatabaseConnection, sql: &str) -> i64 {
    let row = conn
        .query_one_raw(Statement::from_string(conn.get_database_backend(), sql.to_string()))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "n").unwrap()
}

fn id_of(v: &Value) -> Uuid {
    v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {v}"))
        .parse()
        .unwrap()
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn fmt_d(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    } else if d < Duration::from_secs(1) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}
