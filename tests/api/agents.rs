//! Agents start only in a proven workspace (seed 000 "Launch admission", I15-I20, I26-I28), with the
//! project's test agent as a real process.
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, git, git_repo, id_of, worktrees_of};

both_backends!(
    profiles_are_listed_without_their_environment,
    an_agent_works_in_its_admitted_worktree,
    a_local_agent_works_in_the_repository,
    admission_refuses_a_broken_workspace_and_changes_nothing,
    a_successful_resume_heals_a_wrong_workspace_path,
    stop_escalates_to_sigkill_for_an_agent_that_ignores_abort,
    a_second_launch_returns_the_running_session,
    bad_agent_requests_fail_cleanly,
    deleting_an_idle_session_stops_its_agent_and_keeps_the_workspace,
    a_restart_relaunches_open_sessions_in_the_same_worktree,
    an_executor_transition_forwards_nothing_and_keeps_the_old_workspace,
    a_failed_transition_leaves_the_current_environment_in_place,
    a_crashed_agent_is_restarted_then_failed_past_the_threshold,
    attention_requests_belong_to_their_session,
    the_summary_counts_agents_per_directory,
    an_inadmissible_session_is_failed_on_restore_never_moved,
    restore_relaunches_two_at_a_time,
    a_snapshot_then_the_stream_loses_nothing_while_an_agent_streams,
    a_launch_cut_off_by_a_crash_is_restored,
    a_restore_that_moves_a_session_to_recovering_reports_it,
    notices_are_events_and_never_ask_for_attention,
);

const WAIT: Duration = Duration::from_secs(20);

pub(crate) fn uuid(v: &Value) -> Uuid {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string: {v}"))
        .parse()
        .unwrap()
}

/// Polls the session until `pred` holds (with a deadline).
pub(crate) async fn wait_session(app: &TestApp, id: Uuid, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
        if pred(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "session never {what}: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `n` of the session's inbox messages are delivered to its agent.
pub(crate) async fn wait_delivered(app: &TestApp, id: Uuid, n: usize) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let list = app.get(&format!("/api/v1/sessions/{id}/messages")).await.ok(200);
        let delivered = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["state"] == "delivered")
            .count();
        if delivered >= n {
            return list;
        }
        assert!(tokio::time::Instant::now() < deadline, "never {n} delivered: {list}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The texts the agent replied with, from the `runtime.output` events of a session.
pub(crate) async fn replies(app: &TestApp, session: Uuid) -> Vec<String> {
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "runtime.output" && e["session_id"] == session.to_string())
        .filter(|e| e["data"]["event"]["type"] == "message_end" && e["data"]["event"]["message"]["role"] == "assistant")
        .map(|e| {
            e["data"]["event"]["message"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

async fn wait_reply(app: &TestApp, session: Uuid, n: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let r = replies(app, session).await;
        if r.len() >= n {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reply #{n} from the agent: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn pid_alive(pid: i64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

pub(crate) async fn execution_pid(app: &TestApp, execution: Uuid) -> i64 {
    use sea_orm::EntityTrait;
    let e = berth::entity::agent_execution::Entity::find_by_id(execution)
        .one(app.db())
        .await
        .unwrap()
        .unwrap();
    e.pid.expect("the durable handle records the pid") as i64
}

/// What admission must never change: git state, files and registrations of the source and the worktree.
fn fingerprint(source: &Path, worktree: &Path) -> (Vec<String>, String, String, Vec<String>) {
    let mut listing: Vec<String> = walk(worktree).into_iter().map(|p| p.display().to_string()).collect();
    listing.sort();
    (
        worktrees_of(source),
        git(source, &["status", "--porcelain"]),
        git(source, &["rev-parse", "HEAD"]),
        listing,
    )
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries {
        let p = e.unwrap().path();
        if p.file_name().is_some_and(|n| n == ".git") {
            out.push(p);
            continue;
        }
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

async fn profiles_are_listed_without_their_environment(app: TestApp) {
    let r = app.get("/api/v1/agent-profiles").await;
    let list = r.ok(200);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["fakepi", "missing", "stubborn", "test"]);
    assert!(
        !r.text.contains("s3cret-value"),
        "environment values never leave the config"
    );
}

// I15, I17, I19: the agent's working directory is the admitted worktree; prompts and messages arrive.
async fn an_agent_works_in_its_admitted_worktree(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Agent", &[repo]).await;
    let r = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "pwd"}),
        )
        .await;
    let s = r.ok(201);
    let id = uuid(&s["id"]);
    assert!(s["execution_id"].is_string());
    assert_eq!(s["desired_open"], true);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    assert_eq!(
        wait_reply(&app, id, 1).await[0],
        worktree.display().to_string(),
        "the agent runs in the worktree"
    );
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    assert!(pid_alive(pid));
    // The profile's environment reaches the agent.
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "env BERTH_TEST_SECRET"}),
    )
    .await
    .ok(202);
    assert_eq!(wait_reply(&app, id, 2).await[1], "s3cret-value");
    // Nothing else of berth's environment does: the test process holds CARGO_* variables and, in CI, the
    // PostgreSQL URL; the agent sees only the allow-list, its profile's and its session's.
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "envkeys"}))
        .await
        .ok(202);
    let keys = wait_reply(&app, id, 3).await[2].clone();
    let keys: Vec<&str> = keys.split(' ').collect();
    assert!(keys.contains(&"PATH") && keys.contains(&"BERTH_SESSION_ID"), "{keys:?}");
    let leaked: Vec<&&str> = keys
        .iter()
        .filter(|k| {
            !(berth::runtime::INHERITED_ENV.contains(k)
                || k.starts_with("LC_")
                || ["BERTH_TEST_SECRET", "BERTH_SESSION_ID", "BERTH_EXECUTION_ID"].contains(k))
        })
        .collect();
    assert!(leaked.is_empty(), "the agent inherited {leaked:?}");
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "write hello.txt hi there"}),
    )
    .await
    .ok(202);
    wait_reply(&app, id, 4).await;
    assert_eq!(std::fs::read_to_string(worktree.join("hello.txt")).unwrap(), "hi there");
    // Events: the state went starting -> idle/running, and output is visible as runtime.output.
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let states: Vec<String> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.state_changed" && e["session_id"] == id.to_string())
        .map(|e| e["data"]["state"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(states.first().map(String::as_str), Some("starting"));
    assert!(
        states.contains(&"running".to_string()) && states.contains(&"idle".to_string()),
        "{states:?}"
    );
    // The transcript is kept in the conversation history.
    assert!(app.count("session_messages").await >= 6);
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
    assert!(!pid_alive(pid));
}

async fn a_local_agent_works_in_the_repository(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Local agent", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "local", "agent_profile": "test", "prompt": "pwd"}),
        )
        .await
        .ok(201);
    assert_eq!(
        wait_reply(&app, uuid(&s["id"]), 1).await[0],
        source.display().to_string()
    );
    app.post(&format!("/api/v1/sessions/{}/stop", uuid(&s["id"])), json!({}))
        .await
        .ok(200);
}

