//! Environment status writes: a `creating` row settles (ready or failed) only through `settle`, a
//! compare-and-set on the row its materializer still holds followed by its event; earlier environments
//! are superseded (kept for diagnostics, untouched on disk) with theirs.
use crate::ids::{EnvironmentId, InstanceId, TaskId};
use sea_orm::DatabaseTransaction;
use serde_json::json;

use crate::domain::Ctx;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::store::environments::{self as store, Settle};
use crate::store::tasks::{ensure_no_cleanup, lock_task};

/// Supersedes what is left of earlier attempts (failed, or creating with an expired lease), keeping
/// them recorded for diagnostics; a new attempt adopts any worktree they left in place.
pub(super) async fn supersede_stale(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    owner: &task::Model,
    envs: &[env::Model],
) -> Result<()> {
    for stale in envs
        .iter()
        .filter(|e| matches!(e.status, EnvironmentStatus::Failed | EnvironmentStatus::Creating))
    {
        supersede(txn, ctx, owner, stale.id, "retry").await?;
    }
    Ok(())
}

/// Records an environment as superseded (kept for diagnostics, untouched on disk), with its event.
pub(crate) async fn supersede(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    owner: &task::Model,
    env_id: EnvironmentId,
    reason: &str,
) -> Result<()> {
    store::mark_superseded(txn, env_id, crate::clock::now()).await?;
    events::append(
        txn,
        ctx.instance_id,
        EventType::EnvironmentSuperseded,
        env_subject(owner, env_id),
        json!({ "reason": reason }),
    )
    .await?;
    Ok(())
}

/// Admission refused the current environment: it becomes `broken` (with its category) and says so in
/// an event, unless it already changed. Returns whether it did. `task_archived` or
/// `task_cleanup_in_progress` instead when the task's lifecycle is what took the workspace (I7).
pub(crate) async fn mark_broken(
    ctx: &Ctx,
    task_id: TaskId,
    owner: &task::Model,
    env_id: EnvironmentId,
    category: crate::error::ReuseCategory,
) -> Result<bool> {
    let txn = ctx.db.begin_write().await?;
    // A workspace an archive, delete or reset is removing (or removed) is not broken: the task's
    // lifecycle answers the launch, and the environment is left to it.
    if lock_task(&txn, owner.id).await?.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    ensure_no_cleanup(&txn, &[task_id, owner.id]).await?;
    if !store::mark_broken(&txn, env_id, &category.as_str(), crate::clock::now()).await? {
        txn.rollback().await?;
        return Ok(false);
    }
    events::append(
        &txn,
        ctx.instance_id,
        EventType::EnvironmentBroken,
        env_subject(owner, env_id),
        json!({ "category": category, "recovery": "reset_environment" }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(true)
}

/// A broken environment admission proved again is ready, with `environment.ready` (`reason: recovered`).
pub(crate) async fn mark_recovered(ctx: &Ctx, owner: &task::Model, env_id: EnvironmentId) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    if !store::mark_recovered(&txn, env_id, crate::clock::now()).await? {
        txn.rollback().await?;
        return Ok(());
    }
    events::append(
        &txn,
        ctx.instance_id,
        EventType::EnvironmentReady,
        env_subject(owner, env_id),
        json!({ "reason": "recovered" }),
    )
    .await?;
    ctx.commit(txn).await
}

/// What a `broken` environment's admission found (an unreadable record reads as missing).
pub(crate) fn broken_category(e: &env::Model) -> crate::error::ReuseCategory {
    e.broken_category
        .as_deref()
        .and_then(crate::error::ReuseCategory::parse)
        .unwrap_or(crate::error::ReuseCategory::WorkspaceMissing)
}

/// A `creating` environment as its materializer holds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub id: EnvironmentId,
    pub materializer_id: Option<InstanceId>,
}

impl From<&env::Model> for Held {
    fn from(e: &env::Model) -> Self {
        Held {
            id: e.id,
            materializer_id: e.materializer_id,
        }
    }
}

/// The one way a `creating` environment settles (ready or failed): compare-and-set on the row its
/// materializer still holds, then the event, in the caller's transaction. False when it was taken over
/// or settled meanwhile (nothing written).
pub(super) async fn settle(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    owner: &task::Model,
    held: Held,
    to: Settle,
    now: chrono::DateTime<chrono::Utc>,
    event: (EventType, serde_json::Value),
) -> Result<bool> {
    let (event_type, payload) = event;
    if !store::settle_held(txn, held.id, held.materializer_id, to, now).await? {
        return Ok(false);
    }
    events::append(txn, ctx.instance_id, event_type, env_subject(owner, held.id), payload).await?;
    Ok(true)
}

pub(super) fn env_subject(owner: &task::Model, env_id: EnvironmentId) -> Subject {
    Subject {
        task_environment_id: Some(env_id),
        ..Subject::task(owner.workspace_id, owner.id)
    }
}
