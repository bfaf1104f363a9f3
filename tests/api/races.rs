//! The lifecycle under contention (I5–I14): cascades across three levels, archive and reset racing
//! session creation (50 rounds each; delete racing creation is
//! `cleanup::creation_racing_deletion_never_leaves_an_untracked_worktree`), and unarchive while the
//! archive job runs. After each, nothing leaks (every registered worktree of the source repository is
//! named by a live environment's inventory, and nothing is left on disk that none names) and no work is
//! lost (archive keeps branches; a reset's new environment is whole).
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{
    Backend, HANGING_WORKER, TestApp, branch_exists, id_of, seen, uuid, wait_job, wait_job_settled, wait_until_every,
    worktrees_of,
};

both_backends!(
    cascade_archive_and_delete_across_three_levels,
    archive_racing_session_creation_leaks_nothing,
    reset_racing_session_creation_leaks_nothing,
    archive_racing_a_launch_leaves_no_agent_running,
);

const WAIT: Duration = Duration::from_secs(60);
const ROUNDS: usize = 50;
/// Each launch round starts an agent process.
const LAUNCH_ROUNDS: usize = 12;

async fn jobs_succeed(app: &TestApp, reply: &Value) {
    for j in reply["cleanup_jobs"].as_array().unwrap() {
        let done = wait_job_settled(app, uuid(&j["id"])).await;
        assert_eq!(done["state"], "succeeded", "{done}");
    }
}

