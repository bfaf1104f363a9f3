//! Inherit chains stay whole and a reset needs consent and is resumed after: deleting or archiving a link or
//! an owner never leaves a task pointing at nothing (I8), `unarchive` refuses before anything changes (I10),
//! a dirty reset is refused without consent (I11), and old sessions resume in a fresh environment through the
//! normal election (I14).
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::both_backends;
use crate::helpers::{self, SETTLED, TestApp, uuid, worktrees_of};

both_backends!(
    deleting_a_middle_link_keeps_the_chain_whole,
    deleting_an_owner_whose_inheritors_are_archived_cleans_it_as_one_unit,
    archive_hands_the_environment_to_the_nearest_live_inheritor,
    archive_then_unarchive_across_a_chain_and_resume,
    a_dirty_reset_is_refused_then_consented_and_resumed,
    a_subtask_archived_while_its_owners_environment_is_made_gets_no_session,
);

const WAIT: Duration = Duration::from_secs(30);

async fn wait_job(app: &TestApp, id: Uuid) -> Value {
    helpers::wait_job(app, id, WAIT, SETTLED).await
}

async fn wait_jobs(app: &TestApp, reply: &Value) {
    for j in reply["cleanup_jobs"].as_array().unwrap() {
        assert_eq!(wait_job(app, uuid(&j["id"])).await["state"], "succeeded");
    }
}

/// The environment lookup of a task: `Some` environment, or `None` when the task resolves to an owner
/// that has none right now (`404 not_found` for the environment). Never a chain that leads nowhere.
async fn environment_of(app: &TestApp, task: Uuid) -> Option<Value> {
    let r = app.get(&format!("/api/v1/tasks/{task}/environment")).await;
    match r.status.as_u16() {
        200 => Some(r.json()),
        404 => {
            let p = r.problem(404, "not_found");
            assert_eq!(
                p["detail"], "environment not found",
                "a dangling lookup for {task}: {p}"
            );
            None
        }
        other => panic!("environment lookup of {task} answered {other}: {}", r.text),
    }
}

async fn task(app: &TestApp, id: Uuid) -> Value {
    app.get(&format!("/api/v1/tasks/{id}")).await.ok(200)
}

async fn agent_session(app: &TestApp, task: Uuid) -> Value {
    app.post(
        &format!("/api/v1/tasks/{task}/sessions"),
        json!({"executor_type": "worktree", "agent_profile": "test"}),
    )
    .await
    .ok(201)
}

// I8: deleting the middle inherit_parent task of a three-level chain splices it out: the leaf inherits
// through the owner, and its lookups and sessions keep working in the same environment.
async fn deleting_a_middle_link_keeps_the_chain_whole(app: TestApp) {
    let f = app.task_with_repo("Owner").await;
    let (ws, owner) = (f.workspace, f.task);
    let middle = app.subtask(ws, owner, "Middle").await;
    let leaf = app.subtask(ws, middle, "Leaf").await;
    let s = app.session(leaf, "worktree").await;
    let r = app.delete(&format!("/api/v1/tasks/{middle}")).await.ok(202);
    wait_jobs(&app, &r).await;

    let leaf_task = task(&app, leaf).await;
    assert_eq!(leaf_task["parent_task_id"], owner.to_string());
    assert_eq!(leaf_task["workspace_mode"], "inherit_parent");
    for t in [owner, leaf] {
        let env = environment_of(&app, t).await.expect("the chain's environment");
        assert_eq!(env["id"], s["task_environment_id"]);
        assert_eq!(env["task_id"], owner.to_string());
    }
    let again = app.session(leaf, "worktree").await;
    assert_eq!(again["workspace_path"], s["workspace_path"]);
    assert!(Path::new(s["workspace_path"].as_str().unwrap()).is_dir());
}

