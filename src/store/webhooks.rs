//! Webhook subscriptions and their delivery attempts: queries only. Every write a deliverer makes
//! names its lease (`lease_owner`), so a process that lost the lease changes nothing.
use crate::ids::{DeliveryId, InstanceId, WebhookId, WorkspaceId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect,
};

use crate::entity::{webhook, webhook_delivery as delivery};
use crate::error::Result;

pub async fn insert<C: ConnectionTrait>(conn: &C, w: webhook::Model) -> Result<()> {
    let am: webhook::ActiveModel = w.into();
    webhook::Entity::insert(am).exec_without_returning(conn).await?;
    Ok(())
}

pub async fn find<C: ConnectionTrait>(conn: &C, id: WebhookId) -> Result<Option<webhook::Model>> {
    Ok(webhook::Entity::find_by_id(id).one(conn).await?)
}

/// Subscriptions, oldest first; with `workspaces`, only those of these workspaces.
pub async fn list<C: ConnectionTrait>(conn: &C, workspaces: Option<&[WorkspaceId]>) -> Result<Vec<webhook::Model>> {
    let mut q = webhook::Entity::find().order_by_asc(webhook::Column::Id);
    if let Some(ids) = workspaces {
        q = q.filter(webhook::Column::WorkspaceId.is_in(ids.to_vec()));
    }
    Ok(q.all(conn).await?)
}

/// Writes every column of `w` (a person's change: url, types, enabled, secrets).
pub async fn save<C: ConnectionTrait>(conn: &C, w: webhook::Model) -> Result<()> {
    let am: webhook::ActiveModel = sea_orm::ActiveModelTrait::reset_all(webhook::ActiveModel::from(w));
    webhook::Entity::update(am).exec(conn).await?;
    Ok(())
}

pub async fn delete<C: ConnectionTrait>(conn: &C, id: WebhookId) -> Result<bool> {
    Ok(webhook::Entity::delete_by_id(id).exec(conn).await?.rows_affected == 1)
}

/// Stops delivery of a subscription about to be deleted: every deliverer's next check and write fail.
pub async fn stop<C: ConnectionTrait>(conn: &C, id: WebhookId) -> Result<()> {
    webhook::Entity::update_many()
        .col_expr(webhook::Column::Enabled, Expr::value(false))
        .filter(webhook::Column::Id.eq(id))
        .exec(conn)
        .await?;
    Ok(())
}

/// Whether `owner` still delivers the subscription: it is there, enabled, and `owner` holds its lease
/// (checked before each post).
pub async fn still_delivers<C: ConnectionTrait>(conn: &C, id: WebhookId, owner: InstanceId) -> Result<bool> {
    Ok(webhook::Entity::find()
        .filter(webhook::Column::Id.eq(id))
        .filter(webhook::Column::Enabled.eq(true))
        .filter(webhook::Column::LeaseOwner.eq(owner))
        .count(conn)
        .await?
        == 1)
}

/// Whether no process holds the subscription's lease now (none, or an expired one), or it is gone.
pub async fn lease_free<C: ConnectionTrait>(conn: &C, id: WebhookId, now: DateTime<Utc>) -> Result<bool> {
    Ok(webhook::Entity::find()
        .filter(webhook::Column::Id.eq(id))
        .filter(webhook::Column::LeaseOwner.is_not_null())
        .filter(webhook::Column::LeaseExpiresAt.gte(now))
        .count(conn)
        .await?
        == 0)
}

/// Enabled subscriptions nobody delivers now (no lease, or an expired one).
pub async fn unleased<C: ConnectionTrait>(conn: &C, now: DateTime<Utc>) -> Result<Vec<WebhookId>> {
    Ok(webhook::Entity::find()
        .select_only()
        .column(webhook::Column::Id)
        .filter(webhook::Column::Enabled.eq(true))
        .filter(free(now))
        .into_tuple()
        .all(conn)
        .await?)
}