/// Active inventory rows of live (ready or stopped) environments naming `path`.
async fn live_owners(app: &TestApp, path: &str) -> i64 {
    let backend = app.db().get_database_backend();
    let sql = format!(
        "SELECT COUNT(*) AS n FROM task_environment_repos r JOIN task_environments e ON e.id = r.task_environment_id \
         WHERE r.worktree_path = '{}' AND r.status = 'active' AND e.status IN ('ready', 'stopped')",
        path.replace('\'', "''")
    );
    let row = app
        .db()
        .query_one_raw(Statement::from_string(backend, sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

/// I13 and no leak: every registered worktree of `source` (but itself) has exactly one live owner, and
/// every worktree directory under the managed root is registered.
async fn assert_no_leak(app: &TestApp, source: &Path) {
    let registered: Vec<String> = worktrees_of(source)
        .into_iter()
        .filter(|p| p != &source.display().to_string())
        .collect();
    for path in &registered {
        assert_eq!(
            live_owners(app, path).await,
            1,
            "a registered worktree nobody owns: {path}"
        );
        assert!(Path::new(path).is_dir(), "a registration without its directory: {path}");
    }
    for task_dir in std::fs::read_dir(&app.config.worktree_root).unwrap() {
        let task_dir = task_dir.unwrap().path();
        let Ok(entries) = std::fs::read_dir(&task_dir) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            assert!(
                registered.contains(&p.display().to_string()),
                "a worktree directory left on disk that git does not know: {}",
                p.display()
            );
        }
    }
}

async fn child(app: &TestApp, ws: Uuid, parent: Uuid, title: &str, repo: Uuid) -> Uuid {
    id_of(
        &app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": title, "parent_task_id": parent, "repositories": [{"repository_id": repo}]}),
        )
        .await
        .ok(201),
    )
}

// I5, I8: a cascade archive cleans the three levels' own environments (branches kept), a cascade
// delete removes the three tasks and what is left, and no registration or directory leaks.
async fn cascade_archive_and_delete_across_three_levels(app: TestApp) {
    let f = app.task_with_repo("Root").await;
    let (ws, repo, source, root) = (f.workspace, f.repository, f.repo_dir.clone(), f.task);
    let mid = child(&app, ws, root, "Mid", repo).await;
    let leaf = child(&app, ws, mid, "Leaf", repo).await;
    let mut worktrees: Vec<(PathBuf, String)> = Vec::new();
    for t in [root, mid, leaf] {
        let s = app.session(t, "worktree").await;
        let env = app.get(&format!("/api/v1/tasks/{t}/environment")).await.ok(200);
        worktrees.push((
            PathBuf::from(s["workspace_path"].as_str().unwrap()),
            env["repos"][0]["worktree_branch"].as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(worktrees_of(&source).len(), 4);

    let r = app
        .post(&format!("/api/v1/tasks/{root}/archive?cascade=true"), json!({}))
        .await
        .ok(202);
    assert_eq!(r["cleanup_jobs"].as_array().unwrap().len(), 3, "{r}");
    jobs_succeed(&app, &r).await;
    for t in [root, mid, leaf] {
        let task = app.get(&format!("/api/v1/tasks/{t}")).await.ok(200);
        assert!(task["archived_at"].is_string(), "{task}");
    }
    for (w, branch) in &worktrees {
        assert!(!w.exists(), "archived: {} removed", w.display());
        assert!(branch_exists(&source, branch), "archive keeps {branch}");
    }
    assert_no_leak(&app, &source).await;

    let r = app
        .call(
            Method::DELETE,
            &format!("/api/v1/tasks/{root}?cascade=true"),
            Some(&app.admin),
            None,
        )
        .await
        .ok(202);
    assert_eq!(r["cleanup_jobs"].as_array().unwrap().len(), 3, "{r}");
    jobs_succeed(&app, &r).await;
    for t in [root, mid, leaf] {
        app.get(&format!("/api/v1/tasks/{t}")).await.problem(404, "not_found");
    }
    for (_, branch) in &worktrees {
        assert!(
            !branch_exists(&source, branch),
            "merged berth branches go with a delete: {branch}"
        );
    }
    assert_eq!(app.count("tasks").await, 0);
    assert_eq!(worktrees_of(&source), vec![source.display().to_string()]);
    assert_no_leak(&app, &source).await;
}

// I6, I7: a session create racing an archive either wins (its worktree is then the archive's to clean,
// its branch kept) or is refused; never a worktree nobody owns.
async fn archive_racing_session_creation_leaks_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let mut won = Vec::new();
    let mut jobs = Vec::new();
    for i in 0..ROUNDS {
        let task = app.task(ws, &format!("archive race {i}"), &[repo]).await;
        let (create_url, archive_url) = (
            format!("/api/v1/tasks/{task}/sessions"),
            format!("/api/v1/tasks/{task}/archive"),
        );
        let create = app.post(&create_url, json!({"executor_type": "worktree", "start": false}));
        let archive = app.post(&archive_url, json!({}));
        let (c, a) = tokio::join!(create, archive);
        match c.status.as_u16() {
            201 => won.push((task, uuid(&c.json()["task_environment_id"]))),
            409 => {
                let code = c.json()["code"].as_str().unwrap_or_default().to_string();
                assert!(
                    ["task_archived", "task_cleanup_in_progress", "workspace_preparing"].contains(&code.as_str()),
                    "{}",
                    c.text
                );
            }
            other => panic!("create answered {other}: {}", c.text),
        }
        jobs.push(a.ok(202));
    }
    for r in &jobs {
        jobs_succeed(&app, r).await;
    }
    for (task, env) in won {
        let t = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
        assert!(t["archived_at"].is_string());
        let env = app.get(&format!("/api/v1/environments/{env}")).await.ok(200);
        let branch = env["repos"][0]["worktree_branch"].as_str().unwrap();
        assert!(
            branch_exists(&source, branch),
            "no lost work: the archived task's branch {branch} is kept"
        );
    }
    assert_eq!(worktrees_of(&source), vec![source.display().to_string()]);
    assert_no_leak(&app, &source).await;
}

// I7, I8, I18: an archive racing a launch, of a session in the current environment or one that makes an
// executor transition: the launch either lands before the barrier (and the archive stops its agent) or is
// refused, or its agent is stopped by the launch itself when it finds the archive's job as it records the
// agent running. A launch whose workspace the archive's job removed first is answered by the archive,
// not by marking the environment broken. Never an agent left running in an archived task, never a
// worktree nobody owns.
async fn archive_racing_a_launch_leaves_no_agent_running(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let mut tasks = Vec::new();
    let mut jobs = Vec::new();
    for i in 0..LAUNCH_ROUNDS {
        let transition = i % 2 == 1;
        let task = app.task(ws, &format!("launch race {i}"), &[repo]).await;
        let archive_url = format!("/api/v1/tasks/{task}/archive");
        let (launch_url, body) = if transition {
            // The task's environment is local; a worktree session makes a candidate beside it (I18).
            app.session(task, "local").await;
            let body = json!({"executor_type": "worktree", "agent_profile": "test", "prompt": "hang"});
            (format!("/api/v1/tasks/{task}/sessions"), body)
        } else {
            let s = app.unstarted_agent(task, "worktree", "test").await;
            (
                format!("/api/v1/sessions/{}/launch", uuid(&s["id"])),
                json!({"prompt": "hang"}),
            )
        };
        let (l, a) = tokio::join!(app.post(&launch_url, body), app.post(&archive_url, json!({})));
        match l.status.as_u16() {
            200 | 201 => {}
            409 => {
                let code = l.json()["code"].as_str().unwrap_or_default().to_string();
                assert!(
                    [
                        "task_archived",
                        "task_cleanup_in_progress",
                        "workspace_preparing",
                        "conflict"
                    ]
                    .contains(&code.as_str()),
                    "{}",
                    l.text
                );
            }
            other => panic!("the launch answered {other}: {}", l.text),
        }
        jobs.push(a.ok(202));
        tasks.push(task);
    }
    for r in &jobs {
        jobs_succeed(&app, r).await;
    }
    wait_until_every(
        "no agent in an archived task",
        WAIT,
        Duration::from_millis(20),
        || async {
            let mut live = Vec::new();
            for id in app.app_state.ctx.runtime.live_sessions() {
                live.push(app.get(&format!("/api/v1/sessions/{id}")).await.json());
            }
            seen(live.is_empty(), live)
        },
    )
    .await;
    for task in tasks {
        let sessions = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200);
        for s in sessions["items"].as_array().unwrap() {
            assert!(
                ["cancelled", "failed", "stopped"].contains(&s["state"].as_str().unwrap()),
                "every session of an archived task is over: {s}"
            );
            assert_eq!(s["desired_open"], false, "nothing restarts it: {s}");
        }
    }
    assert_eq!(worktrees_of(&source), vec![source.display().to_string()]);
    assert_no_leak(&app, &source).await;
}

// I7, I14: a session create racing a reset either lands before it (and the reset's job removes the old
// worktree), is refused while the job runs, or lands after (a fresh environment, whole). Never a leak,
// never a live environment missing its worktree.
async fn reset_racing_session_creation_leaks_nothing(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let mut tasks = Vec::new();
    for i in 0..ROUNDS {
        let task = app.task(ws, &format!("reset race {i}"), &[repo]).await;
        app.session(task, "worktree").await;
        let (create_url, reset_url) = (
            format!("/api/v1/tasks/{task}/sessions"),
            format!("/api/v1/tasks/{task}/environment/reset"),
        );
        let create = app.post(&create_url, json!({"executor_type": "worktree", "start": false}));
        let reset = app.post(&reset_url, json!({}));
        let (c, r) = tokio::join!(create, reset);
        assert!(matches!(c.status.as_u16(), 201 | 409), "{}", c.text);
        let job = r.ok(202);
        let done = wait_job_settled(&app, uuid(&job["cleanup_job"]["id"])).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        tasks.push(task);
    }
    for task in tasks {
        let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await;
        if env.status.as_u16() == 200 {
            let env = env.json();
            if env["status"] == "ready" {
                let path = env["repos"][0]["worktree_path"].as_str().unwrap();
                assert!(Path::new(path).is_dir(), "a ready environment is whole: {env}");
            }
        }
    }
    assert_no_leak(&app, &source).await;
}

// I10: unarchive while the archive job runs waits for it (the job is never cut off half way), then the
// task is back and its next launch materializes afresh. The job's first worker hangs holding it (a
// failpoint); a healthy process rescues it once the lease expires.
async fn unarchive_waits_for_the_running_archive_job(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, HANGING_WORKER).await else {
        return;
    };
    let f = app.task_with_repo("Back").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    let s = f.unstarted_agent("worktree", "test").await;
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    let r = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    wait_job(&app, id, WAIT, &["running"]).await;

    let unarchive_url = format!("/api/v1/tasks/{task}/unarchive");
    let unarchive = app.post(&unarchive_url, json!({}));
    tokio::pin!(unarchive);
    // While the job runs, unarchive does not answer and the task stays archived.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut unarchive)
            .await
            .is_err(),
        "unarchive answered while the archive job was running"
    );
    let t = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert!(t["archived_at"].is_string(), "still archived while the job runs");

    let mut config = app.config.clone();
    config.cleanup_failpoint = None;
    let healthy = berth::startup::Application::build(config).await.unwrap();
    let un = unarchive.await.ok(200);
    assert_eq!(
        un["cancelled_cleanup_jobs"],
        json!([]),
        "the running job was waited for, not cancelled"
    );
    assert_eq!(wait_job_settled(&app, id).await["state"], "succeeded");
    assert!(!worktree.exists(), "the job finished what it started");
    let t = app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert!(t["archived_at"].is_null());
    let relaunched = app
        .post(&format!("/api/v1/sessions/{}/launch", uuid(&s["id"])), json!({}))
        .await
        .ok(200);
    assert!(worktree.is_dir(), "the launch materialized afresh");
    assert_eq!(relaunched["workspace_path"], s["workspace_path"]);
    app.post(&format!("/api/v1/sessions/{}/stop", uuid(&s["id"])), json!({}))
        .await
        .ok(200);
    assert_no_leak(&app, &source).await;
    healthy.background().iter().for_each(|h| h.abort());
}

crate::backend_tests!(unarchive_waits_for_the_running_archive_job: unarchive_waits_for_the_running_archive_job_sqlite, unarchive_waits_for_the_running_archive_job_postgres);
