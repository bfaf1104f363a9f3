//! Two berth processes on one database behave as one service. A second `Application` with another
//! `node_id` serves its own port; messages, aborts, stops, answers and a launch posted to it reach the
//! agent the first one runs, through the database (PostgreSQL `NOTIFY`, or the owner's poll on SQLite).
//! Restore relaunching only a node's own sessions is
//! `inbox::restore_leaves_another_nodes_sessions_alone`. An archive or a delete posted to one replica
//! stops the agent another one runs before it answers, and so before anything is removed (I8).
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{execution_pid, pid_alive, uuid, wait_delivered, wait_exited, wait_session};
use crate::both_backends;
use crate::helpers::{Backend, Reply, TestApp, seen_json, wait_job_settled, wait_until, wait_until_every};
use crate::inbox::{wait_message, wait_replies};

both_backends!(
    a_message_posted_to_another_replica_reaches_the_agent,
    an_abort_posted_to_another_replica_ends_the_turn_there,
    a_stop_posted_to_another_replica_stops_the_agent,
    an_answer_posted_to_another_replica_reaches_the_agent,
    a_launch_posted_to_another_replica_returns_the_running_agent,
    an_archive_stops_the_agent_another_replica_runs_first,
    a_delete_stops_the_agent_another_replica_runs_first,
);

const WAIT: Duration = Duration::from_secs(20);

/// A second berth on the same database and data directory, as node `replica-b`, serving HTTP.
pub(crate) struct Replica {
    pub(crate) base: String,
    pub(crate) client: reqwest::Client,
    pub(crate) token: String,
    state: actix_web::web::Data<berth::api::AppState>,
    handle: actix_web::dev::ServerHandle,
    background: Vec<tokio::task::AbortHandle>,
}

impl Replica {
    pub(crate) async fn start(app: &TestApp) -> Replica {
        Replica::start_as(app, "replica-b").await
    }

    /// A second berth on the same database and data directory, as node `node_id`.
    pub(crate) async fn start_as(app: &TestApp, node_id: &str) -> Replica {
        let mut config = app.config.clone();
        config.node_id = node_id.into();
        let server = berth::startup::Application::build(config)
            .await
            .expect("the second replica starts");
        let replica = Replica {
            base: format!("http://127.0.0.1:{}", server.port()),
            client: crate::helpers::client(),
            token: app.token("admin"),
            state: server.state.clone(),
            handle: server.handle(),
            background: server.background(),
        };
        tokio::spawn(server.run_until_stopped());
        replica
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Reply {
        self.call(Method::POST, path, Some(body)).await
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, None).await
    }

    pub(crate) async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let res = req.send().await.expect("request");
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        Reply { status, headers, text }
    }

    /// Whether this replica's own runtime runs the session's agent.
    pub(crate) fn runs(&self, id: Uuid) -> bool {
        self.state.ctx.runtime.is_live(id.into())
    }

    /// Ends this replica's background loops (its routing loop among them); its agents keep running.
    fn stop_background(&self) {
        self.background.iter().for_each(|b| b.abort());
    }

    pub(crate) async fn stop(self) {
        self.state.ctx.runtime.stop_all().await;
        for b in &self.background {
            b.abort();
        }
        self.handle.stop(false).await;
    }
}

/// A running `test` agent on the first replica; with `prompt`, that is its first message.
async fn session(app: &TestApp, prompt: Option<&str>) -> Uuid {
    let f = app.task_with_repo("Replicas").await;
    uuid(&f.agent_with("test", prompt).await["id"])
}

/// The agent runs on the first replica only.
fn runs_on_first(app: &TestApp, b: &Replica, id: Uuid) {
    assert!(
        app.app_state.ctx.runtime.is_live(id.into()),
        "the first replica runs the agent"
    );
    assert!(
        !b.state.ctx.runtime.is_live(id.into()),
        "the second replica runs nothing for it"
    );
}

async fn a_message_posted_to_another_replica_reaches_the_agent(app: TestApp) {
    let id = session(&app, None).await;
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let b = Replica::start(&app).await;
    runs_on_first(&app, &b, id);
    let m = b
        .post(
            &format!("/api/v1/sessions/{id}/messages"),
            json!({"text": "hello from b"}),
        )
        .await
        .ok(202);
    assert_eq!(m["session_id"], id.to_string());
    wait_message(&app, id, &m, "delivered").await;
    assert_eq!(wait_replies(&app, id, 1).await, ["hello from b"]);
    // And the next one, while the first replica's agent is still the one that answers.
    let again = b
        .post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "again"}))
        .await
        .ok(202);
    wait_message(&app, id, &again, "delivered").await;
    assert_eq!(wait_replies(&app, id, 2).await, ["hello from b", "again"]);
    runs_on_first(&app, &b, id);
    b.stop().await;
}

