//! Every environment a task ever had is cleaned by the task's lifecycle (I9–I13): an executor transition
//! leaves the old worktree environment superseded with its worktree on disk; archive and delete remove
//! it with the current one, a dirty one is kept and reported unless consented to, and for a task that
//! lives on the reconcile pass removes it through a `superseded_cleanup` job. Nothing the inventory does
//! not name is touched: the source repository the local environment works in, and a worktree a later
//! environment adopted.
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{Backend, TestApp, git, seen, uuid, wait_job_settled, wait_until, worktrees_of};

both_backends!(
    archive_removes_what_a_superseded_environment_left,
    a_delete_names_dirty_work_of_every_environment,
    a_transitions_own_directory_goes_with_its_environment,
);

const WAIT: Duration = Duration::from_secs(60);

/// What the source repository looks like to its user.
fn source_state(source: &Path) -> (String, String, String) {
    (
        git(source, &["status", "--porcelain"]),
        git(source, &["rev-parse", "HEAD"]),
        git(source, &["for-each-ref", "--format=%(refname)", "refs/heads/main"]),
    )
}

struct Leftover {
    task: Uuid,
    source: PathBuf,
    /// The superseded environment's worktree, still on disk.
    worktree: PathBuf,
    /// Its branch (berth created it).
    branch: String,
    old_env: Uuid,
}

/// A task whose worktree environment an executor transition (a `local` launch) superseded: its worktree
/// is left on disk, recorded by the superseded environment's inventory, and no agent runs.
async fn leftover(app: &TestApp, ws: Uuid, name: &str) -> Leftover {
    let (repo, source) = app.repository(ws, name).await;
    let task = app.task(ws, name, &[repo]).await;
    let s = app.session(task, "worktree").await;
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    let old_env = uuid(&s["task_environment_id"]);
    let local = app
        .post(
            &format!("/api/v1/tasks/{task}/sessions"),
            json!({"executor_type": "local", "agent_profile": "test"}),
        )
        .await
        .ok(201);
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(env["executor_type"], "local", "the launch made the transition");
    app.post(&format!("/api/v1/sessions/{}/stop", uuid(&local["id"])), json!({}))
        .await
        .ok(200);
    let old = app.get(&format!("/api/v1/environments/{old_env}")).await.ok(200);
    assert_eq!(old["status"], "superseded");
    assert_eq!(
        old["repos"][0]["status"], "active",
        "its inventory still names the worktree"
    );
    assert!(worktree.is_dir(), "the transition leaves the old worktree on disk");
    let branch = old["repos"][0]["worktree_branch"].as_str().unwrap().to_string();
    Leftover {
        task,
        source,
        worktree,
        branch,
        old_env,
    }
}

// I9, I13: archiving a task removes its superseded environment's worktree (and only its registration),
// retires that inventory, and leaves the source repository the current local environment works in as
// it was.
async fn archive_removes_what_a_superseded_environment_left(app: TestApp) {
    let ws = app.workspace("ws").await;
    let l = leftover(&app, ws, "svc").await;
    let before = source_state(&l.source);
    let r = app
        .post(&format!("/api/v1/tasks/{}/archive", l.task), json!({}))
        .await
        .ok(202);
    let job = wait_job_settled(&app, uuid(&r["cleanup_jobs"][0]["id"])).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["resource_snapshot"]["superseded"][0]["id"], l.old_env.to_string());
    assert!(!l.worktree.exists(), "the superseded worktree is removed");
    assert!(
        !worktrees_of(&l.source).contains(&l.worktree.display().to_string()),
        "and its registration"
    );
    let old = app.get(&format!("/api/v1/environments/{}", l.old_env)).await.ok(200);
    assert_eq!(old["repos"][0]["status"], "deleted", "{old}");
    assert_eq!(source_state(&l.source), before, "the source repository is untouched");
    assert!(l.source.join("README.md").is_file());
}

