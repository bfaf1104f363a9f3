//! A delete whose worktrees are on a node that is down (I11 with decision 4). The dirty check cannot be
//! made there, so the delete is refused `503 node_unavailable` and nothing changes, unless the caller
//! consents to keeping dirty work (`keep_dirty_worktrees=true`): then the job, which waits for the node
//! and says so (`waiting_for`), keeps a worktree with changes untouched and lists it under leftovers,
//! and removes a clean one. A job a decommission ends still names the worktrees it would have removed.
//! A worktree found dirty by a delete's job without any consent is listed too, never left owned by
//! nothing. In-process nodes on one disk (each judges only its own); separate disks are `fleet.rs`.
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{Backend, SETTLED, TestApp, branch_exists, uuid, worktrees_of};
use crate::nodes::{job_on, wait_node};
use crate::replicas::Replica;

both_backends!(
    a_delete_while_its_node_is_down_keeps_dirty_work_only_with_consent,
    a_job_a_decommission_ended_still_names_its_worktrees,
    a_dirty_worktree_a_delete_finds_without_consent_is_listed,
);

const WAIT: Duration = Duration::from_secs(60);

/// A task over its own repository with a worktree (no agent); returns (task, source, worktree, branch).
async fn worktree_task(app: &TestApp, ws: Uuid, name: &str) -> (Uuid, PathBuf, PathBuf, String) {
    let (repo, source) = app.repository(ws, name).await;
    let task = app.task(ws, name, &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "start": false}),
        )
        .await
        .ok(201);
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let branch = env["repos"][0]["worktree_branch"].as_str().unwrap().to_string();
    (
        task,
        source,
        PathBuf::from(s["workspace_path"].as_str().unwrap()),
        branch,
    )
}

/// The cleanup jobs of a task, as `b` lists them.
async fn jobs_of(b: &Replica, task: Uuid) -> Vec<Value> {
    b.get(&format!("/api/v1/cleanup-jobs?task_id={task}")).await.ok(200)["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// A berth on a one-second lease, so a stopped node is seen down soon.
async fn short_lease(app: TestApp) -> Option<TestApp> {
    let backend: Backend = app.backend;
    drop(app);
    TestApp::spawn_with(backend, &[("BERTH_NODE_LEASE_SECS", "1")]).await
}

fn waits_for_node(job: &Value, node: &str) {
    let w = &job["waiting_for"];
    assert_eq!(w["reason"], "node_unavailable", "{job}");
    assert_eq!(w["node_id"], node, "{job}");
    assert!(w["since"].is_string(), "since when, known from its lease: {job}");
}

async fn a_delete_while_its_node_is_down_keeps_dirty_work_only_with_consent(app: TestApp) {
    let Some(app) = short_lease(app).await else { return };
    let a = app.config.node_id.clone();
    let ws = app.workspace("ws").await;
    let (dirty, dirty_source, dirty_wt, dirty_branch) = worktree_task(&app, ws, "dirty").await;
    let (clean, _, clean_wt, _) = worktree_task(&app, ws, "clean").await;
    let precious: Vec<u8> = b"uncommitted work\n\x00\xffbytes".to_vec();
    std::fs::write(dirty_wt.join("precious.bin"), &precious).unwrap();
    let b = Replica::start_as(&app, "node-b").await;
    app.stop_server();
    wait_node(&b, &a, "down").await;

    // I11: refused, the work on A's disk cannot be checked; nothing changes (a clean worktree is not
    // known clean either).
    for task in [dirty, clean] {
        let r = b.call(Method::DELETE, &format!("/api/v1/tasks/{task}"), None).await;
        let problem = r.problem(503, "node_unavailable");
        assert_eq!(problem["node_id"], a.as_str(), "{problem}");
        b.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
        assert!(jobs_of(&b, task).await.is_empty(), "no job was written");
    }
    // A workspace delete needs the same consent.
    b.call(
        Method::DELETE,
        &format!("/api/v1/workspaces/{ws}?confirm_name=ws"),
        None,
    )
    .await
    .problem(503, "node_unavailable");
    b.get(&format!("/api/v1/workspaces/{ws}")).await.ok(200);
    // Keeping and discarding at once is no consent at all.
    b.call(
        Method::DELETE,
        &format!("/api/v1/tasks/{dirty}?keep_dirty_worktrees=true&discard_worktree_changes=true"),
        None,
    )
    .await
    .problem(422, "validation_failed");
    b.get(&format!("/api/v1/tasks/{dirty}")).await.ok(200);

    // With consent: accepted; each job waits for A and says so.
    let mut jobs = Vec::new();
    for task in [dirty, clean] {
        let r = b
            .call(
                Method::DELETE,
                &format!("/api/v1/tasks/{task}?keep_dirty_worktrees=true"),
                None,
            )
            .await
            .ok(202);
        let j = &r["cleanup_jobs"][0];
        assert_eq!(j["node_id"], a.as_str(), "{r}");
        waits_for_node(j, &a);
        b.get(&format!("/api/v1/tasks/{task}")).await.problem(404, "not_found");
        jobs.push(uuid(&j["id"]));
    }
    let listed = jobs_of(&b, dirty).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["state"], "pending");
    waits_for_node(&listed[0], &a);
    waits_for_node(&b.get(&format!("/api/v1/cleanup-jobs/{}", jobs[1])).await.ok(200), &a);
    assert!(
        dirty_wt.exists() && clean_wt.exists(),
        "nothing on A's disk is touched while it is down"
    );

    // A comes back: its jobs run there.
    let back = berth::startup::Application::build(app.config.clone())
        .await
        .expect("node A restarts");
    let (background, handle) = (back.background(), back.handle());
    tokio::spawn(back.run_until_stopped());
    wait_node(&b, &a, "up").await;
    let done = job_on(&b, jobs[0], SETTLED).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["waiting_for"].is_null(), "{done}");
    assert!(
        done["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("kept the worktree"),
        "{done}"
    );
    // I11: the dirty worktree is kept, byte for byte, still a worktree of its repository, with its branch.
    assert_eq!(std::fs::read(dirty_wt.join("precious.bin")).unwrap(), precious);
    assert!(worktrees_of(&dirty_source).contains(&dirty_wt.display().to_string()));
    assert!(
        branch_exists(&dirty_source, &dirty_branch),
        "its branch is kept with it"
    );
    // And owned: listed under the workspace's leftovers.
    let listed = b.get(&format!("/api/v1/workspaces/{ws}/leftovers")).await.ok(200);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["reason"], "dirty_worktree", "{listed}");
    assert_eq!(items[0]["path"], dirty_wt.display().to_string());
    assert!(items[0]["task_id"].is_null(), "its task is gone: {listed}");
    assert_eq!(items[0]["node_id"], a.as_str());
    // The clean one is removed as usual.
    let done = job_on(&b, jobs[1], SETTLED).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(!clean_wt.exists(), "the clean worktree is removed");
    background.iter().for_each(|h| h.abort());
    handle.stop(false).await;
    b.stop().await;
}

