//! Admission of an environment as it stands: the candidate built from the canonical inventory (never from
//! a session's copy) and proven off the async threads. A launch asks it before an agent starts (I17); a
//! git-status inspection asks it before reading a worktree, so what either finds is recorded the same way.
use std::path::PathBuf;

use crate::domain::Ctx;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::error::{Error, Result, ReuseCategory};
use crate::executor::admission::{self, AdmittedWorkspace, Candidate, Refusal};
use crate::store::environments as env_store;
use crate::store::tasks as task_store;

/// Builds the admission candidate from the canonical inventory (never from a session's copy) and
/// validates it off the async threads.
pub(crate) async fn admit(
    ctx: &Ctx,
    owner: &task::Model,
    current: &env::Model,
    requested: ExecutorType,
    // A transition candidate is admitted while still `creating` (it becomes current only after its launch).
    candidate: bool,
) -> Result<std::result::Result<AdmittedWorkspace, Refusal>> {
    // Another node's disk is never judged from here (what is absent here is there): its requests are
    // carried out by that node, and nothing is marked broken for not being on this disk.
    if current.node_id != ctx.config.node_id {
        return Err(Error::Unavailable(format!(
            "the environment is on node {}; requests that need its disk are carried out there",
            current.node_id
        )));
    }
    let rows = env_store::active_repos(&ctx.db.conn, current.id).await?;
    let slots: Vec<admission::Slot> = task_store::slots_with_repositories(&ctx.db.conn, owner.id)
        .await?
        .iter()
        .filter_map(|(slot, repo)| {
            repo.as_ref().map(|r| admission::Slot {
                repository_id: slot.repository_id,
                branch_slug: slot.branch_slug.clone(),
                common_git_dir: PathBuf::from(&r.common_git_dir),
                source_path: PathBuf::from(&r.path),
            })
        })
        .collect();
    let rows: Vec<admission::Row> = rows
        .into_iter()
        .map(|r| admission::Row {
            repository_id: r.repository_id,
            branch_slug: r.branch_slug,
            worktree_path: r.worktree_path.map(PathBuf::from),
            worktree_id: r.worktree_id,
        })
        .collect();
    // This environment's own directory: the one its rows live in (a transition has its own), which must
    // be a directory of this task directly under the managed root.
    let root = &ctx.config.worktree_root;
    // An environment imported from kandev adopted its worktrees where kandev made them, outside the
    // managed root; its directory is the one they share (admission still proves each of them).
    let adopted = current.imported_from.is_some();
    let task_root = rows
        .iter()
        .filter_map(|r| r.worktree_path.as_ref().and_then(|p| p.parent()).map(PathBuf::from))
        .next()
        .filter(|dir| {
            adopted
                || (dir.parent() == Some(root.as_path())
                    && dir
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n == owner.slug || n.starts_with(&format!("{}-", owner.slug))))
        })
        .unwrap_or_else(|| root.join(&owner.slug));
    let environment_id = current.id;
    let executor = current.executor_type;
    // A broken environment is admitted afresh: mended, it is ready again.
    let ready = matches!(
        current.status,
        EnvironmentStatus::Ready | EnvironmentStatus::Stopped | EnvironmentStatus::Broken
    ) || (candidate && current.status == EnvironmentStatus::Creating);
    tokio::task::spawn_blocking(move || {
        admission::admit(
            &Candidate {
                environment_id,
                executor,
                ready,
                task_root: &task_root,
                slots: &slots,
                rows: &rows,
            },
            requested,
        )
    })
    .await
    .map_err(|e| Error::Internal(e.into()))
}

impl From<Refusal> for ReuseCategory {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::ExecutorMismatch => ReuseCategory::ExecutorMismatch,
            Refusal::InventoryIncomplete => ReuseCategory::InventoryIncomplete,
            Refusal::InventoryAmbiguous => ReuseCategory::InventoryAmbiguous,
            Refusal::WorkspaceMissing => ReuseCategory::WorkspaceMissing,
            Refusal::NotAGitWorktree => ReuseCategory::NotAGitWorktree,
            Refusal::RepositoryMismatch => ReuseCategory::RepositoryMismatch,
            Refusal::EnvironmentNotReady => ReuseCategory::EnvironmentNotReady,
        }
    }
}
