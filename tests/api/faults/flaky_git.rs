//! A git CLI that fails every third call: materializations fail cleanly, cleanup jobs retry until they
//! complete, and the invariants hold.
use std::path::Path;

use reqwest::Method;
use serde_json::json;

use super::{
    assert_invariants, call, connect, create_task, git_wrapper, process_env, setup, start, wait_jobs_finished,
    wait_ready,
};
use crate::both_backends;
use crate::helpers::{TestApp, id_of};

both_backends!(a_failing_git_cli_is_retried_until_jobs_complete);

// The git CLI fails every third call (a wrapper first in PATH): materialization failures surface as
// errors without leftovers, cleanup jobs retry and complete, and the invariants hold.
async fn a_failing_git_cli_is_retried_until_jobs_complete(app: TestApp) {
    let counter = app.scratch.path().join("git-calls");
    let bin = git_wrapper(
        &app,
        "flaky-bin",
        &format!(
            "n=$(( $(cat '{c}' 2>/dev/null || echo 0) + 1 ))\necho $n > '{c}'\n\
             if [ $((n % 3)) -eq 0 ]; then echo 'fatal: injected failure' >&2; exit 128; fi\n",
            c = counter.display()
        ),
    );

    let data = app.scratch.path().join("flaky");
    let env = process_env(&app, &data);
    let log = app.scratch.path().join("flaky.log");
    let mut b = start(&env, Some(&bin), &log);
    let client = crate::helpers::client();
    wait_ready(&client, &mut b).await;
    let api = format!("{}/api/v1", b.base);
    let token = app.admin.clone();
    let (ws, repo, source) = setup(&client, &b.base, &token, app.scratch.path()).await;
    let mut tasks = Vec::new();
    let mut failures = 0;
    for i in 0..6 {
        let (status, t) = create_task(&client, &token, &api, ws, repo, &format!("flaky {i}")).await;
        assert_eq!(status, 201, "{t}");
        let task = id_of(&t);
        // A failed `git worktree add` is an error answer; asking again tries again.
        let mut made = false;
        for _ in 0..6 {
            let (status, s) = call(
                &client,
                &token,
                Method::POST,
                format!("{api}/tasks/{task}/sessions"),
                Some(json!({"executor_type": "worktree", "start": false})),
            )
            .await;
            if status == 201 {
                assert!(Path::new(s["workspace_path"].as_str().unwrap()).join(".git").is_file());
                made = true;
                break;
            }
            assert!(
                (400..600).contains(&status) && status != 500,
                "a git failure answers a problem, not {status}: {s}"
            );
            failures += 1;
        }
        assert!(made, "materialization never succeeded through the flaky git");
        tasks.push(task);
    }
    assert!(
        failures > 0 || std::fs::read_to_string(&counter).is_ok(),
        "the wrapper ran"
    );
    for task in &tasks {
        // The dirty check may meet a failing git: a 503 that changed nothing, and a retry goes through.
        let mut deleted = false;
        for _ in 0..6 {
            let (status, r) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
            if status == 202 {
                deleted = true;
                break;
            }
            assert_eq!(status, 503, "{r}");
            assert_eq!(r["code"], "unavailable");
        }
        assert!(deleted, "the delete never went through");
    }
    let conn = connect(&app, &data).await;
    let jobs = wait_jobs_finished(&conn).await;
    assert!(
        jobs.iter().all(|(s, _)| s == "succeeded"),
        "every job succeeds in the end: {jobs:?}"
    );
    let calls: u64 = std::fs::read_to_string(&counter).unwrap().trim().parse().unwrap();
    assert!(calls >= 3, "berth's git calls went through the wrapper ({calls})");
    // Nothing of the deleted tasks is left: no worktree registered, none on disk, branches kept.
    let listing = crate::helpers::worktrees_of(&source);
    assert_eq!(listing.len(), 1, "only the main work tree remains: {listing:?}");
    assert_invariants(&conn, &data.join("worktrees").canonicalize().unwrap()).await;
    drop(b);
}
