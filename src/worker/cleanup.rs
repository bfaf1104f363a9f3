//! The cleanup worker (decision 3, I9): claims due jobs of this node in a short transaction (`FOR UPDATE
//! SKIP LOCKED` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite), runs them outside any transaction under a
//! lease kept alive by a heartbeat, and records the result only while it still holds the lease. An
//! expired lease is rescued by any worker of the node. What a job destroys is `domain::cleanup::execute`.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use uuid::Uuid;

use crate::domain::Ctx;
use crate::domain::cleanup::barrier::reconcile_prepared;
use crate::domain::cleanup::execute::{self, Outcome};
use crate::domain::cleanup::reconcile::reconcile_superseded;
use crate::domain::cleanup::state::{JobEvent, transition};
use crate::entity::cleanup_job::{self as job, CleanupJobState};
use crate::error::{Error, Result};
use crate::store::cleanup_jobs::{self as store, JobPatch, LeaseGuard};

/// The claim's query, reachable by the benches and tests.
pub use crate::store::cleanup_jobs::next_claimable;

/// One worker, forever.
pub async fn run(ctx: Ctx, index: usize) {
    let owner = format!("{}/{}/{index}", ctx.config.node_id, ctx.instance_id);
    let mut reconciled: Option<std::time::Instant> = None;
    let mut swept: Option<std::time::Instant> = None;
    loop {
        // One worker per process looks for superseded environments' leftovers, slowly.
        if index == 0 && swept.is_none_or(|at| at.elapsed() >= ctx.config.sweep_interval) {
            if let Err(e) = reconcile_superseded(&ctx).await {
                tracing::warn!(error = %chain(e), "reconciling superseded environments failed");
            }
            swept = Some(std::time::Instant::now());
        }
        // Prepared jobs are reconciled only after a grace of minutes: once per poll interval is enough,
        // and a busy worker does not pay a query per job for it (35% -> see BENCHMARKS.md).
        if reconciled.is_none_or(|at| at.elapsed() >= ctx.config.cleanup_poll) {
            if let Err(e) = reconcile_prepared(&ctx).await {
                tracing::warn!(error = %chain(e), "reconciling prepared cleanup jobs failed");
            }
            reconciled = Some(std::time::Instant::now());
        }
        match claim(&ctx, &owner).await {
            // Finished inside the claim: nothing physical was left to do.
            Ok(Some(j)) if j.state != CleanupJobState::Running => {}
            Ok(Some(j)) => process(&ctx, &owner, j).await,
            Ok(None) => {
                let _ = tokio::time::timeout(ctx.config.cleanup_poll, ctx.cleanup_wake.notified()).await;
            }
            Err(e) => {
                tracing::warn!(error = %chain(e), "claiming a cleanup job failed");
                tokio::time::sleep(ctx.config.cleanup_poll).await;
            }
        }
    }
}

/// An error with its whole source chain, for the log.
pub(crate) fn chain(e: impl Into<anyhow::Error>) -> String {
    format!("{:#}", e.into())
}

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
fn job_actor(j: &job::Model) -> Option<crate::actor::Actor> {
    crate::actor::Actor::of(j.actor_sub.clone(), j.actor_session_id)
}

async fn process(ctx: &Ctx, owner: &str, j: job::Model) {
    crate::actor::within(job_actor(&j), process_job(ctx, owner, j)).await
}

async fn process_job(ctx: &Ctx, owner: &str, j: job::Model) {
    if ctx.config.cleanup_failpoint.as_deref() == Some("hang_after_claim") {
        // A test failpoint: behave like a process that died holding the lease.
        std::future::pending::<()>().await;
    }
    let lost = Arc::new(AtomicBool::new(false));
    let heartbeat = tokio::spawn(heartbeat(
        ctx.clone(),
        owner.to_string(),
        j.id,
        j.attempts,
        lost.clone(),
    ))
    .abort_handle();
    let outcome = execute::execute(ctx, &j, &lost).await;
    heartbeat.abort();
    if let Err(e) = record(ctx, owner, &j, outcome).await {
        tracing::warn!(job = %j.id, error = %chain(e), "could not record a cleanup result; the lease will expire and the job run again");
    }
}

async fn heartbeat(ctx: Ctx, owner: String, id: Uuid, attempts: i32, lost: Arc<AtomicBool>) {
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
            Err(e) => tracing::warn!(job = %id, error = %chain(e), "cleanup heartbeat failed; retrying"),
        }
    }
}

/// Compare-and-set on owner and attempt: a worker whose lease was taken (or whose job was cancelled)
/// records nothing.
async fn record(ctx: &Ctx, owner: &str, j: &job::Model, outcome: Outcome) -> Result<()> {
    let (event, patch) = execute::record_of(ctx, j, outcome);
    let guard = LeaseGuard {
        owner,
        attempts: j.attempts,
    };
    let txn = ctx.db.begin_write().await?;
    transition(&txn, ctx, j, event, Some(guard), patch).await?;
    ctx.commit(txn).await
}

/// Starts the configured number of workers.
pub fn start(ctx: &Ctx) -> Vec<tokio::task::AbortHandle> {
    (0..ctx.config.cleanup_workers)
        .map(|i| tokio::spawn(run(ctx.clone(), i)).abort_handle())
        .collect()
}