async fn an_abort_posted_to_another_replica_ends_the_turn_there(app: TestApp) {
    let id = session(&app, Some("hang")).await;
    wait_delivered(&app, id, 1).await;
    let s = wait_session(&app, id, "running", |s| s["state"] == "running").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    let b = Replica::start(&app).await;
    let queued = b
        .post(
            &format!("/api/v1/sessions/{id}/messages"),
            json!({"text": "queued behind", "delivery": "follow_up"}),
        )
        .await
        .ok(202);
    let aborted = b.post(&format!("/api/v1/sessions/{id}/abort"), json!({})).await.ok(200);
    assert_eq!(aborted["id"], id.to_string());
    let cancelled = wait_message(&app, id, &queued, "cancelled").await;
    assert!(cancelled["reason"].as_str().unwrap().contains("abort"), "{cancelled}");
    let after = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    assert_eq!(after["desired_open"], true);
    assert_eq!(after["execution_id"], s["execution_id"], "the same agent");
    assert!(pid_alive(pid), "the agent still runs");
    runs_on_first(&app, &b, id);
    // The agent takes the next message, posted to either replica.
    let m = b
        .post(
            &format!("/api/v1/sessions/{id}/messages"),
            json!({"text": "still here"}),
        )
        .await
        .ok(202);
    wait_message(&app, id, &m, "delivered").await;
    assert_eq!(wait_replies(&app, id, 1).await, ["still here"]);
    b.stop().await;
}

async fn a_stop_posted_to_another_replica_stops_the_agent(app: TestApp) {
    let id = session(&app, Some("hang")).await;
    wait_delivered(&app, id, 1).await;
    let s = wait_session(&app, id, "running", |s| s["state"] == "running").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    let mut b = Replica::start(&app).await;
    let waiting = app
        .post(
            &format!("/api/v1/sessions/{id}/messages"),
            json!({"text": "never sent"}),
        )
        .await
        .ok(202);
    // Bob asks the replica that does not run the agent (the events say it was Bob).
    b.token = crate::helpers::mint(&app.config, "bob", "admin", None, None);
    let stopped = b.post(&format!("/api/v1/sessions/{id}/stop"), json!({})).await.ok(200);
    assert_eq!(
        stopped["state"], "stopped",
        "answered once the owner stopped it: {stopped}"
    );
    assert_eq!(stopped["desired_open"], false);
    assert!(
        !app.app_state.ctx.runtime.is_live(id.into()),
        "the first replica's agent is gone"
    );
    wait_exited(pid, WAIT).await;
    let m = wait_message(&app, id, &waiting, "cancelled").await;
    assert!(m["reason"].as_str().unwrap().contains("stopped"), "{m}");
    let events = crate::agents::all_events(&app).await;
    let stop = events
        .iter()
        .find(|e| {
            e["type"] == "session.state_changed" && e["session_id"] == id.to_string() && e["data"]["state"] == "stopped"
        })
        .expect("the stop's state change");
    assert_eq!(
        stop["actor"]["sub"], "bob",
        "the owner records who asked on the other replica: {stop}"
    );
    let cancelled = events
        .iter()
        .find(|e| e["type"] == "session.message_updated" && e["data"]["message"]["state"] == "cancelled")
        .expect("the queued message's cancellation");
    assert_eq!(cancelled["actor"]["sub"], "bob", "{cancelled}");
    // Nothing runs anywhere now: an abort on either replica is refused as on one.
    b.post(&format!("/api/v1/sessions/{id}/abort"), json!({}))
        .await
        .problem(409, "conflict");
    assert_eq!(b.state.ctx.runtime.live_count(), 0);
    b.stop().await;
}

async fn an_answer_posted_to_another_replica_reaches_the_agent(app: TestApp) {
    let id = session(&app, Some("ask")).await;
    wait_session(&app, id, "asking", |s| s["state"] == "attention").await;
    let b = Replica::start(&app).await;
    // The question shows on the replica that does not run the agent, as its node recorded it.
    let snap = wait_until_every("a question on b", WAIT, Duration::from_millis(20), || async {
        let snap = b.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
        seen_json(
            snap["attention_requests"].as_array().is_some_and(|a| !a.is_empty()),
            snap,
        )
    })
    .await;
    assert_eq!(snap["attention_requests"][0]["method"], "confirm");
    let request_id = snap["attention_requests"][0]["id"].as_str().unwrap().to_string();
    let path = format!("/api/v1/sessions/{id}/attention/{request_id}");
    // The owner's refusals come back as the same problems: a wrong shape, an unknown request.
    let wrong = b
        .post(&path, json!({"value": "yes"}))
        .await
        .problem(422, "validation_failed");
    assert_eq!(wrong["errors"][0]["field"], "confirmed", "{wrong}");
    b.post(
        &format!("/api/v1/sessions/{id}/attention/nope"),
        json!({"confirmed": true}),
    )
    .await
    .problem(404, "not_found");
    let still = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(still["attention_requests"].as_array().unwrap().len(), 1, "{still}");
    b.post(&path, json!({"confirmed": true})).await.ok(200);
    assert_eq!(wait_replies(&app, id, 1).await, ["answered true"]);
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let snap = b.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    // Answered: no longer pending, wherever it is asked.
    b.post(&path, json!({"confirmed": true}))
        .await
        .problem(404, "not_found");
    b.stop().await;
}

