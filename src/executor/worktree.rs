//! Materializing a worktree environment: one `git worktree add` per repository slot, then proof that each
//! directory is a worktree of the slot's repository. A directory this task already owns (an earlier,
//! interrupted attempt) is adopted when it is exactly the slot's worktree; anything else fails the slot.
use crate::ids::RepositoryId;
use std::path::{Path, PathBuf};

use crate::git::{self, cli::GitMutations};
use crate::managed_path::{ManagedPath, ManagedRoot};

/// What to create for one repository slot.
#[derive(Debug, Clone)]
pub struct SlotPlan {
    pub repository_id: RepositoryId,
    pub repository_name: String,
    pub repository_path: PathBuf,
    pub common_git_dir: PathBuf,
    pub branch_slug: String,
    pub branch: String,
    /// The user named the branch (else it is the default `berth/<task>`).
    pub branch_named: bool,
    /// The start point when the branch does not exist yet.
    pub base: String,
    /// The directory name inside the task directory.
    pub dir: String,
    pub position: i32,
}

/// A slot that exists on disk.
#[derive(Debug, Clone)]
pub struct Materialized {
    pub repository_id: RepositoryId,
    pub branch_slug: String,
    pub position: i32,
    pub worktree_id: Option<String>,
    pub worktree_path: String,
    pub worktree_branch: Option<String>,
    /// This attempt ran `git worktree add` and found the branch already there (`Some(true)`) or created
    /// it (`Some(false)`); `None` when it adopted a directory an earlier attempt left.
    pub branch_existed: Option<bool>,
    /// Created by this attempt (and so the only kind of directory compensation may remove).
    created: Option<(PathBuf, ManagedPath)>,
}

#[derive(Debug)]
pub struct SlotFailure {
    pub position: i32,
    pub repository_id: RepositoryId,
    pub repository_name: String,
    /// For the inventory row's `error_message` (readers of the environment may see paths).
    pub message: String,
}

/// How far one repository's materialization got (`environment.progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Reading the source repository: does the task's branch exist, or what does it start from.
    Fetching,
    /// `git worktree add` (or adopting the worktree an interrupted attempt of this task left).
    CreatingWorktree,
    /// The repository's worktree exists and is proven to be the slot's.
    Ready,
}

/// Told each [`Stage`] as a repository reaches it, in order; what it does (record an event) is at least
/// queued, in that order, before the materialization goes on, so the stages of a repository are seen in
/// order.
pub type Progress<'a> =
    &'a (dyn Fn(crate::ids::RepositoryId, Stage) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync);

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a blocking git inspection panicked")
}

/// Creates (or adopts) every slot in order. On the first failure, removes what this attempt created and
/// returns the failure; nothing it did not create is touched.
pub async fn materialize(
    git: &dyn GitMutations,
    root: &ManagedRoot,
    task_dir: &str,
    plans: &[SlotPlan],
    progress: Progress<'_>,
) -> Result<Vec<Materialized>, SlotFailure> {
    let mut done: Vec<Materialized> = Vec::with_capacity(plans.len());
    for plan in plans {
        match materialize_slot(git, root, task_dir, plan, progress).await {
            Ok(m) => {
                progress(plan.repository_id, Stage::Ready).await;
                done.push(m);
            }
            Err(message) => {
                compensate(git, &done).await;
                return Err(SlotFailure {
                    position: plan.position,
                    repository_id: plan.repository_id,
                    repository_name: plan.repository_name.clone(),
                    message,
                });
            }
        }
    }
    Ok(done)
}

