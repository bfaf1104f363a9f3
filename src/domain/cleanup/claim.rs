//! Claiming a cleanup job and recording its run (decision 3, I9): the claim is a short transaction
//! (`FOR UPDATE SKIP LOCKED` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite) that moves one due (or
//! abandoned) job of this node to `running` under a lease; the heartbeat keeps the lease; the result is
//! recorded only while the lease is still ours. The worker (`worker::cleanup`) calls these.
use crate::ids::CleanupJobId;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::execute::{self, Outcome};
use super::state::{JobEvent, transition};
use crate::domain::Ctx;
use crate::entity::cleanup_job as job;
use crate::error::{Error, Result};
use crate::store::cleanup_jobs::{self as store, JobPatch, LeaseGuard, next_claimable};

/// A cleanup job as its row holds it.
pub type CleanupJob = job::Model;

/// Claims one due (or abandoned) job of this node: `running`, attempts + 1, our lease.
pub async fn claim(ctx: &Ctx, owner: &str) -> Result<Option<job::Model>> {
    let now = crate::clock::now();
    let txn = ctx.db.begin_write().await?;
    let Some(found) = next_claimable(&txn, &ctx.config.node_id, now).await? else {
        txn.rollback().await?;
        return Ok(None);
    };
    let lease = chrono::Duration::from_std(ctx.config.cleanup_lease).unwrap_or(chrono::Duration::minutes(5));
    let (event, patch) = if execute::nothing_to_do(&found) {
        // No process to stop and no environment to remove: the job is done in the claim's own
        // transaction (atomic, so no lease is needed), one commit and one event instead of two.
        let patch = JobPatch {
            attempts: Some(found.attempts + 1),
            lease_owner: Some(None),
            lease_expires_at: Some(None),
            next_attempt_at: Some(None),
            last_error: Some(None),
            completed_at: Some(Some(now)),
        };
        (JobEvent::ClaimNothingToDo, patch)
    } else {
        let patch = JobPatch {
            attempts: Some(found.attempts + 1),
            lease_owner: Some(Some(owner.to_string())),
            lease_expires_at: Some(Some(now + lease)),
            ..Default::default()
        };
        (JobEvent::Claim, patch)
    };
    // The row is locked (or the SQLite writer lock held), so the compare-and-set cannot miss. Its event, like
    // every event of the job's run, is on behalf of whoever asked for the job.
    let claimed = crate::actor::within(job_actor(&found), transition(&txn, ctx, &found, event, None, patch))
        .await?
        .ok_or_else(|| Error::Stale("a claimed cleanup job changed under its lock".into()))?;
    // A claim need not survive a database crash: losing it leaves the job due again, which is the state a
    // worker killed right after its claim leaves too, once its lease expires; the job then runs again, as
    // every interrupted job does (it destroys only what is still there). Nothing else reads it durably
    // first: its event is delivered only after its stamp, a flushed commit later in the log; the run's
    // result is recorded by a flushed commit. So the claim does not wait for the flush.
    crate::store::Db::unflushed(&txn).await?;
    ctx.commit(txn).await?;
    let due_at = found.next_attempt_at.or(found.lease_expires_at).unwrap_or(now);
    ctx.metrics.cleanup_claimed((now - due_at).to_std().unwrap_or_default());
    Ok(Some(claimed))
}

/// Who asked for the job: its run acts for them.
pub fn job_actor(j: &job::Model) -> Option<crate::actor::Actor> {
    crate::actor::Actor::of(j.actor_sub.clone(), j.actor_session_id)
}

/// The heartbeat of a running job: extends its lease every third of it; sets `lost` and stops when the
/// lease was taken over or the job cancelled.
pub async fn keep_lease(ctx: Ctx, owner: String, id: CleanupJobId, attempts: i32, lost: Arc<AtomicBool>) {
    let every = (ctx.config.cleanup_lease / 3).max(Duration::from_millis(100));
    let lease = chrono::Duration::from_std(ctx.config.cleanup_lease).unwrap_or(chrono::Duration::minutes(5));
    let guard = LeaseGuard {
        owner: &owner,
        attempts,
    };
    loop {
        tokio::time::sleep(every).await;
        match store::extend_lease(&ctx.db.conn, id, guard, crate::clock::now() + lease).await {
            Ok(true) => {}
            // Taken over, or cancelled: stop before touching anything else.
            Ok(false) => {
                lost.store(true, Ordering::Release);
                return;
            }
            // A passing database error: try again at the next beat (the lease has slack for it).
            Err(e) => {
                tracing::warn!(job = %id, error = %crate::error::with_causes(&e), "cleanup heartbeat failed; retrying")
            }
        }
    }
}

/// Compare-and-set on owner and attempt: a worker whose lease was taken (or whose job was cancelled)
/// records nothing.
pub async fn record(ctx: &Ctx, owner: &str, j: &job::Model, outcome: Outcome) -> Result<()> {
    let (event, patch) = execute::record_of(ctx, j, outcome);
    let guard = LeaseGuard {
        owner,
        attempts: j.attempts,
    };
    let txn = ctx.db.begin_write().await?;
    transition(&txn, ctx, j, event, Some(guard), patch).await?;
    ctx.commit(txn).await
}
