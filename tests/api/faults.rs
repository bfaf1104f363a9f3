//! Faults a deployment meets: berth killed with SIGKILL mid-workload, its git CLI failing, two
//! processes sharing one node id. After each, nothing committed is lost and the invariants hold
//! (`assert_invariants`): every worktree on disk is in some inventory or in an unfinished job's
//! snapshot; every active inventory row's worktree exists or its environment failed; no job is stuck
//! `running` past its lease.
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{Backend, TestApp, git_repo, id_of};

both_backends!(
    sigkill_at_random_points_loses_nothing,
    a_failing_git_cli_is_retried_until_jobs_complete,
    two_processes_with_one_node_id_run_each_job_once,
    postgres_restarting_under_load_answers_503_and_loses_nothing,
    a_full_disk_on_sqlite_answers_503_and_corrupts_nothing,
    a_materialization_that_loses_to_a_delete_records_its_branch_and_progress,
    a_materializer_killed_after_a_delete_leaves_no_worktree,
    a_transition_killed_after_a_delete_leaves_no_worktree,
    a_transition_slower_than_its_lease_keeps_it,
    a_lifecycle_job_waits_in_place_for_a_materializer_of_its_process,
);

const WAIT: Duration = Duration::from_secs(90);

/// A `berth serve` of its own (the release of a test, not the in-process server), on the test's database.
pub(crate) struct Berth {
    pub(crate) child: Child,
    pub(crate) base: String,
}

