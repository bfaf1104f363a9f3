//! Task lifecycle cleanup through durable jobs (seed 001 scenarios, I5-I13): what a task owned is removed
//! only by its lifecycle, never what is dirty without consent, and the job finishes across crashes.
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{
    self, HANGING_WORKER, TestApp, branch_exists, git, id_of, seen, seen_json, uuid, wait_until, wait_until_every,
    worktrees_of,
};

both_backends!(
    archive_after_the_last_session_was_deleted_and_a_restart,
    delete_after_the_last_session_was_deleted_and_a_restart,
    a_dirty_delete_is_refused_then_consented,
    a_dirty_worktree_without_consent_fails_the_job_and_stays,
    a_transient_git_failure_is_retried_from_the_snapshot,
    a_crashed_worker_is_rescued_after_its_lease,
    claims_never_hand_a_job_out_twice,
    a_symlink_inside_a_worktree_is_not_followed,
    a_shared_environment_is_preserved_and_transferred,
    creation_racing_deletion_never_leaves_an_untracked_worktree,
    quick_chats_expire_through_the_delete_path,
    workspace_delete_needs_the_name_and_removes_everything_it_owned,
    environment_reset_waits_for_idle_sessions_and_rematerializes,
    lifecycle_permissions_are_separate,
    unarchive_cancels_pending_and_failed_archive_jobs,
    a_reconciled_prepared_job_reaches_live_streams_at_once,
);

const WAIT: Duration = Duration::from_secs(30);

/// Waits (with a deadline) until the job reaches one of `states`.
async fn wait_job(app: &TestApp, id: Uuid, states: &[&str]) -> Value {
    helpers::wait_job(app, id, WAIT, states).await
}

/// A task over one repository with a materialized worktree; returns (task, repo path, worktree, branch).
async fn task_with_worktree(app: &TestApp, ws: Uuid, title: &str, repo_name: &str) -> (Uuid, PathBuf, PathBuf, String) {
    let (repo, source) = app.repository(ws, repo_name).await;
    let task = app.task(ws, title, &[repo]).await;
    let s = app.session(task, "worktree").await;
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let branch = env["repos"][0]["worktree_branch"].as_str().unwrap().to_string();
    (
        task,
        source,
        PathBuf::from(s["workspace_path"].as_str().unwrap()),
        branch,
    )
}

/// A second server on the same database and data dir ("berth restarted").
async fn restart(app: &TestApp) -> Vec<tokio::task::AbortHandle> {
    let other = berth::startup::Application::build(app.config.clone()).await.unwrap();
    other.background()
}

// Seed 001: the final session was deleted and berth restarted; archive schedules the worktree's removal,
// which the job completes, keeping the branch; unarchive re-materializes from it.
async fn archive_after_the_last_session_was_deleted_and_a_restart(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (task, source, worktree, branch) = task_with_worktree(&app, ws, "Archive me", "svc").await;
    let s = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200)["items"][0]["id"].clone();
    app.delete(&format!("/api/v1/sessions/{}", uuid(&s))).await.ok(204);
    let second = restart(&app).await;

    // Read before the archive: its job may remove the environment before a read after it.
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let r = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    assert!(r["task"]["archived_at"].is_string());
    let job = &r["cleanup_jobs"][0];
    assert_eq!(job["trigger"], "archive");
    // Found through the task (the session was deleted), and shown without paths (I34).
    assert_eq!(
        job["resource_snapshot"]["environment"]["worktrees"][0]["worktree_id"],
        env["repos"][0]["worktree_id"]
    );
    assert!(
        !job.to_string().contains(&worktree.display().to_string()),
        "no path in a job: {job}"
    );
    let done = wait_job(&app, uuid(&job["id"]), &["succeeded", "failed"]).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(!worktree.exists(), "the worktree directory is gone");
    assert_eq!(
        worktrees_of(&source),
        vec![source.display().to_string()],
        "and its registration"
    );
    assert!(branch_exists(&source, &branch), "the branch is kept for unarchive");
    app.post(
        &format!("/api/v1/tasks/{task}/sessions"),
        json!({"executor_type": "worktree"}),
    )
    .await
    .problem(409, "task_archived");

    let un = app
        .post(&format!("/api/v1/tasks/{task}/unarchive"), json!({}))
        .await
        .ok(200);
    assert!(un["task"]["archived_at"].is_null());
    assert_eq!(un["recovery"][0]["branch_status"], "local");
    let again = app.session(task, "worktree").await;
    assert_eq!(
        PathBuf::from(again["workspace_path"].as_str().unwrap()),
        worktree,
        "re-materialized in place"
    );
    assert_eq!(
        git(&worktree, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        branch,
        "from the kept branch"
    );
    let types: Vec<String> = app.events().await.into_iter().map(|e| e.1).collect();
    for t in ["task.archived", "task.unarchived", "cleanup_job.updated"] {
        assert!(types.contains(&t.to_string()), "{t}");
    }
    second.iter().for_each(|h| h.abort());
}

