//! Writers racing over sessions and their agents, each race run many times on both databases: an archive
//! racing a launch that fails never rewrites the cancellation (one terminal state per session, I32's one
//! event per committed change), a task delete's job racing a session delete's job after the node is back
//! never removes the worktree under the deleted session's agent (I8), and git status read from the
//! instance that does not run the agent is as fresh as from the one that does (I20, I25).
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{execution_pid, pid_alive, uuid};
use crate::both_backends;
use crate::helpers::{Backend, SETTLED, TestApp, branch_exists, git, seen, seen_json, wait_until, wait_until_every};
use crate::replicas::Replica;

both_backends!(
    a_failure_recorded_after_a_cancellation_is_refused,
    archive_racing_a_failing_launch_leaves_one_terminal_state,
    a_task_delete_job_never_removes_a_worktree_under_a_deleted_sessions_agent,
    git_status_from_the_instance_not_running_the_agent_is_fresh,
    git_status_reads_only_the_validated_environment,
);

const WAIT: Duration = Duration::from_secs(60);
const ROUNDS: usize = 50;

/// A launch that gets past its handle and then fails slowly: an ACP profile whose process never answers
/// `initialize` and exits after a while (or when it is stopped).
fn slow_failing_profile() -> (String, berth::config::AgentProfile) {
    let profile = berth::config::AgentProfile {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), "sleep 0.3".into()],
        protocol: berth::config::AgentProtocol::Acp,
        ..Default::default()
    };
    ("slowfail".to_string(), profile)
}

const TERMINAL: [&str; 3] = ["cancelled", "failed", "stopped"];

/// The states each session went through, oldest first, from its `session.state_changed` events.
async fn states_by_session(app: &TestApp) -> HashMap<Uuid, Vec<String>> {
    let mut out: HashMap<Uuid, Vec<String>> = HashMap::new();
    for e in app.event_rows().await {
        if e.event_type.as_str() != "session.state_changed" {
            continue;
        }
        if let Some(s) = e.session_id {
            let state = e.data["state"].as_str().unwrap_or_default().to_string();
            out.entry(s.into()).or_default().push(state);
        }
    }
    out
}

// I32 (one event per committed change) and the session table: `record_failure` is a compare-and-set on
// the state and execution its caller read. A failure recorded against a session an archive cancelled
// meanwhile is refused and writes nothing; a cancelled session never becomes failed.
async fn a_failure_recorded_after_a_cancellation_is_refused(app: TestApp) {
    use berth::domain::sessions::{Seen, record_failure};
    let ctx = app.app_state.ctx.clone();
    let f = app.task_with_repo("Cancelled stays cancelled").await;
    let started = f.started_session("test").await;
    let id = started.id;
    let read = |id: Uuid| {
        let conn = app.db().clone();
        async move { berth::store::sessions::find(&conn, id.into()).await.unwrap().unwrap() }
    };
    let task = berth::store::tasks::find(app.db(), f.task.into())
        .await
        .unwrap()
        .unwrap();
    // What a failing launch or exit report read before the archive.
    let before = read(id).await;
    assert_eq!(before.state, berth::entity::task_session::SessionState::Idle);
    let archived = app
        .post(&format!("/api/v1/tasks/{}/archive", f.task), json!({}))
        .await
        .ok(202);
    for j in archived["cleanup_jobs"].as_array().unwrap() {
        let done = crate::helpers::wait_job_settled(&app, uuid(&j["id"])).await;
        assert_eq!(done["state"], "succeeded", "{done}");
    }
    let cancelled = read(id).await;
    assert_eq!(cancelled.state, berth::entity::task_session::SessionState::Cancelled);
    let events_before = states_by_session(&app).await.remove(&id).unwrap_or_default();
    for seen in [
        Seen::exactly(&before),
        Seen::on_execution(before.execution_id),
        // Even a caller that saw it cancelled: the table refuses `failed` after a cancellation.
        Seen::exactly(&cancelled),
    ] {
        let recorded = record_failure(&ctx, &task, id.into(), seen, "agent_exited", "too late")
            .await
            .unwrap();
        assert!(!recorded, "refused for {seen:?}");
    }
    let after = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(after["state"], "cancelled", "{after}");
    assert_ne!(after["last_error"]["code"], "agent_exited", "{after}");
    assert_eq!(
        states_by_session(&app).await.remove(&id).unwrap_or_default(),
        events_before,
        "no event for a refused failure"
    );
    // The compare-and-set is not a refusal of everything: on a live task, a stale read is refused and
    // the current one is recorded, with one event.
    let g = app.task_with_repo_in("ws2", "svc2", "Fails once").await;
    let other = g.started_session("test").await.id;
    let other_task = berth::store::tasks::find(app.db(), g.task.into())
        .await
        .unwrap()
        .unwrap();
    let current = read(other).await;
    let stale = Seen::exactly(&berth::entity::task_session::Model {
        state: berth::entity::task_session::SessionState::Running,
        ..current.clone()
    });
    assert!(
        !record_failure(&ctx, &other_task, other.into(), stale, "agent_exited", "stale")
            .await
            .unwrap()
    );
    assert!(
        record_failure(
            &ctx,
            &other_task,
            other.into(),
            Seen::exactly(&current),
            "agent_exited",
            "now"
        )
        .await
        .unwrap()
    );
    let failed = app.get(&format!("/api/v1/sessions/{other}")).await.ok(200);
    assert_eq!(failed["state"], "failed", "{failed}");
    let states = states_by_session(&app).await.remove(&other).unwrap_or_default();
    assert_eq!(states.iter().filter(|s| *s == "failed").count(), 1, "{states:?}");
}