async fn materialize_slot(
    git: &dyn GitMutations,
    root: &ManagedRoot,
    task_dir: &str,
    plan: &SlotPlan,
    progress: Progress<'_>,
) -> Result<Materialized, String> {
    let task_root = root.join(&[task_dir]).map_err(|e| e.to_string())?;
    let target = root.join(&[task_dir, &plan.dir]).map_err(|e| e.to_string())?;
    let target_path = target.as_path().to_path_buf();
    let mut created = None;
    let mut branch_existed = None;
    progress(plan.repository_id, Stage::Fetching).await;
    if std::fs::symlink_metadata(&target_path).is_err() {
        std::fs::create_dir_all(task_root.as_path()).map_err(|e| format!("cannot create the task directory: {e}"))?;
        let (common, repo, branch) = (
            plan.common_git_dir.clone(),
            plan.repository_path.clone(),
            plan.branch.clone(),
        );
        let exists = blocking(move || git::branch_exists_in(&common, &repo, &branch))
            .await
            .map_err(|_| "the source repository is missing or is not a git repository".to_string())?;
        let base = (!exists).then_some(plan.base.as_str());
        branch_existed = Some(exists);
        progress(plan.repository_id, Stage::CreatingWorktree).await;
        git.worktree_add(&plan.repository_path, &target, &plan.branch, base)
            .await
            .map_err(|e| e.to_string())?;
        created = Some((plan.repository_path.clone(), target.clone()));
    }
    if created.is_none() {
        progress(plan.repository_id, Stage::CreatingWorktree).await;
    }
    // Prove what is there, whether just created or left by an interrupted attempt of this task.
    let path = target_path.clone();
    let common = plan.common_git_dir.clone();
    let info = blocking(move || {
        registration_is_complete(&path, &common).and_then(|()| git::inspect_worktree(&path).map_err(|e| e.to_string()))
    })
    .await;
    let verdict = match info {
        Ok(info) if info.common_git_dir != plan.common_git_dir => {
            Err("the directory is a worktree of another repository".to_string())
        }
        Ok(info) if info.branch.as_deref() != Some(plan.branch.as_str()) => {
            Err("the directory is on another branch".to_string())
        }
        Ok(info) if info.worktree_id.is_none() => Err("the directory is not a linked worktree".to_string()),
        Ok(info) => Ok(info),
        Err(e) => Err(format!("the directory is not a usable worktree: {e}")),
    };
    match verdict {
        Ok(info) => Ok(Materialized {
            repository_id: plan.repository_id,
            branch_slug: plan.branch_slug.clone(),
            position: plan.position,
            worktree_id: info.worktree_id,
            worktree_path: target_path.to_string_lossy().into_owned(),
            worktree_branch: Some(plan.branch.clone()),
            branch_existed,
            created,
        }),
        Err(message) => {
            if let Some((repo, target)) = created {
                remove_created(git, &repo, &target).await;
            }
            Err(message)
        }
    }
}

/// A worktree is adoptable only when git finished creating it and its registration points back at it:
/// `<target>/.git` names `<common>/worktrees/<id>`, whose `gitdir` names `<target>/.git`, with no
/// `locked` marker (git leaves "initializing" there when it is killed mid-checkout).
fn registration_is_complete(target: &Path, common: &Path) -> Result<(), String> {
    let incomplete = |why: &str| Err(format!("the directory is not a complete worktree registration: {why}"));
    let dot_git = target.join(".git");
    let Ok(pointer) = std::fs::read_to_string(&dot_git) else {
        return incomplete("no .git file");
    };
    let Some(admin) = pointer.trim().strip_prefix("gitdir:").map(|p| PathBuf::from(p.trim())) else {
        return incomplete("no gitdir in .git");
    };
    let admin = admin
        .canonicalize()
        .map_err(|_| "the directory's git registration is missing".to_string())?;
    if admin.parent() != Some(common.join("worktrees").as_path()) {
        return incomplete("registered with another repository");
    }
    if admin.join("locked").exists() {
        return incomplete("the registration is locked (an interrupted checkout?)");
    }
    let back =
        std::fs::read_to_string(admin.join("gitdir")).map_err(|_| "the registration has no gitdir".to_string())?;
    let back = PathBuf::from(back.trim())
        .canonicalize()
        .map_err(|_| "the registration points elsewhere".to_string())?;
    if back != dot_git.canonicalize().map_err(|e| e.to_string())? {
        return incomplete("the registration points at another directory");
    }
    Ok(())
}

/// Removes the worktrees this attempt created (never `--force`; branches are kept, a retry reuses them).
pub async fn compensate(git: &dyn GitMutations, done: &[Materialized]) {
    for m in done.iter().rev() {
        if let Some((repo, target)) = &m.created {
            remove_created(git, repo, target).await;
        }
    }
}

async fn remove_created(git: &dyn GitMutations, repo: &Path, target: &ManagedPath) {
    if let Err(e) = git.worktree_remove(repo, target).await {
        tracing::warn!(path = %target.as_path().display(), error = %e, "could not remove a worktree this attempt created; a retry adopts it");
    }
}
