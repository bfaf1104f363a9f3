//! SIGKILL at random points of a scripted workload, twenty times over: afterwards every job finishes
//! and the invariants hold.
use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use uuid::Uuid;

use super::{assert_invariants, call, connect, create_task, process_env, setup, start, wait_jobs_finished, wait_ready};
use crate::both_backends;
use crate::helpers::{TestApp, id_of};

both_backends!(sigkill_at_random_points_loses_nothing);

/// One step of the scripted workload against a process; errors (the process may be dying) are ignored.
async fn workload(client: reqwest::Client, base: String, token: String, ws: Uuid, repo: Uuid, seed: u64) {
    let api = format!("{base}/api/v1");
    let mut rng = seed;
    let mut next = move || {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) as usize
    };
    for i in 0.. {
        let (status, t) = create_task(&client, &token, &api, ws, repo, &format!("w{seed}-{i}")).await;
        if status != 201 {
            tokio::task::yield_now().await;
            continue;
        }
        let task = id_of(&t);
        let (_, s) = call(
            &client,
            &token,
            Method::POST,
            format!("{api}/tasks/{task}/sessions"),
            Some(json!({"executor_type": "worktree", "start": false})),
        )
        .await;
        match next() % 4 {
            0 => {
                if let Some(id) = s["id"].as_str() {
                    call(&client, &token, Method::DELETE, format!("{api}/sessions/{id}"), None).await;
                }
            }
            1 => {
                call(
                    &client,
                    &token,
                    Method::POST,
                    format!("{api}/tasks/{task}/archive"),
                    None,
                )
                .await;
            }
            _ => {
                call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
            }
        }
    }
}

// SIGKILL at random points of a workload (task and session creates, session deletes, archives, task
// deletes), 20 times, restarting each time: afterwards every job finishes and the invariants hold.
async fn sigkill_at_random_points_loses_nothing(app: TestApp) {
    let data = app.scratch.path().join("killed");
    let env = process_env(&app, &data);
    let worktree_root = data.join("worktrees");
    let log = app.scratch.path().join("killed.log");
    let client = crate::helpers::client();
    let mut ids = None;
    let mut rng: u64 = 0x5eed_0001;
    for round in 0..20u64 {
        let mut b = start(&env, None, &log);
        wait_ready(&client, &mut b).await;
        let (ws, repo) = match ids {
            Some(ids) => ids,
            None => {
                let (ws, repo, _) = setup(&client, &b.base, &app.admin, app.scratch.path()).await;
                *ids.insert((ws, repo))
            }
        };
        let work = tokio::spawn(workload(
            client.clone(),
            b.base.clone(),
            app.admin.clone(),
            ws,
            repo,
            round,
        ));
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let after = 50 + (rng >> 33) % 700;
        tokio::time::sleep(Duration::from_millis(after)).await;
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(b.child.id() as i32, libc::SIGKILL);
        }
        let _ = b.child.wait();
        work.abort();
    }
    // A last life: let it finish what the others left.
    let mut b = start(&env, None, &log);
    wait_ready(&client, &mut b).await;
    let conn = connect(&app, &data).await;
    let jobs = wait_jobs_finished(&conn).await;
    assert!(!jobs.is_empty(), "the workload made cleanup jobs");
    assert!(
        jobs.iter().all(|(s, _)| s != "failed"),
        "a job failed: {jobs:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Give environments caught mid-materialization their lease, then check.
    assert_invariants(&conn, &worktree_root.canonicalize().unwrap()).await;
    drop(b);
}