// I15, I16: a missing directory, a plain directory, a worktree of another repository: refused with the
// category, before any process exists; git state, files and inventory are unchanged.
async fn admission_refuses_a_broken_workspace_and_changes_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let other = git_repo(&app.scratch.path().join("other"), "main");
    let task = app.task(ws, "Broken", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test", "start": false}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    let env_before = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let moved = worktree.with_file_name("svc-moved-away");

    type Step<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Step, Step)> = vec![
        (
            "workspace_missing",
            Box::new(|| std::fs::rename(&worktree, &moved).unwrap()),
            Box::new(|| std::fs::rename(&moved, &worktree).unwrap()),
        ),
        (
            "not_a_git_worktree",
            Box::new(|| {
                std::fs::rename(&worktree, &moved).unwrap();
                std::fs::create_dir_all(&worktree).unwrap();
                std::fs::write(worktree.join("plain.txt"), "plain").unwrap();
            }),
            Box::new(|| {
                std::fs::remove_dir_all(&worktree).unwrap();
                std::fs::rename(&moved, &worktree).unwrap();
            }),
        ),
        (
            "repository_mismatch",
            Box::new(|| {
                std::fs::rename(&worktree, &moved).unwrap();
                git(
                    &other,
                    &["worktree", "add", "-q", "-b", "elsewhere", worktree.to_str().unwrap()],
                );
            }),
            Box::new(|| {
                git(&other, &["worktree", "remove", worktree.to_str().unwrap()]);
                std::fs::rename(&moved, &worktree).unwrap();
            }),
        ),
    ];
    for (category, break_it, mend_it) in cases {
        break_it();
        let before = fingerprint(&source, &worktree);
        let other_before = worktrees_of(&other);
        let r = app.post(&format!("/api/v1/sessions/{id}/resume"), json!({})).await;
        let p = r.problem(409, "workspace_reuse_unsafe");
        assert_eq!(p["category"], category);
        assert_eq!(p["retryable"], true);
        assert_eq!(p["action"], "reset_environment");
        for secret in [
            worktree.display().to_string(),
            source.display().to_string(),
            "berth/".to_string(),
            "s3cret".to_string(),
        ] {
            assert!(
                !r.text.contains(&secret),
                "{category}: the body leaks {secret}: {}",
                r.text
            );
        }
        assert_eq!(
            fingerprint(&source, &worktree),
            before,
            "{category}: nothing changed on disk or in git"
        );
        assert_eq!(worktrees_of(&other), other_before);
        // The refusal marks the environment broken, and changes nothing else of it.
        let env_now = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
        assert_eq!(env_now["repos"], env_before["repos"], "{category}: inventory unchanged");
        assert_eq!(env_now["id"], env_before["id"]);
        assert_eq!(env_now["status"], "broken");
        assert_eq!(env_now["broken_category"], category);
        assert_eq!(
            app.count("agent_executions").await,
            0,
            "{category}: no process was started"
        );
        let failed = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
        assert_eq!(failed["state"], "failed");
        assert_eq!(failed["last_error"]["code"], "workspace_reuse_unsafe");
        mend_it();
    }
    // Mended, the same session resumes in its worktree: admission proved it again, so it is ready again.
    app.post(&format!("/api/v1/sessions/{id}/resume"), json!({"prompt": "pwd"}))
        .await
        .ok(200);
    assert_eq!(wait_reply(&app, id, 1).await[0], worktree.display().to_string());
    let env_now = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(env_now["status"], "ready");
    assert!(env_now["broken_category"].is_null());
    assert_eq!(env_now["repos"], env_before["repos"]);
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