// I7, I32: an archive racing a launch that gets past its handle and then fails (the agent never opens its
// conversation). Whichever commits first, each session ends in exactly one terminal state with exactly one
// terminal state event, and one the archive cancelled stays cancelled (the launch's failure is refused).
async fn archive_racing_a_failing_launch_leaves_one_terminal_state(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let Some(app) = TestApp::spawn_with_profiles(backend, &[], vec![slow_failing_profile()]).await else {
        return;
    };
    let ws = app.workspace("ws").await;
    let (repo, _source) = app.repository(ws, "svc").await;
    let mut sessions = Vec::new();
    let mut jobs = Vec::new();
    for i in 0..ROUNDS {
        let task = app.task(ws, &format!("archive x launch {i}"), &[repo]).await;
        let s = uuid(&app.unstarted_agent(task, "worktree", "slowfail").await["id"]);
        let launch_url = format!("/api/v1/sessions/{s}/launch");
        let archive_url = format!("/api/v1/tasks/{task}/archive");
        // The archive lands before the launch's handle, during its failing start, or after it failed.
        let delay = Duration::from_millis(40 * (i % 6) as u64);
        let archive = async {
            tokio::time::sleep(delay).await;
            app.post(&archive_url, json!({})).await
        };
        let (l, a) = tokio::join!(app.post(&launch_url, json!({})), archive);
        match l.status.as_u16() {
            200 => {}
            409 | 502 | 503 => {
                let code = l.json()["code"].as_str().unwrap_or_default().to_string();
                assert!(
                    [
                        "task_archived",
                        "task_cleanup_in_progress",
                        "agent_start_failed",
                        "conflict",
                    ]
                    .contains(&code.as_str()),
                    "{}",
                    l.text
                );
            }
            other => panic!("the launch answered {other}: {}", l.text),
        }
        jobs.push(a.ok(202));
        sessions.push(s);
    }
    for r in &jobs {
        for j in r["cleanup_jobs"].as_array().unwrap() {
            let done = crate::helpers::wait_job_settled(&app, uuid(&j["id"])).await;
            assert_eq!(done["state"], "succeeded", "{done}");
        }
    }
    // Every launch has answered and every job settled; wait until no agent of these sessions is live.
    wait_until_every("no agent left", WAIT, Duration::from_millis(20), || async {
        let live = app.app_state.ctx.runtime.live_sessions();
        seen(live.is_empty(), live)
    })
    .await;
    let states = states_by_session(&app).await;
    let (mut launched_then_cancelled, mut launched_then_failed) = (0, 0);
    for s in &sessions {
        let row = app.get(&format!("/api/v1/sessions/{s}")).await.ok(200);
        let now = row["state"].as_str().unwrap().to_string();
        let went = states.get(s).cloned().unwrap_or_default();
        let terminal: Vec<&String> = went.iter().filter(|st| TERMINAL.contains(&st.as_str())).collect();
        assert!(TERMINAL.contains(&now.as_str()), "every session is over: {row}");
        assert_eq!(terminal.len(), 1, "exactly one terminal state event for {s}: {went:?}");
        assert_eq!(went.last(), Some(&now), "the last event is the state: {went:?} {row}");
        if went.iter().any(|st| st == "cancelled") {
            assert_eq!(now, "cancelled", "a cancelled session stayed cancelled: {went:?}");
        }
        if went.iter().any(|st| st == "starting") {
            match now.as_str() {
                "cancelled" => launched_then_cancelled += 1,
                "failed" => launched_then_failed += 1,
                _ => {}
            }
        }
    }
    eprintln!(
        "archive x launch: {launched_then_cancelled} launches cancelled by the archive after their handle, \
         {launched_then_failed} failed before it"
    );
    assert!(
        launched_then_cancelled > 0,
        "the race never reached a launch past its handle: nothing was tested"
    );
}

