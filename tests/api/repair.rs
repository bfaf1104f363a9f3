//! A reset repairs every `broken` category. git never runs in a directory admission refused; what sits
//! there is the user's: moved aside whole and listed (`GET /workspaces/{id}/leftovers`) without consent,
//! removed only with `discard_worktree_changes=true` (I11); the job never waits out a day of retries on
//! something that fails the same way each time; the next launch materializes a fresh worktree at the same
//! path (I13, I17). The user's source repository is never touched.
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{TestApp, git, git_repo, uuid, wait_job_settled, worktrees_of};

both_backends!(
    a_reset_repairs_every_broken_category,
    a_consented_reset_removes_what_replaced_the_worktree,
);

#[derive(Clone, Copy, Debug)]
enum Breakage {
    /// The worktree directory is gone.
    Missing,
    /// Its `.git` file is gone: a plain directory with the user's files.
    Unlinked,
    /// Another repository's clone sits in its place, with the user's files.
    Replaced,
    /// The user re-cloned the task's repository: the worktree's registration is gone with the old clone.
    Recloned,
}

impl Breakage {
    fn category(self) -> &'static str {
        match self {
            Breakage::Missing => "workspace_missing",
            Breakage::Unlinked => "not_a_git_worktree",
            Breakage::Replaced => "repository_mismatch",
            Breakage::Recloned => "not_a_git_worktree",
        }
    }
}

struct Broken {
    task: Uuid,
    session: Uuid,
    env: Uuid,
    worktree: PathBuf,
    source: PathBuf,
}

/// A task whose worktree environment a launch found broken in the given way, the user's `notes.txt` in
/// the broken directory (when there is one).
async fn broken(app: &TestApp, ws: Uuid, name: &str, how: Breakage) -> Broken {
    let (repo, source) = app.repository(ws, name).await;
    let task = app.task(ws, name, &[repo]).await;
    let s = app.unstarted_agent(task, "worktree", "test").await;
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    match how {
        Breakage::Missing => std::fs::remove_dir_all(&worktree).unwrap(),
        Breakage::Unlinked => std::fs::remove_file(worktree.join(".git")).unwrap(),
        Breakage::Replaced => {
            std::fs::remove_dir_all(&worktree).unwrap();
            let other = git_repo(&app.scratch.path().join(format!("{name}-other")), "main");
            git(
                app.scratch.path(),
                &["clone", "-q", other.to_str().unwrap(), worktree.to_str().unwrap()],
            );
        }
        Breakage::Recloned => {
            let upstream = app.scratch.path().join(format!("{name}-upstream"));
            git(
                app.scratch.path(),
                &[
                    "clone",
                    "-q",
                    "--bare",
                    source.to_str().unwrap(),
                    upstream.to_str().unwrap(),
                ],
            );
            std::fs::remove_dir_all(&source).unwrap();
            git(
                app.scratch.path(),
                &["clone", "-q", upstream.to_str().unwrap(), source.to_str().unwrap()],
            );
        }
    }
    if !matches!(how, Breakage::Missing) {
        std::fs::write(worktree.join("notes.txt"), format!("{name}: mine")).unwrap();
    }
    let sid = uuid(&s["id"]);
    let p = app
        .post(&format!("/api/v1/sessions/{sid}/launch"), json!({}))
        .await
        .problem(409, "workspace_reuse_unsafe");
    assert_eq!(p["category"], how.category(), "{how:?}");
    let env = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(env["status"], "broken");
    Broken {
        task,
        session: sid,
        env: uuid(&env["id"]),
        worktree,
        source,
    }
}

fn source_state(source: &Path) -> (String, String, Vec<String>) {
    (
        git(source, &["status", "--porcelain"]),
        git(source, &["rev-parse", "HEAD"]),
        std::fs::read_dir(source)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
    )
}

async fn leftovers(app: &TestApp, ws: Uuid) -> Vec<Value> {
    app.get(&format!("/api/v1/workspaces/{ws}/leftovers")).await.ok(200)["items"]
        .as_array()
        .unwrap()
        .clone()
}