// I11: a superseded worktree holding changes is never destroyed without consent, and never left without
// an owner either: a delete checks every environment it would remove, answers 409 naming the environment
// the dirty worktree belongs to, and changes nothing; the same delete with
// `discard_worktree_changes=true` removes it.
async fn a_delete_names_dirty_work_of_every_environment(app: TestApp) {
    let ws = app.workspace("ws").await;
    let kept = leftover(&app, ws, "kept").await;
    std::fs::write(kept.worktree.join("notes.txt"), "work in progress").unwrap();
    let p = app
        .delete(&format!("/api/v1/tasks/{}", kept.task))
        .await
        .problem(409, "task_delete_dirty_worktree");
    assert_eq!(
        p["dirty_repositories"][0]["task_environment_id"],
        kept.old_env.to_string(),
        "{p}"
    );
    assert_eq!(p["dirty_repositories"][0]["dirty_file_count"], 1, "{p}");
    app.get(&format!("/api/v1/tasks/{}", kept.task)).await.ok(200);
    assert_eq!(
        std::fs::read_to_string(kept.worktree.join("notes.txt")).unwrap(),
        "work in progress",
        "the uncommitted work is still there"
    );
    assert!(crate::helpers::branch_exists(&kept.source, &kept.branch));

    let consented = leftover(&app, ws, "consented").await;
    std::fs::write(consented.worktree.join("notes.txt"), "scratch").unwrap();
    let before = source_state(&consented.source);
    let r = app
        .delete(&format!(
            "/api/v1/tasks/{}?discard_worktree_changes=true",
            consented.task
        ))
        .await
        .ok(202);
    let job = wait_job_settled(&app, uuid(&r["cleanup_jobs"][0]["id"])).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(job["last_error"].is_null(), "{job}");
    assert!(!consented.worktree.exists(), "consented: removed");
    // The branch policy applies to a superseded worktree's branch too: berth made it, it is merged.
    assert_eq!(job["resource_snapshot"]["branches"][0]["action"], "delete", "{job}");
    assert!(!crate::helpers::branch_exists(&consented.source, &consented.branch));
    assert_eq!(
        source_state(&consented.source),
        before,
        "the source repository is untouched"
    );
}

