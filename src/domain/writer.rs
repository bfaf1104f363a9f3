//! One writer at a time per environment. Everything that changes an environment's worktrees (files,
//! the checkout, berth's refs in its repositories) holds the environment's writer lease while it does:
//! an agent for its whole turn (from the prompt's delivery until the turn settled, `attention`
//! included), a restore, a commit, a merge that moves a checkout, the turn checkpoints, and every
//! cleanup before it touches a path. The lease is a row (`writer_leases`), taken by compare-and-set, on
//! both databases; it records the node and instance that hold it and lapses with that instance's lease.
//!
//! The functions that write take a `WriterLease`, which only `acquire` (and `resume_turn`, for the turn
//! that already holds one) makes: a path that writes a worktree without holding the lease does not
//! compile (the architecture test checks that the writing calls sit in functions that take one).
use crate::ids::{CleanupJobId, EnvironmentId, SessionId};
use std::time::Duration;

use uuid::Uuid;

use super::Ctx;
use crate::entity::task_environment::EnvironmentStatus;
use crate::entity::writer_lease::{self as lease, Writer};
use crate::error::{Error, Result, WriterHolding};
use crate::store::writer_leases as store;

/// The proof that its holder is the one writer of an environment's worktrees. Not `Clone`: released
/// once, by value.
#[derive(Debug)]
pub struct WriterLease {
    environment_id: EnvironmentId,
    token: Uuid,
    writer: Writer,
}

impl WriterLease {
    pub fn environment_id(&self) -> EnvironmentId {
        self.environment_id
    }

    pub fn writer(&self) -> Writer {
        self.writer
    }
}

/// Who asks for the lease.
#[derive(Debug, Clone, Copy)]
pub enum Asking {
    Turn(SessionId),
    Restore,
    Landing,
    Cleanup(CleanupJobId),
}

impl Asking {
    fn writer(self) -> Writer {
        match self {
            Asking::Turn(_) => Writer::Turn,
            Asking::Restore => Writer::Restore,
            Asking::Landing => Writer::Landing,
            Asking::Cleanup(_) => Writer::Cleanup,
        }
    }

    fn holder_id(self) -> Option<Uuid> {
        match self {
            Asking::Turn(s) => Some(s.uuid()),
            Asking::Cleanup(j) => Some(j.uuid()),
            Asking::Restore | Asking::Landing => None,
        }
    }
}

/// Takes the environment's writer lease, or says who holds it (`409`: `session_busy` for a turn,
/// `restore_in_progress`, `landing_in_progress`, `task_cleanup_in_progress`). A holding whose instance
/// no longer holds its instance lease is taken over; a cleanup job takes over its own earlier holding
/// (a retry). Anyone but a cleanup is refused on an environment that is no one's to write any more
/// (superseded, lost) and on a task that is archived or being cleaned (I7): the task row is locked for
/// the check, so a barrier that commits after it finds this lease held and waits for it.
pub async fn acquire(ctx: &Ctx, env_id: EnvironmentId, asking: Asking) -> Result<WriterLease> {
    for _ in 0..4 {
        let row = lease::Model {
            task_environment_id: env_id,
            token: Uuid::now_v7(),
            holder: asking.writer(),
            holder_id: asking.holder_id(),
            node_id: ctx.config.node_id.clone(),
            instance_id: ctx.instance_id,
            acquired_at: crate::clock::now(),
        };
        let token = row.token;
        let txn = ctx.db.begin_write().await?;
        if !matches!(asking, Asking::Cleanup(_)) {
            let e = crate::store::environments::find(&txn, env_id)
                .await?
                .ok_or(Error::NotFound("environment"))?;
            if matches!(
                e.status,
                EnvironmentStatus::Superseded | EnvironmentStatus::Lost | EnvironmentStatus::Failed
            ) {
                return Err(Error::InvalidState(
                    "the environment is no longer its task's to write".into(),
                ));
            }
            crate::store::tasks::lock_task(&txn, e.task_id).await?;
            crate::store::tasks::ensure_not_archived_or_cleaning(&txn, &[e.task_id]).await?;
        }
        let taken = store::insert_if_free(&txn, row).await?;
        let held = if taken { None } else { store::find(&txn, env_id).await? };
        txn.commit().await?;
        if taken {
            return Ok(WriterLease {
                environment_id: env_id,
                token,
                writer: asking.writer(),
            });
        }
        let Some(held) = held else {
            // Released between the insert and the read: try again.
            continue;
        };
        // A cleanup job ended every agent of the environment before it asks (I8): a turn's holding is
        // what an ended agent left (its session deleted with its task, say), and its own earlier holding
        // is a retry's.
        let stale_for_cleanup = matches!(asking, Asking::Cleanup(_))
            && (held.holder == Writer::Turn
                || (held.holder == Writer::Cleanup && held.holder_id == asking.holder_id()));
        if stale_for_cleanup || !super::nodes::instance_alive(ctx, held.instance_id).await? {
            tracing::info!(environment = %env_id, holder = ?held.holder, instance = %held.instance_id,
                "taking over a writer lease its holder no longer holds");
            store::delete_held(&ctx.db.conn, env_id, held.token).await?;
            continue;
        }
        return Err(busy(&held));
    }
    Err(Error::Unavailable("the writer lease kept changing hands".into()))
}