// I8, I10: an owner whose only inheritors are archived is deleted with its environment (one job cleans
// it); the archived chain is re-rooted at its nearest link, so every lookup is typed, unarchive of a
// deeper link is refused while that link is archived (nothing changes), and the chain comes back.
async fn deleting_an_owner_whose_inheritors_are_archived_cleans_it_as_one_unit(app: TestApp) {
    let f = app.task_with_repo("Owner").await;
    let (ws, source, owner) = (f.workspace, f.repo_dir.clone(), f.task);
    let a = app.subtask(ws, owner, "A").await;
    let b = app.subtask(ws, a, "B").await;
    let s = app.session(b, "worktree").await;
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    let r = app
        .post(&format!("/api/v1/tasks/{a}/archive?cascade=true"), json!({}))
        .await
        .ok(202);
    wait_jobs(&app, &r).await;
    assert!(Path::new(&worktree).is_dir(), "the owner is live: nothing removed");

    let r = app.delete(&format!("/api/v1/tasks/{owner}")).await.ok(202);
    wait_jobs(&app, &r).await;
    assert!(
        !Path::new(&worktree).exists(),
        "no live inheritor: the environment is cleaned"
    );
    assert!(!worktrees_of(&source).contains(&worktree));

    let a_task = task(&app, a).await;
    assert_eq!(a_task["workspace_mode"], "new_workspace");
    assert!(a_task["parent_task_id"].is_null());
    assert_eq!(task(&app, b).await["parent_task_id"], a.to_string());
    for t in [a, b] {
        assert!(environment_of(&app, t).await.is_none());
    }
    // B works in A's environment, and A is archived: refused, nothing changed.
    app.post(&format!("/api/v1/tasks/{b}/unarchive"), json!({}))
        .await
        .problem(409, "task_archived");
    assert!(!task(&app, b).await["archived_at"].is_null());
    app.post(&format!("/api/v1/tasks/{a}/unarchive"), json!({}))
        .await
        .ok(200);
    app.post(&format!("/api/v1/tasks/{b}/unarchive"), json!({}))
        .await
        .ok(200);
    let fresh = app.session(b, "worktree").await;
    assert_ne!(fresh["task_environment_id"], s["task_environment_id"]);
    for t in [a, b] {
        let env = environment_of(&app, t).await.expect("a fresh environment");
        assert_eq!(env["task_id"], a.to_string());
    }
}

// I8: archiving an owner hands its environment to the nearest live inheritor, past an archived link,
// which the rest of the chain inherits through; the work stays, and the archived owner comes back with
// a directory of its own.
async fn archive_hands_the_environment_to_the_nearest_live_inheritor(app: TestApp) {
    let f = app.task_with_repo("Owner").await;
    let (ws, owner) = (f.workspace, f.task);
    let link = app.subtask(ws, owner, "Link").await;
    let leaf = app.subtask(ws, link, "Leaf").await;
    let s = app.session(leaf, "worktree").await;
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    std::fs::write(Path::new(&worktree).join("leaf-work.txt"), "in progress").unwrap();
    let r = app
        .post(&format!("/api/v1/tasks/{link}/archive"), json!({}))
        .await
        .ok(202);
    wait_jobs(&app, &r).await;
    let r = app
        .post(&format!("/api/v1/tasks/{owner}/archive"), json!({}))
        .await
        .ok(202);
    wait_jobs(&app, &r).await;
    assert_eq!(
        std::fs::read_to_string(Path::new(&worktree).join("leaf-work.txt")).unwrap(),
        "in progress"
    );

    let leaf_task = task(&app, leaf).await;
    assert_eq!(leaf_task["workspace_mode"], "new_workspace");
    assert_eq!(leaf_task["parent_task_id"], owner.to_string());
    assert_eq!(task(&app, link).await["parent_task_id"], leaf.to_string());
    for t in [leaf, link] {
        let env = environment_of(&app, t).await.expect("the handed-over environment");
        assert_eq!(env["id"], s["task_environment_id"]);
        assert_eq!(env["task_id"], leaf.to_string());
        assert_eq!(env["ownership_generation"], 2);
    }
    assert!(environment_of(&app, owner).await.is_none());
    assert_eq!(app.session(leaf, "worktree").await["workspace_path"], worktree.as_str());

    // Both come back; the owner's next session gets a directory of its own, not the leaf's.
    app.post(&format!("/api/v1/tasks/{link}/unarchive"), json!({}))
        .await
        .ok(200);
    app.post(&format!("/api/v1/tasks/{owner}/unarchive"), json!({}))
        .await
        .ok(200);
    let own = f.session("worktree").await;
    assert_ne!(own["workspace_path"], worktree.as_str());
    assert_ne!(own["task_environment_id"], s["task_environment_id"]);
    assert_eq!(
        environment_of(&app, link).await.unwrap()["id"],
        s["task_environment_id"]
    );
}

