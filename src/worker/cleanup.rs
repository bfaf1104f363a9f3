//! The cleanup worker (decision 3, I9): claims due jobs of this node (`domain::cleanup::claim`), runs
//! them outside any transaction under a lease kept alive by a heartbeat, and records the result only
//! while it still holds the lease. An expired lease is rescued by any worker of the node. What a job
//! destroys is `domain::cleanup::execute`.
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::domain::Ctx;
use crate::domain::cleanup::CleanupJobState;
use crate::domain::cleanup::barrier::reconcile_prepared;
use crate::domain::cleanup::claim::{CleanupJob, claim, job_actor, keep_lease, record};
use crate::domain::cleanup::execute;
use crate::domain::cleanup::reconcile::reconcile_superseded;

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

async fn process(ctx: &Ctx, owner: &str, j: CleanupJob) {
    crate::actor::within(job_actor(&j), process_job(ctx, owner, j)).await
}

async fn process_job(ctx: &Ctx, owner: &str, j: CleanupJob) {
    if ctx.config.cleanup_failpoint.as_deref() == Some("hang_after_claim") {
        // A test failpoint: behave like a process that died holding the lease.
        std::future::pending::<()>().await;
    }
    let lost = Arc::new(AtomicBool::new(false));
    let heartbeat = tokio::spawn(keep_lease(
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

/// Starts the configured number of workers.
pub fn start(ctx: &Ctx) -> Vec<tokio::task::AbortHandle> {
    (0..ctx.config.cleanup_workers)
        .map(|i| tokio::spawn(run(ctx.clone(), i)).abort_handle())
        .collect()
}