fn busy(held: &lease::Model) -> Error {
    let holder = serde_json::to_value(held.holder)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    Error::WriterBusy(Box::new(WriterHolding {
        task_environment_id: held.task_environment_id,
        holder,
        holder_id: held.holder_id,
        node_id: held.node_id.clone(),
        since: held.acquired_at,
    }))
}

/// Gives the lease back, and wakes what waits for it here (queued prompts).
pub async fn release(ctx: &Ctx, lease: WriterLease) {
    if let Err(err) = store::delete_held(&ctx.db.conn, lease.environment_id, lease.token).await {
        // It lapses with this instance's lease; until then the environment waits.
        tracing::warn!(environment = %lease.environment_id, error = %err, "could not release a writer lease");
    }
    ctx.writers.notify_waiters();
}

/// Whether the lease is still this holding's (nothing took it over): read after a write that must not
/// outlast it (a checkpoint's ref, which a cleanup that took over may have forgotten already), so the
/// writer undoes it.
pub async fn still_held(ctx: &Ctx, lease: &WriterLease) -> Result<bool> {
    Ok(store::find(&ctx.db.conn, lease.environment_id)
        .await?
        .is_some_and(|h| h.token == lease.token))
}

/// The lease the session's turn holds through this instance, for the turn's end (its checkpoint and
/// its release): `None` when the turn holds none any more (the session stopped, the lease lapsed).
pub async fn resume_turn(ctx: &Ctx, session_id: SessionId) -> Result<Option<WriterLease>> {
    Ok(store::held_by_turn(&ctx.db.conn, session_id)
        .await?
        .filter(|h| h.instance_id == ctx.instance_id)
        .map(|h| WriterLease {
            environment_id: h.task_environment_id,
            token: h.token,
            writer: Writer::Turn,
        }))
}

/// The session's turn is over without settling (its agent stopped, crashed, failed, was cancelled or
/// deleted): its lease goes, in the transaction that records it.
pub(crate) async fn end_turn<C: sea_orm::ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<()> {
    store::release_turn(conn, session_id).await?;
    Ok(())
}

/// Waits until the environment's lease is free (or `limit` passed): woken by a release here, and
/// looking again every second for a release by another instance or a lapse.
pub async fn wait_free(ctx: &Ctx, env_id: EnvironmentId, limit: Duration) -> Result<bool> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let released = ctx.writers.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        match store::find(&ctx.db.conn, env_id).await? {
            None => return Ok(true),
            Some(h) if !super::nodes::instance_alive(ctx, h.instance_id).await? => return Ok(true),
            Some(_) => {}
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let step = (deadline - now).min(Duration::from_secs(1));
        let _ = tokio::time::timeout(step, released).await;
    }
}

/// Who holds the environment's lease now, for a view (`None`: no one, or an instance that lapsed).
pub async fn holder(ctx: &Ctx, env_id: EnvironmentId) -> Result<Option<lease::Model>> {
    match store::find(&ctx.db.conn, env_id).await? {
        Some(h) if super::nodes::instance_alive(ctx, h.instance_id).await? => Ok(Some(h)),
        _ => Ok(None),
    }
}