// I10, I14: a cascade archive cleans the chain's environment; unarchiving the leaf first is refused and
// changes nothing; once the chain is back, the leaf's old session resumes in a fresh environment through
// the normal election, with no manual step.
async fn archive_then_unarchive_across_a_chain_and_resume(app: TestApp) {
    let f = app.task_with_repo("Owner").await;
    let (ws, owner) = (f.workspace, f.task);
    let middle = app.subtask(ws, owner, "Middle").await;
    let leaf = app.subtask(ws, middle, "Leaf").await;
    let s = agent_session(&app, leaf).await;
    let sid = uuid(&s["id"]);
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    let r = app
        .post(&format!("/api/v1/tasks/{owner}/archive?cascade=true"), json!({}))
        .await
        .ok(202);
    assert_eq!(r["cleanup_jobs"].as_array().unwrap().len(), 3);
    wait_jobs(&app, &r).await;
    assert!(!Path::new(&worktree).exists());
    for t in [owner, middle, leaf] {
        assert!(environment_of(&app, t).await.is_none());
    }

    app.post(&format!("/api/v1/tasks/{leaf}/unarchive"), json!({}))
        .await
        .problem(409, "task_archived");
    assert!(!task(&app, leaf).await["archived_at"].is_null(), "nothing changed");
    for t in [owner, middle, leaf] {
        app.post(&format!("/api/v1/tasks/{t}/unarchive"), json!({}))
            .await
            .ok(200);
    }
    let resumed = app
        .post(&format!("/api/v1/sessions/{sid}/resume"), json!({}))
        .await
        .ok(200);
    assert_ne!(resumed["task_environment_id"], s["task_environment_id"]);
    let env = environment_of(&app, leaf).await.expect("materialized by the resume");
    assert_eq!(env["id"], resumed["task_environment_id"]);
    assert_eq!(env["task_id"], owner.to_string());
    assert!(Path::new(resumed["workspace_path"].as_str().unwrap()).is_dir());
    app.post(&format!("/api/v1/sessions/{sid}/stop"), json!({}))
        .await
        .ok(200);
}

