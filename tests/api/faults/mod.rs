//! Faults a deployment meets: berth killed with SIGKILL mid-workload, its git CLI failing, two
//! processes sharing one node id. After each, nothing committed is lost and the invariants hold
//! (`assert_invariants`): every worktree on disk is in some inventory or in an unfinished job's
//! snapshot; every active inventory row's worktree exists or its environment failed; no job is stuck
//! `running` past its lease.
//!
//! This module holds what the fault tests share: a `berth serve` process of the test's own on the test's
//! database, calls to it, and the invariant checks. The scenarios are in the submodules, one fault each;
//! `gates` holds the git wrappers that hold `git worktree add` for several of them.
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, git_repo, id_of, seen, wait_until, wait_until_every};

mod crash;
mod flaky_git;
mod gates;
mod outage;
mod overtaken;
mod twins;
mod under_way;

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
    let url = format!("{}/readyz", b.base);
    wait_until("berth to become ready", WAIT, || {
        if let Ok(Some(status)) = b.child.try_wait() {
            panic!("berth exited while starting: {status}");
        }
        let ready = client.get(&url).send();
        async move {
            match ready.await {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("answered {}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await
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

/// Posts a task `title` over `repo` to workspace `ws`; the status and the body.
async fn create_task(
    client: &reqwest::Client,
    token: &str,
    api: &str,
    ws: Uuid,
    repo: Uuid,
    title: &str,
) -> (u16, Value) {
    let body = json!({"title": title, "repositories": [{"repository_id": repo}]});
    call(
        client,
        token,
        Method::POST,
        format!("{api}/workspaces/{ws}/tasks"),
        Some(body),
    )
    .await
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
    let (status, t) = create_task(client, token, api, ws, repo, title).await;
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
    let every = Duration::from_millis(200);
    wait_until_every("the invariants to hold", WAIT, every, || {
        invariants(conn, worktree_root)
    })
    .await;
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
    wait_until("every cleanup job to finish", WAIT, || async {
        let all: Vec<(String, i32)> = rows(conn, "SELECT state, attempts FROM task_resource_cleanup_jobs")
            .await
            .into_iter()
            .map(|r| (r.try_get("", "state").unwrap(), r.try_get("", "attempts").unwrap()))
            .collect();
        let done = all
            .iter()
            .all(|(s, _)| matches!(s.as_str(), "succeeded" | "cancelled" | "failed"));
        seen(done, all)
    })
    .await
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