// I19: a launch writes the effective workspace back, healing a wrong value written earlier.
async fn a_successful_resume_heals_a_wrong_workspace_path(app: TestApp) {
    use berth::entity::task_environment as env;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Heal", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test", "start": false}),
        )
        .await
        .ok(201);
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    let env_id = uuid(&s["task_environment_id"]);
    // The old fallback order's mistake: the source repository recorded as the workspace.
    env::Entity::update(env::ActiveModel {
        id: Set(env_id),
        workspace_path: Set(Some(source.display().to_string())),
        ..Default::default()
    })
    .exec(app.db())
    .await
    .unwrap();
    let id = uuid(&s["id"]);
    let launched = app
        .post(&format!("/api/v1/sessions/{id}/launch"), json!({"prompt": "pwd"}))
        .await
        .ok(200);
    assert_eq!(
        launched["workspace_path"],
        worktree.as_str(),
        "the session projects the healed path"
    );
    assert_eq!(
        wait_reply(&app, id, 1).await[0],
        worktree,
        "the agent ran in the worktree, not the source"
    );
    assert_eq!(
        app.get(&format!("/api/v1/environments/{env_id}")).await.ok(200)["workspace_path"],
        worktree.as_str()
    );
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

// I28: stop clears desired_open, aborts, waits, SIGTERMs, and SIGKILLs an agent that ignores both.
async fn stop_escalates_to_sigkill_for_an_agent_that_ignores_abort(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Stubborn", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "stubborn", "prompt": "hang"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    let s = wait_session(&app, id, "running", |s| s["state"] == "running").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    assert!(pid_alive(pid));
    // The launch prompt is stored first, then handed to the agent: wait until it has it (it hangs).
    wait_delivered(&app, id, 1).await;
    // Busy: a running session cannot be deleted.
    app.delete(&format!("/api/v1/sessions/{id}"))
        .await
        .problem(409, "session_busy");
    let stopped = app
        .post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
    assert_eq!(stopped["state"], "stopped");
    assert_eq!(stopped["desired_open"], false);
    assert!(!pid_alive(pid), "the process group was killed");
    // The transcript is kept; messages to a stopped session are refused.
    assert!(app.count("session_messages").await >= 1);
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "hello?"}))
        .await
        .problem(409, "conflict");
}

