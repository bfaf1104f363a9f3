//! Two `berth serve` processes sharing one node id on one PostgreSQL database: each cleanup job runs once,
//! and both event streams see every job succeed.
use std::collections::HashSet;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::{
    WAIT, assert_invariants, call, connect, process_env, setup, start, task_with_worktree, wait_jobs_finished,
    wait_ready,
};
use crate::both_backends;
use crate::helpers::{Backend, TestApp};

both_backends!(two_processes_with_one_node_id_run_each_job_once);

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