fn free(now: DateTime<Utc>) -> Condition {
    Condition::any()
        .add(webhook::Column::LeaseOwner.is_null())
        .add(webhook::Column::LeaseExpiresAt.lt(now))
}

/// Takes (or keeps) the lease of an enabled subscription until `until`; whether this process holds it.
pub async fn lease<C: ConnectionTrait>(
    conn: &C,
    id: WebhookId,
    owner: InstanceId,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<bool> {
    Ok(webhook::Entity::update_many()
        .col_expr(webhook::Column::LeaseOwner, Expr::value(owner))
        .col_expr(webhook::Column::LeaseExpiresAt, Expr::value(until))
        .filter(webhook::Column::Id.eq(id))
        .filter(webhook::Column::Enabled.eq(true))
        .filter(free(now).add(webhook::Column::LeaseOwner.eq(owner)))
        .exec(conn)
        .await?
        .rows_affected
        == 1)
}

/// Gives the lease up (a process that stops delivering it).
pub async fn release<C: ConnectionTrait>(conn: &C, id: WebhookId, owner: InstanceId) -> Result<()> {
    webhook::Entity::update_many()
        .col_expr(webhook::Column::LeaseOwner, Expr::value(Option::<InstanceId>::None))
        .col_expr(
            webhook::Column::LeaseExpiresAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(webhook::Column::Id.eq(id))
        .filter(webhook::Column::LeaseOwner.eq(owner))
        .exec(conn)
        .await?;
    Ok(())
}

/// Gives up every lease `owner` holds (a process shutting down): another replica, or this node started
/// again, delivers them at once instead of after the lease runs out.
pub async fn release_all<C: ConnectionTrait>(conn: &C, owner: InstanceId) -> Result<u64> {
    let done = webhook::Entity::update_many()
        .col_expr(webhook::Column::LeaseOwner, Expr::value(Option::<InstanceId>::None))
        .col_expr(
            webhook::Column::LeaseExpiresAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(webhook::Column::LeaseOwner.eq(owner))
        .exec(conn)
        .await?;
    Ok(done.rows_affected)
}

/// Where the deliverer stands: its cursor and the retry state of the event after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub cursor: i64,
    pub attempts: i32,
    pub failing_since: Option<DateTime<Utc>>,
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// Records the deliverer's position, while it holds the lease of the enabled subscription; whether it did.
pub async fn set_position<C: ConnectionTrait>(
    conn: &C,
    id: WebhookId,
    owner: InstanceId,
    p: &Position,
) -> Result<bool> {
    Ok(webhook::Entity::update_many()
        .col_expr(webhook::Column::Cursor, Expr::value(p.cursor))
        .col_expr(webhook::Column::Attempts, Expr::value(p.attempts))
        .col_expr(webhook::Column::FailingSince, Expr::value(p.failing_since))
        .col_expr(webhook::Column::NextAttemptAt, Expr::value(p.next_attempt_at))
        .filter(webhook::Column::Id.eq(id))
        .filter(webhook::Column::LeaseOwner.eq(owner))
        .filter(webhook::Column::Enabled.eq(true))
        .exec(conn)
        .await?
        .rows_affected
        == 1)
}

/// The attempts since the last record and the position they reached, in the caller's transaction;
/// whether this process still delivers the subscription (it holds the lease, and the subscription is
/// still there and enabled).
pub async fn record(
    txn: &DatabaseTransaction,
    id: WebhookId,
    owner: InstanceId,
    attempts: Vec<delivery::Model>,
    p: &Position,
) -> Result<bool> {
    if !set_position(txn, id, owner, p).await? {
        return Ok(false);
    }
    if !attempts.is_empty() {
        let rows: Vec<delivery::ActiveModel> = attempts.into_iter().map(Into::into).collect();
        delivery::Entity::insert_many(rows).exec_without_returning(txn).await?;
    }
    Ok(true)
}

/// Disables a subscription its receiver failed for too long (while this process holds its lease).
pub async fn disable<C: ConnectionTrait>(
    conn: &C,
    id: WebhookId,
    owner: InstanceId,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    Ok(webhook::Entity::update_many()
        .col_expr(webhook::Column::Enabled, Expr::value(false))
        .col_expr(webhook::Column::DisabledReason, Expr::value(reason))
        .col_expr(
            webhook::Column::NextAttemptAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(webhook::Column::LeaseOwner, Expr::value(Option::<InstanceId>::None))
        .col_expr(
            webhook::Column::LeaseExpiresAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(webhook::Column::UpdatedAt, Expr::value(now))
        .filter(webhook::Column::Id.eq(id))
        .filter(webhook::Column::LeaseOwner.eq(owner))
        .filter(webhook::Column::Enabled.eq(true))
        .exec(conn)
        .await?
        .rows_affected
        == 1)
}

/// The lowest cursor of an enabled subscription that is not lagging: retention keeps every event after it.
pub async fn lowest_holding_cursor<C: ConnectionTrait>(conn: &C) -> Result<Option<i64>> {
    let lowest: Option<Option<i64>> = webhook::Entity::find()
        .select_only()
        .column_as(webhook::Column::Cursor.min(), "lowest")
        .filter(webhook::Column::Enabled.eq(true))
        .filter(webhook::Column::Lagging.eq(false))
        .into_tuple()
        .one(conn)
        .await?;
    Ok(lowest.flatten())
}

/// The enabled subscriptions (the sweep measures how far behind each is).
pub async fn enabled<C: ConnectionTrait>(conn: &C) -> Result<Vec<webhook::Model>> {
    Ok(webhook::Entity::find()
        .filter(webhook::Column::Enabled.eq(true))
        .all(conn)
        .await?)
}

/// Marks an enabled subscription lagging or not; whether this call changed it (one event per change,
/// however many replicas sweep).
pub async fn set_lagging<C: ConnectionTrait>(conn: &C, id: WebhookId, lagging: bool) -> Result<bool> {
    Ok(webhook::Entity::update_many()
        .col_expr(webhook::Column::Lagging, Expr::value(lagging))
        .filter(webhook::Column::Id.eq(id))
        .filter(webhook::Column::Enabled.eq(true))
        .filter(webhook::Column::Lagging.eq(!lagging))
        .exec(conn)
        .await?
        .rows_affected
        == 1)
}

pub async fn insert_delivery<C: ConnectionTrait>(conn: &C, d: delivery::Model) -> Result<()> {
    let am: delivery::ActiveModel = d.into();
    delivery::Entity::insert(am).exec_without_returning(conn).await?;
    Ok(())
}

/// A subscription's newest attempts, newest first.
pub async fn deliveries<C: ConnectionTrait>(
    conn: &C,
    webhook_id: WebhookId,
    limit: u64,
) -> Result<Vec<delivery::Model>> {
    Ok(delivery::Entity::find()
        .filter(delivery::Column::WebhookId.eq(webhook_id))
        .order_by_desc(delivery::Column::Id)
        .limit(limit)
        .all(conn)
        .await?)
}

/// Deletes a subscription's attempts older than its newest `keep`.
pub async fn trim_deliveries<C: ConnectionTrait>(conn: &C, webhook_id: WebhookId, keep: u64) -> Result<()> {
    let oldest_kept: Option<DeliveryId> = delivery::Entity::find()
        .select_only()
        .column(delivery::Column::Id)
        .filter(delivery::Column::WebhookId.eq(webhook_id))
        .order_by_desc(delivery::Column::Id)
        .offset(keep.saturating_sub(1))
        .into_tuple()
        .one(conn)
        .await?;
    if let Some(id) = oldest_kept {
        delivery::Entity::delete_many()
            .filter(delivery::Column::WebhookId.eq(webhook_id))
            .filter(delivery::Column::Id.lt(id))
            .exec(conn)
            .await?;
    }
    Ok(())
}