// I27: one live process per session; launching a running session returns it.
async fn a_second_launch_returns_the_running_session(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Once", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    let url = format!("/api/v1/sessions/{id}/launch");
    let again = futures_util::future::join_all((0..3).map(|_| app.post(&url, json!({})))).await;
    for r in again {
        assert_eq!(r.ok(200)["execution_id"], s["execution_id"]);
    }
    assert_eq!(app.count("agent_executions").await, 1);
    assert_eq!(app.app_state.ctx.runtime.live_count(), 1);
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

async fn bad_agent_requests_fail_cleanly(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Bad agents", &[repo]).await;
    let url = format!("/api/v1/tasks/{task}/sessions");
    app.post(&url, json!({"executor_type": "worktree", "agent_profile": "nope"}))
        .await
        .problem(422, "validation_failed");
    app.post(&url, json!({"executor_type": "worktree", "start": true}))
        .await
        .problem(422, "validation_failed");
    app.post(
        &url,
        json!({"executor_type": "worktree", "agent_profile": "test", "start": false, "prompt": "x"}),
    )
    .await
    .problem(422, "validation_failed");
    assert_eq!(app.count("task_sessions").await, 0);
    // A profile whose command does not exist: a typed failure, the session failed, nothing else changed.
    let r = app
        .post(&url, json!({"executor_type": "worktree", "agent_profile": "missing"}))
        .await;
    let p = r.problem(409, "conflict");
    assert_eq!(p["action"], "check_agent_profile");
    assert!(!r.text.contains("/nonexistent"), "no path in the body");
    let sessions = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200);
    let s = &sessions["items"][0];
    assert_eq!(s["state"], "failed");
    assert_eq!(s["last_error"]["code"], "agent_start_failed");
    assert_eq!(
        app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200)["status"],
        "ready"
    );
    assert_eq!(worktrees_of(&source).len(), 2, "the workspace stays");
    // A session without a profile cannot be launched; messages need a running agent.
    let plain = id_of(&app.post(&url, json!({"executor_type": "worktree"})).await.ok(201));
    app.post(&format!("/api/v1/sessions/{plain}/launch"), json!({}))
        .await
        .problem(422, "validation_failed");
    app.post(&format!("/api/v1/sessions/{plain}/messages"), json!({"text": "hi"}))
        .await
        .problem(409, "conflict");
    app.post(&format!("/api/v1/sessions/{plain}/launch"), json!({"bogus": 1}))
        .await
        .problem(400, "validation_failed");
    let reader = app.token("sessions:read");
    app.call(
        Method::POST,
        &format!("/api/v1/sessions/{plain}/launch"),
        Some(&reader),
        Some(json!({})),
    )
    .await
    .problem(403, "insufficient_scope");
}

// I4 with a live agent: an idle session has its process stopped first; the workspace stays.
async fn deleting_an_idle_session_stops_its_agent_and_keeps_the_workspace(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Idle delete", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "write note.txt kept"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    wait_reply(&app, id, 1).await;
    let s = wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    app.delete(&format!("/api/v1/sessions/{id}")).await.ok(204);
    assert!(!pid_alive(pid));
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    assert_eq!(std::fs::read_to_string(worktree.join("note.txt")).unwrap(), "kept");
    assert!(worktrees_of(&source).contains(&worktree.display().to_string()));
    assert_eq!(app.count("task_resource_cleanup_jobs").await, 0);
}

// I26, I29, seed 000 "Recovery": after a restart, an open session is relaunched through admission with a
// new execution id, the same session id, in the same worktree (never the source repository).
async fn a_restart_relaunches_open_sessions_in_the_same_worktree(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Restart", &[repo]).await;
    let open = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let closed = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let (open_id, closed_id) = (uuid(&open["id"]), uuid(&closed["id"]));
    wait_session(&app, open_id, "idle", |s| s["state"] == "idle").await;
    app.post(&format!("/api/v1/sessions/{closed_id}/stop"), json!({}))
        .await
        .ok(200);
    let old_pid = execution_pid(&app, uuid(&open["execution_id"])).await;
    // Shut the first server's agents down as a server stop does (desired_open stays), then start anew.
    app.app_state.ctx.runtime.stop_all().await;
    assert!(!pid_alive(old_pid));
    let restarted = berth::startup::Application::build(app.config.clone()).await.unwrap();
    let runtime = restarted.state.ctx.runtime.clone();
    let new_instance = restarted.state.ctx.instance_id;
    assert_ne!(new_instance, app.app_state.ctx.instance_id, "a new instance id");
    assert_eq!(runtime.live_count(), 1, "only the open session came back");
    let s = app.get(&format!("/api/v1/sessions/{open_id}")).await.ok(200);
    assert_eq!(s["state"], "idle");
    assert_ne!(s["execution_id"], open["execution_id"], "a new execution id");
    assert_eq!(s["workspace_path"], open["workspace_path"]);
    assert_ne!(s["workspace_path"], source.display().to_string().as_str());
    let new_pid = execution_pid(&app, uuid(&s["execution_id"])).await;
    assert!(pid_alive(new_pid));
    assert_eq!(
        app.get(&format!("/api/v1/sessions/{closed_id}")).await.ok(200)["state"],
        "stopped",
        "an explicitly stopped session stays stopped"
    );
    runtime.stop_all().await;
    for b in restarted.background() {
        b.abort();
    }
}