// Seed 001: delete after the final session was deleted and a restart: the row goes at once, the job removes
// the worktree and its registration.
async fn delete_after_the_last_session_was_deleted_and_a_restart(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (task, source, worktree, _) = task_with_worktree(&app, ws, "Delete me", "svc").await;
    let s = app.get(&format!("/api/v1/tasks/{task}/sessions")).await.ok(200)["items"][0]["id"].clone();
    app.delete(&format!("/api/v1/sessions/{}", uuid(&s))).await.ok(204);
    let second = restart(&app).await;
    let r = app.delete(&format!("/api/v1/tasks/{task}")).await.ok(202);
    app.get(&format!("/api/v1/tasks/{task}"))
        .await
        .problem(404, "not_found");
    let done = wait_job(&app, uuid(&r["cleanup_jobs"][0]["id"]), &["succeeded", "failed"]).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["task_id"], task.to_string(), "the job outlives its task");
    assert!(!worktree.exists());
    assert_eq!(worktrees_of(&source).len(), 1);
    assert!(source.join("README.md").exists(), "the source repository is untouched");
    second.iter().for_each(|h| h.abort());
}

// I11: refused before anything changes, listing repositories and counts; consented, it goes.
async fn a_dirty_delete_is_refused_then_consented(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (task, source, worktree, _) = task_with_worktree(&app, ws, "Dirty", "svc").await;
    std::fs::write(worktree.join("wip.txt"), "work in progress").unwrap();
    std::fs::write(worktree.join("README.md"), "changed").unwrap();
    let r = app.delete(&format!("/api/v1/tasks/{task}")).await;
    let p = r.problem(409, "task_delete_dirty_worktree");
    let repo_id = app.get(&format!("/api/v1/workspaces/{ws}/repositories")).await.ok(200)["items"][0]["id"].clone();
    let env_id = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200)["id"].clone();
    assert_eq!(p["dirty_repositories"], p["repositories"]);
    assert_eq!(
        p["repositories"],
        json!([{"repository_id": repo_id, "task_environment_id": env_id, "dirty_file_count": 2}])
    );
    assert!(!r.text.contains(&worktree.display().to_string()));
    app.get(&format!("/api/v1/tasks/{task}")).await.ok(200);
    assert_eq!(app.count("task_resource_cleanup_jobs").await, 0, "nothing changed");
    assert_eq!(
        std::fs::read_to_string(worktree.join("wip.txt")).unwrap(),
        "work in progress"
    );

    let r = app
        .delete(&format!("/api/v1/tasks/{task}?discard_worktree_changes=true"))
        .await
        .ok(202);
    let job = &r["cleanup_jobs"][0];
    assert_eq!(
        job["resource_snapshot"]["discard_worktree_changes"], true,
        "consent is recorded"
    );
    assert_eq!(
        wait_job(&app, uuid(&job["id"]), &["succeeded", "failed"]).await["state"],
        "succeeded"
    );
    assert!(!worktree.exists());
    assert_eq!(worktrees_of(&source).len(), 1);
}