async fn superseded_jobs(app: &TestApp, task: Uuid) -> Vec<Value> {
    app.get(&format!(
        "/api/v1/cleanup-jobs?task_id={task}&trigger=superseded_cleanup"
    ))
    .await
    .ok(200)["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// A `superseded_cleanup` job of the task, once the reconcile pass wrote one and it finished.
async fn reconciled(app: &TestApp, task: Uuid) -> Value {
    let jobs = wait_until("the reconcile pass", WAIT, || async {
        let jobs = superseded_jobs(app, task).await;
        seen(!jobs.is_empty(), jobs)
    })
    .await;
    wait_job_settled(app, uuid(&jobs[0]["id"])).await
}

// For a task that lives on, the reconcile pass (a short grace, a fast sweep) removes what its superseded
// environment left, by itself (no actor), keeps a dirty one and reports it, and the task keeps working in
// its current environment afterwards. The grace is what lets the test look at a leftover (and dirty one)
// before the pass does: with none, a pass could win that race.
async fn the_reconcile_pass_heals_leaks_of_a_task_that_lives_on(backend: Backend) {
    let Some(app) = TestApp::spawn_with(
        backend,
        &[("BERTH_SUPERSEDED_GRACE_SECS", "3"), ("BERTH_SWEEP_INTERVAL_MS", "100")],
    )
    .await
    else {
        return;
    };
    let ws = app.workspace("ws").await;
    let clean = leftover(&app, ws, "clean").await;
    let dirty = leftover(&app, ws, "dirty").await;
    std::fs::write(dirty.worktree.join("notes.txt"), "uncommitted").unwrap();
    // A checkpoint of each superseded environment, kept alive by berth's ref (as a turn leaves one).
    let checkpoint_ref = |l: &Leftover| format!("refs/berth/checkpoints/{}/c-0", l.old_env);
    let refs_of = |l: &Leftover| {
        git(
            &l.source,
            &[
                "for-each-ref",
                "--format=%(refname)",
                &format!("refs/berth/checkpoints/{}/", l.old_env),
            ],
        )
    };
    for l in [&clean, &dirty] {
        git(&l.source, &["update-ref", &checkpoint_ref(l), "HEAD"]);
    }
    let before = source_state(&clean.source);

    let job = reconciled(&app, clean.task).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["trigger"], "superseded_cleanup");
    assert_eq!(job["task_environment_id"], clean.old_env.to_string());
    assert!(job["actor"].is_null(), "berth did it on its own: {job}");
    assert!(!clean.worktree.exists(), "the leak healed");
    assert_eq!(
        source_state(&clean.source),
        before,
        "the source repository is untouched"
    );
    let task = app.get(&format!("/api/v1/tasks/{}", clean.task)).await.ok(200);
    assert!(task["archived_at"].is_null(), "the task lives on");

    let job = reconciled(&app, dirty.task).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        job["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("kept the worktree"),
        "reported: {job}"
    );
    assert!(
        dirty.worktree.join("notes.txt").is_file(),
        "never destroyed without consent"
    );
    // I36: the kept worktree keeps its environment's checkpoints (its restore points); the removed one's
    // went with it.
    assert!(
        refs_of(&dirty).contains(&checkpoint_ref(&dirty)),
        "kept with the worktree"
    );
    assert!(refs_of(&clean).trim().is_empty(), "gone with the worktree");
    // It is listed too, with a way to dispose of it (consent required).
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/leftovers")).await.ok(200);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["reason"], "dirty_worktree");
    assert_eq!(items[0]["path"], dirty.worktree.display().to_string());
    assert_eq!(items[0]["task_id"], dirty.task.to_string());
    assert_eq!(items[0]["task_environment_id"], dirty.old_env.to_string());
    let dispose = format!("/api/v1/workspaces/{ws}/leftovers/{}", items[0]["id"].as_str().unwrap());
    app.delete(&dispose).await.problem(422, "validation_failed");
    assert!(
        dirty.worktree.join("notes.txt").is_file(),
        "no consent, nothing changed"
    );
    // Passes ran since (a later leftover was reconciled, and each pass looks at the oldest first): the
    // kept worktree was reported once, not once per pass.
    let later = leftover(&app, ws, "later").await;
    assert_eq!(reconciled(&app, later.task).await["state"], "succeeded");
    assert_eq!(
        superseded_jobs(&app, dirty.task).await.len(),
        1,
        "one job per environment"
    );

    // Disposed of with consent: the worktree goes with its registration (only that one), the
    // environment's inventory row with it, the branch stays, the list is empty.
    let before = source_state(&dirty.source);
    app.delete(&format!("{dispose}?discard_worktree_changes=true"))
        .await
        .ok(204);
    assert!(!dirty.worktree.exists(), "disposed of");
    assert!(refs_of(&dirty).trim().is_empty(), "its checkpoints went with it");
    assert!(!worktrees_of(&dirty.source).contains(&dirty.worktree.display().to_string()));
    assert!(crate::helpers::branch_exists(&dirty.source, &dirty.branch));
    assert_eq!(
        source_state(&dirty.source),
        before,
        "the source repository is untouched"
    );
    let old = app
        .get(&format!("/api/v1/environments/{}", dirty.old_env))
        .await
        .ok(200);
    assert_eq!(old["repos"][0]["status"], "deleted", "{old}");
    let listed = app.get(&format!("/api/v1/workspaces/{ws}/leftovers")).await.ok(200);
    assert_eq!(listed["items"], json!([]), "{listed}");
    app.delete(&format!("{dispose}?discard_worktree_changes=true"))
        .await
        .problem(404, "not_found");

    // The task still works: a new session in its current (local) environment.
    let s = app
        .post(
            &format!("/api/v1/tasks/{}/sessions", clean.task),
            json!({"executor_type": "local", "start": false}),
        )
        .await
        .ok(201);
    assert_eq!(s["workspace_path"], clean.source.display().to_string());
}

// A superseded environment's background cleanup never blocks a user. Leftovers are made with no worker;
// then a process whose one worker writes both tasks' `superseded_cleanup` jobs in one pass, claims one and
// hangs in it (a failpoint: a slow removal). Both tasks take new sessions meanwhile (this was
// `409 task_cleanup_in_progress`); an archive takes over the job still waiting (cancelled, its environment
// in the archive's snapshot) and waits only for the one a worker holds (409, retry later).
async fn background_cleanup_never_blocks_a_user(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, &[("BERTH_CLEANUP_WORKERS", "0")]).await else {
        return;
    };
    let ws = app.workspace("ws").await;
    let first = leftover(&app, ws, "first").await;
    let second = leftover(&app, ws, "second").await;
    let mut config = app.config.clone();
    config.cleanup_workers = 1;
    config.cleanup_failpoint = Some("hang_after_claim".into());
    config.superseded_grace = Duration::ZERO;
    config.sweep_interval = Duration::from_millis(100);
    let worker = berth::startup::Application::build(config).await.unwrap();
    let (held, waiting) = wait_until("a running and a waiting job", WAIT, || async {
        let a = superseded_jobs(&app, first.task).await;
        let b = superseded_jobs(&app, second.task).await;
        if let ([a], [b]) = (&a[..], &b[..]) {
            match (a["state"].as_str(), b["state"].as_str()) {
                (Some("running"), Some("pending")) => return Ok(((&first, a.clone()), (&second, b.clone()))),
                (Some("pending"), Some("running")) => return Ok(((&second, b.clone()), (&first, a.clone()))),
                _ => {}
            }
        }
        Err(format!("{a:?} {b:?}"))
    })
    .await;
    for l in [held.0, waiting.0] {
        app.post(
            &format!("/api/v1/tasks/{}/sessions", l.task),
            json!({"executor_type": "local", "start": false}),
        )
        .await
        .ok(201);
    }
    let r = app
        .post(&format!("/api/v1/tasks/{}/archive", waiting.0.task), json!({}))
        .await
        .ok(202);
    let archive = app
        .get(&format!(
            "/api/v1/cleanup-jobs/{}",
            r["cleanup_jobs"][0]["id"].as_str().unwrap()
        ))
        .await
        .ok(200);
    assert_eq!(
        archive["resource_snapshot"]["superseded"][0]["id"],
        waiting.0.old_env.to_string(),
        "the archive covers the superseded environment: {archive}"
    );
    let taken = app
        .get(&format!("/api/v1/cleanup-jobs/{}", waiting.1["id"].as_str().unwrap()))
        .await
        .ok(200);
    assert_eq!(taken["state"], "cancelled", "taken over by the archive: {taken}");
    app.post(&format!("/api/v1/tasks/{}/archive", held.0.task), json!({}))
        .await
        .problem(409, "task_cleanup_in_progress");
    worker.background().iter().for_each(|h| h.abort());
}