// I30: an agent that dies is restarted in the same workspace (recovering), a bounded number of times in a
// window; past that the session is failed with the reason.
async fn a_crashed_agent_is_restarted_then_failed_past_the_threshold(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let Some(app) = TestApp::spawn_with(
        backend,
        &[
            ("BERTH_AGENT_RESTART_MAX", "2"),
            ("BERTH_AGENT_RESTART_BACKOFF_MS", "10"),
        ],
    )
    .await
    else {
        return;
    };
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Crashy", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    let mut execution = s["execution_id"].clone();
    for round in 1..=2 {
        app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "crash"}))
            .await
            .ok(202);
        let back = wait_session(&app, id, "restarted", |v| {
            v["state"] == "idle" && v["execution_id"] != execution
        })
        .await;
        assert_eq!(
            back["workspace_path"], s["workspace_path"],
            "round {round}: the same workspace"
        );
        execution = back["execution_id"].clone();
    }
    app.post(&format!("/api/v1/sessions/{id}/messages"), json!({"text": "crash"}))
        .await
        .ok(202);
    let failed = wait_session(&app, id, "failed", |v| v["state"] == "failed").await;
    assert_eq!(failed["last_error"]["code"], "agent_exited");
    assert!(
        failed["last_error"]["message"].as_str().unwrap().contains("status 3"),
        "{failed}"
    );
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let recovering = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "session.state_changed" && e["data"]["state"] == "recovering")
        .count();
    assert_eq!(recovering, 2, "each restart is visible");
    assert_eq!(app.app_state.ctx.runtime.live_count(), 0);
}

// I18: launching with another executor makes a fresh environment for it; nothing of the old one is
// forwarded; the old one is kept, superseded and untouched; the current one changes only after the launch.
async fn an_executor_transition_forwards_nothing_and_keeps_the_old_workspace(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Transition", &[repo]).await;
    let local = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "local", "agent_profile": "test", "prompt": "pwd"}),
        )
        .await
        .ok(201);
    let local_id = uuid(&local["id"]);
    assert_eq!(wait_reply(&app, local_id, 1).await[0], source.display().to_string());
    app.post(&format!("/api/v1/sessions/{local_id}/stop"), json!({}))
        .await
        .ok(200);
    let old_env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(old_env["executor_type"], "local");
    let before = (
        git(&source, &["status", "--porcelain"]),
        git(&source, &["rev-parse", "HEAD"]),
    );

    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "pwd"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    assert!(
        worktree.starts_with(&app.config.worktree_root),
        "a fresh worktree, not the old path"
    );
    assert_eq!(wait_reply(&app, id, 1).await[0], worktree.display().to_string());
    let new_env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_ne!(new_env["id"], old_env["id"]);
    assert_eq!(new_env["executor_type"], "worktree");
    assert_eq!(new_env["status"], "ready");
    assert!(new_env["repos"][0]["worktree_id"].is_string());
    assert_ne!(
        new_env["repos"][0]["id"], old_env["repos"][0]["id"],
        "no inventory row forwarded"
    );
    assert_eq!(s["task_environment_id"], new_env["id"]);
    assert_ne!(s["execution_id"], local["execution_id"]);
    let kept = app
        .get(&format!("/api/v1/environments/{}", uuid(&old_env["id"])))
        .await
        .ok(200);
    assert_eq!(kept["status"], "superseded", "recorded for diagnostics");
    assert_eq!(kept["repos"], old_env["repos"], "its inventory untouched");
    assert_eq!(
        (
            git(&source, &["status", "--porcelain"]),
            git(&source, &["rev-parse", "HEAD"])
        ),
        before,
        "the source is untouched"
    );
    assert_eq!(app.count("tasks").await, 1, "no second task");
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