// I11: without consent, a dirty worktree ends the job failed at once and stays; an operator retries.
async fn a_dirty_worktree_without_consent_fails_the_job_and_stays(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (task, _, worktree, _) = task_with_worktree(&app, ws, "Dirty archive", "svc").await;
    std::fs::write(worktree.join("precious.txt"), "do not lose").unwrap();
    let r = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    let failed = wait_job(&app, id, &["failed", "succeeded"]).await;
    assert_eq!(failed["state"], "failed");
    assert_eq!(failed["attempts"], 1, "no retry loop");
    assert!(failed["last_error"].as_str().unwrap().contains("changed files"));
    assert_eq!(
        std::fs::read_to_string(worktree.join("precious.txt")).unwrap(),
        "do not lose"
    );
    let listed = app.get("/api/v1/cleanup-jobs?state=failed").await.ok(200);
    assert_eq!(listed["items"][0]["id"], id.to_string());
    // The user keeps the file elsewhere; the operator retries with a fresh budget.
    std::fs::remove_file(worktree.join("precious.txt")).unwrap();
    let retried = app
        .post(&format!("/api/v1/cleanup-jobs/{id}/retry"), json!({}))
        .await
        .ok(200);
    assert_eq!(retried["state"], "pending");
    assert_eq!(retried["attempts"], 0);
    assert_eq!(wait_job(&app, id, &["succeeded"]).await["attempts"], 1);
    assert!(!worktree.exists());
    app.post(&format!("/api/v1/cleanup-jobs/{id}/cancel"), json!({}))
        .await
        .problem(409, "conflict");
}

// Seed 001: a transient git failure; the retry (from the persisted snapshot) completes.
async fn a_transient_git_failure_is_retried_from_the_snapshot(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (task, source, worktree, _) = task_with_worktree(&app, ws, "Flaky", "svc").await;
    // The repository's git directory is away for a while: every git call about the worktree fails.
    let git_dir = source.join(".git");
    let away = source.join(".git-away");
    std::fs::rename(&git_dir, &away).unwrap();
    let r = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    let j = wait_until_every("a retry", WAIT, Duration::from_millis(20), || async {
        let j = app.get(&format!("/api/v1/cleanup-jobs/{id}")).await.ok(200);
        seen_json(j["attempts"].as_i64().unwrap() >= 2, j)
    })
    .await;
    assert_ne!(j["state"], "succeeded");
    assert!(j["last_error"].is_string());
    assert!(worktree.exists(), "nothing removed while git failed");
    std::fs::rename(&away, &git_dir).unwrap();
    assert_eq!(wait_job(&app, id, &["succeeded"]).await["state"], "succeeded");
    assert!(!worktree.exists());
}

// I9: a worker that dies holding a job (a failpoint) is rescued by another process once the lease
// expires, which finishes from the snapshot.
async fn a_crashed_worker_is_rescued_after_its_lease(app: TestApp) {
    let Some(app) = app.respawn_with(HANGING_WORKER).await else {
        return;
    };
    let ws = app.workspace("ws").await;
    let (task, _, worktree, _) = task_with_worktree(&app, ws, "Crash", "svc").await;
    let r = app.delete(&format!("/api/v1/tasks/{task}")).await.ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    let running = wait_job(&app, id, &["running"]).await;
    assert_eq!(running["attempts"], 1);
    assert!(worktree.exists(), "the hung worker did nothing");
    // A healthy process on the same database and node.
    let mut config = app.config.clone();
    config.cleanup_failpoint = None;
    let healthy = berth::startup::Application::build(config).await.unwrap();
    let done = wait_job(&app, id, &["succeeded"]).await;
    // Rescued after the lease expired (on a loaded machine a slow rescuer may itself be rescued once more).
    assert!(done["attempts"].as_i64().unwrap() >= 2, "rescued: {done}");
    assert!(!worktree.exists());
    healthy.background().iter().for_each(|h| h.abort());
}

