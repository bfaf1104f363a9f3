//! Nodes and instances. Every berth process is an instance of a node holding a lease; `GET /nodes`
//! shows them. A node whose every instance let its lease lapse is down: what needs its agents answers
//! `503 node_unavailable` at once, never after the routing deadline, its sessions say so, and a task
//! delete is accepted with its disk work left as a job that runs when the node is back (I8: the job
//! ends the agent the delete could not reach before it touches anything). In-process replicas here;
//! separate processes on separate disks are `fleet.rs`.
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{execution_pid, pid_alive, uuid};
use crate::both_backends;
use crate::fixture::StartedSession;
use crate::helpers::{Backend, SETTLED, TestApp, seen_json, wait_until};
use crate::replicas::Replica;

both_backends!(
    nodes_and_instances_are_listed,
    a_dead_node_answers_at_once_and_its_delete_waits_for_it,
    a_down_node_is_decommissioned_and_its_tasks_move_on,
    only_the_node_holding_a_leftover_judges_it,
);

const WAIT: Duration = Duration::from_secs(60);

async fn nodes_and_instances_are_listed(app: TestApp) {
    let me = app.config.node_id.clone();
    let listed = app.get("/api/v1/nodes").await.ok(200);
    assert_eq!(listed["node_id"], me.as_str(), "{listed}");
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    let node = &items[0];
    assert_eq!(node["id"], me.as_str());
    assert_eq!(node["state"], "up");
    let instances = node["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1, "{node}");
    assert_eq!(instances[0]["id"], listed["instance_id"]);
    assert_eq!(instances[0]["pid"], std::process::id());
    assert_eq!(instances[0]["live"], true);
    // The scheme forwarded requests (and their tokens) travel with.
    assert_eq!(instances[0]["scheme"], "http", "{node}");
    assert!(instances[0]["url"].as_str().unwrap().starts_with("http://"));
    assert_eq!(instances[0]["db_max_connections"], 5);
    assert_eq!(node["db_max_connections"], 5);
    assert!(!instances[0]["host"].as_str().unwrap().is_empty());
    assert_eq!(
        node["holds"],
        json!({"environments": 0, "live_sessions": 0, "pending_jobs": 0})
    );
    // A repository registered on a node berth has never seen: the caller's mistake (422), not a node
    // that is down (schemathesis found the 503).
    let ws = app.workspace("nowhere").await;
    let r = app
        .post(
            &format!("/api/v1/workspaces/{ws}/repositories"),
            json!({"path": "/tmp", "node_id": "no-such-node"}),
        )
        .await;
    let problem = r.problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "node_id", "{problem}");
    // Admin only.
    let reader = app.token("tasks:read sessions:read cleanup:read");
    app.call(reqwest::Method::GET, "/api/v1/nodes", Some(&reader), None)
        .await
        .problem(403, "insufficient_scope");
    // Readiness and the metrics name who answered.
    let ready = app.call(reqwest::Method::GET, "/readyz", None, None).await.ok(200);
    assert_eq!(ready["node_id"], me.as_str());
    assert_eq!(ready["instance_id"], listed["instance_id"]);
    let metrics = app.call(reqwest::Method::GET, "/metrics", None, None).await.text;
    let line = format!(
        "berth_instance_info{{node_id=\"{me}\",instance_id=\"{}\"}} 1",
        listed["instance_id"].as_str().unwrap()
    );
    assert!(metrics.contains(&line), "{line} missing from:\n{metrics}");
    // A second node on the same database is listed, up, with its own instance.
    let b = Replica::start_as(&app, "node-b").await;
    let listed = b.get("/api/v1/nodes").await.ok(200);
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    let mut want = vec![me.as_str(), "node-b"];
    want.sort();
    assert_eq!(ids, want, "{listed}");
    assert!(listed["items"].as_array().unwrap().iter().all(|n| n["state"] == "up"));
    b.stop().await;
}

/// Waits (with a deadline) until `b` lists node `node` in `state`.
pub(crate) async fn wait_node(b: &Replica, node: &str, state: &str) -> Value {
    wait_until(&format!("node {node} {state}"), WAIT, || async {
        let listed = b.get("/api/v1/nodes").await.ok(200);
        match listed["items"].as_array().unwrap().iter().find(|n| n["id"] == node) {
            Some(n) if n["state"] == state => Ok(n.clone()),
            _ => Err(listed.to_string()),
        }
    })
    .await
}