// I11 for a reset: a dirty worktree is refused with the repositories and their counts, and nothing
// changes; with consent the reset proceeds and removes it; the old session then resumes in a fresh
// environment (I14).
async fn a_dirty_reset_is_refused_then_consented_and_resumed(app: TestApp) {
    let f = app.task_with_repo("Reset").await;
    let (repo, source, t) = (f.repository, f.repo_dir.clone(), f.task);
    let s = agent_session(&app, t).await;
    let sid = uuid(&s["id"]);
    app.post(&format!("/api/v1/sessions/{sid}/stop"), json!({}))
        .await
        .ok(200);
    let worktree = s["workspace_path"].as_str().unwrap().to_string();
    std::fs::write(Path::new(&worktree).join("unsaved.txt"), "work").unwrap();
    let jobs_before = app.count("task_resource_cleanup_jobs").await;

    let p = app
        .post(&format!("/api/v1/tasks/{t}/environment/reset"), json!({}))
        .await
        .problem(409, "task_delete_dirty_worktree");
    assert_eq!(p["repositories"][0]["repository_id"], repo.to_string());
    assert_eq!(p["repositories"][0]["dirty_file_count"], 1);
    assert_eq!(app.count("task_resource_cleanup_jobs").await, jobs_before, "no job");
    let env = environment_of(&app, t).await.expect("still current");
    assert_eq!(env["id"], s["task_environment_id"]);
    assert_eq!(env["status"], "ready");
    assert!(Path::new(&worktree).join("unsaved.txt").exists());

    let r = app
        .post(
            &format!("/api/v1/tasks/{t}/environment/reset?discard_worktree_changes=true"),
            json!({}),
        )
        .await
        .ok(202);
    assert_eq!(
        wait_job(&app, uuid(&r["cleanup_job"]["id"])).await["state"],
        "succeeded"
    );
    assert!(!Path::new(&worktree).join("unsaved.txt").exists());
    assert!(!worktrees_of(&source).contains(&worktree));
    assert!(environment_of(&app, t).await.is_none());

    let resumed = app
        .post(&format!("/api/v1/sessions/{sid}/resume"), json!({}))
        .await
        .ok(200);
    assert_ne!(resumed["task_environment_id"], s["task_environment_id"]);
    assert_eq!(
        environment_of(&app, t).await.unwrap()["id"],
        resumed["task_environment_id"]
    );
    assert!(Path::new(resumed["workspace_path"].as_str().unwrap()).is_dir());
    app.post(&format!("/api/v1/sessions/{sid}/stop"), json!({}))
        .await
        .ok(200);
}

// A first session is recorded in the transaction that publishes its environment. A subtask archived while
// its owner's environment is being made gets no session (`task_archived`, as before the change), and the
// environment, which is the owner's, is published all the same (I1, I7). Without the subtask's own check
// in that transaction, the session would be recorded on an archived task.
async fn a_subtask_archived_while_its_owners_environment_is_made_gets_no_session(app: TestApp) {
    use berth::entity::task as task_entity;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, sea_query::Expr};
    let f = app.task_with_repo("owner").await;
    let (ws, owner) = (f.workspace, f.task);
    let child = app.subtask(ws, owner, "child").await;

    let gate = std::sync::Arc::new(gated_git::Gate::default());
    let mut ctx = app.app_state.ctx.clone();
    ctx.git = std::sync::Arc::new(gated_git::Gated {
        inner: ctx.git.clone(),
        gate: gate.clone(),
    });
    let principal = app.app_state.verifier.verify(&app.admin).unwrap().unbound().unwrap();
    let create = tokio::spawn(async move {
        berth::domain::sessions::create(
            &ctx,
            &principal,
            child.into(),
            berth::domain::sessions::NewSession {
                executor_type: berth::entity::task_environment::ExecutorType::Worktree,
                agent_profile: None,
                name: None,
                prompt: None,
                start: Some(false),
            },
        )
        .await
    });
    tokio::time::timeout(WAIT, gate.entered.notified())
        .await
        .expect("the materialization reached git");
    // The archive commits while git runs (written directly: the API's archive would also start a job).
    task_entity::Entity::update_many()
        .col_expr(task_entity::Column::ArchivedAt, Expr::value(chrono::Utc::now()))
        .filter(task_entity::Column::Id.eq(child))
        .exec(app.db())
        .await
        .unwrap();
    gate.release.notify_one();
    let created = tokio::time::timeout(WAIT, create)
        .await
        .expect("the create finished")
        .unwrap();
    assert!(
        matches!(created, Err(berth::error::Error::TaskArchived)),
        "an archived subtask got a session: {:?}",
        created.map(|v| v.session.id)
    );
    let env = environment_of(&app, owner)
        .await
        .expect("the owner has its environment");
    assert_eq!(env["status"], "ready", "{env}");
    let sessions = app.get(&format!("/api/v1/tasks/{child}/sessions")).await.ok(200);
    assert_eq!(sessions["items"], json!([]), "{sessions}");
}