async fn a_failed_transition_leaves_the_current_environment_in_place(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "No switch", &[repo]).await;
    app.session(task, "worktree").await;
    let current = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    // A local launch whose agent cannot start: the candidate fails, the worktree environment stays current.
    app.post(
        &format!("/api/v1/tasks/{task}/sessions"),
        json!({"executor_type": "local", "agent_profile": "missing"}),
    )
    .await
    .problem(409, "conflict");
    let still = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(still["id"], current["id"]);
    assert_eq!(still["status"], "ready");
    assert_eq!(worktrees_of(&source).len(), 2);
    // It still works: a worktree session attaches to it.
    assert_eq!(
        app.session(task, "worktree").await["task_environment_id"],
        current["id"]
    );
}

// I31: an attention request belongs to one session; no other session can answer it. The snapshot shows
// it, with the transcript and the seq to follow the stream from.
async fn attention_requests_belong_to_their_session(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Ask", &[repo]).await;
    let a = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "ask"}),
        )
        .await
        .ok(201);
    let b = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let (a_id, b_id) = (uuid(&a["id"]), uuid(&b["id"]));
    wait_session(&app, a_id, "asking", |s| s["state"] == "attention").await;
    let snap = app.get(&format!("/api/v1/sessions/{a_id}/snapshot")).await.ok(200);
    assert_eq!(snap["state"], "attention");
    assert_eq!(snap["label"], "ask", "the first prompt labels an unnamed session");
    assert_eq!(snap["instance_id"], app.app_state.ctx.instance_id.to_string());
    assert!(snap["latest_seq"].as_i64().unwrap() > 0);
    let requests = snap["attention_requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["method"], "confirm");
    let request_id = requests[0]["id"].as_str().unwrap().to_string();
    // Another session cannot answer it; an unknown id is not pending.
    app.post(
        &format!("/api/v1/sessions/{b_id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .problem(404, "not_found");
    app.post(
        &format!("/api/v1/sessions/{a_id}/attention/nope"),
        json!({"confirmed": true}),
    )
    .await
    .problem(404, "not_found");
    // The answer has the shape the question's method takes, or it is refused and the question stays
    // pending.
    for wrong in [
        json!({"value": "yes"}),
        json!({}),
        json!({"confirmed": true, "value": "yes"}),
        json!({"cancelled": false}),
    ] {
        app.post(&format!("/api/v1/sessions/{a_id}/attention/{request_id}"), wrong)
            .await
            .problem(422, "validation_failed");
    }
    let still = app.get(&format!("/api/v1/sessions/{a_id}/snapshot")).await.ok(200);
    assert_eq!(still["attention_requests"].as_array().unwrap().len(), 1, "{still}");
    assert_eq!(still["state"], "attention");
    app.post(
        &format!("/api/v1/sessions/{a_id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .ok(200);
    assert_eq!(wait_reply(&app, a_id, 1).await[0], "answered true");
    wait_session(&app, a_id, "idle", |s| s["state"] == "idle").await;
    let after = app.get(&format!("/api/v1/sessions/{a_id}/snapshot")).await.ok(200);
    assert!(after["attention_requests"].as_array().unwrap().is_empty());
    let roles: Vec<&str> = after["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, vec!["user", "assistant"]);
    assert_eq!(after["statistics"]["turns"], 1);
    // Answering again: no longer pending.
    app.post(
        &format!("/api/v1/sessions/{a_id}/attention/{request_id}"),
        json!({"confirmed": true}),
    )
    .await
    .problem(404, "not_found");
    for id in [a_id, b_id] {
        app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
            .await
            .ok(200);
    }
}

// Seed 002 "summary": open, working, attention and error counts per environment directory, from stored
// state; six or more open sessions in one directory add a warning, never a cap.
async fn the_summary_counts_agents_per_directory(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Busy dir", &[repo]).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let prompt = if i == 0 {
            "hang"
        } else if i == 1 {
            "ask"
        } else {
            "pwd"
        };
        let s = app
            .post(
                &format!("/api/v1/tasks/{task}/sessions"),
                json!({"executor_type": "worktree", "agent_profile": "test", "prompt": prompt}),
            )
            .await
            .ok(201);
        ids.push(uuid(&s["id"]));
    }
    wait_session(&app, ids[0], "working", |s| s["state"] == "running").await;
    wait_session(&app, ids[1], "asking", |s| s["state"] == "attention").await;
    for id in &ids[2..] {
        wait_session(&app, *id, "idle", |s| s["state"] == "idle").await;
    }
    assert_eq!(
        app.app_state.ctx.runtime.live_count(),
        6,
        "six live agents in one worktree: no cap"
    );
    let sum = app.get(&format!("/api/v1/workspaces/{ws}/summary")).await.ok(200);
    assert_eq!(sum["tasks_active"], 1);
    assert_eq!(sum["sessions"]["open"], 6);
    assert_eq!(sum["sessions"]["working"], 1);
    assert_eq!(sum["sessions"]["attention"], 1);
    let dirs = sum["directories"].as_array().unwrap();
    assert_eq!(dirs.len(), 1);
    assert_eq!(dirs[0]["open"], 6);
    assert!(dirs[0]["warning"].is_string(), "{sum}");
    for id in ids {
        app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
            .await
            .ok(200);
    }
    let after = app.get(&format!("/api/v1/workspaces/{ws}/summary")).await.ok(200);
    assert_eq!(after["sessions"]["open"], 0);
    assert!(after["directories"][0]["warning"].is_null());
}

// I29: a session whose workspace fails admission on restore is failed with its reason; berth never starts
// it in another directory or another conversation.
async fn an_inadmissible_session_is_failed_on_restore_never_moved(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Gone", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    app.app_state.ctx.runtime.stop_all().await;
    // While berth is down, the worktree disappears.
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    std::fs::rename(&worktree, worktree.with_file_name("moved-away")).unwrap();
    let restarted = berth::startup::Application::build(app.config.clone()).await.unwrap();
    let runtime = restarted.state.ctx.runtime.clone();
    assert_eq!(runtime.live_count(), 0, "nothing started anywhere else");
    let after = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(after["state"], "failed");
    assert_eq!(after["last_error"]["code"], "workspace_reuse_unsafe");
    assert_eq!(
        after["workspace_path"], s["workspace_path"],
        "still the same workspace, not the source"
    );
    assert_ne!(after["workspace_path"], source.display().to_string().as_str());
    restarted.background().iter().for_each(|h| h.abort());
}

// I29: open sessions are relaunched two at a time.
async fn restore_relaunches_two_at_a_time(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Many", &[repo]).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(uuid(
            &app.post(
                &format!("/api/v1/tasks/{task}/sessions"),
                json!({"executor_type": "worktree", "agent_profile": "test"}),
            )
            .await
            .ok(201)["id"],
        ));
    }
    for id in &ids {
        wait_session(&app, *id, "idle", |s| s["state"] == "idle").await;
    }
    app.app_state.ctx.runtime.stop_all().await;
    let restarted = berth::startup::Application::build(app.config.clone()).await.unwrap();
    let ctx = restarted.state.ctx.clone();
    assert_eq!(ctx.runtime.live_count(), 4, "all four came back");
    assert_eq!(
        ctx.restore_stats
            .max_concurrent
            .load(std::sync::atomic::Ordering::Relaxed),
        2,
        "two at a time, never more"
    );
    ctx.runtime.stop_all().await;
    restarted.background().iter().for_each(|h| h.abort());
}

