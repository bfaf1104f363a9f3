//! Landing the work: commit what an agent did in its worktree, merge the task branch into its base
//! without touching anyone's checkout, push it, and open a pull request. Each operation is one file; what
//! they share is here: the environment must be one whose worktrees can be read here, and the slot's
//! branch, base branch and paths.
//!
//! The author of what berth writes is the person who asked: the token's `name` and `email` claims when
//! it has both; else `BERTH_GIT_AUTHOR` (`Name <email>`); else `berth <berth@localhost>`. The committer is
//! always berth.
mod commit;
mod merge;
pub mod pull_requests;
mod push;

use crate::ids::{EnvironmentId, RepositoryId};
use std::path::PathBuf;

use super::Ctx;
use crate::auth::Principal;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::error::{Error, Result};
use crate::git::BranchName;
use crate::git::land::Signature;

pub use commit::{Committed, commit};
pub use merge::{MergeRequest, Merged, Strategy, merge};
pub use push::{Pushed, push};

/// One repository slot of an environment, as landing needs it.
pub(crate) struct Slot {
    pub repository_id: RepositoryId,
    /// The task's worktree (berth's).
    pub worktree: PathBuf,
    /// The registered repository (its common git dir holds the branches).
    pub repository: PathBuf,
    /// The task branch.
    pub branch: BranchName,
    /// The slot's base branch (the repository's default when the task named none).
    pub base_branch: String,
}

/// The environment, when its worktrees can be landed from here: seen by a caller whose token is not an
/// agent's (an agent never lands its own work), not broken, ready, on this node.
pub(crate) async fn landable(
    ctx: &Ctx,
    p: &crate::auth::UnboundPrincipal,
    env_id: EnvironmentId,
) -> Result<(env::Model, task::Model)> {
    let view = super::environments::get(ctx, p, env_id).await?;
    let e = view.env;
    if e.status == EnvironmentStatus::Broken {
        return Err(Error::WorkspaceReuseUnsafe(super::environments::broken_category(&e)));
    }
    if !matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped) {
        return Err(Error::InvalidState("only a ready environment's work is landed".into()));
    }
    if e.executor_type != crate::entity::task_environment::ExecutorType::Worktree {
        return Err(Error::InvalidState(
            "a local environment works in your own checkout: commit and merge there".into(),
        ));
    }
    super::nodes::here(ctx, &e.node_id).await?;
    let task = crate::store::tasks::find(&ctx.db.conn, e.task_id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    Ok((e, task))
}

/// Refused while an agent's turn runs in the environment (`409 session_busy`).
pub(crate) async fn idle(ctx: &Ctx, e: &env::Model) -> Result<()> {
    let busy = crate::store::sessions::in_environment(&ctx.db.conn, e.id)
        .await?
        .iter()
        .any(|s| s.state.is_busy());
    if busy { Err(Error::SessionBusy) } else { Ok(()) }
}

/// The environment's slots (those named, or all), first to last; a repository that is not one of them is
/// `422` on `field`.
pub(crate) async fn slots(ctx: &Ctx, e: &env::Model, only: Option<&[RepositoryId]>, field: &str) -> Result<Vec<Slot>> {
    let worktrees = super::checkpoints::worktrees(ctx, e).await?;
    if let Some(ids) = only
        && let Some(unknown) = ids.iter().find(|id| !worktrees.iter().any(|w| w.repository_id == **id))
    {
        return Err(Error::invalid(
            field,
            format!("{unknown} is not a repository of this environment"),
        ));
    }
    let rows = crate::store::environments::repos_of(&ctx.db.conn, e.id).await?;
    let task_slots = crate::store::tasks::slots_of(&ctx.db.conn, e.task_id).await?;
    let mut out = Vec::new();
    for w in worktrees {
        if only.is_some_and(|ids| !ids.contains(&w.repository_id)) {
            continue;
        }
        let branch = rows
            .iter()
            .find(|r| r.repository_id == w.repository_id && r.position == w.position)
            .and_then(|r| r.worktree_branch.clone())
            .and_then(|b| BranchName::parse(&b).ok())
            .ok_or_else(|| Error::InvalidState("the slot has no task branch".into()))?;
        let base_branch = task_slots
            .iter()
            .find(|s| s.repository_id == w.repository_id && s.position == w.position)
            .and_then(|s| s.base_branch.clone())
            .unwrap_or(w.default_branch);
        if !w.worktree.is_dir() {
            return Err(Error::WorkspaceReuseUnsafe(
                crate::error::ReuseCategory::WorkspaceMissing,
            ));
        }
        out.push(Slot {
            repository_id: w.repository_id,
            worktree: w.worktree,
            repository: w.repository,
            branch,
            base_branch,
        });
    }
    Ok(out)
}

/// Who the commits berth writes for `p` are by (see the module's note).
pub(crate) fn author(ctx: &Ctx, p: &Principal) -> Signature {
    if let (Some(name), Some(email)) = (&p.name, &p.email) {
        return Signature {
            name: name.clone(),
            email: email.clone(),
        };
    }
    ctx.config
        .git_author
        .clone()
        .unwrap_or_else(crate::git::land::committer)
}

fn git_failed(op: &str) -> impl Fn(crate::git::cli::GitError) -> Error + '_ {
    move |err| Error::Internal(anyhow::anyhow!("{op}: {err}"))
}
