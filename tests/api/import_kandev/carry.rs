//! The cleanup kandev still owed becomes berth's. An archived task's pending archive job and a deleted
//! task's delete job become pending berth cleanup jobs with complete snapshots; a job kandev gave up on is
//! a failed berth job an operator may retry; finished and uncommitted ones are history. And the worker
//! then really does the work on the adopted worktrees, where kandev made them (outside
//! `BERTH_WORKTREE_ROOT`). An imported task's archive, delete and reset work on them as on berth's own.
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth::entity::{cleanup_job as job, task, task_environment as env, task_environment_repo as env_repo};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{Value, json};
use uuid::Uuid;

use super::fixture::*;
use super::{env_of, has, session_of, succeeded, task_of};
use crate::helpers::{TestApp, wait_until, worktrees_of};

/// kandev's `resource_snapshot` naming these worktrees of repository `r1`.
fn snapshot(worktrees: &[(&Path, &str)], discard: bool) -> String {
    let list: Vec<Value> = worktrees
        .iter()
        .map(|(path, branch)| {
            json!({"id": format!("wt-{branch}"), "task_id": "t", "repository_id": "r1", "repository_path": "/x",
                   "path": path.display().to_string(), "branch": branch, "base_branch": "main", "status": "active"})
        })
        .collect();
    json!({"worktrees": list, "discard_worktree_changes": discard, "sessions": []}).to_string()
}

/// The report's entry for the berth job carrying kandev job `id`.
#[track_caller]
fn carried(report: &Value, id: &str) -> Value {
    report["cleanup_jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no cleanup_jobs in {report}"))
        .iter()
        .find(|j| j["kandev_ids"].as_array().unwrap().contains(&json!(id)))
        .unwrap_or_else(|| panic!("kandev job {id} was not carried: {report}"))
        .clone()
}

async fn berth_job(app: &TestApp, entry: &Value) -> job::Model {
    let id: Uuid = entry["job_id"].as_str().unwrap().parse().unwrap();
    job::Entity::find_by_id(id).one(app.db()).await.unwrap().unwrap()
}

fn paths_of(snapshot: &Value) -> Vec<String> {
    snapshot["environment"]["worktrees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worktree_path"].as_str().unwrap().to_string())
        .collect()
}

/// An archived task whose archive kandev had not finished: its environment with one worktree, a session.
async fn archived_task(w: &World, k: &mut Kandev, wt: &Path) {
    k.repo("r1", "proj", &w.repo).await;
    k.task("t-arch", "Archived").await;
    k.task_repo("t-arch", "r1").await;
    k.env("e1", "t-arch", T2, None).await;
    k.env_repo("er1", "e1", "r1", "", "wt-a", wt, "feature/a", "active")
        .await;
    k.session("s1", "t-arch", "COMPLETED", "e1", T2).await;
    k.archive("t-arch").await;
    k.job_with(
        "j-arch",
        "t-arch",
        "archive",
        "pending",
        &snapshot(&[(wt, "feature/a")], false),
    )
    .await;
}