/// Waits (with a deadline) until the cleanup job `id`, as `b` reads it, is in one of `states`.
async fn job_on(b: &Replica, id: Uuid, states: &[&str]) -> Value {
    wait_until(&format!("cleanup job {id} in {states:?}"), WAIT, || async {
        let j = b.get(&format!("/api/v1/cleanup-jobs/{id}")).await.ok(200);
        seen_json(states.iter().any(|s| j["state"] == *s), j)
    })
    .await
}

async fn wait_node(b: &Replica, node: &str, state: &str) {
    wait_until(&format!("node {node} {state}"), WAIT, || async {
        let listed = b.get("/api/v1/nodes").await.ok(200);
        match listed["items"].as_array().unwrap().iter().find(|n| n["id"] == node) {
            Some(n) if n["state"] == state => Ok(()),
            _ => Err(listed.to_string()),
        }
    })
    .await
}

/// How many rounds of the node race: each is a task with a lingering agent.
const NODE_ROUNDS: usize = 50;

// I8 after a node returns: while node A is down, a session is deleted (its agent and conversation left
// as a `session_delete` job) and then its task (a delete job for A). When A is back the two jobs may run in
// either order or at once on A's two workers; the task's job still ends the deleted session's agent before
// it removes the worktree (a watcher checks the pid whenever the worktree is gone). Its committed work
// stays on its branch.
async fn a_task_delete_job_never_removes_a_worktree_under_a_deleted_sessions_agent(app: TestApp) {
    let backend: Backend = app.backend;
    drop(app);
    let Some(app) = TestApp::spawn_with(
        backend,
        &[("BERTH_NODE_LEASE_SECS", "1"), ("BERTH_ROUTING_DEADLINE_MS", "120000")],
    )
    .await
    else {
        return;
    };
    let a = app.config.node_id.clone();
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    struct Round {
        task: Uuid,
        session: Uuid,
        worktree: PathBuf,
        branch: String,
        commit: String,
        pid: i64,
    }
    let mut rounds = Vec::new();
    for i in 0..NODE_ROUNDS {
        let task = app.task(ws, &format!("node race {i}"), &[repo]).await;
        let started = app.started_agent(task, "test").await;
        let worktree = PathBuf::from(started.created["workspace_path"].as_str().unwrap());
        // Work committed on the task's branch: the delete must keep it (unmerged).
        std::fs::write(worktree.join("work.txt"), format!("round {i}\n")).unwrap();
        git(&worktree, &["add", "work.txt"]);
        git(&worktree, &["commit", "-q", "-m", "work"]);
        let branch = git(&worktree, &["rev-parse", "--abbrev-ref", "HEAD"])
            .trim()
            .to_string();
        let commit = git(&worktree, &["rev-parse", "HEAD"]).trim().to_string();
        let pid = execution_pid(&app, uuid(&started.idle["execution_id"])).await;
        rounds.push(Round {
            task,
            session: started.id,
            worktree,
            branch,
            commit,
            pid,
        });
    }
    let b = Replica::start_as(&app, "node-b").await;
    // Node A dies; its agents run on, as they may after a crash.
    app.stop_server();
    wait_node(&b, &a, "down").await;
    let mut session_jobs = Vec::new();
    let mut task_jobs = Vec::new();
    for r in &rounds {
        // B's view of A may lag the lease by a refresh: a `503 node_unavailable` says to retry.
        wait_until("the session delete accepted", WAIT, || async {
            let r = b
                .call(
                    reqwest::Method::DELETE,
                    &format!("/api/v1/sessions/{}", r.session),
                    None,
                )
                .await;
            match r.status.as_u16() {
                204 => Ok(()),
                503 => Err(r.text),
                _ => panic!("the session delete answered {}: {}", r.status, r.text),
            }
        })
        .await;
        let listed = b
            .get(&format!(
                "/api/v1/cleanup-jobs?task_id={}&trigger=session_delete",
                r.task
            ))
            .await
            .ok(200);
        session_jobs.push(uuid(&listed["items"][0]["id"]));
        let deleted = b
            // Its node is down: the dirty check cannot be made there, so the delete consents to keeping
            // dirty work (there is none: the change is committed, the worktree goes).
            .call(
                reqwest::Method::DELETE,
                &format!("/api/v1/tasks/{}?keep_dirty_worktrees=true", r.task),
                None,
            )
            .await
            .ok(202);
        task_jobs.push(uuid(&deleted["cleanup_jobs"][0]["id"]));
    }
    for r in &rounds {
        assert!(
            pid_alive(r.pid) && r.worktree.exists(),
            "nothing of A's runs or goes while it is down"
        );
    }
    // Watch every pair from now on: a worktree gone while its deleted session's agent lives is the hole.
    let stop = Arc::new(AtomicBool::new(false));
    let pairs: Vec<(PathBuf, i64)> = rounds.iter().map(|r| (r.worktree.clone(), r.pid)).collect();
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seen_under = Vec::new();
            while !stop.load(Ordering::Acquire) {
                for (worktree, pid) in &pairs {
                    if !worktree.exists() && pid_alive(*pid) && !seen_under.contains(pid) {
                        seen_under.push(*pid);
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen_under
        })
    };
    // A comes back, its two workers played here so that the interleaving is chosen: in even rounds the
    // task's job runs to its end before the session_delete job starts (the order a second worker may
    // take), in odd rounds both run at once.
    let mut config = app.config.clone();
    config.cleanup_workers = 0;
    let restarted = berth::startup::Application::build(config)
        .await
        .expect("node A restarts");
    let ctx = restarted.state.ctx.clone();
    let background = restarted.background();
    let handle = restarted.handle();
    tokio::spawn(restarted.run_until_stopped());
    let owner = "played-worker";
    let mut claimed = HashMap::new();
    while let Some(j) = berth::domain::cleanup::claim::claim(&ctx, owner).await.unwrap() {
        claimed.insert(Uuid::from(j.id), j);
    }
    let run = |j: berth::domain::cleanup::claim::CleanupJob| {
        let ctx = ctx.clone();
        async move {
            let lost = AtomicBool::new(false);
            let outcome = berth::domain::cleanup::execute::execute(&ctx, &j, &lost).await;
            berth::domain::cleanup::claim::record(&ctx, owner, &j, outcome)
                .await
                .unwrap();
        }
    };
    for (i, (sj, tj)) in session_jobs.iter().zip(task_jobs.iter()).enumerate() {
        let sj = claimed.remove(sj).expect("the session_delete job was claimable on A");
        let tj = claimed.remove(tj).expect("the task's job was claimable on A");
        if i % 2 == 0 {
            run(tj).await;
            run(sj).await;
        } else {
            tokio::join!(run(tj), run(sj));
        }
    }
    for id in session_jobs.iter().chain(task_jobs.iter()) {
        let done = job_on(&b, *id, SETTLED).await;
        assert_eq!(done["state"], "succeeded", "{done}");
    }
    stop.store(true, Ordering::Release);
    let under = watcher.join().unwrap();
    assert!(
        under.is_empty(),
        "worktrees removed while the deleted session's agent still ran (pids {under:?})"
    );
    for r in &rounds {
        assert!(!pid_alive(r.pid), "the deleted session's agent was ended");
        assert!(!r.worktree.exists(), "the task's worktree was removed");
        assert!(
            branch_exists(&source, &r.branch),
            "the work's branch is kept: {}",
            r.branch
        );
        let tip = git(&source, &["rev-parse", &r.branch]).trim().to_string();
        assert_eq!(tip, r.commit, "no work is lost");
    }
    background.iter().for_each(|h| h.abort());
    handle.stop(false).await;
    b.stop().await;
}

