//! Commit what is in an environment's worktrees: all of it, or the listed paths, in each listed slot
//! (every slot by default), never while an agent's turn runs there.
use crate::ids::{EnvironmentId, RepositoryId};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use super::{Ctx, author, git_failed, idle, landable, slots};
use crate::auth::UnboundPrincipal;
use crate::domain::writer::{self, Asking, WriterLease};
use crate::error::{Error, Result};
use crate::events::{self, EventType, Subject};
use crate::git::land::{Landed, Step};

/// The longest commit message.
const MAX_MESSAGE: usize = 20_000;

#[derive(Debug, Serialize, ToSchema)]
pub struct SlotCommit {
    pub repository_id: RepositoryId,
    /// The task branch the commit is on.
    pub branch: String,
    pub commit: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Committed {
    pub task_environment_id: EnvironmentId,
    /// One per slot that had something to commit.
    pub commits: Vec<SlotCommit>,
}

pub async fn commit(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    env_id: EnvironmentId,
    message: &str,
    repository_ids: Option<&[RepositoryId]>,
    paths: &[String],
) -> Result<Committed> {
    if message.trim().is_empty() || message.len() > MAX_MESSAGE {
        return Err(Error::invalid("message", "must be 1 to 20000 bytes"));
    }
    for (i, path) in paths.iter().enumerate() {
        let p = std::path::Path::new(path);
        if path.is_empty() || !p.components().all(|c| matches!(c, std::path::Component::Normal(_))) {
            return Err(Error::invalid(
                &format!("paths[{i}]"),
                "must be a relative path inside the worktree",
            ));
        }
    }
    let (e, task) = landable(ctx, p, env_id).await?;
    // The one writer of the worktrees while it commits; a worktree that fails admission's proof (gone,
    // replaced, re-cloned at its path) is never staged: the same problem a diff or a restore gets.
    let lease = writer::acquire(ctx, e.id, Asking::Landing).await?;
    let written = async {
        idle(ctx, &e).await?;
        crate::domain::git_status::prove(ctx, &e).await?;
        let slots = slots(ctx, &e, repository_ids, "repository_ids").await?;
        write_commits(ctx, &slots, paths, message, &author(ctx, p), &lease).await
    }
    .await;
    writer::release(ctx, lease).await;
    let commits = written?;
    if commits.is_empty() {
        return Err(Error::NothingToCommit);
    }
    let txn = ctx.db.begin_write().await?;
    events::append(
        &txn,
        ctx.instance_id,
        EventType::EnvironmentCommitted,
        Subject {
            task_environment_id: Some(e.id),
            ..Subject::task(task.workspace_id, task.id)
        },
        json!({ "commits": commits }),
    )
    .await?;
    ctx.commit(txn).await?;
    // What git status shows changed: observed now rather than on the next turn.
    if let Err(err) = super::super::git_status::refresh(ctx, p, e.id).await {
        tracing::warn!(environment = %e.id, error = %err, "git status after a commit");
    }
    Ok(Committed {
        task_environment_id: e.id,
        commits,
    })
}

/// One commit per slot with changes, under the environment's writer lease.
async fn write_commits(
    ctx: &Ctx,
    slots: &[super::Slot],
    paths: &[String],
    message: &str,
    author: &crate::git::land::Signature,
    _lease: &WriterLease,
) -> Result<Vec<SlotCommit>> {
    let root = crate::managed_path::ManagedRoot::from_config(&ctx.config);
    let mut commits = Vec::new();
    for s in slots {
        let target = root
            .adopt(&s.worktree)
            .map_err(|err| Error::Internal(anyhow::anyhow!("commit: {err}")))?;
        let step = Step::Commit {
            target: &target,
            paths,
            message,
            author,
        };
        if let Landed::Committed(commit) = ctx.git.land(&step).await.map_err(git_failed("commit"))? {
            commits.push(SlotCommit {
                repository_id: s.repository_id,
                branch: s.branch.as_str().to_string(),
                commit,
            });
        }
    }
    Ok(commits)
}
