//! The cleanup worker (decision 3, I9): claims due jobs of this node in a short transaction (`FOR UPDATE
//! SKIP LOCKED` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite), runs them outside any transaction under a
//! lease kept alive by a heartbeat, and records the result only while it still holds the lease. An
//! expired lease is rescued by any worker of the node.
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sea_orm::sea_query::{Expr, LockBehavior, LockType};
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use crate::domain::Ctx;
use crate::domain::cleanup::{self, Snapshot, WorktreeSnapshot};
use crate::entity::cleanup_job as job;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::entity::task_environment_repo::{self as env_repo, EnvironmentRepoStatus};
use crate::entity::task_session::{self as session, SessionState};
use crate::managed_path::ManagedRoot;

enum Outcome {
    Done,
    /// The reason for the job went away (the task was unarchived): nothing was removed.
    Cancelled(String),
    /// Worth another attempt later.
    Retry(String),
    /// Retrying cannot help (for example a dirty worktree without consent): fail now, touch nothing.
    Terminal(String),
}

/// One worker, forever.
pub async fn run(ctx: Ctx, index: usize) {
    let owner = format!("{}/{}/{index}", ctx.config.node_id, ctx.instance_id);
    let mut reconciled: Option<std::time::Instant> = None;
    loop {
        // Prepared jobs are reconciled only after a grace of minutes: once per poll interval is enough,
        // and a busy worker does not pay a query per job for it (issue 9: 35% -> see BENCHMARKS.md).
        if reconciled.is_none_or(|at| at.elapsed() >= ctx.config.cleanup_poll) {
            if let Err(e) = reconcile_prepared(&ctx).await {
                tracing::warn!(error = %e, "reconciling prepared cleanup jobs failed");
            }
            reconciled = Some(std::time::Instant::now());
        }
        match claim(&ctx, &owner).await {
            // Finished inside the claim: nothing physical was left to do.
            Ok(Some(j)) if j.state != "running" => {}
            Ok(Some(j)) => process(&ctx, &owner, j).await,
            Ok(None) => {
                let _ = tokio::time::timeout(ctx.config.cleanup_poll, ctx.cleanup_wake.notified()).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "claiming a cleanup job failed");
                tokio::time::sleep(ctx.config.cleanup_poll).await;
            }
        }
    }
}