/// The worktree paths a job names in `would_have_removed`.
fn would_have_removed(job: &Value) -> Vec<String> {
    job["would_have_removed"]["worktree_paths"]
        .as_array()
        .unwrap_or_else(|| panic!("{job}"))
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

async fn a_job_a_decommission_ended_still_names_its_worktrees(app: TestApp) {
    let Some(app) = short_lease(app).await else { return };
    let a = app.config.node_id.clone();
    let ws = app.workspace("ws").await;
    let (task, _, worktree, _) = worktree_task(&app, ws, "doomed").await;
    let b = Replica::start_as(&app, "node-b").await;
    app.stop_server();
    wait_node(&b, &a, "down").await;
    let r = b
        .call(
            Method::DELETE,
            &format!("/api/v1/tasks/{task}?keep_dirty_worktrees=true"),
            None,
        )
        .await
        .ok(202);
    let job = uuid(&r["cleanup_jobs"][0]["id"]);
    assert!(r["cleanup_jobs"][0]["would_have_removed"].is_null(), "{r}");
    waits_for_node(&r["cleanup_jobs"][0], &a);
    b.post(&format!("/api/v1/nodes/{a}/decommission"), json!({"node_id": a}))
        .await
        .ok(200);
    let j = b.get(&format!("/api/v1/cleanup-jobs/{job}")).await.ok(200);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert!(j["waiting_for"].is_null(), "it waits for nothing any more: {j}");
    assert_eq!(j["would_have_removed"]["node_id"], a.as_str(), "{j}");
    assert!(j["would_have_removed"]["at"].is_string(), "{j}");
    assert_eq!(would_have_removed(&j), vec![worktree.display().to_string()]);
    // Listed the same.
    let listed = jobs_of(&b, task).await;
    assert_eq!(would_have_removed(&listed[0]), vec![worktree.display().to_string()]);
    assert!(Path::new(&worktree).exists(), "a decommission deletes nothing");
    b.stop().await;
}

/// A delete's job that finds a worktree with changes and no consent (here a workspace delete, which
/// asks for none) fails touching nothing, and lists the worktree: its task is gone, so nothing else
/// owns it.
async fn a_dirty_worktree_a_delete_finds_without_consent_is_listed(app: TestApp) {
    use sea_orm::EntityTrait;
    // I11: no consent, nothing removed; I13: nothing the inventory does not name is touched.
    let ws = app.workspace("ws").await;
    let (task, _, worktree, _) = worktree_task(&app, ws, "svc").await;
    std::fs::write(worktree.join("notes.txt"), "keep me").unwrap();
    let r = app
        .delete(&format!("/api/v1/workspaces/{ws}?confirm_name=ws"))
        .await
        .ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    let failed = crate::helpers::wait_job(&app, id, WAIT, SETTLED).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert!(
        failed["last_error"].as_str().unwrap().contains("changed files"),
        "{failed}"
    );
    assert_eq!(std::fs::read_to_string(worktree.join("notes.txt")).unwrap(), "keep me");
    let kept = berth::entity::leftover::Entity::find().all(app.db()).await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].path, worktree.display().to_string());
    assert_eq!(kept[0].reason, berth::entity::leftover::LeftoverReason::DirtyWorktree);
    assert_eq!(kept[0].task_id.map(|t| t.to_string()), Some(task.to_string()));
}