// Decision 3: four claimers on one database never hand out a job twice.
async fn claims_never_hand_a_job_out_twice(app: TestApp) {
    use berth::entity::cleanup_job as job;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let backend = app.backend;
    drop(app);
    let Some(app) = TestApp::spawn_with(backend, &[("BERTH_CLEANUP_WORKERS", "0")]).await else {
        return;
    };
    let n = if backend == crate::helpers::Backend::Postgres {
        10_000
    } else {
        2000
    };
    let now = chrono::Utc::now() - chrono::Duration::seconds(1);
    let snapshot = json!({"task_id": Uuid::nil(), "workspace_id": Uuid::nil(), "environment": null, "sessions": [], "discard_worktree_changes": false, "keep_branches": true});
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let rows = chunk.iter().map(|_| job::ActiveModel {
            id: Set(berth::ids::CleanupJobId::now_v7()),
            operation_id: Set(berth::ids::OperationId::now_v7()),
            task_id: Set(berth::ids::TaskId::now_v7()),
            workspace_id: Set((Uuid::nil()).into()),
            task_environment_id: Set(None),
            trigger: Set(job::CleanupTrigger::Delete),
            state: Set(job::CleanupJobState::Pending),
            attempts: Set(0),
            max_attempts: Set(8),
            next_attempt_at: Set(Some(now)),
            last_error: Set(None),
            resource_snapshot: Set(snapshot.clone()),
            node_id: Set(app.config.node_id.clone()),
            lease_owner: Set(None),
            lease_expires_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            completed_at: Set(None),
            actor_sub: Set(None),
            actor_session_id: Set(None),
        });
        job::Entity::insert_many(rows)
            .exec_without_returning(app.db())
            .await
            .unwrap();
    }
    let claimers = (0..4).map(|w| {
        let ctx = app.app_state.ctx.clone();
        tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(j) = berth::domain::cleanup::claim::claim(&ctx, &format!("claimer-{w}"))
                .await
                .unwrap()
            {
                got.push(j.id);
            }
            got
        })
    });
    let mut all: Vec<berth::ids::CleanupJobId> = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let unique: std::collections::HashSet<berth::ids::CleanupJobId> = all.iter().copied().collect();
    assert_eq!(all.len(), n, "every job claimed");
    assert_eq!(unique.len(), n, "none claimed twice");
}

// I13: removing a worktree never follows a symlink out of it.
async fn a_symlink_inside_a_worktree_is_not_followed(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (task, _, worktree, _) = task_with_worktree(&app, ws, "Symlink", "svc").await;
    let outside = app.scratch.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep.txt"), "outside the root").unwrap();
    std::os::unix::fs::symlink(&outside, worktree.join("link")).unwrap();
    let r = app
        .delete(&format!("/api/v1/tasks/{task}?discard_worktree_changes=true"))
        .await
        .ok(202);
    assert_eq!(
        wait_job(&app, uuid(&r["cleanup_jobs"][0]["id"]), &["succeeded", "failed"]).await["state"],
        "succeeded"
    );
    assert!(!worktree.exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("keep.txt")).unwrap(),
        "outside the root"
    );
}

// I8: archiving preserves an environment a live subtask uses; deleting transfers it to the subtask.
async fn a_shared_environment_is_preserved_and_transferred(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (parent, source, worktree, _) = task_with_worktree(&app, ws, "Parent", "svc").await;
    let child = app.subtask(ws, parent, "Child").await;
    let cs = app.session(child, "worktree").await;
    std::fs::write(worktree.join("child-work.txt"), "in progress").unwrap();
    let env_id = cs["task_environment_id"].clone();

    let r = app
        .post(&format!("/api/v1/tasks/{parent}/archive"), json!({}))
        .await
        .ok(202);
    assert_eq!(
        wait_job(&app, uuid(&r["cleanup_jobs"][0]["id"]), &["succeeded", "failed"]).await["state"],
        "succeeded"
    );
    assert!(
        worktree.join("child-work.txt").exists(),
        "preserved: the subtask still works there"
    );
    app.post(&format!("/api/v1/tasks/{parent}/unarchive"), json!({}))
        .await
        .ok(200);

    let r = app
        .delete(&format!("/api/v1/tasks/{parent}?discard_worktree_changes=true"))
        .await
        .ok(202);
    assert_eq!(
        wait_job(&app, uuid(&r["cleanup_jobs"][0]["id"]), &["succeeded", "failed"]).await["state"],
        "succeeded"
    );
    let env = app.get(&format!("/api/v1/tasks/{child}/environment")).await.ok(200);
    assert_eq!(env["id"], env_id, "the same environment");
    assert_eq!(env["task_id"], child.to_string(), "now owned by the surviving subtask");
    assert_eq!(env["ownership_generation"], 2);
    assert_eq!(
        std::fs::read_to_string(worktree.join("child-work.txt")).unwrap(),
        "in progress"
    );
    assert!(worktrees_of(&source).contains(&worktree.display().to_string()));
    let child_task = app.get(&format!("/api/v1/tasks/{child}")).await.ok(200);
    assert_eq!(child_task["workspace_mode"], "new_workspace");
    // The child keeps working there.
    assert_eq!(
        app.session(child, "worktree").await["workspace_path"],
        cs["workspace_path"]
    );
}