/// The git status of an environment as `get` reads it: (path, worktree status) of each file.
fn files_of(status: &Value) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = status["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["files"].as_array().cloned().unwrap_or_default())
        .map(|f| {
            (
                f["path"].as_str().unwrap_or_default().to_string(),
                f["worktree_status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    files.sort();
    files
}

// I25 on a node with two instances: while an agent is live in the environment, a fresh inspection is
// authoritative on the instance that does not run it too (the agent_executions rows of live instances say
// so); once no agent is live, the newest stored observation is, on both.
async fn git_status_from_the_instance_not_running_the_agent_is_fresh(app: TestApp) {
    // A second instance of the same node (same disk), started first: it runs nothing of the first's.
    let b = Replica::start_as(&app, &app.config.node_id).await;
    let f = app.task_with_repo("Status on two instances").await;
    let started = f.started_session("test").await;
    let env = uuid(&started.idle["task_environment_id"]);
    let worktree = PathBuf::from(started.created["workspace_path"].as_str().unwrap());
    let status_url = format!("/api/v1/environments/{env}/git-status");
    // An observation stored before the change.
    app.post(&format!("{status_url}/refresh"), json!({})).await.ok(200);
    assert!(
        app.app_state.ctx.runtime.is_live(started.id.into()) && !b.runs(started.id),
        "the agent is the first instance's"
    );
    std::fs::write(worktree.join("fresh.txt"), "written while the agent is live\n").unwrap();
    let on_b = b.get(&status_url).await.ok(200);
    assert!(
        files_of(&on_b).iter().any(|(p, _)| p == "fresh.txt"),
        "the instance not running the agent inspects afresh: {on_b}"
    );
    let on_a = app.get(&status_url).await.ok(200);
    assert_eq!(files_of(&on_a), files_of(&on_b), "both instances agree: {on_a} {on_b}");
    // No agent live any more: the newest stored observation is authoritative, on both instances.
    app.post(&format!("/api/v1/sessions/{}/stop", started.id), json!({}))
        .await
        .ok(200);
    wait_until("the agent stopped", WAIT, || async {
        let s = app.get(&format!("/api/v1/sessions/{}", started.id)).await.ok(200);
        seen_json(s["state"] == "stopped", s)
    })
    .await;
    std::fs::write(worktree.join("later.txt"), "written with no agent live\n").unwrap();
    for (who, status) in [
        ("b", b.get(&status_url).await.ok(200)),
        ("a", app.get(&status_url).await.ok(200)),
    ] {
        let files = files_of(&status);
        assert!(files.iter().any(|(p, _)| p == "fresh.txt"), "{who}: {status}");
        assert!(
            !files.iter().any(|(p, _)| p == "later.txt"),
            "{who}: with no agent live the stored observation stands: {status}"
        );
    }
    b.stop().await;
}

// I20: files, changes and git status come only from the selected, validated environment. A worktree that
// stops being the environment's (replaced by a plain directory) is refused with a typed 409 and the
// environment reads stale; what was read from it never becomes current, and a reset's fresh environment
// reports its own worktree, not the rejected one's status.
async fn git_status_reads_only_the_validated_environment(app: TestApp) {
    let f = app.task_with_repo("Validated reads").await;
    let session = f.session("worktree").await;
    let sid = uuid(&session["id"]);
    let env = uuid(&session["task_environment_id"]);
    let worktree = PathBuf::from(session["workspace_path"].as_str().unwrap());
    let status_url = format!("/api/v1/environments/{env}/git-status");
    std::fs::write(worktree.join("kept.txt"), "before\n").unwrap();
    let first = app.post(&format!("{status_url}/refresh"), json!({})).await.ok(200);
    assert!(files_of(&first).iter().any(|(p, _)| p == "kept.txt"), "{first}");
    // The session shows its environment's workspace path.
    let s = app.get(&format!("/api/v1/sessions/{sid}")).await.ok(200);
    assert_eq!(s["workspace_path"], session["workspace_path"], "{s}");
    // The worktree is replaced by a plain directory (a re-clone, a restore from backup).
    std::fs::remove_dir_all(&worktree).unwrap();
    std::fs::create_dir_all(&worktree).unwrap();
    git(&worktree, &["init", "-q"]);
    std::fs::write(worktree.join("rogue.txt"), "not the environment's\n").unwrap();
    let r = app.post(&format!("{status_url}/refresh"), json!({})).await;
    let problem = r.problem(409, "workspace_reuse_unsafe");
    assert!(problem["category"].is_string(), "{problem}");
    let now = app.get(&status_url).await.ok(200);
    assert_eq!(
        now["stale"], true,
        "the status of a rejected workspace reads stale: {now}"
    );
    assert!(
        !files_of(&now).iter().any(|(p, _)| p == "rogue.txt"),
        "nothing read from the rejected workspace becomes current: {now}"
    );
    let diff = app.get(&format!("/api/v1/sessions/{sid}/diff")).await;
    assert_ne!(
        diff.status.as_u16(),
        200,
        "no changes served from a rejected workspace: {}",
        diff.text
    );
    assert!(!diff.text.contains("rogue.txt"), "{}", diff.text);
}