/// The reset's job finished in one attempt, and the old session launches in a fresh, ready environment
/// whose worktree is a real worktree of the task's repository at the same path.
async fn reset_and_relaunch(app: &TestApp, b: &Broken, query: &str) -> Value {
    let r = app
        .post(&format!("/api/v1/tasks/{}/environment/reset{query}", b.task), json!({}))
        .await
        .ok(202);
    let job = wait_job_settled(app, uuid(&r["cleanup_job"]["id"])).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempts"], 1, "no retries: {job}");
    let relaunched = app
        .post(&format!("/api/v1/sessions/{}/launch", b.session), json!({}))
        .await
        .ok(200);
    let fresh = app.get(&format!("/api/v1/tasks/{}/environment", b.task)).await.ok(200);
    assert_ne!(fresh["id"], b.env.to_string());
    assert_eq!(fresh["status"], "ready", "{fresh}");
    assert_eq!(relaunched["task_environment_id"], fresh["id"]);
    assert_eq!(relaunched["workspace_path"], b.worktree.display().to_string());
    let common = git(
        &b.worktree,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    );
    assert_eq!(
        PathBuf::from(common.trim()),
        b.source.join(".git"),
        "a worktree of the task's repository again"
    );
    assert!(!b.worktree.join("notes.txt").exists(), "fresh, not the old directory");
    assert_eq!(
        worktrees_of(&b.source)
            .iter()
            .filter(|w| **w == b.worktree.display().to_string())
            .count(),
        1,
        "one registration at the path: the old one was forgotten"
    );
    app.post(&format!("/api/v1/sessions/{}/stop", b.session), json!({}))
        .await
        .ok(200);
    fresh
}

// Without consent: the reset answers 202 (never the 503 of a git status run in the broken directory),
// moves what sat there aside whole, lists it, and the session works again; disposing of it needs
// consent.
async fn a_reset_repairs_every_broken_category(app: TestApp) {
    let ws = app.workspace("ws").await;
    let mut expected = Vec::new();
    for (name, how) in [
        ("gone", Breakage::Missing),
        ("unlinked", Breakage::Unlinked),
        ("replaced", Breakage::Replaced),
        ("recloned", Breakage::Recloned),
    ] {
        let b = broken(&app, ws, name, how).await;
        let before = source_state(&b.source);
        reset_and_relaunch(&app, &b, "").await;
        assert_eq!(
            source_state(&b.source),
            before,
            "{how:?}: the source repository is untouched"
        );
        if !matches!(how, Breakage::Missing) {
            expected.push((b.task, b.worktree.clone(), format!("{name}: mine")));
        }
    }

    let items = leftovers(&app, ws).await;
    assert_eq!(items.len(), expected.len(), "{items:?}");
    for (item, (task, worktree, notes)) in items.iter().zip(&expected) {
        assert_eq!(item["reason"], "set_aside", "{item}");
        assert_eq!(item["task_id"], task.to_string());
        assert_eq!(item["original_path"], worktree.display().to_string());
        let kept = PathBuf::from(item["path"].as_str().unwrap());
        assert_ne!(&kept, worktree);
        assert_eq!(
            std::fs::read_to_string(kept.join("notes.txt")).unwrap(),
            *notes,
            "the user's file is never lost without consent"
        );
    }
    // The replaced directory was moved whole, its own repository with it.
    let replaced = PathBuf::from(items[1]["path"].as_str().unwrap());
    assert!(replaced.join(".git").is_dir(), "the clone is intact");
    git(&replaced, &["status", "--porcelain"]);

    // Disposing of one: consent required, then it is gone and leaves the list.
    let dispose = format!("/api/v1/workspaces/{ws}/leftovers/{}", items[0]["id"].as_str().unwrap());
    app.delete(&dispose).await.problem(422, "validation_failed");
    let first = PathBuf::from(items[0]["path"].as_str().unwrap());
    assert!(first.join("notes.txt").is_file(), "no consent: nothing changed");
    let reader = app.token("tasks:read");
    app.call(
        reqwest::Method::DELETE,
        &format!("{dispose}?discard_worktree_changes=true"),
        Some(&reader),
        None,
    )
    .await
    .problem(403, "insufficient_scope");
    app.delete(&format!("{dispose}?discard_worktree_changes=true"))
        .await
        .ok(204);
    assert!(!first.exists(), "disposed of");
    assert_eq!(leftovers(&app, ws).await.len(), 2);
    // A directory someone removed by hand leaves the list by itself.
    std::fs::remove_dir_all(&replaced).unwrap();
    let left = leftovers(&app, ws).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["id"], items[2]["id"]);
}

// With consent the broken directory is removed (not moved aside, nothing listed), and only it.
async fn a_consented_reset_removes_what_replaced_the_worktree(app: TestApp) {
    let ws = app.workspace("ws").await;
    for (name, how) in [("unlinked", Breakage::Unlinked), ("replaced", Breakage::Replaced)] {
        let b = broken(&app, ws, name, how).await;
        let before = source_state(&b.source);
        reset_and_relaunch(&app, &b, "?discard_worktree_changes=true").await;
        assert_eq!(
            source_state(&b.source),
            before,
            "{how:?}: the source repository is untouched"
        );
    }
    assert_eq!(leftovers(&app, ws).await, Vec::<Value>::new());
    let other = app.scratch.path().join("replaced-other");
    assert!(
        other.join("README.md").is_file(),
        "the repository the clone came from is untouched"
    );
}