// I27 across replicas: launching on the replica that does not run the agent returns the session as it
// is (no second process), and its prompt reaches the running agent.
async fn a_launch_posted_to_another_replica_returns_the_running_agent(app: TestApp) {
    let id = session(&app, None).await;
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let b = Replica::start(&app).await;
    let launched = b
        .post(&format!("/api/v1/sessions/{id}/launch"), json!({"prompt": "via b"}))
        .await
        .ok(200);
    assert_eq!(
        launched["execution_id"], s["execution_id"],
        "the same agent: {launched}"
    );
    assert_eq!(wait_replies(&app, id, 1).await, ["via b"]);
    assert_eq!(b.state.ctx.runtime.live_count(), 0, "no second process");
    runs_on_first(&app, &b, id);
    b.stop().await;
}

/// A task whose environment the first replica made and whose `test` agent the second replica launched and
/// runs, in a hanging turn. The second is another instance of the same node (an agent runs on the node
/// that holds its worktree; a launch sent to another node is carried out there). Returns the replica, the
/// task, the session, the agent's pid and the worktree.
async fn working_on_second(app: &TestApp) -> (Replica, Uuid, Uuid, i64, String) {
    let f = app.task_with_repo("Replicas").await;
    let s = f.unstarted_agent("worktree", "test").await;
    let id = uuid(&s["id"]);
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    let b = Replica::start_as(app, &app.config.node_id).await;
    b.post(&format!("/api/v1/sessions/{id}/launch"), json!({"prompt": "hang"}))
        .await
        .ok(200);
    wait_delivered(app, id, 1).await;
    let s = wait_session(app, id, "running", |s| s["state"] == "running").await;
    let pid = execution_pid(app, uuid(&s["execution_id"])).await;
    assert!(
        b.state.ctx.runtime.is_live(id.into()),
        "the second replica runs the agent"
    );
    assert!(!app.app_state.ctx.runtime.is_live(id.into()));
    (b, f.task, id, pid, worktree)
}

// I8 across replicas: an archive stops the task's agent wherever it runs, before it answers, and so before
// its job (on the environment's node, which does not run the agent) removes the worktree.
async fn an_archive_stops_the_agent_another_replica_runs_first(app: TestApp) {
    let (b, task, id, pid, worktree) = working_on_second(&app).await;
    let archived = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    assert!(
        !pid_alive(pid),
        "the agent working on the second replica is stopped before the archive answers"
    );
    assert!(!b.state.ctx.runtime.is_live(id.into()));
    let job = wait_job_settled(&app, uuid(&archived["cleanup_jobs"][0]["id"])).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        !std::path::Path::new(&worktree).exists(),
        "the job removed the worktree"
    );
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert!(["cancelled", "stopped"].contains(&s["state"].as_str().unwrap()), "{s}");
    assert_eq!(s["desired_open"], false, "nothing restarts it");
    assert_eq!(b.state.ctx.runtime.live_count(), 0);
    b.stop().await;
}

// I8 across replicas: a delete stops the task's agent wherever it runs before its rows go (after that no
// record would name the process for its node to stop).
async fn a_delete_stops_the_agent_another_replica_runs_first(app: TestApp) {
    let (b, task, id, pid, worktree) = working_on_second(&app).await;
    let deleted = app.delete(&format!("/api/v1/tasks/{task}")).await.ok(202);
    assert!(
        !pid_alive(pid),
        "the agent working on the second replica is stopped before the delete answers"
    );
    assert!(!b.state.ctx.runtime.is_live(id.into()));
    let job = wait_job_settled(&app, uuid(&deleted["cleanup_jobs"][0]["id"])).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        !std::path::Path::new(&worktree).exists(),
        "the job removed the worktree"
    );
    app.get(&format!("/api/v1/sessions/{id}"))
        .await
        .problem(404, "not_found");
    assert_eq!(b.state.ctx.runtime.live_count(), 0);
    b.stop().await;
}