pub(crate) async fn kandev_pending_cleanup_becomes_berth_cleanup_jobs(app: TestApp) {
    // No worker: the jobs stay exactly as the import wrote them.
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, &[("BERTH_CLEANUP_WORKERS", "0")])
        .await
        .expect("the backend of the test is available");
    let w = World::new(&app);
    let (wt_a, wt_d, wt_f) = (
        w.worktree("arch", "feature/a"),
        w.worktree("gone", "feature/d"),
        w.worktree("gone2", "feature/f"),
    );
    let mut k = w.kandev(Gen::Normalized).await;
    archived_task(&w, &mut k, &wt_a).await;
    // Tasks kandev deleted (no row), whose cleanup it still owed or gave up on.
    k.job_with(
        "j-del",
        "t-deleted",
        "delete",
        "retry_wait",
        &snapshot(&[(&wt_d, "feature/d")], true),
    )
    .await;
    k.job_with(
        "j-fail",
        "t-deleted-2",
        "cascade_delete",
        "failed",
        &snapshot(&[(&wt_f, "feature/f")], false),
    )
    .await;
    // Owed nothing: finished, or its delete never committed (the task lives).
    k.job_with("j-done", "t-arch", "archive", "succeeded", "{}").await;
    k.task("t-live", "Live").await;
    k.job_with("j-prep", "t-live", "delete", "prepared", "{}").await;
    let db = k.finish().await;

    let run = import(&app, &db, "ws", &[], &[]).await;
    succeeded(&run);
    has(&run.report, "history", "cleanup_job_finished", "j-done");
    has(&run.report, "history", "cleanup_job_not_committed", "j-prep");
    assert_eq!(
        run.report["cleanup_jobs"].as_array().unwrap().len(),
        3,
        "{}",
        run.report
    );

    // The archived task's archive: pending, snapshotting its imported environment as a berth archive does.
    let t = task_of(&app, "t-arch").await;
    assert!(t.archived_at.is_some(), "the task is archived as kandev had it");
    let e = env_of(&app, "e1").await.unwrap();
    let entry = carried(&run.report, "j-arch");
    assert_eq!(
        (&entry["task_id"], &entry["trigger"], &entry["state"]),
        (&json!("t-arch"), &json!("archive"), &json!("pending"))
    );
    assert_eq!(entry["paths"], json!([wt_a.display().to_string()]));
    let j = berth_job(&app, &entry).await;
    assert_eq!(
        (j.trigger, j.state),
        (job::CleanupTrigger::Archive, job::CleanupJobState::Pending)
    );
    assert_eq!((j.task_id, j.task_environment_id), (t.id, Some(e.id)));
    assert!(j.next_attempt_at.is_some(), "due at once");
    let s = &j.resource_snapshot;
    assert_eq!(s["task_id"], json!(t.id));
    assert_eq!(s["environment"]["id"], json!(e.id));
    assert_eq!(paths_of(s), vec![wt_a.display().to_string()]);
    let repo = &s["environment"]["worktrees"][0];
    assert_eq!(
        (&repo["repository_path"], &repo["branch"], &repo["base_branch"]),
        (
            &json!(w.repo.display().to_string()),
            &json!("feature/a"),
            &json!("main")
        )
    );
    assert_eq!(s["sessions"], json!([session_of(&app, "s1").await.id]));
    assert_eq!(s["discard_worktree_changes"], false);

    // The deleted task's delete: pending, kandev's worktree and kandev's consent, no berth task.
    let entry = carried(&run.report, "j-del");
    assert_eq!(
        (&entry["trigger"], &entry["state"], &entry["discard_worktree_changes"]),
        (&json!("delete"), &json!("pending"), &json!(true))
    );
    let j = berth_job(&app, &entry).await;
    assert!(
        task::Entity::find_by_id(j.task_id)
            .one(app.db())
            .await
            .unwrap()
            .is_none(),
        "kandev deleted the task; berth has none"
    );
    assert_eq!(j.task_environment_id, None);
    assert_eq!(paths_of(&j.resource_snapshot), vec![wt_d.display().to_string()]);
    assert_eq!(j.resource_snapshot["discard_worktree_changes"], true);
    assert_eq!(
        j.resource_snapshot["environment"]["task_root"],
        json!(wt_d.parent().unwrap().display().to_string()),
        "kandev's task directory, removed once empty"
    );

    // What kandev gave up on: failed in berth too, with kandev's reason, for an operator to retry.
    let entry = carried(&run.report, "j-fail");
    let j = berth_job(&app, &entry).await;
    assert_eq!(
        (j.trigger, j.state),
        (job::CleanupTrigger::CascadeDelete, job::CleanupJobState::Failed)
    );
    assert!(j.last_error.as_deref().unwrap().contains("worktree is locked"), "{j:?}");
    let listed = app.get("/api/v1/cleanup-jobs?state=failed").await.ok(200);
    assert_eq!(listed["items"][0]["id"], json!(j.id), "{listed}");
    let retried = app
        .post(&format!("/api/v1/cleanup-jobs/{}/retry", j.id), json!({}))
        .await
        .ok(200);
    assert_eq!(retried["state"], "pending");

    // The worktrees are still on disk (the import touches nothing); a second import carries nothing twice.
    assert!(wt_a.is_dir() && wt_d.is_dir() && wt_f.is_dir());
    let again = import(&app, &db, "ws", &[], &[]).await;
    succeeded(&again);
    assert_eq!(again.report["already_imported"], true, "{}", again.report);
    assert_eq!(again.report["cleanup_jobs"], json!([]));
    assert_eq!(app.count("task_resource_cleanup_jobs").await, 3);
}