// Seed 002: load the snapshot while an agent streams, follow the stream from its latest_seq: nothing is
// missing and nothing repeats.
async fn a_snapshot_then_the_stream_loses_nothing_while_an_agent_streams(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Streaming", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    app.post(
        &format!("/api/v1/sessions/{id}/messages"),
        json!({"text": "stream 500"}),
    )
    .await
    .ok(202);
    wait_session(&app, id, "working", |s| s["state"] == "running").await;
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    let from = snap["latest_seq"].as_i64().unwrap();
    let mut sse = crate::helpers::Sse::open(&app, &app.admin, &format!("?after={from}"), None).await;
    let mut streamed = Vec::new();
    loop {
        let frame = sse.next(WAIT).await.expect("the stream stays open");
        if frame.event != "message" {
            continue;
        }
        streamed.push(frame.id.unwrap());
        let e: Value = serde_json::from_str(&frame.data).unwrap();
        if e["type"] == "runtime.output" && e["data"]["event"]["type"] == "agent_end" {
            break;
        }
    }
    let events = all_events(&app).await;
    let committed: Vec<i64> = events
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .filter(|s| *s > from && *s <= *streamed.last().unwrap())
        .collect();
    assert_eq!(streamed, committed, "every event after the snapshot, once, in order");
    assert!(!streamed.is_empty(), "output arrived live after the snapshot");
    // Together, what preceded the snapshot and what streamed after it hold the whole turn. Streamed
    // deltas are coalesced: the events rebuild the 500 chunks, in order.
    let chunks: String = events
        .iter()
        .filter(|e| e["session_id"] == id.to_string() && e["data"]["event"]["type"] == "message_update")
        .map(|e| e["data"]["event"]["delta"].as_str().unwrap())
        .collect();
    assert_eq!(chunks, (0..500).map(|i| format!("chunk {i} ")).collect::<String>());
    let done = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert_eq!(done["statistics"]["input_tokens"], 10);
    assert_eq!(done["statistics"]["output_tokens"], 20);
    assert_eq!(done["statistics"]["cost"], 0.5);
    assert!(done["active_tool"].is_null(), "the tool ended");
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

