//! Materializations a crash abandoned are taken over (I14).
use super::lease::lease;
use crate::domain::Ctx;
use crate::entity::task_environment as env;
use crate::error::Result;
use crate::store::environments as store;
use crate::store::tasks::ensure_no_cleanup;

/// Materializations this node abandoned (the process died mid-way: `creating`, lease expired) are taken
/// over for tasks that still want them, so a worktree git finished after the crash is adopted into the
/// inventory instead of lying on disk unrecorded. Tasks being cleaned up are left to their job, whose
/// snapshot names the planned paths. Run at startup and by the sweep.
pub async fn recover_abandoned(ctx: &Ctx) -> Result<usize> {
    let before = crate::clock::now() - lease(ctx);
    let stale = store::creating_untouched_since(&ctx.db.conn, &ctx.config.node_id, before).await?;
    let mut recovered = 0;
    for e in stale {
        if take_over(ctx, &e).await? {
            recovered += 1;
        }
    }
    Ok(recovered)
}

/// Re-materializes an abandoned environment's task, unless it was archived or is being cleaned up.
async fn take_over(ctx: &Ctx, e: &env::Model) -> Result<bool> {
    let Some(owner) = crate::store::tasks::find(&ctx.db.conn, e.task_id).await? else {
        return Ok(false);
    };
    if owner.archived_at.is_some() || ensure_no_cleanup(&ctx.db.conn, &[owner.id]).await.is_err() {
        return Ok(false);
    }
    match super::ensure_ready(ctx, &owner, e.executor_type).await {
        Ok(_) => Ok(true),
        Err(err) => {
            tracing::warn!(environment = %e.id, error = %err, "could not take over an abandoned materialization");
            Ok(false)
        }
    }
}