/// berth with its worktree root at kandev's task directories: adopted worktrees are inside it.
async fn wait_done(app: &TestApp, id: Uuid) -> job::Model {
    wait_until("the job to finish", Duration::from_secs(30), || async {
        let j = job::Entity::find_by_id(id).one(app.db()).await.unwrap().unwrap();
        let done = matches!(j.state, job::CleanupJobState::Succeeded | job::CleanupJobState::Failed);
        if done { Ok(j) } else { Err(format!("{:?}", j.state)) }
    })
    .await
}

// The worker does what kandev owed: the archived task's worktree goes, its inventory is retired, and the
// deleted task's worktree goes with its git registration.
pub(crate) async fn the_worker_does_the_cleanup_kandev_owed(app: TestApp) {
    let w = World::new(&app);
    let (wt_a, wt_d): (PathBuf, PathBuf) = (w.worktree("arch", "feature/a"), w.worktree("gone", "feature/d"));
    let mut k = w.kandev(Gen::Normalized).await;
    archived_task(&w, &mut k, &wt_a).await;
    k.job_with(
        "j-del",
        "t-deleted",
        "delete",
        "pending",
        &snapshot(&[(&wt_d, "feature/d")], false),
    )
    .await;
    let db = k.finish().await;
    let run = import(&app, &db, "ws", &[], &[]).await;
    succeeded(&run);
    for id in ["j-arch", "j-del"] {
        let j = wait_done(&app, (berth_job(&app, &carried(&run.report, id)).await.id).into()).await;
        assert_eq!(j.state, job::CleanupJobState::Succeeded, "{id}: {:?}", j.last_error);
    }
    let listed = worktrees_of(&w.repo);
    for wt in [&wt_a, &wt_d] {
        assert!(!wt.exists(), "{} is removed", wt.display());
        assert!(!listed.contains(&wt.display().to_string()), "{listed:?}");
    }
    let e = env_of(&app, "e1").await.unwrap();
    assert_eq!(e.status, env::EnvironmentStatus::Superseded);
    let active = env_repo::Entity::find()
        .filter(env_repo::Column::TaskEnvironmentId.eq(e.id))
        .filter(env_repo::Column::Status.eq(env_repo::EnvironmentRepoStatus::Active))
        .all(app.db())
        .await
        .unwrap();
    assert!(active.is_empty(), "{active:?}");
}