impl Drop for Berth {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Settings for the processes: the test's database, its own data dir (so its node id is its own and the
/// in-process server never claims its jobs), quick leases and retries.
pub(crate) fn process_env(app: &TestApp, data_dir: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for key in ["BERTH_JWT_SECRET", "BERTH_DATABASE_URL"] {
        if let Some(v) = app.env.get(key) {
            env.insert(key.to_string(), v.clone());
        }
    }
    std::fs::create_dir_all(data_dir).unwrap();
    env.insert("BERTH_DATA_DIR".into(), data_dir.display().to_string());
    env.insert("BERTH_DB_MAX_CONNECTIONS".into(), "5".into());
    env.insert("BERTH_CLEANUP_POLL_MS".into(), "50".into());
    env.insert("BERTH_CLEANUP_RETRY_DELAYS_SECS".into(), "0.05".into());
    env.insert("BERTH_CLEANUP_MAX_ATTEMPTS".into(), "50".into());
    env.insert("BERTH_CLEANUP_LEASE_SECS".into(), "2".into());
    env.insert("BERTH_CLEANUP_PREPARED_GRACE_SECS".into(), "1".into());
    env.insert("BERTH_MATERIALIZE_LEASE_SECS".into(), "2".into());
    env.insert("BERTH_EVENT_POLL_MS".into(), "100".into());
    env.insert("BERTH_SWEEP_INTERVAL_MS".into(), "300".into());
    env.insert("RUST_LOG".into(), "warn".into());
    env
}

pub(crate) fn start(env: &BTreeMap<String, String>, path_prefix: Option<&Path>, log: &Path) -> Berth {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berth"));
    cmd.arg("serve")
        .envs(env)
        .env("BERTH_BIND", format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap());
    if let Some(prefix) = path_prefix {
        cmd.env(
            "PATH",
            format!("{}:{}", prefix.display(), std::env::var("PATH").unwrap_or_default()),
        );
    }
    Berth {
        child: cmd.spawn().expect("berth starts"),
        base: format!("http://127.0.0.1:{port}"),
    }
}

pub(crate) async fn wait_ready(client: &reqwest::Client, b: &mut Berth) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(r) = client.get(format!("{}/readyz", b.base)).send().await
            && r.status().is_success()
        {
            return;
        }
        if let Ok(Some(status)) = b.child.try_wait() {
            panic!("berth exited while starting: {status}");
        }
        assert!(tokio::time::Instant::now() < deadline, "berth never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn call(client: &reqwest::Client, token: &str, method: Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut req = client
        .request(method, url)
        .bearer_auth(token)
        .timeout(Duration::from_secs(30));
    if let Some(b) = body {
        req = req.json(&b);
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// A workspace and a registered repository, made through the process (on SQLite its database is its own).
async fn setup(client: &reqwest::Client, base: &str, token: &str, scratch: &Path) -> (Uuid, Uuid, PathBuf) {
    let (status, w) = call(
        client,
        token,
        Method::POST,
        format!("{base}/api/v1/workspaces"),
        Some(json!({"name": "ws"})),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    let ws = id_of(&w);
    let source = git_repo(&scratch.join("svc"), "main");
    let (status, r) = call(
        client,
        token,
        Method::POST,
        format!("{base}/api/v1/workspaces/{ws}/repositories"),
        Some(json!({"path": source})),
    )
    .await;
    assert_eq!(status, 201, "{r}");
    (ws, id_of(&r), source)
}

/// A task over `repo` whose first session (without an agent) materialized its worktree.
async fn task_with_worktree(
    client: &reqwest::Client,
    token: &str,
    api: &str,
    ws: Uuid,
    repo: Uuid,
    title: &str,
) -> Uuid {
    let (status, t) = call(
        client,
        token,
        Method::POST,
        format!("{api}/workspaces/{ws}/tasks"),
        Some(json!({"title": title, "repositories": [{"repository_id": repo}]})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    let task = id_of(&t);
    let (status, s) = call(
        client,
        token,
        Method::POST,
        format!("{api}/tasks/{task}/sessions"),
        Some(json!({"executor_type": "worktree", "start": false})),
    )
    .await;
    assert_eq!(status, 201, "{s}");
    task
}

/// A connection of the test's own to the database the processes use.
async fn connect(app: &TestApp, data_dir: &Path) -> DatabaseConnection {
    let url = match app.env.get("BERTH_DATABASE_URL") {
        Some(url) => url.clone(),
        None => format!("sqlite://{}?mode=rw", data_dir.join("berth.db").display()),
    };
    sea_orm::Database::connect(url).await.unwrap()
}

async fn rows(conn: &DatabaseConnection, sql: &str) -> Vec<sea_orm::QueryResult> {
    conn.query_all_raw(Statement::from_string(conn.get_database_backend(), sql.to_string()))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Waits (with a deadline) until the invariants hold: work a crash interrupted is finished by the sweep.
async fn assert_invariants(conn: &DatabaseConnection, worktree_root: &Path) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match invariants(conn, worktree_root).await {
            Ok(()) => return,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The three invariants this file's header names, checked against the disk and the database.
async fn invariants(conn: &DatabaseConnection, worktree_root: &Path) -> Result<(), String> {
    let mut known: HashSet<String> = HashSet::new();
    for r in rows(
        conn,
        "SELECT worktree_path FROM task_environment_repos WHERE worktree_path IS NOT NULL AND deleted_at IS NULL",
    )
    .await
    {
        known.insert(r.try_get::<String>("", "worktree_path").unwrap());
    }
    for r in rows(
        conn,
        "SELECT resource_snapshot FROM task_resource_cleanup_jobs WHERE state NOT IN ('succeeded', 'cancelled')",
    )
    .await
    {
        let snap: Value = r.try_get("", "resource_snapshot").unwrap();
        for w in snap["environment"]["worktrees"].as_array().into_iter().flatten() {
            known.insert(w["worktree_path"].as_str().unwrap().to_string());
        }
    }
    // Every worktree on disk (a directory with a `.git` file two levels under the root) is accounted for.
    for task_dir in std::fs::read_dir(worktree_root).unwrap().flatten() {
        for entry in std::fs::read_dir(task_dir.path()).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.join(".git").is_file() && !known.contains(&path.display().to_string()) {
                return Err(format!(
                    "a worktree on disk is in no inventory and no unfinished job: {}",
                    path.display()
                ));
            }
        }
    }
    // Every active inventory row's worktree exists, unless its environment failed.
    for r in rows(
        conn,
        "SELECT r.worktree_path AS path, e.status AS status FROM task_environment_repos r \
         JOIN task_environments e ON e.id = r.task_environment_id \
         WHERE r.status = 'active' AND r.worktree_path IS NOT NULL AND e.executor_type = 'worktree'",
    )
    .await
    {
        let path: String = r.try_get("", "path").unwrap();
        let status: String = r.try_get("", "status").unwrap();
        if !(Path::new(&path).exists() || status == "failed") {
            return Err(format!(
                "an active inventory row's worktree is missing ({status}): {path}"
            ));
        }
    }
    // No job is stuck running past its lease (two seconds of slack for a heartbeat in flight).
    let now = chrono::Utc::now() - chrono::Duration::seconds(2);
    for r in rows(
        conn,
        "SELECT id, lease_expires_at FROM task_resource_cleanup_jobs WHERE state = 'running'",
    )
    .await
    {
        let lease: Option<chrono::DateTime<chrono::Utc>> = r.try_get("", "lease_expires_at").unwrap();
        if lease.is_none_or(|l| l <= now) {
            return Err("a job is running past its lease".into());
        }
    }
    Ok(())
}

/// Waits until no job is unfinished; returns the states of all jobs.
async fn wait_jobs_finished(conn: &DatabaseConnection) -> Vec<(String, i32)> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let all: Vec<(String, i32)> = rows(conn, "SELECT state, attempts FROM task_resource_cleanup_jobs")
            .await
            .into_iter()
            .map(|r| (r.try_get("", "state").unwrap(), r.try_get("", "attempts").unwrap()))
            .collect();
        if all
            .iter()
            .all(|(s, _)| matches!(s.as_str(), "succeeded" | "cancelled" | "failed"))
        {
            return all;
        }
        assert!(tokio::time::Instant::now() < deadline, "jobs never finished: {all:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One step of the scripted workload against a process; errors (the process may be dying) are ignored.
async fn workload(client: reqwest::Client, base: String, token: String, ws: Uuid, repo: Uuid, seed: u64) {
    let api = format!("{base}/api/v1");
    let mut rng = seed;
    let mut next = move || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as usize
    };
    for i in 0.. {
        let (status, t) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": format!("w{seed}-{i}"), "repositories": [{"repository_id": repo}]})),
        )
        .await;
        if status != 201 {
            tokio::task::yield_now().await;
            continue;
        }
        let task = id_of(&t);
        let (_, s) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/tasks/{task}/sessions"),
            Some(json!({"executor_type": "worktree", "start": false})),
        )
        .await;
        match next() % 4 {
            0 => {
                if let Some(id) = s["id"].as_str() {
                    call(&client, &token, Method::DELETE, format!("{api}/sessions/{id}"), None).await;
                }
            }
            1 => {
                call(
                    &client,
                    &token,
                    Method::POST,
                    format!("{api}/tasks/{task}/archive"),
                    None,
                )
                .await;
            }
            _ => {
                call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
            }
        }
    }
}

// SIGKILL at random points of a workload (task and session creates, session deletes, archives, task
// deletes), 20 times, restarting each time: afterwards every job finishes and the invariants hold.
async fn sigkill_at_random_points_loses_nothing(app: TestApp) {
    let data = app.scratch.path().join("killed");
    let env = process_env(&app, &data);
    let worktree_root = data.join("worktrees");
    let log = app.scratch.path().join("killed.log");
    let client = crate::helpers::client();
    let mut ids = None;
    let mut rng: u64 = 0x5eed_0001;
    for round in 0..20u64 {
        let mut b = start(&env, None, &log);
        wait_ready(&client, &mut b).await;
        let (ws, repo) = match ids {
            Some(ids) => ids,
            None => {
                let (ws, repo, _) = setup(&client, &b.base, &app.admin, app.scratch.path()).await;
                *ids.insert((ws, repo))
            }
        };
        let work = tokio::spawn(workload(
            client.clone(),
            b.base.clone(),
            app.admin.clone(),
            ws,
            repo,
            round,
        ));
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let after = 50 + (rng >> 33) % 700;
        tokio::time::sleep(Duration::from_millis(after)).await;
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(b.child.id() as i32, libc::SIGKILL);
        }
        let _ = b.child.wait();
        work.abort();
    }
    // A last life: let it finish what the others left.
    let mut b = start(&env, None, &log);
    wait_ready(&client, &mut b).await;
    let conn = connect(&app, &data).await;
    let jobs = wait_jobs_finished(&conn).await;
    assert!(!jobs.is_empty(), "the workload made cleanup jobs");
    assert!(
        jobs.iter().all(|(s, _)| s != "failed"),
        "a job failed: {jobs:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Give environments caught mid-materialization their lease, then check.
    assert_invariants(&conn, &worktree_root.canonicalize().unwrap()).await;
    drop(b);
}

fn unstarted_worktree() -> Value {
    json!({"executor_type": "worktree", "start": false})
}

/// Creates a session of `task` (with `body`) in the background and returns once the git wrapper reports
/// (by creating `entered`) that `git worktree add` is running and held at its gate.
async fn session_held_in_worktree_add(
    client: &reqwest::Client,
    token: &str,
    api: &str,
    task: Uuid,
    body: Value,
    entered: &Path,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let session = tokio::spawn({
        let (client, token, url) = (client.clone(), token.to_owned(), format!("{api}/tasks/{task}/sessions"));
        async move { call(&client, &token, Method::POST, url, Some(body)).await }
    });
    let deadline = tokio::time::Instant::now() + WAIT;
    while !entered.exists() {
        assert!(tokio::time::Instant::now() < deadline, "git worktree add never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    session
}

/// A directory holding a `git` that runs `script` (shell) and then the real git, for the front of a
/// process's PATH.
fn git_wrapper(app: &TestApp, dir: &str, script: &str) -> PathBuf {
    let real_git = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let bin = app.scratch.path().join(dir);
    std::fs::create_dir_all(&bin).unwrap();
    let wrapper = bin.join("git");
    // `$real_git` names the git the wrapper stands in front of, for a script that runs it itself.
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nreal_git='{real_git}'\n{script}exec \"$real_git\" \"$@\"\n"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

// The git CLI fails every third call (a wrapper first in PATH): materialization failures surface as
// errors without leftovers, cleanup jobs retry and complete, and the invariants hold.
async fn a_failing_git_cli_is_retried_until_jobs_complete(app: TestApp) {
    let counter = app.scratch.path().join("git-calls");
    let bin = git_wrapper(
        &app,
        "flaky-bin",
        &format!(
            "n=$(( $(cat '{c}' 2>/dev/null || echo 0) + 1 ))\necho $n > '{c}'\n\
             if [ $((n % 3)) -eq 0 ]; then echo 'fatal: injected failure' >&2; exit 128; fi\n",
            c = counter.display()
        ),
    );

    let data = app.scratch.path().join("flaky");
    let env = process_env(&app, &data);
    let log = app.scratch.path().join("flaky.log");
    let mut b = start(&env, Some(&bin), &log);
    let client = crate::helpers::client();
    wait_ready(&client, &mut b).await;
    let api = format!("{}/api/v1", b.base);
    let token = app.admin.clone();
    let (ws, repo, source) = setup(&client, &b.base, &token, app.scratch.path()).await;
    let mut tasks = Vec::new();
    let mut failures = 0;
    for i in 0..6 {
        let (status, t) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": format!("flaky {i}"), "repositories": [{"repository_id": repo}]})),
        )
        .await;
        assert_eq!(status, 201, "{t}");
        let task = id_of(&t);
        // A failed `git worktree add` is an error answer; asking again tries again.
        let mut made = false;
        for _ in 0..6 {
            let (status, s) = call(
                &client,
                &token,
                Method::POST,
                format!("{api}/tasks/{task}/sessions"),
                Some(json!({"executor_type": "worktree", "start": false})),
            )
            .await;
            if status == 201 {
                assert!(Path::new(s["workspace_path"].as_str().unwrap()).join(".git").is_file());
                made = true;
                break;
            }
            assert!(
                (400..600).contains(&status) && status != 500,
                "a git failure answers a problem, not {status}: {s}"
            );
            failures += 1;
        }
        assert!(made, "materialization never succeeded through the flaky git");
        tasks.push(task);
    }
    assert!(
        failures > 0 || std::fs::read_to_string(&counter).is_ok(),
        "the wrapper ran"
    );
    for task in &tasks {
        // The dirty check may meet a failing git: a 503 that changed nothing, and a retry goes through.
        let mut deleted = false;
        for _ in 0..6 {
            let (status, r) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
            if status == 202 {
                deleted = true;
                break;
            }
            assert_eq!(status, 503, "{r}");
            assert_eq!(r["code"], "unavailable");
        }
        assert!(deleted, "the delete never went through");
    }
    let conn = connect(&app, &data).await;
    let jobs = wait_jobs_finished(&conn).await;
    assert!(
        jobs.iter().all(|(s, _)| s == "succeeded"),
        "every job succeeds in the end: {jobs:?}"
    );
    let calls: u64 = std::fs::read_to_string(&counter).unwrap().trim().parse().unwrap();
    assert!(calls >= 3, "berth's git calls went through the wrapper ({calls})");
    // Nothing of the deleted tasks is left: no worktree registered, none on disk, branches kept.
    let listing = crate::helpers::worktrees_of(&source);
    assert_eq!(listing.len(), 1, "only the main work tree remains: {listing:?}");
    assert_invariants(&conn, &data.join("worktrees").canonicalize().unwrap()).await;
    drop(b);
}

// Two processes with the same node id on one database: each cleanup job runs exactly once, and events
// written through either arrive on both streams.
async fn two_processes_with_one_node_id_run_each_job_once(app: TestApp) {
    if app.backend == Backend::Sqlite {
        // Two processes on one SQLite file with one node id is the same test with a file lock; the
        // deployment this guards (replicas) is PostgreSQL's.
        return;
    }
    let data = app.scratch.path().join("twins");
    let mut env = process_env(&app, &data);
    env.insert("BERTH_NODE_ID".into(), "twin".into());
    // A long lease: a job that ran twice here could only be a double claim, never a rescue.
    env.insert("BERTH_CLEANUP_LEASE_SECS".into(), "300".into());
    env.insert("BERTH_CLEANUP_WORKERS".into(), "4".into());
    let log = app.scratch.path().join("twins.log");
    let client = crate::helpers::client();
    let mut one = start(&env, None, &log);
    let mut two = start(&env, None, &log);
    wait_ready(&client, &mut one).await;
    wait_ready(&client, &mut two).await;
    let token = app.admin.clone();
    let streams: Vec<crate::helpers::Sse> = {
        let mut v = Vec::new();
        for b in [&one, &two] {
            let resp = client
                .get(format!("{}/api/v1/events/stream", b.base))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            let mut sse = crate::helpers::Sse::from_response(resp);
            assert_eq!(sse.next(WAIT).await.unwrap().event, "ready");
            v.push(sse);
        }
        v
    };
    let (ws, repo, source) = setup(&client, &one.base, &token, app.scratch.path()).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let via = if i % 2 == 0 { &one } else { &two };
        let api = format!("{}/api/v1", via.base);
        tasks.push(task_with_worktree(&client, &token, &api, ws, repo, &format!("twin {i}")).await);
    }
    let mut jobs = HashSet::new();
    for (i, task) in tasks.iter().enumerate() {
        let via = if i % 2 == 0 { &two } else { &one };
        let (status, r) = call(
            &client,
            &token,
            Method::DELETE,
            format!("{}/api/v1/tasks/{task}", via.base),
            None,
        )
        .await;
        assert_eq!(status, 202, "{r}");
        jobs.insert(r["cleanup_jobs"][0]["id"].as_str().unwrap().to_string());
    }
    let conn = connect(&app, &data).await;
    let all = wait_jobs_finished(&conn).await;
    assert_eq!(all.len(), tasks.len());
    assert!(
        all.iter().all(|(s, a)| s == "succeeded" && *a == 1),
        "each job ran once and succeeded: {all:?}"
    );
    assert_eq!(crate::helpers::worktrees_of(&source).len(), 1);
    // Both streams saw every job succeed, whichever process ran it.
    for mut sse in streams {
        let mut succeeded = HashSet::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        while succeeded.len() < jobs.len() && tokio::time::Instant::now() < deadline {
            let Some(frame) = sse.next(Duration::from_secs(10)).await else {
                continue;
            };
            let Ok(e) = serde_json::from_str::<Value>(&frame.data) else {
                continue;
            };
            if e["type"] == "cleanup_job.updated" && e["data"]["state"] == "succeeded" {
                succeeded.insert(e["data"]["cleanup_job_id"].as_str().unwrap_or_default().to_string());
            }
        }
        assert_eq!(succeeded, jobs, "a stream missed a job's success");
    }
    assert_invariants(&conn, &data.join("worktrees").canonicalize().unwrap()).await;
    drop((one, two));
}

/// A PostgreSQL cluster of the test's own (initdb into a temp dir, run as the `postgres` user), so the
/// test can stop and start it without touching the shared server other tests use.
struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    _tmp: tempfile::TempDir,
}

impl PrivatePostgres {
    fn create() -> Option<PrivatePostgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .flatten()
            .map(|e| e.path().join("bin"))
            .find(|b| b.join("pg_ctl").is_file())?;
        let tmp = tempfile::TempDir::new().unwrap();
        let dir = tmp.path().join("cluster");
        std::fs::create_dir_all(&dir).unwrap();
        // initdb refuses to run as root: the cluster belongs to the postgres user.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        if as_postgres {
            let uid = Command::new("id").args(["-u", "postgres"]).output().ok()?;
            let uid: u32 = String::from_utf8_lossy(&uid.stdout).trim().parse().ok()?;
            let gid = Command::new("id").args(["-g", "postgres"]).output().ok()?;
            let gid: u32 = String::from_utf8_lossy(&gid.stdout).trim().parse().ok()?;
            std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid)).unwrap();
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pg = PrivatePostgres {
            bin,
            dir,
            port,
            _tmp: tmp,
        };
        let ok = pg.run(&[
            "initdb",
            "-D",
            pg.dir.to_str().unwrap(),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        ok.then_some(pg)
    }

    fn run(&self, args: &[&str]) -> bool {
        let program = self.bin.join(args[0]);
        let mut cmd = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let out = cmd.args(&args[1..]).current_dir("/").output().expect("runs");
        if !out.status.success() {
            eprintln!(
                "{args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        out.status.success()
    }

    fn start(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        assert!(
            self.run(&[
                "pg_ctl",
                "-D",
                self.dir.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start"
            ]),
            "the private PostgreSQL starts"
        );
    }

    fn stop(&self) {
        assert!(self.run(&["pg_ctl", "-D", self.dir.to_str().unwrap(), "-m", "fast", "-w", "stop"]));
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.run(&["pg_ctl", "-D", self.dir.to_str().unwrap(), "-m", "immediate", "stop"]);
    }
}

// PostgreSQL restarted while requests and cleanup jobs are in flight: berth answers 503 problem+json
// during the outage (not a hang, not a panic), reconnects without a restart, and loses no committed change.
async fn postgres_restarting_under_load_answers_503_and_loses_nothing(app: TestApp) {
    if app.backend == Backend::Sqlite {
        return;
    }
    let Some(pg) = PrivatePostgres::create() else {
        panic!("could not create a private PostgreSQL cluster (initdb under /usr/lib/postgresql)");
    };
    pg.start();
    let data = app.scratch.path().join("outage");
    let mut env = process_env(&app, &data);
    env.insert("BERTH_DATABASE_URL".into(), pg.url());
    let log = app.scratch.path().join("outage.log");
    let client = crate::helpers::client();
    let mut b = start(&env, None, &log);
    wait_ready(&client, &mut b).await;
    let token = app.admin.clone();
    let api = format!("{}/api/v1", b.base);
    let (ws, repo, source) = setup(&client, &b.base, &token, app.scratch.path()).await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(task_with_worktree(&client, &token, &api, ws, repo, &format!("outage {i}")).await);
    }
    // Deletes in flight when the database goes away: their jobs must still finish afterwards.
    for task in &tasks[..3] {
        let (status, r) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
        assert_eq!(status, 202, "{r}");
    }
    pg.stop();
    // During the outage: a 503 problem+json for reads and writes, in bounded time; the process lives.
    for (method, path, body) in [
        (Method::GET, format!("{api}/tasks/{}", tasks[4]), None),
        (
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": "during the outage"})),
        ),
        (Method::DELETE, format!("{api}/tasks/{}", tasks[5]), None),
    ] {
        let started = std::time::Instant::now();
        let mut req = client
            .request(method.clone(), &path)
            .bearer_auth(&token)
            .timeout(Duration::from_secs(30));
        if let Some(b) = &body {
            req = req.json(b);
        }
        let r = req.send().await.expect("answered during the outage, not hung");
        assert_eq!(r.status().as_u16(), 503, "{method} {path}");
        assert_eq!(
            r.headers().get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["code"], "unavailable", "{p}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "answered within the acquire timeout"
        );
    }
    let r = client.get(format!("{}/readyz", b.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 503, "not ready while the database is down");
    assert!(b.child.try_wait().unwrap().is_none(), "berth is still running");
    pg.start();
    // Back without a restart: ready again, writes work, and what was committed before is all there.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, _) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": "after the outage"})),
        )
        .await;
        if status == 201 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "berth never reconnected ({status})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(b.child.try_wait().unwrap().is_none(), "berth did not restart");
    for task in &tasks[3..] {
        let (status, t) = call(&client, &token, Method::GET, format!("{api}/tasks/{task}"), None).await;
        assert_eq!(status, 200, "{t}");
    }
    let conn = sea_orm::Database::connect(pg.url()).await.unwrap();
    let jobs = wait_jobs_finished(&conn).await;
    assert_eq!(jobs.len(), 3, "exactly the three deletes made jobs: {jobs:?}");
    assert!(jobs.iter().all(|(s, _)| s == "succeeded"), "{jobs:?}");
    assert_eq!(
        crate::helpers::worktrees_of(&source).len(),
        4,
        "the main work tree and the three surviving tasks' worktrees"
    );
    assert_invariants(&conn, &data.join("worktrees").canonicalize().unwrap()).await;
    conn.close().await.ok();
    drop(b);
}

// The SQLite data directory's disk fills up: writes answer 503 problem+json (never 500), and once space
// returns, writes work again, every write that was answered 201 is there, and the file is intact.
async fn a_full_disk_on_sqlite_answers_503_and_corrupts_nothing(app: TestApp) {
    if app.backend == Backend::Postgres {
        return;
    }
    let mount = app.scratch.path().join("small-disk");
    std::fs::create_dir_all(&mount).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&mount)
        .output()
        .is_ok_and(|o| o.status.success());
    if !mounted {
        eprintln!("NOT RUN: cannot mount a small tmpfs here (needs root); the disk-full fault is untested");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    let data = mount.join("data");
    let mut env = process_env(&app, &data);
    env.remove("BERTH_DATABASE_URL");
    env.insert(
        "BERTH_WORKTREE_ROOT".into(),
        app.scratch.path().join("worktrees-full").display().to_string(),
    );
    let log = app.scratch.path().join("full.log");
    let client = crate::helpers::client();
    let mut b = start(&env, None, &log);
    wait_ready(&client, &mut b).await;
    let token = app.admin.clone();
    let api = format!("{}/api/v1", b.base);
    let (status, w) = call(
        &client,
        &token,
        Method::POST,
        format!("{api}/workspaces"),
        Some(json!({"name": "ws"})),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    let ws = id_of(&w);
    // Fill the disk, leaving a little room for the first writes.
    let filler = mount.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    let len = std::fs::metadata(&filler).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(len.saturating_sub(256 * 1024))
        .unwrap();
    let description = "x".repeat(19_000);
    let mut created = Vec::new();
    let mut unavailable = 0;
    for i in 0..60 {
        let (status, t) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": format!("full {i}"), "description": description})),
        )
        .await;
        match status {
            201 => created.push(id_of(&t)),
            503 => {
                assert_eq!(t["code"], "unavailable", "{t}");
                unavailable += 1;
                if unavailable >= 3 {
                    break;
                }
            }
            other => panic!(
                "a full disk answered {other}: {t}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
        }
    }
    assert!(
        unavailable > 0,
        "the disk never filled ({} tasks written)",
        created.len()
    );
    assert!(b.child.try_wait().unwrap().is_none(), "berth is still running");
    // Space returns: writes work again without a restart.
    std::fs::remove_file(&filler).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, t) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/workspaces/{ws}/tasks"),
            Some(json!({"title": "after"})),
        )
        .await;
        if status == 201 {
            created.push(id_of(&t));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes never resumed ({status}: {t})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for task in &created {
        let (status, _) = call(&client, &token, Method::GET, format!("{api}/tasks/{task}"), None).await;
        assert_eq!(
            status,
            200,
            "a task answered 201 is there\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    drop(b);
    let conn = connect(&app, &data).await;
    let check = rows(&conn, "PRAGMA integrity_check").await;
    let verdict: String = check[0].try_get_by_index(0).unwrap();
    assert_eq!(verdict, "ok");
    conn.close().await.ok();
}

/// The branch ledger and the last progress stages commit with the publish. When a delete sets its
/// barrier while `git worktree add` runs, the publish fails; what it would have recorded is recorded all
/// the same (`Made::record_unpublished`): the branch berth created stays on record as berth's (and is
/// kept: the delete's snapshot could not know its origin), and every stage is in the log before
/// `environment.failed`. Nothing else is touched: the source repository keeps its branches.
async fn a_materialization_that_loses_to_a_delete_records_its_branch_and_progress(app: TestApp) {
    let (bin, entered, release) = held_before_worktree_add(&app);

    let data = app.scratch.path().join("gated");
    let env = process_env(&app, &data);
    let mut b = start(&env, Some(&bin), &app.scratch.path().join("gated.log"));
    let client = crate::helpers::client();
    wait_ready(&client, &mut b).await;
    let api = format!("{}/api/v1", b.base);
    let token = app.admin.clone();
    let (ws, repo, source) = setup(&client, &b.base, &token, app.scratch.path()).await;
    let before = crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let (status, t) = call(
        &client,
        &token,
        Method::POST,
        format!("{api}/workspaces/{ws}/tasks"),
        Some(json!({"title": "lost", "repositories": [{"repository_id": repo}]})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    let task = id_of(&t);
    let conn = connect(&app, &data).await;
    let slugs: Vec<String> = rows(&conn, "SELECT slug FROM tasks")
        .await
        .into_iter()
        .map(|r| r.try_get("", "slug").unwrap())
        .collect();
    let [slug] = slugs.as_slice() else {
        panic!("one task: {slugs:?}")
    };
    let branch = format!("berth/{slug}");

    let session = session_held_in_worktree_add(&client, &token, &api, task, unstarted_worktree(), &entered).await;
    let (status, d) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
    assert_eq!(
        status, 202,
        "the delete sets its barrier while the worktree is made: {d}"
    );
    std::fs::write(&release, "").unwrap();
    let (lost, s) = session.await.unwrap();
    // Its barrier stands (409), or its job already removed the task (404).
    assert!(
        (lost, s["code"].as_str()) == (409, Some("task_cleanup_in_progress"))
            || (lost, s["code"].as_str()) == (404, Some("not_found")),
        "the publish lost to the delete: {lost} {s}"
    );

    wait_jobs_finished(&conn).await;
    // The branch berth made is on record as berth's, and kept (the delete could not know its origin).
    let (status, listed) = call(
        &client,
        &token,
        Method::GET,
        format!("{api}/workspaces/{ws}/branches"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    let names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["branch"].as_str())
        .collect();
    assert_eq!(names, [branch.as_str()], "{listed}");
    assert!(crate::helpers::branch_exists(&source, &branch));
    // The source repository's own refs are as they were; the worktree is gone.
    let after = crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let kept: Vec<&str> = after
        .lines()
        .filter(|l| !l.starts_with(&format!("refs/heads/{branch} ")))
        .collect();
    assert_eq!(kept, before.lines().collect::<Vec<_>>());
    assert!(
        !Path::new(&env["BERTH_DATA_DIR"])
            .join("worktrees")
            .join(slug)
            .join("svc")
            .exists()
    );
    // Every stage, then the failure.
    let (status, page) = call(
        &client,
        &token,
        Method::GET,
        format!("{api}/events?after=0&limit=1000"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let events: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["task_id"] == task.to_string())
        .collect();
    let progress: Vec<&&Value> = events.iter().filter(|e| e["type"] == "environment.progress").collect();
    let stages: Vec<&str> = progress.iter().filter_map(|e| e["data"]["stage"].as_str()).collect();
    assert_eq!(stages, ["fetching", "creating_worktree", "ready"], "{events:?}");
    let last_stage = progress.iter().filter_map(|e| e["seq"].as_i64()).max();
    // Recorded failed while its task stands (409); gone with its task when the job won first (404).
    let failed = events
        .iter()
        .find(|e| e["type"] == "environment.failed")
        .and_then(|e| e["seq"].as_i64());
    assert_eq!(failed.is_some(), lost == 409, "{lost}: {events:?}");
    assert!(failed.is_none() || last_stage < failed, "{events:?}");
}

/// The delete's job must not finish before the materialization it overtook: once the delete removed the
/// task and its environment, no row records what `git worktree add` is still making. Here the job runs
/// while git is held at a gate, git then makes the worktree, and berth is SIGKILLed before its publish
/// meets the barrier (so no compensation ever removes what git made). The restarted berth's job removes
/// it (I9, I13): it waited for the materializer instead of succeeding before git had made anything. The
/// source repository keeps its refs; the branch berth made is kept (its origin was never recorded).
async fn a_materializer_killed_after_a_delete_leaves_no_worktree(app: TestApp) {
    let dir = app.scratch.path();
    let Gate {
        bin,
        entered,
        release,
        made,
    } = held_around_worktree_add(&app);
    let data = dir.join("killed");
    let env = process_env(&app, &data);
    let mut b = start(&env, Some(&bin), &dir.join("killed.log"));
    let client = crate::helpers::client();
    wait_ready(&client, &mut b).await;
    let api = format!("{}/api/v1", b.base);
    let token = app.admin.clone();
    let (ws, repo, source) = setup(&client, &b.base, &token, dir).await;
    let refs = || crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let before = refs();
    let (status, t) = call(
        &client,
        &token,
        Method::POST,
        format!("{api}/workspaces/{ws}/tasks"),
        Some(json!({"title": "killed", "repositories": [{"repository_id": repo}]})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    let task = id_of(&t);
    let conn = connect(&app, &data).await;
    let slug: String = rows(&conn, "SELECT slug FROM tasks").await[0]
        .try_get("", "slug")
        .unwrap();
    let worktree = data.join("worktrees").join(&slug).join("svc");

    let session = session_held_in_worktree_add(&client, &token, &api, task, unstarted_worktree(), &entered).await;
    let (status, d) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
    assert_eq!(status, 202, "the delete overtakes the materialization: {d}");
    kill_once_git_made_it(&conn, &mut b, &release, &made).await;
    let _ = session.await;
    assert!(
        worktree.join(".git").exists(),
        "git made the worktree before berth died"
    );

    let mut b = start(&env, None, &dir.join("killed.log"));
    wait_ready(&client, &mut b).await;
    let jobs = wait_jobs_finished(&conn).await;
    assert!(jobs.iter().all(|(s, _)| s == "succeeded"), "{jobs:?}");
    assert!(
        !worktree.exists(),
        "the delete's job removed what the killed materializer made"
    );
    assert_invariants(&conn, &data.join("worktrees").canonicalize().unwrap()).await;
    let branch = format!("refs/heads/berth/{slug} ");
    let after = refs();
    assert_eq!(
        after.lines().filter(|l| !l.starts_with(&branch)).collect::<Vec<_>>(),
        before.lines().collect::<Vec<_>>(),
        "the source repository keeps its refs"
    );
}

/// I18 with I9 and I13: an executor transition makes its candidate in a directory of its own, beside the
/// current environment. A delete that overtakes the candidate's `git worktree add` must name what the
/// candidate makes and wait for it, so that the job removes it even when berth is killed before the
/// launch could give the candidate up. The source repository keeps its refs.
async fn a_transition_killed_after_a_delete_leaves_no_worktree(app: TestApp) {
    let dir = app.scratch.path();
    let Gate {
        bin,
        entered,
        release,
        made,
    } = held_around_worktree_add(&app);
    let mut g = gated(&app, "transition", &bin).await;
    let data = dir.join("transition");
    let source = g.source.clone();
    let refs = || crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let before = refs();
    let task = g.task_on_local("switched").await;
    let slug: String = rows(&g.conn, "SELECT slug FROM tasks").await[0]
        .try_get("", "slug")
        .unwrap();

    // A worktree launch is a transition: its candidate is made beside the local environment.
    let launch = json!({"executor_type": "worktree", "agent_profile": "test"});
    let session = g.session_held(task, launch, &entered).await;
    let (status, d) = g.call(Method::DELETE, &format!("/tasks/{task}"), None).await;
    assert_eq!(status, 202, "the delete overtakes the transition: {d}");
    kill_once_git_made_it(&g.conn, &mut g.b, &release, &made).await;
    let _ = session.await;
    let worktrees = data.join("worktrees");
    let candidates: Vec<PathBuf> = std::fs::read_dir(&worktrees)
        .unwrap()
        .map(|e| e.unwrap().path().join("svc"))
        .filter(|w| w.join(".git").exists())
        .collect();
    assert_eq!(
        candidates.len(),
        1,
        "git made the candidate's worktree before berth died: {candidates:?}"
    );
    assert!(
        candidates[0]
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("{slug}-")),
        "a transition's directory of its own: {candidates:?}"
    );

    g.b = start(&g.env, None, &dir.join("transition.log"));
    wait_ready(&g.client, &mut g.b).await;
    let jobs = wait_jobs_finished(&g.conn).await;
    assert!(jobs.iter().all(|(s, _)| s == "succeeded"), "{jobs:?}");
    assert!(
        !candidates[0].exists(),
        "the delete's job removed what the killed transition made"
    );
    let registered = crate::helpers::git(&source, &["worktree", "list", "--porcelain"]);
    assert_eq!(
        registered.lines().filter(|l| l.starts_with("worktree ")).count(),
        1,
        "only the source's own worktree is registered: {registered}"
    );
    assert_invariants(&g.conn, &worktrees.canonicalize().unwrap()).await;
    // The candidate's branch is kept (`berth/<slug>-<suffix>`: its origin was never recorded).
    let branch = format!("refs/heads/berth/{slug}-");
    let after = refs();
    assert_eq!(
        after.lines().filter(|l| !l.starts_with(&branch)).collect::<Vec<_>>(),
        before.lines().collect::<Vec<_>>(),
        "the source repository keeps its refs"
    );
}

/// A `berth serve` of its own (`process_env`, with the agent profile `test`) whose git is the wrapper in
/// `bin`, serving a workspace with one registered repository: for the tests that hold its git at a gate.
struct Gated {
    b: Berth,
    env: BTreeMap<String, String>,
    client: reqwest::Client,
    token: String,
    api: String,
    ws: Uuid,
    repo: Uuid,
    source: PathBuf,
    conn: DatabaseConnection,
}

async fn gated(app: &TestApp, name: &str, bin: &Path) -> Gated {
    let dir = app.scratch.path();
    let data = dir.join(name);
    let mut env = process_env(app, &data);
    let config = data.join("berth.toml");
    let agent = env!("CARGO_BIN_EXE_berth-test-agent");
    std::fs::write(&config, format!("[agents.test]\ncommand = {agent:?}\n")).unwrap();
    env.insert("BERTH_CONFIG".into(), config.display().to_string());
    let mut b = start(&env, Some(bin), &dir.join(format!("{name}.log")));
    let client = crate::helpers::client();
    wait_ready(&client, &mut b).await;
    let api = format!("{}/api/v1", b.base);
    let token = app.admin.clone();
    let (ws, repo, source) = setup(&client, &b.base, &token, dir).await;
    let conn = connect(app, &data).await;
    Gated {
        b,
        env,
        client,
        token,
        api,
        ws,
        repo,
        source,
        conn,
    }
}

impl Gated {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        call(&self.client, &self.token, method, format!("{}{path}", self.api), body).await
    }

    /// A task of the repository.
    async fn task(&self, title: &str) -> Uuid {
        let body = json!({"title": title, "repositories": [{"repository_id": self.repo}]});
        let (status, t) = self
            .call(Method::POST, &format!("/workspaces/{}/tasks", self.ws), Some(body))
            .await;
        assert_eq!(status, 201, "{t}");
        id_of(&t)
    }

    /// A task whose environment is a local one (no worktree): a worktree launch in it is a transition.
    async fn task_on_local(&self, title: &str) -> Uuid {
        let task = self.task(title).await;
        let body = json!({"executor_type": "local", "start": false});
        let (status, s) = self
            .call(Method::POST, &format!("/tasks/{task}/sessions"), Some(body))
            .await;
        assert_eq!(status, 201, "{s}");
        task
    }

    /// `session_held_in_worktree_add` on this berth.
    async fn session_held(&self, task: Uuid, body: Value, entered: &Path) -> tokio::task::JoinHandle<(u16, Value)> {
        session_held_in_worktree_add(&self.client, &self.token, &self.api, task, body, entered).await
    }
}

/// A git wrapper whose `git worktree add` waits at a gate the test opens: it touches `entered`, waits for
/// `release`, then runs. Returns the wrapper's directory, `entered` and `release`.
fn held_before_worktree_add(app: &TestApp) -> (PathBuf, PathBuf, PathBuf) {
    let (entered, release) = (app.scratch.path().join("entered"), app.scratch.path().join("release"));
    let bin = git_wrapper(
        app,
        "gated-bin",
        &format!(
            "case \" $* \" in *\" worktree add \"*)\n  touch '{entered}'\n  i=0\n  \
             while [ ! -e '{release}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n;;\nesac\n",
            entered = entered.display(),
            release = release.display(),
        ),
    );
    (bin, entered, release)
}

/// I14 with I18: a transition's candidate keeps its `creating` lease fresh from its election until the
/// launch promotes or abandons it. Its `git worktree add` is held well past the lease (2 s here): the
/// row's lease is renewed meanwhile, another session's transition is refused (`workspace_preparing`)
/// instead of taking the candidate for an abandoned attempt and superseding it, and once git goes on the
/// launch promotes the candidate.
async fn a_transition_slower_than_its_lease_keeps_it(app: TestApp) {
    let (bin, entered, release) = held_before_worktree_add(&app);
    let g = gated(&app, "slow", &bin).await;
    let lease = chrono::Duration::seconds(g.env["BERTH_MATERIALIZE_LEASE_SECS"].parse().unwrap());
    let task = g.task_on_local("slow").await;

    // A worktree launch is a transition: its candidate waits in `git worktree add`.
    let launch = json!({"executor_type": "worktree", "agent_profile": "test"});
    let first = g.session_held(task, launch.clone(), &entered).await;
    let sql = "SELECT id, created_at, updated_at FROM task_environments WHERE status = 'creating'";
    // Well before the gate gives up by itself (60 s), after which the row changes for other reasons.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let candidate: Uuid = loop {
        let found = rows(&g.conn, sql).await;
        assert_eq!(found.len(), 1, "one candidate, still creating");
        let created: chrono::DateTime<chrono::Utc> = found[0].try_get("", "created_at").unwrap();
        let touched: chrono::DateTime<chrono::Utc> = found[0].try_get("", "updated_at").unwrap();
        if touched > created + lease + chrono::Duration::milliseconds(500) {
            break found[0].try_get("", "id").unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the candidate's lease was not renewed while its launch ran (updated {touched}, created {created})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Past the lease of its election, the candidate is still a materialization under way.
    let (status, p) = g
        .call(Method::POST, &format!("/tasks/{task}/sessions"), Some(launch))
        .await;
    assert_eq!(status, 409, "{p}");
    assert_eq!(p["code"], "workspace_preparing", "{p}");

    std::fs::write(&release, "").unwrap();
    let (status, s) = first.await.unwrap();
    assert_eq!(status, 201, "the slow launch succeeds: {s}");
    let (status, e) = g.call(Method::GET, &format!("/tasks/{task}/environment"), None).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["id"], candidate.to_string(), "the candidate became current: {e}");
    assert_eq!(e["executor_type"], "worktree", "{e}");
    assert_eq!(e["status"], "ready", "{e}");
}

/// I13 with I14: a delete or an archive that overtakes a materialization running in the same process has
/// its job wait for that materializer in place: claimed once, it goes on the moment the materializer is
/// done, with no round trips through `retry_wait` (a delete's wrote two `cleanup_job.updated` events a
/// second; an archive's was an attempt, retried after the retry delay).
async fn a_lifecycle_job_waits_in_place_for_a_materializer_of_its_process(app: TestApp) {
    let (bin, entered, release) = held_before_worktree_add(&app);
    let g = gated(&app, "inplace", &bin).await;
    for (title, method, path) in [("deleted", Method::DELETE, ""), ("archived", Method::POST, "/archive")] {
        let task = g.task(title).await;
        let _ = std::fs::remove_file(&entered);
        let _ = std::fs::remove_file(&release);
        let session = g.session_held(task, unstarted_worktree(), &entered).await;
        let body = (method == Method::POST).then(|| json!({}));
        let (status, d) = g.call(method, &format!("/tasks/{task}{path}"), body).await;
        assert_eq!(status, 202, "{title}: it overtakes the materialization: {d}");
        let job = d["cleanup_jobs"][0]["id"].as_str().unwrap().to_string();

        // The job has run once while git is held (it waits, or has let its claim go to look again later).
        // (Any earlier round's job has succeeded.)
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let states: Vec<String> = rows(&g.conn, "SELECT state FROM task_resource_cleanup_jobs")
                .await
                .iter()
                .map(|r| r.try_get("", "state").unwrap())
                .collect();
            if states.iter().any(|s| s == "running" || s == "retry_wait") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{title}: the job never ran: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::write(&release, "").unwrap();
        let _ = session.await;
        let jobs = wait_jobs_finished(&g.conn).await;
        assert!(jobs.iter().all(|(s, _)| s == "succeeded"), "{title}: {jobs:?}");

        let (status, page) = g.call(Method::GET, "/events?after=0&limit=1000", None).await;
        assert_eq!(status, 200, "{page}");
        let states: Vec<&str> = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "cleanup_job.updated" && e["data"]["cleanup_job_id"] == job.as_str())
            .filter_map(|e| e["data"]["state"].as_str())
            .collect();
        assert_eq!(
            states.iter().filter(|s| **s == "running").count(),
            1,
            "{title}: claimed once: {states:?}"
        );
        assert!(
            !states.contains(&"retry_wait"),
            "{title}: no round trips while it waited: {states:?}"
        );
        assert_eq!(states.last(), Some(&"succeeded"), "{title}: {states:?}");
    }
}

/// A git wrapper that holds `git worktree add` at a gate (it touches `entered`, and waits for `release`),
/// then runs it, touches `made` and holds again: berth, waiting for the wrapper, never gets further.
struct Gate {
    bin: PathBuf,
    entered: PathBuf,
    release: PathBuf,
    made: PathBuf,
}

fn held_around_worktree_add(app: &TestApp) -> Gate {
    let dir = app.scratch.path();
    let (entered, release, made) = (dir.join("entered"), dir.join("release"), dir.join("made"));
    let bin = git_wrapper(
        app,
        "held-bin",
        &format!(
            "case \" $* \" in *\" worktree add \"*)\n  touch '{entered}'\n  i=0\n  \
             while [ ! -e '{release}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n  \
             \"$real_git\" \"$@\"\n  rc=$?\n  touch '{made}'\n  i=0\n  \
             while [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n  exit $rc\n;;\nesac\n",
            entered = entered.display(),
            release = release.display(),
            made = made.display(),
        ),
    );
    Gate {
        bin,
        entered,
        release,
        made,
    }
}

/// Once the delete's job has run at least once while git waits at the gate (it waits too, or, wrongly,
/// has finished), lets git make the worktree and SIGKILLs berth before anything records or removes it.
async fn kill_once_git_made_it(conn: &DatabaseConnection, b: &mut Berth, release: &Path, made: &Path) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let jobs = rows(conn, "SELECT state, last_error FROM task_resource_cleanup_jobs").await;
        let state: String = jobs[0].try_get("", "state").unwrap();
        let error: Option<String> = jobs[0].try_get("", "last_error").unwrap();
        if state == "succeeded" || (state == "retry_wait" && error.is_some()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never ran: {state} {error:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::write(release, "").unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !made.exists() {
        assert!(tokio::time::Instant::now() < deadline, "git never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unsafe { libc::kill(b.child.id() as i32, libc::SIGKILL) };
    let _ = b.child.wait();
}
