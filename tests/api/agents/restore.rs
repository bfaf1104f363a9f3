//! Restore when berth starts again: open sessions relaunched in their own worktree, two at a time, through
//! `recovering`; an inadmissible one failed, never moved; a launch a crash cut off relaunched.
use std::path::PathBuf;

use serde_json::json;

use super::{all_events, execution_pid, pid_alive, uuid, wait_session};
use crate::both_backends;
use crate::fixture::StartedSession;
use crate::helpers::TestApp;

both_backends!(
    a_restart_relaunches_open_sessions_in_the_same_worktree,
    an_inadmissible_session_is_failed_on_restore_never_moved,
    restore_relaunches_two_at_a_time,
    a_launch_cut_off_by_a_crash_is_restored,
    a_restore_that_moves_a_session_to_recovering_reports_it,
);

// I26, I29, seed 000 "Recovery": after a restart, an open session is relaunched through admission with a
// new execution id, the same session id, in the same worktree (never the source repository).
async fn a_restart_relaunches_open_sessions_in_the_same_worktree(app: TestApp) {
    let f = app.task_with_repo("Restart").await;
    let source = f.repo_dir.clone();
    let open = f.agent("test").await;
    let closed = f.agent("test").await;
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

// I29: a session whose workspace fails admission on restore is failed with its reason; berth never starts
// it in another directory or another conversation.
async fn an_inadmissible_session_is_failed_on_restore_never_moved(app: TestApp) {
    let f = app.task_with_repo("Gone").await;
    let source = f.repo_dir.clone();
    let StartedSession { id, created: s, .. } = f.started_session("test").await;
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
    let f = app.task_with_repo("Many").await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(uuid(&f.agent("test").await["id"]));
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

// A berth crash in the middle of a launch leaves the session `starting` with desired_open: the next start
// relaunches it (a fresh execution, through admission), rather than treating it as under way.
async fn a_launch_cut_off_by_a_crash_is_restored(app: TestApp) {
    let f = app.task_with_repo("Cut off").await;
    let StartedSession { id, created: s, .. } = f.started_session("test").await;
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
    let f = app.task_with_repo("Recover").await;
    let id = f.started_session("test").await.id;
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