// I8, I9 across replicas: when the node that runs the agent does not carry the stop out (its routing loop
// is down), the archive still answers, and its job touches nothing while the agent may run: it retries,
// and removes the worktree only once that node is back and has stopped the agent.
async fn a_cleanup_job_retries_until_the_agent_elsewhere_stopped(backend: Backend) {
    let Some(app) = TestApp::spawn_with(
        backend,
        &[
            ("BERTH_ROUTING_DEADLINE_MS", "300"),
            ("BERTH_CLEANUP_RETRY_DELAYS_SECS", "0.2"),
            ("BERTH_CLEANUP_MAX_ATTEMPTS", "1000"),
        ],
    )
    .await
    else {
        return;
    };
    let (b, task, id, pid, worktree) = working_on_second(&app).await;
    b.stop_background();
    let archived = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    let job_id = uuid(&archived["cleanup_jobs"][0]["id"]);
    let job = wait_until("the job to retry", WAIT, || async {
        let j = app.get(&format!("/api/v1/cleanup-jobs/{job_id}")).await.ok(200);
        seen_json(
            j["attempts"].as_i64().unwrap_or_default() >= 2 && j["state"] == "retry_wait",
            j,
        )
    })
    .await;
    assert!(
        job["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("did not carry out"),
        "{job}"
    );
    assert!(pid_alive(pid), "the agent still runs on the second replica");
    assert!(
        std::path::Path::new(&worktree).exists(),
        "nothing is removed while the agent may work in it"
    );
    // The second replica's routing loop is back: it stops its agent, and the job finishes.
    tokio::spawn(berth::domain::sessions::serve_routed(b.state.ctx.clone()));
    let job = wait_job_settled(&app, job_id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(!pid_alive(pid), "stopped by the node that ran it");
    assert!(!b.state.ctx.runtime.is_live(id.into()));
    assert!(
        !std::path::Path::new(&worktree).exists(),
        "the job removed the worktree"
    );
    b.stop().await;
}

crate::backend_tests!(a_cleanup_job_retries_until_the_agent_elsewhere_stopped: a_cleanup_job_retries_until_the_agent_elsewhere_stopped_sqlite, a_cleanup_job_retries_until_the_agent_elsewhere_stopped_postgres);

// I8 across replicas, for a delete: its rows are what names the agent's process, so once they are gone no
// job could have it stopped. When the node running the agent does not carry the stop out, a task delete
// and a workspace delete answer 503 (retryable) and change nothing: the task, its session, the running
// agent and its worktree stay, the prepared jobs are cancelled, the workspace still takes tasks. Once
// that node is back, the same delete goes through.
async fn a_delete_is_refused_while_the_agent_elsewhere_runs(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, &[("BERTH_ROUTING_DEADLINE_MS", "300")]).await else {
        return;
    };
    let (b, task, id, pid, worktree) = working_on_second(&app).await;
    b.stop_background();
    let ws = uuid(&app.get(&format!("/api/v1/tasks/{task}")).await.ok(200)["workspace_id"]);
    let refused = app
        .delete(&format!("/api/v1/tasks/{task}"))
        .await
        .problem(503, "unavailable");
    assert_eq!(refused["retryable"], true, "{refused}");
    app.delete(&format!("/api/v1/workspaces/{ws}?confirm_name=ws"))
        .await
        .problem(503, "unavailable");
    app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(s["state"], "running", "{s}");
    assert!(pid_alive(pid), "the agent still runs on the second replica");
    assert!(std::path::Path::new(&worktree).exists(), "its worktree is untouched");
    let jobs = app.get(&format!("/api/v1/cleanup-jobs?task_id={task}")).await.ok(200);
    let states: Vec<&str> = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["state"].as_str().unwrap())
        .collect();
    assert!(
        !states.is_empty() && states.iter().all(|s| *s == "cancelled"),
        "the refused deletes' jobs are cancelled: {jobs}"
    );
    let (repo, _) = app.repository(ws, "other").await;
    app.task(ws, "still open", &[repo]).await;

    // The second replica's routing loop is back: the same delete, retried as a 503 says, stops the agent
    // there and goes through (on SQLite that node finds the command at its next poll).
    tokio::spawn(berth::domain::sessions::serve_routed(b.state.ctx.clone()));
    let deleted = wait_until_every(
        "the delete to get through",
        WAIT,
        Duration::from_millis(100),
        || async {
            let r = app.delete(&format!("/api/v1/tasks/{task}")).await;
            if r.status.as_u16() != 503 {
                Ok(r.ok(202))
            } else {
                Err(r.text)
            }
        },
    )
    .await;
    assert!(
        !pid_alive(pid),
        "stopped by the node that ran it, before the delete answered"
    );
    let job = wait_job_settled(&app, uuid(&deleted["cleanup_jobs"][0]["id"])).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        !std::path::Path::new(&worktree).exists(),
        "the job removed the worktree"
    );
    b.stop().await;
}

crate::backend_tests!(a_delete_is_refused_while_the_agent_elsewhere_runs: a_delete_is_refused_while_the_agent_elsewhere_runs_sqlite, a_delete_is_refused_while_the_agent_elsewhere_runs_postgres);