/// Waits (with a deadline) until the cleanup job `id`, as `b` reads it, is in one of `states`.
pub(crate) async fn job_on(b: &Replica, id: Uuid, states: &[&str]) -> Value {
    wait_until(&format!("cleanup job {id} in {states:?}"), WAIT, || async {
        let j = b.get(&format!("/api/v1/cleanup-jobs/{id}")).await.ok(200);
        seen_json(states.iter().any(|s| j["state"] == *s), j)
    })
    .await
}

async fn a_dead_node_answers_at_once_and_its_delete_waits_for_it(app: TestApp) {
    let backend: Backend = app.backend;
    drop(app);
    // A one-second lease; a routing deadline far longer than any answer here may take.
    let Some(app) = TestApp::spawn_with(
        backend,
        &[("BERTH_NODE_LEASE_SECS", "1"), ("BERTH_ROUTING_DEADLINE_MS", "120000")],
    )
    .await
    else {
        return;
    };
    let a = app.config.node_id.clone();
    let f = app.task_with_repo("Stranded").await;
    let task = f.task;
    let StartedSession { id, created, idle: s } = f.started_session("test").await;
    let worktree = std::path::PathBuf::from(created["workspace_path"].as_str().unwrap());
    assert_eq!(s["node"], json!({"id": a, "state": "up"}), "{s}");
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    // A second session on A, to be deleted on its own while A is down.
    let StartedSession { id: other, idle: o, .. } = f.started_session("test").await;
    let other_pid = execution_pid(&app, uuid(&o["execution_id"])).await;
    // The conversation berth keeps for a session is on its node's disk.
    let conversations = app.config.data_dir.join("conversations");
    std::fs::create_dir_all(&conversations).unwrap();
    let conversation = conversations.join(format!("{other}.jsonl"));
    std::fs::write(&conversation, "{}\n").unwrap();
    let b = Replica::start_as(&app, "node-b").await;
    // Node A dies: its process stops serving and renewing (its agent runs on, as one may after a crash).
    app.stop_server();
    let seen = wait_node(&b, &a, "down").await;
    assert_eq!(seen["holds"]["live_sessions"], 2, "{seen}");
    // What needs A's agent answers at once: not after the 120 s routing deadline.
    let started = std::time::Instant::now();
    let r = b.post(&format!("/api/v1/sessions/{id}/stop"), json!({})).await;
    let problem = r.problem(503, "node_unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(problem["node_id"], a.as_str(), "{problem}");
    assert_eq!(problem["retryable"], true);
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    let r = b
        .post(
            &format!("/api/v1/sessions/{id}/launch"),
            json!({"prompt": "are you there?"}),
        )
        .await;
    r.problem(503, "node_unavailable");
    // The session says where its work is and that the node is down.
    let s = b.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(
        s["node"],
        json!({"id": a, "state": "down"}),
        "b's view refreshed before it answered: {s}"
    );
    assert_eq!(s["state"], "idle", "nothing was changed: {s}");
    // A session delete is accepted: the row goes now; ending its agent and removing its conversation
    // wait for A as a `session_delete` job (I4: the agent is ended before anything of it is removed).
    let r = b
        .call(reqwest::Method::DELETE, &format!("/api/v1/sessions/{other}"), None)
        .await;
    r.ok(204);
    b.get(&format!("/api/v1/sessions/{other}"))
        .await
        .problem(404, "not_found");
    let listed = b
        .get(&format!("/api/v1/cleanup-jobs?task_id={task}&trigger=session_delete"))
        .await
        .ok(200);
    let session_job = &listed["items"][0];
    assert_eq!(
        (session_job["state"].as_str(), session_job["node_id"].as_str()),
        (Some("pending"), Some(a.as_str())),
        "{listed}"
    );
    let session_job = uuid(&session_job["id"]);
    assert!(pid_alive(other_pid) && conversation.exists(), "A's to end and remove");
    // A task delete cannot check A's worktrees for changes: refused, unless dirty work is to be kept.
    b.call(reqwest::Method::DELETE, &format!("/api/v1/tasks/{task}"), None)
        .await
        .problem(503, "node_unavailable");
    // Then it is accepted (a waiting session_delete job does not hold it up); its job waits for A,
    // visibly.
    let r = b
        .call(
            reqwest::Method::DELETE,
            &format!("/api/v1/tasks/{task}?keep_dirty_worktrees=true"),
            None,
        )
        .await;
    let jobs = r.ok(202);
    assert_eq!(jobs["cleanup_jobs"][0]["waiting_for"]["node_id"], a.as_str(), "{jobs}");
    let job = uuid(&jobs["cleanup_jobs"][0]["id"]);
    assert_eq!(jobs["cleanup_jobs"][0]["node_id"], a.as_str(), "{jobs}");
    let seen = wait_node(&b, &a, "down").await;
    assert_eq!(seen["holds"]["pending_jobs"], 2, "{seen}");
    assert!(worktree.exists(), "nothing of A's disk is touched while it is down");
    assert!(pid_alive(pid), "the agent is A's to end");
    // A comes back: the job ends the agent the delete could not reach, then removes the worktree.
    let restarted = berth::startup::Application::build(app.config.clone())
        .await
        .expect("node A restarts");
    let background = restarted.background();
    let handle = restarted.handle();
    tokio::spawn(restarted.run_until_stopped());
    wait_node(&b, &a, "up").await;
    let done = job_on(&b, job, SETTLED).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(!pid_alive(pid), "the job ended the agent first (I8)");
    assert!(!worktree.exists());
    job_on(&b, session_job, &["succeeded"]).await;
    assert!(!pid_alive(other_pid), "the deleted session's agent was ended on A");
    assert!(!conversation.exists(), "and its conversation removed there");
    background.iter().for_each(|h| h.abort());
    handle.stop(false).await;
    b.stop().await;
}

/// A node that is down for good is given up. Its environments are lost, its sessions failed with
/// `node_lost`, its waiting jobs end saying what they would have removed, nothing is deleted, and its
/// tasks get new environments elsewhere. It refuses to start again until an operator says so.
async fn a_down_node_is_decommissioned_and_its_tasks_move_on(app: TestApp) {
    let backend: Backend = app.backend;
    drop(app);
    let Some(app) = TestApp::spawn_with(backend, &[("BERTH_NODE_LEASE_SECS", "1")]).await else {
        return;
    };
    let a = app.config.node_id.clone();
    let f = app.task_with_repo("Kept").await;
    let (ws, repo, kept) = (f.workspace, f.repository, f.task);
    let StartedSession { id, created: s, .. } = f.started_session("test").await;
    let lost_env = s["task_environment_id"].as_str().unwrap().to_string();
    let worktree = std::path::PathBuf::from(s["workspace_path"].as_str().unwrap());
    let doomed = app.task(ws, "Doomed", &[repo]).await;
    let d = app
        .post(
            &format!("/api/v1/tasks/{doomed}/sessions"),
            json!({"executor_type": "worktree", "start": false}),
        )
        .await
        .ok(201);
    let doomed_worktree = std::path::PathBuf::from(d["workspace_path"].as_str().unwrap());
    let b = Replica::start_as(&app, "node-b").await;
    // An up node is never given up; nor one whose id the body does not repeat.
    b.post("/api/v1/nodes/node-b/decommission", json!({"node_id": "node-b"}))
        .await
        .problem(409, "conflict");
    app.stop_server();
    wait_node(&b, &a, "down").await;
    // The doomed task's delete (keeping dirty work: A's disk cannot be checked) waits for A.
    let jobs = b
        .call(
            reqwest::Method::DELETE,
            &format!("/api/v1/tasks/{doomed}?keep_dirty_worktrees=true"),
            None,
        )
        .await
        .ok(202);
    let job = uuid(&jobs["cleanup_jobs"][0]["id"]);
    b.post(&format!("/api/v1/nodes/{a}/decommission"), json!({"node_id": "node-x"}))
        .await
        .problem(422, "validation_failed");
    b.post(
        "/api/v1/nodes/no-such-node/decommission",
        json!({"node_id": "no-such-node"}),
    )
    .await
    .problem(404, "not_found");
    let done = b
        .post(&format!("/api/v1/nodes/{a}/decommission"), json!({"node_id": a}))
        .await
        .ok(200);
    assert_eq!(done["environments"], 1, "{done}");
    assert_eq!(done["sessions"], 1, "{done}");
    assert_eq!(done["cleanup_jobs"], 1, "{done}");
    b.post(&format!("/api/v1/nodes/{a}/decommission"), json!({"node_id": a}))
        .await
        .problem(409, "conflict");
    let node = wait_node(&b, &a, "decommissioned").await;
    assert_eq!(node["holds"]["environments"], 0, "{node}");
    // What it held is lost, and said so; nothing was deleted.
    let env = b.get(&format!("/api/v1/environments/{lost_env}")).await.ok(200);
    assert_eq!(env["status"], "lost", "{env}");
    // Said in an event, which fits its member of the event union (openapi tests check the shapes).
    let events = b.get("/api/v1/events?types=environment.lost").await.ok(200);
    let lost: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "environment.lost")
        .collect();
    assert_eq!(lost.len(), 1, "{events}");
    assert_eq!(lost[0]["data"]["node_id"], a.as_str());
    assert_eq!(
        lost[0]["task_environment_id"].as_str(),
        Some(lost_env.as_str()),
        "{events}"
    );
    let s = b.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(s["state"], "failed", "{s}");
    assert_eq!(s["last_error"]["code"], "node_lost", "{s}");
    let j = b.get(&format!("/api/v1/cleanup-jobs/{job}")).await.ok(200);
    assert_eq!(j["state"], "cancelled", "{j}");
    let why = j["last_error"].as_str().unwrap();
    // The worktree it names is redacted in the answer (I34: no filesystem path in a body).
    assert!(
        why.contains("decommissioned") && why.contains("would have removed: <path>"),
        "{why}"
    );
    assert!(
        worktree.exists() && doomed_worktree.exists(),
        "a decommission deletes nothing"
    );
    // The kept task goes on elsewhere: a new session gets a new environment on node b.
    let fresh = b
        .post(
            &format!("/api/v1/tasks/{kept}/sessions"),
            json!({"executor_type": "worktree", "start": false}),
        )
        .await
        .ok(201);
    assert_ne!(fresh["task_environment_id"].as_str().unwrap(), lost_env);
    assert_eq!(fresh["node"], json!({"id": "node-b", "state": "up"}), "{fresh}");
    // A comes back: it refuses to start until an operator says so, then starts and is up.
    app.app_state.ctx.runtime.stop_all().await;
    let refused = berth::startup::Application::build(app.config.clone()).await;
    let Err(e) = refused else {
        panic!("a decommissioned node started");
    };
    assert!(format!("{e:#}").contains("BERTH_NODE_READMIT"), "{e:#}");
    let mut config = app.config.clone();
    config.node_readmit = true;
    let back = berth::startup::Application::build(config).await.expect("readmitted");
    let (background, handle) = (back.background(), back.handle());
    tokio::spawn(back.run_until_stopped());
    wait_node(&b, &a, "up").await;
    assert!(worktree.exists(), "readmitted, it deletes nothing");
    background.iter().for_each(|h| h.abort());
    handle.stop(false).await;
    b.stop().await;
}