// An imported task lives like a native one. Its adopted worktrees (kandev's task directories, outside
// BERTH_WORKTREE_ROOT) are managed in the directory the import found them in: a delete refuses a dirty one
// (naming its environment) and removes it with consent, a reset removes a clean one and the next session
// materializes under the worktree root, an archive removes one. Registrations go with them; the source
// repository and kandev's other directories stay.
pub(crate) async fn an_imported_task_is_archived_deleted_and_reset_like_a_native_one(app: TestApp) {
    let w = World::new(&app);
    let wts: Vec<PathBuf> = ["del", "reset", "arch"]
        .iter()
        .map(|d| w.worktree(d, &format!("feature/{d}")))
        .collect();
    let mut k = w.kandev(Gen::Normalized).await;
    k.repo("r1", "proj", &w.repo).await;
    for (i, d) in ["del", "reset", "arch"].iter().enumerate() {
        k.task(&format!("t-{d}"), d).await;
        k.task_repo(&format!("t-{d}"), "r1").await;
        k.env(&format!("e-{d}"), &format!("t-{d}"), T2, None).await;
        k.env_repo(
            &format!("er-{d}"),
            &format!("e-{d}"),
            "r1",
            "",
            &format!("wt-{d}"),
            &wts[i],
            &format!("feature/{d}"),
            "active",
        )
        .await;
    }
    let db = k.finish().await;
    succeeded(&import(&app, &db, "ws", &[], &[]).await);
    let root = app.config.worktree_root.clone();
    assert!(
        wts.iter().all(|p| !p.starts_with(&root)),
        "adopted outside the worktree root"
    );
    let head = crate::helpers::git(&w.repo, &["rev-parse", "HEAD"]);

    // Delete: a dirty adopted worktree is named with its environment, then removed with consent.
    let t = task_of(&app, "t-del").await;
    std::fs::write(wts[0].join("wip.txt"), "uncommitted").unwrap();
    let p = app
        .delete(&format!("/api/v1/tasks/{}", t.id))
        .await
        .problem(409, "task_delete_dirty_worktree");
    let e = env_of(&app, "e-del").await.unwrap();
    assert_eq!(
        p["dirty_repositories"][0]["task_environment_id"],
        e.id.to_string(),
        "{p}"
    );
    assert!(wts[0].join("wip.txt").is_file());
    let r = app
        .delete(&format!("/api/v1/tasks/{}?discard_worktree_changes=true", t.id))
        .await
        .ok(202);
    let j = crate::helpers::wait_job_settled(&app, crate::helpers::uuid(&r["cleanup_jobs"][0]["id"])).await;
    assert_eq!(j["state"], "succeeded", "{j}");
    assert!(!wts[0].exists(), "removed with consent");

    // Reset: the clean adopted worktree goes; the next session materializes under the worktree root.
    let t = task_of(&app, "t-reset").await;
    let r = app
        .post(&format!("/api/v1/tasks/{}/environment/reset", t.id), json!({}))
        .await
        .ok(202);
    let j = crate::helpers::wait_job_settled(&app, crate::helpers::uuid(&r["cleanup_job"]["id"])).await;
    assert_eq!(j["state"], "succeeded", "{j}");
    assert!(!wts[1].exists(), "the reset removed the adopted worktree");
    let s = app.session(t.id.into(), "worktree").await;
    let fresh = PathBuf::from(s["workspace_path"].as_str().unwrap());
    assert!(fresh.starts_with(&root), "{}", fresh.display());
    assert!(fresh.join("README.md").is_file());

    // Archive: removed as a berth worktree is.
    let t = task_of(&app, "t-arch").await;
    let r = app
        .post(&format!("/api/v1/tasks/{}/archive", t.id), json!({}))
        .await
        .ok(202);
    let j = crate::helpers::wait_job_settled(&app, crate::helpers::uuid(&r["cleanup_jobs"][0]["id"])).await;
    assert_eq!(j["state"], "succeeded", "{j}");
    assert!(!wts[2].exists(), "the archive removed the adopted worktree");

    let listed = worktrees_of(&w.repo);
    for wt in &wts {
        assert!(
            !listed.contains(&wt.display().to_string()),
            "registration gone: {listed:?}"
        );
    }
    assert_eq!(
        crate::helpers::git(&w.repo, &["rev-parse", "HEAD"]),
        head,
        "the source is untouched"
    );
    assert_eq!(crate::helpers::git(&w.repo, &["status", "--porcelain"]), "");
    assert!(
        w.db_dir().exists() || w.backend != crate::helpers::Backend::Sqlite,
        "kandev's data stays"
    );
}
