//! A materialization held at its gate: its candidate keeps its lease past the lease's length, and a
//! delete's or an archive's job that overtakes it waits in place for it.
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use uuid::Uuid;

use super::gates::{gated, held_before_worktree_add, unstarted_worktree};
use super::{WAIT, rows, wait_jobs_finished};
use crate::both_backends;
use crate::helpers::{TestApp, seen, wait_until, wait_until_every};

both_backends!(
    a_transition_slower_than_its_lease_keeps_it,
    a_lifecycle_job_waits_in_place_for_a_materializer_of_its_process,
);

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
    let renewed = "the candidate's lease to be renewed while its launch runs";
    let candidate: Uuid = wait_until(renewed, Duration::from_secs(30), || async {
        let found = rows(&g.conn, sql).await;
        assert_eq!(found.len(), 1, "one candidate, still creating");
        let created: chrono::DateTime<chrono::Utc> = found[0].try_get("", "created_at").unwrap();
        let touched: chrono::DateTime<chrono::Utc> = found[0].try_get("", "updated_at").unwrap();
        if touched > created + lease + chrono::Duration::milliseconds(500) {
            return Ok(found[0].try_get("", "id").unwrap());
        }
        Err(format!("updated {touched}, created {created}"))
    })
    .await;

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
        let every = Duration::from_millis(20);
        wait_until_every(&format!("{title}: the job to run"), WAIT, every, || async {
            let states: Vec<String> = rows(&g.conn, "SELECT state FROM task_resource_cleanup_jobs")
                .await
                .iter()
                .map(|r| r.try_get("", "state").unwrap())
                .collect();
            seen(states.iter().any(|s| s == "running" || s == "retry_wait"), states)
        })
        .await;
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
