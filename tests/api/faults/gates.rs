//! Git wrappers that hold `git worktree add` at a gate the test opens, and a `berth serve` running behind
//! one: for the tests where a delete, an archive or another launch meets a materialization under way.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reqwest::Method;
use sea_orm::DatabaseConnection;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Berth, WAIT, call, connect, git_wrapper, process_env, rows, setup, start, wait_ready};
use crate::helpers::{TestApp, id_of, seen, wait_until};

pub(super) fn unstarted_worktree() -> Value {
    json!({"executor_type": "worktree", "start": false})
}

/// Creates a session of `task` (with `body`) in the background and returns once the git wrapper reports
/// (by creating `entered`) that `git worktree add` is running and held at its gate.
pub(super) async fn session_held_in_worktree_add(
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
    wait_until("git worktree add to run", WAIT, || async { seen(entered.exists(), ()) }).await;
    session
}

/// A `berth serve` of its own (`process_env`, with the agent profile `test`) whose git is the wrapper in
/// `bin`, serving a workspace with one registered repository: for the tests that hold its git at a gate.
pub(super) struct Gated {
    pub(super) b: Berth,
    pub(super) env: BTreeMap<String, String>,
    pub(super) client: reqwest::Client,
    token: String,
    api: String,
    ws: Uuid,
    repo: Uuid,
    pub(super) source: PathBuf,
    pub(super) conn: DatabaseConnection,
}

pub(super) async fn gated(app: &TestApp, name: &str, bin: &Path) -> Gated {
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
    pub(super) async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        call(&self.client, &self.token, method, format!("{}{path}", self.api), body).await
    }

    /// A task of the repository.
    pub(super) async fn task(&self, title: &str) -> Uuid {
        let body = json!({"title": title, "repositories": [{"repository_id": self.repo}]});
        let (status, t) = self
            .call(Method::POST, &format!("/workspaces/{}/tasks", self.ws), Some(body))
            .await;
        assert_eq!(status, 201, "{t}");
        id_of(&t)
    }

    /// A task whose environment is a local one (no worktree): a worktree launch in it is a transition.
    pub(super) async fn task_on_local(&self, title: &str) -> Uuid {
        let task = self.task(title).await;
        let body = json!({"executor_type": "local", "start": false});
        let (status, s) = self
            .call(Method::POST, &format!("/tasks/{task}/sessions"), Some(body))
            .await;
        assert_eq!(status, 201, "{s}");
        task
    }

    /// `session_held_in_worktree_add` on this berth.
    pub(super) async fn session_held(
        &self,
        task: Uuid,
        body: Value,
        entered: &Path,
    ) -> tokio::task::JoinHandle<(u16, Value)> {
        session_held_in_worktree_add(&self.client, &self.token, &self.api, task, body, entered).await
    }
}

/// A git wrapper whose `git worktree add` waits at a gate the test opens: it touches `entered`, waits for
/// `release`, then runs. Returns the wrapper's directory, `entered` and `release`.
pub(super) fn held_before_worktree_add(app: &TestApp) -> (PathBuf, PathBuf, PathBuf) {
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

/// A git wrapper that holds `git worktree add` at a gate (it touches `entered`, and waits for `release`),
/// then runs it, touches `made` and holds again: berth, waiting for the wrapper, never gets further.
pub(super) struct Gate {
    pub(super) bin: PathBuf,
    pub(super) entered: PathBuf,
    pub(super) release: PathBuf,
    pub(super) made: PathBuf,
}

pub(super) fn held_around_worktree_add(app: &TestApp) -> Gate {
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
pub(super) async fn kill_once_git_made_it(conn: &DatabaseConnection, b: &mut Berth, release: &Path, made: &Path) {
    wait_until("the delete's job to run while git is held", WAIT, || async {
        let jobs = rows(conn, "SELECT state, last_error FROM task_resource_cleanup_jobs").await;
        let state: String = jobs[0].try_get("", "state").unwrap();
        let error: Option<String> = jobs[0].try_get("", "last_error").unwrap();
        if state == "succeeded" || (state == "retry_wait" && error.is_some()) {
            Ok(())
        } else {
            Err(format!("the job is {state}, its last error {error:?}"))
        }
    })
    .await;
    std::fs::write(release, "").unwrap();
    wait_until("git to finish the worktree", WAIT, || async { seen(made.exists(), ()) }).await;
    unsafe { libc::kill(b.child.id() as i32, libc::SIGKILL) };
    let _ = b.child.wait();
}
