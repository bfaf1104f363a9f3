//! What berth kept on disk (`cleanup::kept`), listed and disposed of:
//! `GET /workspaces/{id}/leftovers` and
//! `DELETE /workspaces/{id}/leftovers/{leftover_id}?discard_worktree_changes=true`.
use crate::ids::{EnvironmentId, LeftoverId, RepositoryId, TaskId, WorkspaceId};
use std::path::Path;

use anyhow::anyhow;
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::WorktreeSnapshot;
use super::kept::{Owner, blocking};
use super::worktrees::{Dirty, Outcome, claimed_by_another, destroy_worktree};
use crate::auth::UnboundPrincipal;
use crate::domain::Ctx;
use crate::domain::writer::{self, Asking};
use crate::entity::leftover::LeftoverReason;
use crate::error::{Error, Result};
use crate::managed_path::Consent;
use crate::store::{environments as env_store, leftovers as store};

/// A directory berth kept (`GET /workspaces/{id}/leftovers`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Leftover {
    pub id: LeftoverId,
    /// Where it is now.
    pub path: String,
    /// Where it was: the worktree path (the same as `path` for a worktree kept in place).
    pub original_path: String,
    pub reason: LeftoverReason,
    /// What berth found, in words.
    pub detail: String,
    pub repository_id: Option<RepositoryId>,
    /// The task it was kept for; null once that task is gone.
    pub task_id: Option<TaskId>,
    pub task_environment_id: Option<EnvironmentId>,
    /// The node whose disk holds it: a disposal is carried out there (issue 39).
    pub node_id: Option<String>,
    /// Kept since.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// What berth kept on disk in this workspace, oldest first (scope `tasks:read`). A row whose directory is
/// gone (someone removed it) is dropped from the list, by the node whose disk held it only.
pub async fn list(ctx: &Ctx, p: &UnboundPrincipal, workspace_id: WorkspaceId) -> Result<Vec<Leftover>> {
    crate::domain::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let mut out = Vec::new();
    for l in store::of_workspace(&ctx.db.conn, workspace_id).await? {
        // Only the node whose disk holds it can tell that it is gone; others list it as kept.
        let here = l.node_id.as_deref().is_none_or(|n| n == ctx.config.node_id);
        if here && std::fs::symlink_metadata(&l.path).is_err() {
            store::forget(&ctx.db.conn, l.id).await?;
            continue;
        }
        let task_id = match l.task_id {
            Some(id) => crate::store::tasks::find(&ctx.db.conn, id).await?.map(|t| t.id),
            None => None,
        };
        out.push(Leftover {
            id: l.id,
            path: l.path,
            original_path: l.original_path,
            reason: l.reason,
            detail: l.detail,
            repository_id: l.repository_id,
            task_id,
            task_environment_id: l.task_environment_id,
            node_id: l.node_id,
            created_at: l.created_at,
        });
    }
    Ok(out)
}

/// Disposes of a kept directory: what it holds is destroyed, so only with `consent` (I11). A worktree
/// kept in place is removed as a cleanup job would (proved first, never through a symlink, its
/// registration with it); a directory set aside is removed. Refused with `409 conflict` while a live
/// environment names the path again.
pub async fn dispose(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    workspace_id: WorkspaceId,
    id: LeftoverId,
    consent: Option<Consent>,
) -> Result<()> {
    crate::domain::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let l = store::find(&ctx.db.conn, id)
        .await?
        .filter(|l| l.workspace_id == workspace_id)
        .ok_or(Error::NotFound("leftover"))?;
    if let Some(node) = l.node_id.as_deref().filter(|n| *n != ctx.config.node_id) {
        // Forwarded to that node when it is up (`api::forward`); never removed from another disk.
        let state = crate::domain::nodes::state(ctx, node).await?;
        return Err(crate::domain::nodes::unavailable(ctx, node, state));
    }
    let Some(consent) = consent else {
        return Err(Error::invalid(
            "discard_worktree_changes",
            "must be true: disposing of a leftover destroys what it holds",
        ));
    };
    let w: WorktreeSnapshot =
        serde_json::from_value(l.worktree.clone()).map_err(|e| Error::Internal(anyhow!("unreadable leftover: {e}")))?;
    let target = w
        .root(&ctx.config)
        .and_then(|root| root.adopt(Path::new(&l.path)))
        .map_err(|_| Error::InvalidState("the leftover is not inside the worktree root any more".into()))?;
    match l.reason {
        LeftoverReason::SetAside => {
            let path = target.as_path().to_path_buf();
            if std::fs::symlink_metadata(&path).is_ok() {
                let bucket = path.parent().map(Path::to_path_buf);
                blocking(move || {
                    std::fs::remove_dir_all(&path)?;
                    // Its own bucket, when now empty.
                    if let Some(b) = bucket {
                        let _ = std::fs::remove_dir(b);
                    }
                    Ok(())
                })
                .await
                .map_err(|e| Error::Unavailable(format!("removing a leftover failed: {e}")))?;
            }
        }
        LeftoverReason::DirtyWorktree => {
            let env_id = l.task_environment_id.unwrap_or(Uuid::nil().into());
            if claimed_by_another(ctx, env_id, &l.path).await? {
                return Err(Error::InvalidState("an environment works in it again".into()));
            }
            let owner = Owner {
                workspace_id,
                task_id: l.task_id,
                environment_id: l.task_environment_id,
            };
            let mut kept = Vec::new();
            // The one writer of its environment's worktrees while it is removed; its checkpoints (kept
            // with it) go with it.
            let lease = writer::acquire(ctx, env_id, Asking::Cleanup(crate::ids::CleanupJobId::now_v7())).await?;
            let removed = match destroy_worktree(ctx, &w, Some(&consent), Dirty::Fail, owner, &mut kept, &lease).await {
                Outcome::Done | Outcome::DoneKeeping(_) => {
                    let repositories = [w.repository_path.clone()];
                    crate::domain::checkpoints::forget(ctx, env_id, &repositories, &lease).await
                }
                Outcome::Terminal(e) => Err(Error::InvalidState(format!("{e:#}"))),
                other => Err(Error::Unavailable(format!("removing a leftover failed: {other:?}"))),
            };
            writer::release(ctx, lease).await;
            removed?;
            if let Some(env_id) = l.task_environment_id {
                let txn = ctx.db.begin_write().await?;
                env_store::delete_inventory_paths(
                    &txn,
                    env_id,
                    std::slice::from_ref(&l.original_path),
                    crate::clock::now(),
                )
                .await?;
                ctx.commit(txn).await?;
            }
        }
    }
    store::forget(&ctx.db.conn, l.id).await
}