crate::backend_tests!(background_cleanup_never_blocks_a_user: background_cleanup_never_blocks_a_user_sqlite, background_cleanup_never_blocks_a_user_postgres);

crate::backend_tests!(the_reconcile_pass_heals_leaks_of_a_task_that_lives_on: the_reconcile_pass_heals_leaks_sqlite, the_reconcile_pass_heals_leaks_postgres);

// I18, I13: a transition's environment lives in a directory of its own (`<slug>-<suffix>`). Once a job
// removed its worktrees, that directory goes too (only ever if empty), whether the environment was still
// current (an archive) or superseded by a transition back to `local` (a delete); the source repository
// is untouched.
async fn a_transitions_own_directory_goes_with_its_environment(app: TestApp) {
    let ws = app.workspace("ws").await;
    for (name, superseded) in [("current", false), ("superseded", true)] {
        let (repo, source) = app.repository(ws, name).await;
        let task = app.task(ws, name, &[repo]).await;
        app.session(task, "local").await;
        let launch = |executor: &str| json!({"executor_type": executor, "agent_profile": "test"});
        let s = app
            .post(&format!("/api/v1/tasks/{task}/sessions"), launch("worktree"))
            .await
            .ok(201);
        let env_id = uuid(&s["task_environment_id"]);
        let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
        let own = worktree.parent().unwrap().to_path_buf();
        let hex = env_id.simple().to_string();
        assert!(
            own.file_name()
                .unwrap()
                .to_string_lossy()
                .ends_with(&format!("-{}", &hex[hex.len() - 8..])),
            "{name}: the transition made its environment in a directory of its own: {}",
            own.display()
        );
        app.post(&format!("/api/v1/sessions/{}/stop", uuid(&s["id"])), json!({}))
            .await
            .ok(200);
        let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
        assert_eq!(env["id"], env_id.to_string(), "{name}: promoted");
        if superseded {
            let back = app
                .post(&format!("/api/v1/tasks/{task}/sessions"), launch("local"))
                .await
                .ok(201);
            app.post(&format!("/api/v1/sessions/{}/stop", uuid(&back["id"])), json!({}))
                .await
                .ok(200);
            let old = app.get(&format!("/api/v1/environments/{env_id}")).await.ok(200);
            assert_eq!(old["status"], "superseded", "{old}");
        }
        let before = source_state(&source);
        let r = if superseded {
            app.delete(&format!("/api/v1/tasks/{task}")).await.ok(202)
        } else {
            app.post(&format!("/api/v1/tasks/{task}/archive"), json!({}))
                .await
                .ok(202)
        };
        let job = wait_job_settled(&app, uuid(&r["cleanup_jobs"][0]["id"])).await;
        assert_eq!(job["state"], "succeeded", "{name}: {job}");
        assert!(!worktree.exists(), "{name}: the worktree is removed");
        assert!(
            !own.exists(),
            "{name}: and the directory it was made in: {}",
            own.display()
        );
        assert!(own.parent().unwrap().is_dir(), "{name}: the worktree root stays");
        assert_eq!(
            source_state(&source),
            before,
            "{name}: the source repository is untouched"
        );
    }
}