/// Claims one due (or abandoned) job of this node: `running`, attempts + 1, our lease.
pub async fn claim(ctx: &Ctx, owner: &str) -> Result<Option<job::Model>, sea_orm::DbErr> {
    let now = crate::clock::now();
    let txn = ctx.db.begin_write().await?;
    let found = next_claimable(&txn, &ctx.config.node_id, now).await?;
    let Some(found) = found else {
        txn.rollback().await?;
        return Ok(None);
    };
    let lease = chrono::Duration::from_std(ctx.config.cleanup_lease).unwrap_or(chrono::Duration::minutes(5));
    let claimed = if nothing_to_do(&found) {
        // No process to stop and no environment to remove: the job is done in the claim's own
        // transaction (atomic, so no lease is needed), one commit and one event instead of two.
        job::Model {
            state: "succeeded".into(),
            attempts: found.attempts + 1,
            lease_owner: None,
            lease_expires_at: None,
            next_attempt_at: None,
            last_error: None,
            completed_at: Some(now),
            updated_at: now,
            ..found.clone()
        }
    } else {
        job::Model {
            state: "running".into(),
            attempts: found.attempts + 1,
            lease_owner: Some(owner.to_string()),
            lease_expires_at: Some(now + lease),
            updated_at: now,
            ..found.clone()
        }
    };
    job::Entity::update(job::ActiveModel {
        id: Set(claimed.id),
        state: Set(claimed.state.clone()),
        attempts: Set(claimed.attempts),
        lease_owner: Set(claimed.lease_owner.clone()),
        lease_expires_at: Set(claimed.lease_expires_at),
        next_attempt_at: Set(claimed.next_attempt_at),
        last_error: Set(claimed.last_error.clone()),
        completed_at: Set(claimed.completed_at),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(&txn)
    .await?;
    cleanup::job_event(&txn, ctx, &claimed)
        .await
        .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
    txn.commit().await?;
    ctx.events.wake();
    let due_at = found.next_attempt_at.or(found.lease_expires_at).unwrap_or(now);
    ctx.cleanup_stats.claims.fetch_add(1, Ordering::Relaxed);
    ctx.cleanup_stats
        .claim_latency_ms
        .fetch_add((now - due_at).num_milliseconds().max(0) as u64, Ordering::Relaxed);
    Ok(Some(claimed))
}

/// The next job this node may claim, locked (SKIP LOCKED on PostgreSQL): one whose worker died (lease
/// expired) first, else the longest-due pending one. Each is one probe of a partial index (migration
/// m20261129_000002), so a claim costs the same with 10 or 10,000 jobs waiting.
pub async fn next_claimable(
    txn: &sea_orm::DatabaseTransaction,
    node_id: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Option<job::Model>, sea_orm::DbErr> {
    let abandoned = job::Entity::find()
        .filter(job::Column::NodeId.eq(node_id))
        .filter(job::Column::State.eq("running"))
        .filter(job::Column::LeaseExpiresAt.lt(now))
        .order_by_asc(job::Column::LeaseExpiresAt)
        .limit(1)
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .one(txn)
        .await?;
    if abandoned.is_some() {
        return Ok(abandoned);
    }
    job::Entity::find()
        .filter(job::Column::NodeId.eq(node_id))
        .filter(job::Column::State.is_in(["pending", "retry_wait"]))
        .filter(job::Column::NextAttemptAt.lte(now))
        .order_by_asc(job::Column::NextAttemptAt)
        .limit(1)
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .one(txn)
        .await
}

/// A job whose snapshot holds no session and no environment, and whose trigger needs no re-check
/// (archive jobs first check that the task is still archived): executing it would change nothing.
fn nothing_to_do(j: &job::Model) -> bool {
    !matches!(j.trigger.as_str(), "archive" | "cascade_archive")
        && cleanup::snapshot_of(j).is_ok_and(|s| s.environment.is_none() && s.sessions.is_empty())
}

async fn process(ctx: &Ctx, owner: &str, j: job::Model) {
    if ctx.config.cleanup_failpoint.as_deref() == Some("hang_after_claim") {
        // A test failpoint: behave like a process that died holding the lease.
        std::future::pending::<()>().await;
    }
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let heartbeat = tokio::spawn(heartbeat(
        ctx.clone(),
        owner.to_string(),
        j.id,
        j.attempts,
        lost.clone(),
    ))
    .abort_handle();
    let outcome = execute(ctx, &j, &lost).await;
    heartbeat.abort();
    if let Err(e) = record(ctx, owner, &j, outcome).await {
        tracing::warn!(job = %j.id, error = %e, "could not record a cleanup result; the lease will expire and the job run again");
    }
}

async fn heartbeat(ctx: Ctx, owner: String, id: Uuid, attempts: i32, lost: Arc<std::sync::atomic::AtomicBool>) {
    let every = (ctx.config.cleanup_lease / 3).max(Duration::from_millis(100));
    let lease = chrono::Duration::from_std(ctx.config.cleanup_lease).unwrap_or(chrono::Duration::minutes(5));
    loop {
        tokio::time::sleep(every).await;
        let res = job::Entity::update_many()
            .col_expr(
                job::Column::LeaseExpiresAt,
                Expr::value(Some(crate::clock::now() + lease)),
            )
            .filter(job::Column::Id.eq(id))
            .filter(job::Column::LeaseOwner.eq(owner.clone()))
            .filter(job::Column::Attempts.eq(attempts))
            .filter(job::Column::State.eq("running"))
            .exec(&ctx.db.conn)
            .await;
        match res {
            Ok(r) if r.rows_affected == 1 => {}
            // Taken over, or cancelled: stop before touching anything else.
            Ok(_) => {
                lost.store(true, Ordering::Release);
                return;
            }
            // A passing database error: try again at the next beat (the lease has slack for it).
            Err(e) => tracing::warn!(job = %id, error = %e, "cleanup heartbeat failed; retrying"),
        }
    }
}

/// Compare-and-set on owner and attempt: a worker whose lease was taken (or whose job was cancelled)
/// records nothing.
async fn record(ctx: &Ctx, owner: &str, j: &job::Model, outcome: Outcome) -> Result<(), sea_orm::DbErr> {
    let now = crate::clock::now();
    let (state, error, next) = match outcome {
        Outcome::Done => ("succeeded", None, None),
        Outcome::Cancelled(why) => ("cancelled", Some(why), None),
        Outcome::Terminal(e) => ("failed", Some(e), None),
        Outcome::Retry(e) if j.attempts >= j.max_attempts => ("failed", Some(e), None),
        Outcome::Retry(e) => {
            let delays = &ctx.config.cleanup_retry_delays;
            let delay = delays[((j.attempts - 1).max(0) as usize).min(delays.len() - 1)];
            (
                "retry_wait",
                Some(e),
                Some(now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::hours(1))),
            )
        }
    };
    let txn = ctx.db.begin_write().await?;
    let res = job::Entity::update_many()
        .col_expr(job::Column::State, Expr::value(state))
        .col_expr(job::Column::LastError, Expr::value(error.clone()))
        .col_expr(job::Column::NextAttemptAt, Expr::value(next))
        .col_expr(job::Column::LeaseOwner, Expr::value(Option::<String>::None))
        .col_expr(
            job::Column::LeaseExpiresAt,
            Expr::value(Option::<chrono::DateTime<chrono::Utc>>::None),
        )
        .col_expr(job::Column::UpdatedAt, Expr::value(now))
        .col_expr(
            job::Column::CompletedAt,
            Expr::value(matches!(state, "succeeded" | "failed").then_some(now)),
        )
        .filter(job::Column::Id.eq(j.id))
        .filter(job::Column::LeaseOwner.eq(owner))
        .filter(job::Column::Attempts.eq(j.attempts))
        .filter(job::Column::State.eq("running"))
        .exec(&txn)
        .await?;
    if res.rows_affected == 1 {
        let updated = job::Model {
            state: state.into(),
            last_error: error,
            next_attempt_at: next,
            ..j.clone()
        };
        cleanup::job_event(&txn, ctx, &updated)
            .await
            .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
    }
    txn.commit().await?;
    ctx.events.wake();
    Ok(())
}

/// Runs a job from its snapshot (the task row may be gone).
async fn execute(ctx: &Ctx, j: &job::Model, lost: &std::sync::atomic::AtomicBool) -> Outcome {
    let snap: Snapshot = match cleanup::snapshot_of(j) {
        Ok(s) => s,
        Err(e) => return Outcome::Terminal(e.to_string()),
    };
    if matches!(j.trigger.as_str(), "archive" | "cascade_archive") {
        match task::Entity::find_by_id(snap.task_id).one(&ctx.db.conn).await {
            Ok(Some(t)) if t.archived_at.is_none() => return Outcome::Cancelled("the task was unarchived".into()),
            Ok(_) => {}
            Err(e) => return Outcome::Retry(e.to_string()),
        }
    }
    // I8: processes first.
    for s in &snap.sessions {
        ctx.runtime.stop(*s).await;
    }
    let Some(env_snap) = &snap.environment else {
        return Outcome::Done;
    };
    match env::Entity::find_by_id(env_snap.id).one(&ctx.db.conn).await {
        // Still being materialized: its publish will meet the barrier and remove what it made; wait.
        // Abandoned by a crash (lease expired): nobody will publish it; its planned paths are in the snapshot.
        Ok(Some(e)) if crate::domain::environments::is_fresh_creating(ctx, &e) => {
            return Outcome::Retry("the environment is still being prepared".into());
        }
        Ok(_) => {}
        Err(e) => return Outcome::Retry(e.to_string()),
    }
    match shared_elsewhere(ctx, &snap, env_snap.id).await {
        Ok(true) => return Outcome::Done,
        Ok(false) => {}
        Err(e) => return Outcome::Retry(e.to_string()),
    }
    let root = ManagedRoot::from_config(&ctx.config);
    for w in &env_snap.worktrees {
        if lost.load(Ordering::Acquire) {
            return Outcome::Retry("the lease was lost".into());
        }
        // A path that another environment's inventory now names (it adopted it) is not this job's.
        match claimed_by_another(ctx, env_snap.id, &w.worktree_path).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => return Outcome::Retry(e.to_string()),
        }
        match destroy_worktree(ctx, &root, w, snap.discard_worktree_changes).await {
            Outcome::Done => {}
            other => return other,
        }
    }
    if !env_snap.task_root.is_empty()
        && let Ok(dir) = root.adopt(Path::new(&env_snap.task_root))
    {
        // Only if empty: berth never removes what the inventory does not name (I13).
        let _ = std::fs::remove_dir(dir.as_path());
    }
    match retire_environment(ctx, &snap, env_snap.id).await {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Retry(e.to_string()),
    }
}

async fn claimed_by_another(ctx: &Ctx, env_id: Uuid, path: &str) -> Result<bool, sea_orm::DbErr> {
    let rows = env_repo::Entity::find()
        .filter(env_repo::Column::WorktreePath.eq(path))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .filter(env_repo::Column::TaskEnvironmentId.ne(env_id))
        .all(&ctx.db.conn)
        .await?;
    for r in rows {
        let live = env::Entity::find_by_id(r.task_environment_id)
            .one(&ctx.db.conn)
            .await?
            .is_some_and(|e| e.status != EnvironmentStatus::Superseded);
        if live {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Re-checked at destruction time (I8): the environment was transferred to another task, or a live task
/// still works in it.
async fn shared_elsewhere(ctx: &Ctx, snap: &Snapshot, env_id: Uuid) -> Result<bool, sea_orm::DbErr> {
    let Some(e) = env::Entity::find_by_id(env_id).one(&ctx.db.conn).await? else {
        return Ok(false);
    };
    if e.task_id != snap.task_id {
        return Ok(true);
    }
    let heirs = crate::store::tasks::live_inheritors(&ctx.db.conn, snap.task_id)
        .await
        .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
    if !heirs.is_empty() {
        return Ok(true);
    }
    let borrowers = session::Entity::find()
        .filter(session::Column::TaskEnvironmentId.eq(env_id))
        .filter(session::Column::TaskId.ne(snap.task_id))
        .filter(session::Column::State.is_not_in([
            SessionState::Stopped,
            SessionState::Failed,
            SessionState::Cancelled,
        ]))
        .all(&ctx.db.conn)
        .await?;
    for b in borrowers {
        if task::Entity::find_by_id(b.task_id)
            .one(&ctx.db.conn)
            .await?
            .is_some_and(|t| t.archived_at.is_none())
        {
            return Ok(true);
        }
    }
    Ok(false)
}

async fn destroy_worktree(ctx: &Ctx, root: &ManagedRoot, w: &WorktreeSnapshot, consent: bool) -> Outcome {
    // I13: only inside the managed root, never through a symlink.
    let target = match root.adopt(Path::new(&w.worktree_path)) {
        Ok(t) => t,
        Err(e) => {
            return Outcome::Terminal(format!("refusing a worktree path outside the managed root: {e}"));
        }
    };
    let repo = Path::new(&w.repository_path);
    let meta = std::fs::symlink_metadata(target.as_path());
    if meta.is_err() {
        // Already gone counts as done; forget its registration if the repository is still there.
        if repo.is_dir() {
            let _ = ctx.git.worktree_prune(repo).await;
        }
        return Outcome::Done;
    }
    if meta.is_ok_and(|m| m.file_type().is_symlink()) {
        return Outcome::Terminal("the worktree path is a symlink; not following it".into());
    }
    let dirty = match ctx.git.dirty_file_count(target.as_path()).await {
        Ok(n) => n,
        Err(e) => return Outcome::Retry(e.to_string()),
    };
    if dirty > 0 && !consent {
        return Outcome::Terminal(format!(
            "the worktree of repository {} has {dirty} changed files and removing them was not consented to",
            w.repository_id
        ));
    }
    let removed = if dirty > 0 {
        ctx.git.worktree_remove_consented(repo, &target).await
    } else {
        ctx.git.worktree_remove(repo, &target).await
    };
    if let Err(e) = removed {
        // Exit code 128 is not proof of anything: look.
        if std::fs::symlink_metadata(target.as_path()).is_err() {
            let _ = ctx.git.worktree_prune(repo).await;
            return Outcome::Done;
        }
        return Outcome::Retry(e.to_string());
    }
    let _ = ctx.git.worktree_prune(repo).await;
    Outcome::Done
}

/// After destruction: the inventory rows are `deleted` and the environment superseded, if it still
/// belongs to the job's task.
async fn retire_environment(ctx: &Ctx, snap: &Snapshot, env_id: Uuid) -> Result<(), sea_orm::DbErr> {
    let now = crate::clock::now();
    let txn = ctx.db.begin_write().await?;
    let Some(e) = env::Entity::find_by_id(env_id).one(&txn).await? else {
        txn.rollback().await?;
        return Ok(());
    };
    if e.task_id != snap.task_id {
        txn.rollback().await?;
        return Ok(());
    }
    env_repo::Entity::update_many()
        .col_expr(env_repo::Column::Status, Expr::value(EnvironmentRepoStatus::Deleted))
        .col_expr(env_repo::Column::DeletedAt, Expr::value(Some(now)))
        .col_expr(env_repo::Column::UpdatedAt, Expr::value(now))
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .exec(&txn)
        .await?;
    // The environment still belongs to the job's task, so the task row is there (it cascades).
    if e.status != EnvironmentStatus::Superseded
        && let Some(t) = task::Entity::find_by_id(snap.task_id).one(&txn).await?
    {
        crate::domain::environments::supersede(&txn, ctx, &t, env_id, "cleanup")
            .await
            .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
    }
    txn.commit().await?;
    ctx.events.wake();
    Ok(())
}

/// I6: a `prepared` job whose operation crashed is activated if its mutation committed, else cancelled.
pub async fn reconcile_prepared(ctx: &Ctx) -> Result<(), sea_orm::DbErr> {
    let grace = chrono::Duration::from_std(ctx.config.cleanup_prepared_grace).unwrap_or(chrono::Duration::minutes(1));
    let stale = job::Entity::find()
        .filter(job::Column::State.eq("prepared"))
        .filter(job::Column::CreatedAt.lt(crate::clock::now() - grace))
        .all(&ctx.db.conn)
        .await?;
    for j in stale {
        let task_row = task::Entity::find_by_id(j.task_id).one(&ctx.db.conn).await?;
        let committed = match j.trigger.as_str() {
            "archive" | "cascade_archive" => task_row.as_ref().is_some_and(|t| t.archived_at.is_some()),
            "environment_reset" => match j.task_environment_id {
                Some(id) => env::Entity::find_by_id(id)
                    .one(&ctx.db.conn)
                    .await?
                    .is_none_or(|e| e.status == EnvironmentStatus::Superseded),
                None => true,
            },
            _ => task_row.is_none(),
        };
        let now = crate::clock::now();
        let (state, next) = if committed {
            ("pending", Some(now))
        } else {
            ("cancelled", None)
        };
        let txn = ctx.db.begin_write().await?;
        let res = job::Entity::update_many()
            .col_expr(job::Column::State, Expr::value(state))
            .col_expr(job::Column::NextAttemptAt, Expr::value(next))
            .col_expr(job::Column::UpdatedAt, Expr::value(now))
            .filter(job::Column::Id.eq(j.id))
            .filter(job::Column::State.eq("prepared"))
            .exec(&txn)
            .await?;
        if res.rows_affected == 1 {
            cleanup::job_event(
                &txn,
                ctx,
                &job::Model {
                    state: state.into(),
                    ..j.clone()
                },
            )
            .await
            .map_err(|e| sea_orm::DbErr::Custom(e.to_string()))?;
            tracing::info!(job = %j.id, state, "reconciled a prepared cleanup job");
        }
        txn.commit().await?;
    }
    Ok(())
}

/// Starts the configured number of workers.
pub fn start(ctx: &Ctx) -> Vec<tokio::task::AbortHandle> {
    (0..ctx.config.cleanup_workers)
        .map(|i| tokio::spawn(run(ctx.clone(), i)).abort_handle())
        .collect()
}