// A berth crash in the middle of a launch leaves the session `starting` with desired_open: the next start
// relaunches it (a fresh execution, through admission), rather than treating it as under way.
async fn a_launch_cut_off_by_a_crash_is_restored(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Cut off", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    app.app_state.ctx.runtime.stop_all().await;
    app.set_session_state(id, berth::entity::task_session::SessionState::Starting, None)
        .await;
    let restarted = berth::startup::Application::build(app.config.clone()).await.unwrap();
    let ctx = restarted.state.ctx.clone();
    assert_eq!(ctx.runtime.live_count(), 1);
    let after = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
    assert_eq!(after["state"], "idle");
    assert_ne!(after["execution_id"], s["execution_id"]);
    ctx.runtime.stop_all().await;
    restarted.background().iter().for_each(|h| h.abort());
}

// I29, I32: restore moves an open session to `recovering` before relaunching it, and that move is an
// event like every other state change (it used to be written with none).
async fn a_restore_that_moves_a_session_to_recovering_reports_it(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Recover", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    app.app_state.ctx.runtime.stop_all().await;
    let before = all_events(&app).await.last().unwrap()["seq"].as_i64().unwrap();
    let restarted = berth::startup::Application::build(app.config.clone()).await.unwrap();
    let ctx = restarted.state.ctx.clone();
    assert_eq!(ctx.runtime.live_count(), 1, "relaunched");
    let states: Vec<(String, String)> = all_events(&app)
        .await
        .into_iter()
        .filter(|e| {
            e["seq"].as_i64().unwrap() > before
                && e["type"] == "session.state_changed"
                && e["session_id"] == id.to_string()
        })
        .map(|e| {
            (
                e["data"]["state"].as_str().unwrap().to_string(),
                e["instance_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let new_instance = ctx.instance_id.to_string();
    assert_eq!(
        states,
        [
            ("recovering".to_string(), new_instance.clone()),
            ("starting".to_string(), new_instance.clone()),
            ("idle".to_string(), new_instance),
        ],
        "the move to recovering is reported, then the relaunch"
    );
    ctx.runtime.stop_all().await;
    restarted.background().iter().for_each(|h| h.abort());
}

/// Every event, through replay pages.
pub(crate) async fn all_events(app: &TestApp) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = app
            .get(&format!("/api/v1/events?after={after}&limit=1000"))
            .await
            .ok(200);
        let events = page["events"].as_array().unwrap().clone();
        if events.is_empty() {
            return out;
        }
        after = events.last().unwrap()["seq"].as_i64().unwrap();
        out.extend(events);
    }
}

// I31: fire-and-forget UI requests (notify, setStatus, setTitle; they carry ids like questions do) are
// published as events and never put the session in `attention`.
async fn notices_are_events_and_never_ask_for_attention(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, _) = app.repository(ws, "svc").await;
    let task = app.task(ws, "Notices", &[repo]).await;
    let s = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "notify"}),
        )
        .await
        .ok(201);
    let id = uuid(&s["id"]);
    assert_eq!(wait_reply(&app, id, 1).await[0], "notified");
    wait_session(&app, id, "idle", |s| s["state"] == "idle").await;
    let page = app.get("/api/v1/events?after=0&limit=1000").await.ok(200);
    let mine: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["session_id"] == id.to_string())
        .collect();
    let states: Vec<&str> = mine
        .iter()
        .filter(|e| e["type"] == "session.state_changed")
        .map(|e| e["data"]["state"].as_str().unwrap())
        .collect();
    assert!(
        !states.contains(&"attention"),
        "a notice asked for attention: {states:?}"
    );
    let notices: Vec<&str> = mine
        .iter()
        .filter(|e| e["type"] == "runtime.output" && e["data"]["event"]["type"] == "extension_ui_request")
        .map(|e| e["data"]["event"]["method"].as_str().unwrap())
        .collect();
    assert_eq!(notices, ["notify", "setStatus", "setTitle"]);
    let snap = app.get(&format!("/api/v1/sessions/{id}/snapshot")).await.ok(200);
    assert!(snap["attention_requests"].as_array().unwrap().is_empty(), "{snap}");
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}
