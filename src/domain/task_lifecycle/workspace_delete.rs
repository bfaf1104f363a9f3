//! Workspace delete: a job per task, then the workspace and everything it owned.
use crate::ids::WorkspaceId;
use serde_json::json;

use super::delete::{keep_dirty, refuse_down_nodes};
use crate::auth::UnboundPrincipal;
use crate::domain::Ctx;
use crate::domain::cleanup::CleanupTrigger;
use crate::domain::cleanup::barrier::{activate, prepare, settle, stop_agents};
use crate::domain::workspaces;
use crate::entity::cleanup_job as job;
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::store::tasks::{self as task_store, lock_task};
use crate::store::workspaces as workspace_store;

pub async fn delete_workspace(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    workspace_id: WorkspaceId,
    confirm_name: Option<&str>,
    keep_dirty_worktrees: bool,
) -> Result<Vec<job::Model>> {
    let ws = workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    if confirm_name != Some(ws.name.as_str()) {
        return Err(Error::BadRequest("confirm_name must equal the workspace's name".into()));
    }
    if !keep_dirty_worktrees {
        // Work on a down node's disk cannot be looked at: refused unless the caller consents to keeping it.
        refuse_down_nodes(ctx, &task_store::of_workspace(&ctx.db.conn, workspace_id).await?).await?;
    }
    let txn = ctx.db.begin_write().await?;
    // The workspace row first: task creation share-locks it and refuses a `deleting` workspace, so the
    // task list read here is complete (no task can escape its job).
    workspace_store::lock(&txn, workspace_id)
        .await?
        .ok_or(Error::NotFound("workspace"))?;
    let tasks = task_store::of_workspace(&txn, workspace_id).await?;
    let mut jobs = Vec::new();
    for t in &tasks {
        let t = lock_task(&txn, t.id).await?;
        let mut j = prepare(&txn, ctx, &t, CleanupTrigger::WorkspaceDelete, None).await?;
        if keep_dirty_worktrees {
            keep_dirty(&txn, &mut j).await?;
        }
        jobs.push(j);
    }
    workspace_store::mark_deleting(&txn, workspace_id, crate::clock::now()).await?;
    ctx.commit(txn).await?;
    // I8, as for a task delete: an agent that did not stop refuses the delete, which changes nothing.
    let stopped = stop_agents(ctx, &jobs).await;
    if stopped.is_err() {
        let reopened = async {
            let txn = ctx.db.begin_write().await?;
            workspace_store::mark_active(&txn, workspace_id, crate::clock::now()).await?;
            ctx.commit(txn).await
        }
        .await;
        if let Err(e) = reopened {
            tracing::warn!(workspace = %workspace_id, error = %e, "could not reopen a workspace whose delete was refused");
        }
        settle(ctx, &jobs, stopped).await?;
    }
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        workspace_store::delete(&txn, workspace_id).await?;
        events::append(
            &txn,
            ctx.instance_id,
            EventType::WorkspaceDeleted,
            Subject::workspace(workspace_id),
            json!({ "tasks": tasks.len() }),
        )
        .await?;
        activate(&txn, ctx, &mut jobs).await?;
        ctx.commit(txn).await
    }
    .await;
    settle(ctx, &jobs, result).await?;
    Ok(jobs)
}