// I7, repeated: a session racing a delete is either in the snapshot (and removed) or rejected and
// compensated; a worktree never ends up untracked.
async fn creation_racing_deletion_never_leaves_an_untracked_worktree(app: TestApp) {
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let mut jobs = Vec::new();
    for i in 0..50 {
        let task = app.task(ws, &format!("race {i}"), &[repo]).await;
        let (create_url, delete_url) = (
            format!("/api/v1/tasks/{task}/sessions"),
            format!("/api/v1/tasks/{task}?discard_worktree_changes=true"),
        );
        let create = app.post(&create_url, json!({"executor_type": "worktree"}));
        let delete = app.call(Method::DELETE, &delete_url, Some(&app.admin), None);
        let (c, d) = tokio::join!(create, delete);
        assert!(matches!(c.status.as_u16(), 201 | 404 | 409), "{}", c.text);
        let d = d.ok(202);
        jobs.push(uuid(&d["cleanup_jobs"][0]["id"]));
    }
    for id in jobs {
        let j = wait_job(&app, id, &["succeeded", "failed"]).await;
        assert_eq!(j["state"], "succeeded", "{j}");
    }
    // Settle: any compensation has run once its request answered.
    assert_eq!(
        worktrees_of(&source),
        vec![source.display().to_string()],
        "no untracked worktree registration"
    );
    let left: Vec<PathBuf> = std::fs::read_dir(&app.config.worktree_root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::read_dir(p).map(|mut d| d.next().is_some()).unwrap_or(true))
        .collect();
    assert!(left.is_empty(), "no worktree left on disk: {left:?}");
    assert_eq!(app.count("tasks").await, 0);
}

// I12: an idle quick chat goes through the ordinary delete path; a standard task stays.
async fn quick_chats_expire_through_the_delete_path(app: TestApp) {
    let Some(app) = app
        .respawn_with(&[
            ("BERTH_QUICK_CHAT_RETENTION_SECS", "1"),
            ("BERTH_SWEEP_INTERVAL_MS", "100"),
        ])
        .await
    else {
        return;
    };
    let ws = app.workspace("ws").await;
    let (repo, source) = app.repository(ws, "svc").await;
    let chat = id_of(
        &app.post(
            &format!("/api/v1/workspaces/{ws}/tasks"),
            json!({"title": "chat", "kind": "quick_chat", "repositories": [{"repository_id": repo}]}),
        )
        .await
        .ok(201),
    );
    let standard = app.task(ws, "standard", &[repo]).await;
    app.session(chat, "worktree").await;
    wait_until("the quick chat to expire", WAIT, || async {
        let status = app.get(&format!("/api/v1/tasks/{chat}")).await.status;
        seen(status != 200, status)
    })
    .await;
    let jobs = app.get("/api/v1/cleanup-jobs?trigger=quick_chat_expire").await.ok(200);
    let id = uuid(&jobs["items"][0]["id"]);
    wait_job(&app, id, &["succeeded"]).await;
    assert_eq!(worktrees_of(&source).len(), 1);
    app.get(&format!("/api/v1/tasks/{standard}")).await.ok(200);
}