/// What berth kept on one node's disk is looked at only there: another node listing the workspace's
/// leftovers does not find the directory on its own disk and must not drop the record.
async fn only_the_node_holding_a_leftover_judges_it(app: TestApp) {
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let ws = app.workspace("ws").await;
    let b = Replica::start_as(&app, "node-b").await;
    let id = uuid::Uuid::now_v7();
    berth::entity::leftover::Entity::insert(berth::entity::leftover::ActiveModel {
        id: Set(id.into()),
        workspace_id: Set(ws.into()),
        task_id: Set(None),
        task_environment_id: Set(None),
        repository_id: Set(None),
        path: Set("/on/node-b/only".into()),
        original_path: Set("/on/node-b/only".into()),
        reason: Set(berth::entity::leftover::LeftoverReason::SetAside),
        detail: Set("kept on node b".into()),
        worktree: Set(json!({})),
        created_at: Set(chrono::Utc::now()),
        node_id: Set(Some("node-b".into())),
    })
    .exec_without_returning(app.db())
    .await
    .unwrap();
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/leftovers")).await.ok(200);
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        1,
        "listed where it is not: {listed}"
    );
    assert_eq!(listed["items"][0]["node_id"], "node-b");
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/leftovers")).await.ok(200);
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "and kept: {listed}");
    // Node b, whose disk it is on, finds it gone and drops it.
    let listed = b.get(&format!("/api/v1/workspaces/{ws}/leftovers")).await.ok(200);
    assert_eq!(listed["items"].as_array().unwrap().len(), 0, "{listed}");
    b.stop().await;
}
