//! A delete that overtakes a materialization (a first worktree, or an executor transition's candidate):
//! what the materialization made is recorded or removed, even when berth is SIGKILLed in between.
use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::{Value, json};

use super::gates::{
    Gate, gated, held_around_worktree_add, held_before_worktree_add, kill_once_git_made_it,
    session_held_in_worktree_add, unstarted_worktree,
};
use super::{assert_invariants, call, connect, process_env, rows, setup, start, wait_jobs_finished, wait_ready};
use crate::both_backends;
use crate::helpers::{TestApp, id_of};

both_backends!(
    a_materialization_that_loses_to_a_delete_records_its_branch_and_progress,
    a_materializer_killed_after_a_delete_leaves_no_worktree,
    a_transition_killed_after_a_delete_leaves_no_worktree,
);

/// The branch ledger and the last progress stages commit with the publish. When a delete sets its
/// barrier while `git worktree add` runs, the publish fails; what it would have recorded is recorded all
/// the same (`Made::record_unpublished`): the branch berth created stays on record as berth's (and is
/// kept: the delete's snapshot could not know its origin), and every stage is in the log before
/// `environment.failed`. Nothing else is touched: the source repository keeps its branches.
async fn a_materialization_that_loses_to_a_delete_records_its_branch_and_progress(app: TestApp) {
    let (bin, entered, release) = held_before_worktree_add(&app);

    let data = app.scratch.path().join("gated");
    let env = process_env(&app, &data);
    let mut b = start(&env, Some(&bin), &app.scratch.path().join("gated.log"));
    let client = crate::helpers::client();
    wait_ready(&client, &mut b).await;
    let api = format!("{}/api/v1", b.base);
    let token = app.admin.clone();
    let (ws, repo, source) = setup(&client, &b.base, &token, app.scratch.path()).await;
    let before = crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let (status, t) = call(
        &client,
        &token,
        Method::POST,
        format!("{api}/workspaces/{ws}/tasks"),
        Some(json!({"title": "lost", "repositories": [{"repository_id": repo}]})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    let task = id_of(&t);
    let conn = connect(&app, &data).await;
    let slugs: Vec<String> = rows(&conn, "SELECT slug FROM tasks")
        .await
        .into_iter()
        .map(|r| r.try_get("", "slug").unwrap())
        .collect();
    let [slug] = slugs.as_slice() else {
        panic!("one task: {slugs:?}")
    };
    let branch = format!("berth/{slug}");

    let session = session_held_in_worktree_add(&client, &token, &api, task, unstarted_worktree(), &entered).await;
    let (status, d) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
    assert_eq!(
        status, 202,
        "the delete sets its barrier while the worktree is made: {d}"
    );
    std::fs::write(&release, "").unwrap();
    let (lost, s) = session.await.unwrap();
    // Its barrier stands (409), or its job already removed the task (404).
    assert!(
        (lost, s["code"].as_str()) == (409, Some("task_cleanup_in_progress"))
            || (lost, s["code"].as_str()) == (404, Some("not_found")),
        "the publish lost to the delete: {lost} {s}"
    );

    wait_jobs_finished(&conn).await;
    // The branch berth made is on record as berth's, and kept (the delete could not know its origin).
    let (status, listed) = call(
        &client,
        &token,
        Method::GET,
        format!("{api}/workspaces/{ws}/branches"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    let names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["branch"].as_str())
        .collect();
    assert_eq!(names, [branch.as_str()], "{listed}");
    assert!(crate::helpers::branch_exists(&source, &branch));
    // The source repository's own refs are as they were; the worktree is gone.
    let after = crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let kept: Vec<&str> = after
        .lines()
        .filter(|l| !l.starts_with(&format!("refs/heads/{branch} ")))
        .collect();
    assert_eq!(kept, before.lines().collect::<Vec<_>>());
    assert!(
        !Path::new(&env["BERTH_DATA_DIR"])
            .join("worktrees")
            .join(slug)
            .join("svc")
            .exists()
    );
    // Every stage, then the failure.
    let (status, page) = call(
        &client,
        &token,
        Method::GET,
        format!("{api}/events?after=0&limit=1000"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let events: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["task_id"] == task.to_string())
        .collect();
    let progress: Vec<&&Value> = events.iter().filter(|e| e["type"] == "environment.progress").collect();
    let stages: Vec<&str> = progress.iter().filter_map(|e| e["data"]["stage"].as_str()).collect();
    assert_eq!(stages, ["fetching", "creating_worktree", "ready"], "{events:?}");
    let last_stage = progress.iter().filter_map(|e| e["seq"].as_i64()).max();
    // Recorded failed while its task stands (409); gone with its task when the job won first (404).
    let failed = events
        .iter()
        .find(|e| e["type"] == "environment.failed")
        .and_then(|e| e["seq"].as_i64());
    assert_eq!(failed.is_some(), lost == 409, "{lost}: {events:?}");
    assert!(failed.is_none() || last_stage < failed, "{events:?}");
}

/// The delete's job must not finish before the materialization it overtook: once the delete removed the
/// task and its environment, no row records what `git worktree add` is still making. Here the job runs
/// while git is held at a gate, git then makes the worktree, and berth is SIGKILLed before its publish
/// meets the barrier (so no compensation ever removes what git made). The restarted berth's job removes
/// it (I9, I13): it waited for the materializer instead of succeeding before git had made anything. The
/// source repository keeps its refs; the branch berth made is kept (its origin was never recorded).
async fn a_materializer_killed_after_a_delete_leaves_no_worktree(app: TestApp) {
    let dir = app.scratch.path();
    let Gate {
        bin,
        entered,
        release,
        made,
    } = held_around_worktree_add(&app);
    let data = dir.join("killed");
    let env = process_env(&app, &data);
    let mut b = start(&env, Some(&bin), &dir.join("killed.log"));
    let client = crate::helpers::client();
    wait_ready(&client, &mut b).await;
    let api = format!("{}/api/v1", b.base);
    let token = app.admin.clone();
    let (ws, repo, source) = setup(&client, &b.base, &token, dir).await;
    let refs = || crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let before = refs();
    let (status, t) = call(
        &client,
        &token,
        Method::POST,
        format!("{api}/workspaces/{ws}/tasks"),
        Some(json!({"title": "killed", "repositories": [{"repository_id": repo}]})),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    let task = id_of(&t);
    let conn = connect(&app, &data).await;
    let slug: String = rows(&conn, "SELECT slug FROM tasks").await[0]
        .try_get("", "slug")
        .unwrap();
    let worktree = data.join("worktrees").join(&slug).join("svc");

    let session = session_held_in_worktree_add(&client, &token, &api, task, unstarted_worktree(), &entered).await;
    let (status, d) = call(&client, &token, Method::DELETE, format!("{api}/tasks/{task}"), None).await;
    assert_eq!(status, 202, "the delete overtakes the materialization: {d}");
    kill_once_git_made_it(&conn, &mut b, &release, &made).await;
    let _ = session.await;
    assert!(
        worktree.join(".git").exists(),
        "git made the worktree before berth died"
    );

    let mut b = start(&env, None, &dir.join("killed.log"));
    wait_ready(&client, &mut b).await;
    let jobs = wait_jobs_finished(&conn).await;
    assert!(jobs.iter().all(|(s, _)| s == "succeeded"), "{jobs:?}");
    assert!(
        !worktree.exists(),
        "the delete's job removed what the killed materializer made"
    );
    assert_invariants(&conn, &data.join("worktrees").canonicalize().unwrap()).await;
    let branch = format!("refs/heads/berth/{slug} ");
    let after = refs();
    assert_eq!(
        after.lines().filter(|l| !l.starts_with(&branch)).collect::<Vec<_>>(),
        before.lines().collect::<Vec<_>>(),
        "the source repository keeps its refs"
    );
}

/// I18 with I9 and I13: an executor transition makes its candidate in a directory of its own, beside the
/// current environment. A delete that overtakes the candidate's `git worktree add` must name what the
/// candidate makes and wait for it, so that the job removes it even when berth is killed before the
/// launch could give the candidate up. The source repository keeps its refs.
async fn a_transition_killed_after_a_delete_leaves_no_worktree(app: TestApp) {
    let dir = app.scratch.path();
    let Gate {
        bin,
        entered,
        release,
        made,
    } = held_around_worktree_add(&app);
    let mut g = gated(&app, "transition", &bin).await;
    let data = dir.join("transition");
    let source = g.source.clone();
    let refs = || crate::helpers::git(&source, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let before = refs();
    let task = g.task_on_local("switched").await;
    let slug: String = rows(&g.conn, "SELECT slug FROM tasks").await[0]
        .try_get("", "slug")
        .unwrap();

    // A worktree launch is a transition: its candidate is made beside the local environment.
    let launch = json!({"executor_type": "worktree", "agent_profile": "test"});
    let session = g.session_held(task, launch, &entered).await;
    let (status, d) = g.call(Method::DELETE, &format!("/tasks/{task}"), None).await;
    assert_eq!(status, 202, "the delete overtakes the transition: {d}");
    kill_once_git_made_it(&g.conn, &mut g.b, &release, &made).await;
    let _ = session.await;
    let worktrees = data.join("worktrees");
    let candidates: Vec<PathBuf> = std::fs::read_dir(&worktrees)
        .unwrap()
        .map(|e| e.unwrap().path().join("svc"))
        .filter(|w| w.join(".git").exists())
        .collect();
    assert_eq!(
        candidates.len(),
        1,
        "git made the candidate's worktree before berth died: {candidates:?}"
    );
    assert!(
        candidates[0]
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("{slug}-")),
        "a transition's directory of its own: {candidates:?}"
    );

    g.b = start(&g.env, None, &dir.join("transition.log"));
    wait_ready(&g.client, &mut g.b).await;
    let jobs = wait_jobs_finished(&g.conn).await;
    assert!(jobs.iter().all(|(s, _)| s == "succeeded"), "{jobs:?}");
    assert!(
        !candidates[0].exists(),
        "the delete's job removed what the killed transition made"
    );
    let registered = crate::helpers::git(&source, &["worktree", "list", "--porcelain"]);
    assert_eq!(
        registered.lines().filter(|l| l.starts_with("worktree ")).count(),
        1,
        "only the source's own worktree is registered: {registered}"
    );
    assert_invariants(&g.conn, &worktrees.canonicalize().unwrap()).await;
    // The candidate's branch is kept (`berth/<slug>-<suffix>`: its origin was never recorded).
    let branch = format!("refs/heads/berth/{slug}-");
    let after = refs();
    assert_eq!(
        after.lines().filter(|l| !l.starts_with(&branch)).collect::<Vec<_>>(),
        before.lines().collect::<Vec<_>>(),
        "the source repository keeps its refs"
    );
}
