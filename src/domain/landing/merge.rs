//! Merge a task branch into its base without touching anyone's checkout. The result is computed in the
//! object store (`git merge-tree --write-tree`), never in a worktree; a conflict changes nothing and names
//! the paths. The target branch moves only by compare-and-set on the value read here
//! (`expected_into_commit` lets the caller pin it too). When the target is checked out somewhere (the
//! user's own checkout, typically) berth moves it there only if that checkout is clean, by
//! `git merge --ff-only` (the move is always a fast-forward of what it has), and otherwise refuses without
//! naming its path. The task branch and worktree are kept; the task moves to the column that takes merged
//! work.
use crate::ids::{EnvironmentId, RepositoryId};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::{Ctx, author, git_failed, landable, slots};
use crate::auth::UnboundPrincipal;
use crate::domain::writer::{self, Asking, WriterLease};
use crate::entity::task_environment as env;
use crate::entity::task_session::SessionState;
use crate::error::{Error, Result};
use crate::events::{self, EventType, Subject};
use crate::git::BranchName;
use crate::git::land::{BranchMove, CleanCheckout, Step};
use crate::git::merge::{self as land, MergeTree};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// A merge commit with both tips as parents.
    Merge,
    /// One commit on the target holding the task branch's changes.
    Squash,
    /// The target moves to the task branch's tip (refused when it is not a fast-forward).
    FastForward,
}

