//! Admission of a workspace before an agent starts: a broken one is refused and nothing changes, and a
//! successful launch heals a wrong recorded workspace path.
use std::path::{Path, PathBuf};

use serde_json::json;

use super::{uuid, wait_reply};
use crate::both_backends;
use crate::helpers::{TestApp, git, git_repo, worktrees_of};

both_backends!(
    admission_refuses_a_broken_workspace_and_changes_nothing,
    a_successful_resume_heals_a_wrong_workspace_path,
);

/// What admission must never change: git state, files and registrations of the source and the worktree.
fn fingerprint(source: &Path, worktree: &Path) -> (Vec<String>, String, String, Vec<String>) {
    let mut listing: Vec<String> = walk(worktree).into_iter().map(|p| p.display().to_string()).collect();
    listing.sort();
    (
        worktrees_of(source),
        git(source, &["status", "--porcelain"]),
        git(source, &["rev-parse", "HEAD"]),
        listing,
    )
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries {
        let p = e.unwrap().path();
        if p.file_name().is_some_and(|n| n == ".git") {
            out.push(p);
            continue;
        }
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

// I15, I16: a missing directory, a plain directory, a worktree of another repository: refused with the
// category, before any process exists; git state, files and inventory are unchanged.
async fn admission_refuses_a_broken_workspace_and_changes_nothing(app: TestApp) {
    let f = app.task_with_repo("Broken").await;
    let (source, task) = (f.repo_dir.clone(), f.task);
    let other = git_repo(&app.scratch.path().join("other"), "main");
    let s = f.unstarted_agent("worktree", "test").await;
    let id = uuid(&s["id"]);
    let worktree = PathBuf::from(s["workspace_path"].as_str().unwrap());
    let env_before = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    let moved = worktree.with_file_name("svc-moved-away");

    type Step<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Step, Step)> = vec![
        (
            "workspace_missing",
            Box::new(|| std::fs::rename(&worktree, &moved).unwrap()),
            Box::new(|| std::fs::rename(&moved, &worktree).unwrap()),
        ),
        (
            "not_a_git_worktree",
            Box::new(|| {
                std::fs::rename(&worktree, &moved).unwrap();
                std::fs::create_dir_all(&worktree).unwrap();
                std::fs::write(worktree.join("plain.txt"), "plain").unwrap();
            }),
            Box::new(|| {
                std::fs::remove_dir_all(&worktree).unwrap();
                std::fs::rename(&moved, &worktree).unwrap();
            }),
        ),
        (
            "repository_mismatch",
            Box::new(|| {
                std::fs::rename(&worktree, &moved).unwrap();
                git(
                    &other,
                    &["worktree", "add", "-q", "-b", "elsewhere", worktree.to_str().unwrap()],
                );
            }),
            Box::new(|| {
                git(&other, &["worktree", "remove", worktree.to_str().unwrap()]);
                std::fs::rename(&moved, &worktree).unwrap();
            }),
        ),
    ];
    for (category, break_it, mend_it) in cases {
        break_it();
        let before = fingerprint(&source, &worktree);
        let other_before = worktrees_of(&other);
        let r = app.post(&format!("/api/v1/sessions/{id}/resume"), json!({})).await;
        let p = r.problem(409, "workspace_reuse_unsafe");
        assert_eq!(p["category"], category);
        assert_eq!(p["retryable"], true);
        assert_eq!(p["action"], "reset_environment");
        for secret in [
            worktree.display().to_string(),
            source.display().to_string(),
            "berth/".to_string(),
            "s3cret".to_string(),
        ] {
            assert!(
                !r.text.contains(&secret),
                "{category}: the body leaks {secret}: {}",
                r.text
            );
        }
        assert_eq!(
            fingerprint(&source, &worktree),
            before,
            "{category}: nothing changed on disk or in git"
        );
        assert_eq!(worktrees_of(&other), other_before);
        // The refusal marks the environment broken, and changes nothing else of it.
        let env_now = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
        assert_eq!(env_now["repos"], env_before["repos"], "{category}: inventory unchanged");
        assert_eq!(env_now["id"], env_before["id"]);
        assert_eq!(env_now["status"], "broken");
        assert_eq!(env_now["broken_category"], category);
        assert_eq!(
            app.count("agent_executions").await,
            0,
            "{category}: no process was started"
        );
        let failed = app.get(&format!("/api/v1/sessions/{id}")).await.ok(200);
        assert_eq!(failed["state"], "failed");
        assert_eq!(failed["last_error"]["code"], "workspace_reuse_unsafe");
        mend_it();
    }
    // Mended, the same session resumes in its worktree: admission proved it again, so it is ready again.
    app.post(&format!("/api/v1/sessions/{id}/resume"), json!({"prompt": "pwd"}))
        .await
        .ok(200);
    assert_eq!(wait_reply(&app, id, 1).await[0], worktree.display().to_string());
    let env_now = app.get(&format!("/api/v1/tasks/{task}/environment")).await.ok(200);
    assert_eq!(env_now["status"], "ready");
    assert!(env_now["broken_category"].is_null());
    assert_eq!(env_now["repos"], env_before["repos"]);
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}

// I19: a launch writes the effective workspace back, healing a wrong value written earlier.
async fn a_successful_resume_heals_a_wrong_workspace_path(app: TestApp) {
    use berth::entity::task_environment as env;
    use sea_orm::{ActiveValue::Set, EntityTrait};
    let f = app.task_with_repo("Heal").await;
    let source = f.repo_dir.clone();
    let s = f.unstarted_agent("worktree", "test").await;
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    let env_id = uuid(&s["task_environment_id"]);
    // The old fallback order's mistake: the source repository recorded as the workspace.
    env::Entity::update(env::ActiveModel {
        id: Set(env_id.into()),
        workspace_path: Set(Some(source.display().to_string())),
        ..Default::default()
    })
    .exec(app.db())
    .await
    .unwrap();
    let id = uuid(&s["id"]);
    let launched = app
        .post(&format!("/api/v1/sessions/{id}/launch"), json!({"prompt": "pwd"}))
        .await
        .ok(200);
    assert_eq!(
        launched["workspace_path"],
        worktree.as_str(),
        "the session projects the healed path"
    );
    assert_eq!(
        wait_reply(&app, id, 1).await[0],
        worktree,
        "the agent ran in the worktree, not the source"
    );
    assert_eq!(
        app.get(&format!("/api/v1/environments/{env_id}")).await.ok(200)["workspace_path"],
        worktree.as_str()
    );
    app.post(&format!("/api/v1/sessions/{id}/stop"), json!({}))
        .await
        .ok(200);
}