async fn workspace_delete_needs_the_name_and_removes_everything_it_owned(app: TestApp) {
    let ws = app.workspace("doomed").await;
    let (_, source, worktree, _) = task_with_worktree(&app, ws, "One", "svc").await;
    app.delete(&format!("/api/v1/workspaces/{ws}"))
        .await
        .problem(400, "validation_failed");
    app.delete(&format!("/api/v1/workspaces/{ws}?confirm_name=wrong"))
        .await
        .problem(400, "validation_failed");
    app.get(&format!("/api/v1/workspaces/{ws}")).await.ok(200);
    let r = app
        .delete(&format!("/api/v1/workspaces/{ws}?confirm_name=doomed"))
        .await
        .ok(202);
    let jobs = r["cleanup_jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["trigger"], "workspace_delete");
    app.get(&format!("/api/v1/workspaces/{ws}"))
        .await
        .problem(404, "not_found");
    assert_eq!(
        wait_job(&app, uuid(&jobs[0]["id"]), &["succeeded", "failed"]).await["state"],
        "succeeded"
    );
    assert!(!worktree.exists());
    assert!(
        source.join(".git").is_dir(),
        "registered repositories are never touched"
    );
    assert_eq!(worktrees_of(&source).len(), 1);
}

async fn environment_reset_waits_for_idle_sessions_and_rematerializes(app: TestApp) {
    let f = app.task_with_repo("Reset").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    let s = f.agent("test").await;
    let env_before = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    app.post(&format!("/api/v1/tasks/{task}/environment/reset"), json!({}))
        .await
        .problem(409, "session_busy");
    app.post(&format!("/api/v1/sessions/{}/stop", uuid(&s["id"])), json!({}))
        .await
        .ok(200);
    let r = app
        .post(&format!("/api/v1/tasks/{task}/environment/reset"), json!({}))
        .await
        .ok(202);
    assert_eq!(r["cleanup_job"]["trigger"], "environment_reset");
    wait_job(&app, uuid(&r["cleanup_job"]["id"]), &["succeeded"]).await;
    assert_eq!(
        app.get(&format!("/api/v1/environments/{}", uuid(&env_before["id"])))
            .await
            .ok(200)["status"],
        "superseded"
    );
    app.get(&format!("/api/v1/tasks/{task}/environment"))
        .await
        .problem(404, "not_found");
    let fresh = f.session("worktree").await;
    assert_ne!(fresh["task_environment_id"], env_before["id"]);
    assert_eq!(worktrees_of(&source).len(), 2);
    assert!(Path::new(fresh["workspace_path"].as_str().unwrap()).is_dir());
}

async fn lifecycle_permissions_are_separate(app: TestApp) {
    let ws = app.workspace("ws").await;
    let task = app.task(ws, "Perms", &[]).await;
    let deleter = app.token("sessions:delete");
    let archiver = app.token("tasks:archive");
    let reader = app.token("cleanup:read");
    app.call(
        Method::POST,
        &format!("/api/v1/tasks/{task}/archive"),
        Some(&deleter),
        Some(json!({})),
    )
    .await
    .problem(403, "insufficient_scope");
    app.call(Method::DELETE, &format!("/api/v1/tasks/{task}"), Some(&deleter), None)
        .await
        .problem(403, "insufficient_scope");
    app.call(Method::DELETE, &format!("/api/v1/tasks/{task}"), Some(&archiver), None)
        .await
        .problem(403, "insufficient_scope");
    let r = app
        .call(
            Method::POST,
            &format!("/api/v1/tasks/{task}/archive"),
            Some(&archiver),
            Some(json!({})),
        )
        .await
        .ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    app.call(Method::GET, &format!("/api/v1/cleanup-jobs/{id}"), Some(&reader), None)
        .await
        .ok(200);
    app.call(
        Method::POST,
        &format!("/api/v1/cleanup-jobs/{id}/retry"),
        Some(&reader),
        Some(json!({})),
    )
    .await
    .problem(403, "insufficient_scope");
    let metrics = app.call(Method::GET, "/metrics", None, None).await;
    assert!(metrics.text.contains("berth_cleanup_jobs{state="), "{}", metrics.text);
    assert!(metrics.text.contains("berth_cleanup_claims_total"));
}

// I10: unarchive cancels a pending archive job (and a failed one, which a retry would otherwise turn on
// the worktrees in use); the worktree stays; an operator cannot retry it into the live task.
async fn unarchive_cancels_pending_and_failed_archive_jobs(app: TestApp) {
    let backend = app.backend;
    drop(app);
    // No workers: archive jobs stay pending until unarchive.
    let Some(app) = TestApp::spawn_with(backend, &[("BERTH_CLEANUP_WORKERS", "0")]).await else {
        return;
    };
    let ws = app.workspace("ws").await;
    let (task, _, worktree, _) = task_with_worktree(&app, ws, "Back", "svc").await;
    let r = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    assert_eq!(
        app.get(&format!("/api/v1/cleanup-jobs/{id}")).await.ok(200)["state"],
        "pending"
    );
    let un = app
        .post(&format!("/api/v1/tasks/{task}/unarchive"), json!({}))
        .await
        .ok(200);
    assert_eq!(un["cancelled_cleanup_jobs"], json!([id.to_string()]));
    assert_eq!(
        app.get(&format!("/api/v1/cleanup-jobs/{id}")).await.ok(200)["state"],
        "cancelled"
    );
    assert!(worktree.is_dir());
    // A failed archive job: unarchive cancels it too, so nobody can retry it against the live task.
    let r = app
        .post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
        .await
        .ok(202);
    let id = uuid(&r["cleanup_jobs"][0]["id"]);
    {
        use berth::entity::cleanup_job as job;
        use sea_orm::{ActiveValue::Set, EntityTrait};
        job::Entity::update(job::ActiveModel {
            id: Set(id.into()),
            state: Set(job::CleanupJobState::Failed),
            ..Default::default()
        })
        .exec(app.db())
        .await
        .unwrap();
    }
    let un = app
        .post(&format!("/api/v1/tasks/{task}/unarchive"), json!({}))
        .await
        .ok(200);
    assert_eq!(un["cancelled_cleanup_jobs"], json!([id.to_string()]));
    app.post(&format!("/api/v1/cleanup-jobs/{id}/retry"), json!({}))
        .await
        .problem(409, "conflict");
    assert!(worktree.is_dir());
    app.session(task, "worktree").await;
}

// I6, I32: reconciliation settles a prepared job whose operation crashed, and its commit wakes the event
// tailer: a live stream hears of it at once, not at the next slow poll (a minute here).
async fn a_reconciled_prepared_job_reaches_live_streams_at_once(app: TestApp) {
    use berth::entity::cleanup_job as job;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let Some(app) = app
        .respawn_with(&[
            ("BERTH_EVENT_POLL_MS", "60000"),
            ("BERTH_CLEANUP_PREPARED_GRACE_SECS", "0"),
            ("BERTH_CLEANUP_POLL_MS", "100"),
        ])
        .await
    else {
        return;
    };
    let mut sse = crate::helpers::Sse::open(&app, &app.admin, "", None).await;
    // An archive whose task row never changed (it does not exist): its mutation did not commit.
    let id = Uuid::now_v7();
    let created = chrono::Utc::now() - chrono::Duration::seconds(1);
    job::Entity::insert(job::ActiveModel {
        id: Set(id.into()),
        operation_id: Set(berth::ids::OperationId::now_v7()),
        task_id: Set(berth::ids::TaskId::now_v7()),
        workspace_id: Set((Uuid::nil()).into()),
        task_environment_id: Set(None),
        trigger: Set(job::CleanupTrigger::Archive),
        state: Set(job::CleanupJobState::Prepared),
        attempts: Set(0),
        max_attempts: Set(8),
        next_attempt_at: Set(None),
        last_error: Set(None),
        resource_snapshot: Set(json!({"task_id": Uuid::nil(), "workspace_id": Uuid::nil(), "environment": null, "sessions": [], "discard_worktree_changes": false})),
        node_id: Set(app.config.node_id.clone()),
        lease_owner: Set(None),
        lease_expires_at: Set(None),
        created_at: Set(created),
        updated_at: Set(created),
        completed_at: Set(None),
        actor_sub: Set(None),
        actor_session_id: Set(None),
    })
    .exec_without_returning(app.db())
    .await
    .unwrap();
    loop {
        let frame = sse.next(Duration::from_secs(10)).await.expect("the stream stays open");
        let e: Value = serde_json::from_str(&frame.data).unwrap();
        if e["type"] == "cleanup_job.updated" && e["data"]["cleanup_job_id"] == id.to_string() {
            assert_eq!(e["data"]["state"], "cancelled", "{e}");
            break;
        }
    }
    assert_eq!(
        app.get(&format!("/api/v1/cleanup-jobs/{id}")).await.ok(200)["state"],
        "cancelled"
    );
}