pub struct MergeRequest {
    pub repository_id: RepositoryId,
    pub into: Option<String>,
    pub strategy: Strategy,
    pub message: Option<String>,
    pub expected_into_commit: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Merged {
    pub task_environment_id: EnvironmentId,
    pub repository_id: RepositoryId,
    /// The branch that moved.
    pub into: String,
    pub strategy: Strategy,
    /// Where it pointed before.
    pub previous_commit: String,
    /// Where it points now.
    pub commit: String,
    /// A clean checkout of the target was fast-forwarded with it.
    pub checkout_updated: bool,
}

pub async fn merge(ctx: &Ctx, p: &UnboundPrincipal, env_id: EnvironmentId, req: MergeRequest) -> Result<Merged> {
    let (e, task) = landable(ctx, p, env_id).await?;
    let slot = slots(ctx, &e, Some(&[req.repository_id]), "repository_id")
        .await?
        .pop()
        .ok_or_else(|| Error::invalid("repository_id", "is not a repository of this environment"))?;
    let into_name = req.into.clone().unwrap_or_else(|| slot.base_branch.clone());
    // `tasks:land` lands a task where it was meant to go; any other branch is an operator's call.
    if into_name != slot.base_branch {
        p.require(crate::auth::Scope::Admin)?;
    }
    let into = BranchName::parse(&into_name).map_err(|why| Error::invalid("into", why))?;
    if into == slot.branch {
        return Err(Error::invalid("into", "is the task branch itself"));
    }
    let repo = slot.repository.as_path();
    let git = ctx.git.as_ref();
    let failed = git_failed("merge");
    let old = git
        .branch_tip(repo, &into)
        .await
        .map_err(&failed)?
        .ok_or_else(|| Error::invalid("into", "no such branch in the repository"))?;
    if let Some(expected) = &req.expected_into_commit
        && *expected != old
    {
        return Err(Error::BranchMoved(format!(
            "{into_name} is at {old}, not at the expected {expected}"
        )));
    }
    let tip = git
        .branch_tip(repo, &slot.branch)
        .await
        .map_err(&failed)?
        .ok_or_else(|| Error::InvalidState("the task branch has no commit".into()))?;
    if git.is_ancestor(repo, &tip, &old).await.map_err(&failed)? {
        return Err(Error::InvalidState(format!(
            "{into_name} already has everything the task branch has: nothing to merge"
        )));
    }
    let message = req.message.clone().unwrap_or_else(|| match req.strategy {
        Strategy::Squash => format!("{} ({})", task.title, slot.branch.as_str()),
        _ => format!("Merge branch '{}' into {into_name}", slot.branch.as_str()),
    });
    if message.trim().is_empty() || message.len() > 20_000 {
        return Err(Error::invalid("message", "must be 1 to 20000 bytes"));
    }
    let new = match req.strategy {
        Strategy::FastForward => {
            if !git.is_ancestor(repo, &old, &tip).await.map_err(&failed)? {
                return Err(Error::InvalidState(format!(
                    "{into_name} has commits the task branch lacks: not a fast-forward (merge or squash instead)"
                )));
            }
            tip.clone()
        }
        Strategy::Merge | Strategy::Squash => {
            let tree = match land::merge_tree(git, repo, &old, &tip).await.map_err(&failed)? {
                MergeTree::Clean { tree } => tree,
                MergeTree::Conflict { paths } => return Err(Error::MergeConflict(paths)),
            };
            let author = author(ctx, p);
            let parents: Vec<&str> = match req.strategy {
                Strategy::Merge => vec![&old, &tip],
                _ => vec![&old],
            };
            land::commit_tree(git, repo, &tree, &parents, &message, &author)
                .await
                .map_err(&failed)?
        }
    };
    // Where the target is checked out: a clean checkout moves with it; a dirty one refuses it.
    let checkouts = git.checked_out_at(repo, &into).await.map_err(&failed)?;
    let checkout_updated = !checkouts.is_empty();
    if let Some(path) = checkouts.first() {
        if checkouts.len() > 1 || git.dirty_file_count(path).await.map_err(&failed)? > 0 {
            return Err(Error::TargetCheckedOut(into_name));
        }
        // The checkout is an environment's (a `local` session's agent works in the repository itself):
        // moved only while no agent runs there, holding that environment's writer lease.
        let users = checkout_users(ctx, e.id, &slot, path).await?;
        let mut leases = Vec::new();
        let mut refused = None;
        for user in &users {
            let live = crate::store::sessions::in_environment(&ctx.db.conn, user.id)
                .await?
                .iter()
                .any(|s| ctx.runtime.is_live(s.id) || !(s.state.is_terminal() || s.state == SessionState::Stopped));
            let lease = match live {
                true => Err(Error::TargetInUse(into_name.clone())),
                false => writer::acquire(ctx, user.id, Asking::Landing)
                    .await
                    .map_err(|err| match err {
                        Error::WriterBusy(_) => Error::TargetInUse(into_name.clone()),
                        other => other,
                    }),
            };
            match lease {
                Ok(lease) => leases.push(lease),
                Err(err) => {
                    refused = Some(err);
                    break;
                }
            }
        }
        let moved = match refused {
            Some(err) => Err(err),
            None => fast_forward(ctx, path, &old, &new, &into_name, &leases).await,
        };
        for lease in leases {
            writer::release(ctx, lease).await;
        }
        moved?;
    } else {
        let change = BranchMove {
            branch: into.clone(),
            from: old.clone(),
            to: new.clone(),
        };
        git.land(&Step::MoveBranch { repo, change: &change })
            .await
            .map_err(|err| moved_or(err, &into_name))?;
    }
    let merged = Merged {
        task_environment_id: e.id,
        repository_id: slot.repository_id,
        into: into_name,
        strategy: req.strategy,
        previous_commit: old,
        commit: new,
        checkout_updated,
    };
    let txn = ctx.db.begin_write().await?;
    events::append(
        &txn,
        ctx.instance_id,
        EventType::EnvironmentMerged,
        Subject {
            task_environment_id: Some(e.id),
            ..Subject::task(task.workspace_id, task.id)
        },
        json!({
            "repository_id": merged.repository_id,
            "into": merged.into,
            "strategy": merged.strategy,
            "previous_commit": merged.previous_commit,
            "commit": merged.commit,
        }),
    )
    .await?;
    let locked = crate::store::tasks::lock_task(&txn, task.id).await?;
    super::super::columns::on_merged(&txn, ctx, &locked).await?;
    ctx.commit(txn).await?;
    Ok(merged)
}

/// The environments whose files are the checkout at `path`: the `local` ones on the slot's repository
/// (when the checkout is the repository's own) and any whose worktree it is.
async fn checkout_users(
    ctx: &Ctx,
    merging: EnvironmentId,
    slot: &super::Slot,
    path: &std::path::Path,
) -> Result<Vec<env::Model>> {
    let canonical = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let here = canonical(path);
    let mut users = Vec::new();
    if canonical(&slot.repository) == here {
        users.extend(crate::store::environments::local_on(&ctx.db.conn, slot.repository_id).await?);
    }
    for e in crate::store::environments::others_naming(&ctx.db.conn, &path.to_string_lossy(), merging).await? {
        if !users.iter().any(|u: &env::Model| u.id == e.id) {
            users.push(e);
        }
    }
    Ok(users)
}

/// `git merge --ff-only` in the clean checkout, holding the leases of the environments that work in it.
async fn fast_forward(
    ctx: &Ctx,
    path: &std::path::Path,
    old: &str,
    new: &str,
    into_name: &str,
    _leases: &[WriterLease],
) -> Result<()> {
    let checkout = CleanCheckout {
        path: path.to_path_buf(),
        head: old.to_string(),
    };
    let step = Step::FastForward {
        checkout: &checkout,
        to: new,
    };
    ctx.git.land(&step).await.map_err(|err| moved_or(err, into_name))?;
    Ok(())
}

/// A move git refused because the branch (or the checkout) no longer is where it was read: retryable.
fn moved_or(err: crate::git::cli::GitError, into: &str) -> Error {
    Error::BranchMoved(format!(
        "{into} moved while the merge was made ({err}); nothing changed"
    ))
}
