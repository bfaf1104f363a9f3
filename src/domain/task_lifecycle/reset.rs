//! Environment reset: the current environment is superseded and a job removes its resources.
use crate::ids::TaskId;
use serde_json::json;

use super::delete::{Checked, dirty_worktrees};
use crate::auth::UnboundPrincipal;
use crate::domain::Ctx;
use crate::domain::cleanup::CleanupTrigger;
use crate::domain::cleanup::barrier::{activate, prepare, settle};
use crate::domain::{environments, tasks};
use crate::entity::cleanup_job as job;
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::managed_path::Consent;
use crate::store::tasks::{lock_task, owner_of};
use crate::store::{environments as env_store, sessions as sessions_store};

/// Destroys the current environment's resources through a job, so the next session (or the next launch
/// or resume of an old one) materializes afresh. Worktrees holding changes are refused with `409
/// task_delete_dirty_worktree` before anything changes, unless `consent` (the request's explicit
/// `discard_worktree_changes=true`, I11) is given; consent is recorded in the job's snapshot.
pub async fn reset_environment(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    task_id: TaskId,
    consent: Option<Consent>,
) -> Result<job::Model> {
    let t = tasks::readable(&ctx.db.conn, p, task_id).await?;
    if t.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let owner = owner_of(&ctx.db.conn, &t).await?;
    if consent.is_none() {
        // I11 for a reset, before anything changes (outside the write transaction: git runs). A worktree
        // that turns dirty after this ends the job `failed` without removing it.
        let dirty = dirty_worktrees(ctx, std::slice::from_ref(&owner), Checked::Current).await?;
        if !dirty.is_empty() {
            return Err(Error::TaskDeleteDirtyWorktree(dirty));
        }
    }
    let txn = ctx.db.begin_write().await?;
    let owner = lock_task(&txn, owner.id).await?;
    let current = environments::current(&txn, owner.id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    let users = sessions_store::in_environment(&txn, current.id).await?;
    if users.iter().any(|s| s.state.is_busy() || ctx.runtime.is_live(s.id)) {
        return Err(Error::SessionBusy);
    }
    let mut jobs = vec![prepare(&txn, ctx, &owner, CleanupTrigger::EnvironmentReset, consent.as_ref()).await?];
    ctx.commit(txn).await?;
    let result: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        env_store::mark_superseded(&txn, current.id, crate::clock::now()).await?;
        let subject = Subject {
            task_environment_id: Some(current.id),
            ..Subject::task(owner.workspace_id, owner.id)
        };
        events::append(
            &txn,
            ctx.instance_id,
            EventType::EnvironmentReset,
            subject,
            json!({ "cleanup_job_id": jobs[0].id }),
        )
        .await?;
        activate(&txn, ctx, &mut jobs).await?;
        ctx.commit(txn).await
    }
    .await;
    settle(ctx, &jobs, result).await?;
    Ok(jobs.remove(0))
}