/// Git that holds `git worktree add` until the test releases it (everything else as the real one).
mod gated_git {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use berth::git::cli::{GitError, GitMutations};
    use berth::git::{BranchDeletionConsent, BranchName, MergedBranch};
    use berth::managed_path::{Consent, ManagedPath, RecordedRegistration};
    use tokio::sync::Notify;

    #[derive(Default)]
    pub struct Gate {
        pub entered: Notify,
        pub release: Notify,
    }

    pub struct Gated {
        pub inner: Arc<dyn GitMutations>,
        pub gate: Arc<Gate>,
    }

    #[async_trait::async_trait]
    impl GitMutations for Gated {
        async fn worktree_add(
            &self,
            repo: &Path,
            target: &ManagedPath,
            branch: &str,
            base: Option<&str>,
        ) -> Result<(), GitError> {
            self.gate.entered.notify_one();
            self.gate.release.notified().await;
            self.inner.worktree_add(repo, target, branch, base).await
        }
        async fn worktree_remove(&self, repo: &Path, target: &ManagedPath) -> Result<(), GitError> {
            self.inner.worktree_remove(repo, target).await
        }
        async fn worktree_remove_consented(
            &self,
            repo: &Path,
            target: &ManagedPath,
            consent: &Consent,
        ) -> Result<(), GitError> {
            self.inner.worktree_remove_consented(repo, target, consent).await
        }
        async fn worktree_forget(&self, repo: &Path, registration: &RecordedRegistration) -> Result<(), GitError> {
            self.inner.worktree_forget(repo, registration).await
        }
        async fn read_bytes(
            &self,
            op: &'static str,
            repo: &Path,
            args: &[&str],
            envs: &[(&str, &std::ffi::OsStr)],
        ) -> Result<Vec<u8>, GitError> {
            self.inner.read_bytes(op, repo, args, envs).await
        }
        async fn read_answer(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<(i32, Vec<u8>), GitError> {
            self.inner.read_answer(op, repo, args).await
        }
        async fn land(&self, step: &berth::git::land::Step<'_>) -> Result<berth::git::land::Landed, GitError> {
            self.inner.land(step).await
        }
        async fn keep_object(&self, repo: &Path, refname: &str, oid: &str) -> Result<(), GitError> {
            self.inner.keep_object(repo, refname, oid).await
        }
        async fn drop_refs(&self, repo: &Path, prefix: &str) -> Result<(), GitError> {
            self.inner.drop_refs(repo, prefix).await
        }
        async fn write_tree_files(&self, target: &ManagedPath, tree: &str, index_file: &Path) -> Result<(), GitError> {
            self.inner.write_tree_files(target, tree, index_file).await
        }
        async fn dirty_file_count(&self, worktree: &Path) -> Result<usize, GitError> {
            self.inner.dirty_file_count(worktree).await
        }
        async fn branch_tip(&self, repo: &Path, branch: &BranchName) -> Result<Option<String>, GitError> {
            self.inner.branch_tip(repo, branch).await
        }
        async fn upstream_tip(&self, repo: &Path, branch: &BranchName) -> Result<Option<String>, GitError> {
            self.inner.upstream_tip(repo, branch).await
        }
        async fn is_ancestor(&self, repo: &Path, commit: &str, rev: &str) -> Result<bool, GitError> {
            self.inner.is_ancestor(repo, commit, rev).await
        }
        async fn checked_out_at(&self, repo: &Path, branch: &BranchName) -> Result<Vec<PathBuf>, GitError> {
            self.inner.checked_out_at(repo, branch).await
        }
        async fn branch_delete_merged(&self, repo: &Path, proof: &MergedBranch) -> Result<(), GitError> {
            self.inner.branch_delete_merged(repo, proof).await
        }
        async fn branch_delete_consented(
            &self,
            repo: &Path,
            branch: &BranchName,
            consent: &BranchDeletionConsent,
        ) -> Result<(), GitError> {
            self.inner.branch_delete_consented(repo, branch, consent).await
        }
    }
}
