//! Nodes and their instances: queries only; what up, down and given up mean is
//! `domain::nodes`.
use crate::ids::{EnvironmentId, InstanceId};
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter, QueryOrder, QuerySelect,
};

use crate::entity::agent_execution::{self as execution, ExecutionState};
use crate::entity::cleanup_job::{self as job, CleanupJobState};
use crate::entity::task_environment::{self as environment, EnvironmentStatus};
use crate::entity::{instance, node};
use crate::error::Result;

/// Records a starting instance, and its node the first time one of it starts.
pub async fn register<C: ConnectionTrait>(conn: &C, row: instance::Model) -> Result<()> {
    node::Entity::insert(node::ActiveModel {
        id: Set(row.node_id.clone()),
        first_seen_at: Set(row.started_at),
        decommissioned_at: Set(None),
        decommissioned_by: Set(None),
    })
    .on_conflict(OnConflict::column(node::Column::Id).do_nothing().to_owned())
    .exec_without_returning(conn)
    .await?;
    instance::Entity::insert(instance::ActiveModel {
        id: Set(row.id),
        node_id: Set(row.node_id),
        pid: Set(row.pid),
        host: Set(row.host),
        url: Set(row.url),
        version: Set(row.version),
        db_max_connections: Set(row.db_max_connections),
        started_at: Set(row.started_at),
        renewed_at: Set(row.renewed_at),
        lease_until: Set(row.lease_until),
        ended_at: Set(None),
    })
    .exec_without_returning(conn)
    .await?;
    Ok(())
}

/// Extends an instance's lease; false when it has none to extend (it ended, or its row went).
pub async fn renew<C: ConnectionTrait>(
    conn: &C,
    id: InstanceId,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<bool> {
    let res = instance::Entity::update_many()
        .col_expr(instance::Column::RenewedAt, Expr::value(now))
        .col_expr(instance::Column::LeaseUntil, Expr::value(until))
        .filter(instance::Column::Id.eq(id))
        .filter(instance::Column::EndedAt.is_null())
        .exec(conn)
        .await?;
    Ok(res.rows_affected == 1)
}

/// A clean shutdown gives the lease back.
pub async fn end<C: ConnectionTrait>(conn: &C, id: InstanceId, now: DateTime<Utc>) -> Result<()> {
    instance::Entity::update_many()
        .col_expr(instance::Column::EndedAt, Expr::value(now))
        .col_expr(instance::Column::LeaseUntil, Expr::value(now))
        .filter(instance::Column::Id.eq(id))
        .exec(conn)
        .await?;
    Ok(())
}

pub async fn all_nodes<C: ConnectionTrait>(conn: &C) -> Result<Vec<node::Model>> {
    Ok(node::Entity::find().order_by_asc(node::Column::Id).all(conn).await?)
}

pub async fn find_node<C: ConnectionTrait>(conn: &C, id: &str) -> Result<Option<node::Model>> {
    Ok(super::by_key(node::Entity::find_by_id(id.to_string()), conn).await?)
}

/// Instances that hold a lease at `now` or ended within `since` of it, newest first: what a listing
/// shows (older ones are history).
pub async fn instances_since<C: ConnectionTrait>(conn: &C, since: DateTime<Utc>) -> Result<Vec<instance::Model>> {
    Ok(instance::Entity::find()
        .filter(instance::Column::LeaseUntil.gt(since))
        .order_by_desc(instance::Column::StartedAt)
        .all(conn)
        .await?)
}

/// Since when none of the node's recorded instances holds a lease: the latest end of one (its lease
/// running out, or given back); `None` when none is recorded any more.
pub async fn unreachable_since<C: ConnectionTrait>(conn: &C, node_id: &str) -> Result<Option<DateTime<Utc>>> {
    Ok(instance::Entity::find()
        .filter(instance::Column::NodeId.eq(node_id))
        .all(conn)
        .await?
        .into_iter()
        .map(|i| i.ended_at.map_or(i.lease_until, |e| e.min(i.lease_until)))
        .max())
}

pub async fn find_instance<C: ConnectionTrait>(conn: &C, id: InstanceId) -> Result<Option<instance::Model>> {
    Ok(super::by_key(instance::Entity::find_by_id(id), conn).await?)
}

/// The instances holding a lease at `now`.
pub async fn live_instances<C: ConnectionTrait>(conn: &C, now: DateTime<Utc>) -> Result<Vec<instance::Model>> {
    Ok(instance::Entity::find()
        .filter(instance::Column::EndedAt.is_null())
        .filter(instance::Column::LeaseUntil.gt(now))
        .all(conn)
        .await?)
}

/// A node's instances holding a lease at `now`, newest first.
pub async fn live_instances_of<C: ConnectionTrait>(
    conn: &C,
    node_id: &str,
    now: DateTime<Utc>,
) -> Result<Vec<instance::Model>> {
    Ok(instance::Entity::find()
        .filter(instance::Column::NodeId.eq(node_id))
        .filter(instance::Column::EndedAt.is_null())
        .filter(instance::Column::LeaseUntil.gt(now))
        .order_by_desc(instance::Column::StartedAt)
        .all(conn)
        .await?)
}

/// Forgets instances whose lease ended before `before` (their executions name them still: an unknown
/// instance holds no lease).
pub async fn forget_instances_before<C: ConnectionTrait>(conn: &C, before: DateTime<Utc>) -> Result<u64> {
    Ok(instance::Entity::delete_many()
        .filter(instance::Column::LeaseUntil.lt(before))
        .exec(conn)
        .await?
        .rows_affected)
}

#[derive(FromQueryResult)]
struct PerNode {
    node_id: String,
    n: i64,
}

fn per_node(rows: Vec<PerNode>) -> HashMap<String, u64> {
    rows.into_iter().map(|r| (r.node_id, r.n.max(0) as u64)).collect()
}

/// What each node holds: environments on its disk that are not superseded.
pub async fn environments_per_node<C: ConnectionTrait>(conn: &C) -> Result<HashMap<String, u64>> {
    Ok(per_node(
        environment::Entity::find()
            .select_only()
            .column(environment::Column::NodeId)
            .column_as(environment::Column::Id.count(), "n")
            .filter(environment::Column::Status.is_not_in([EnvironmentStatus::Superseded, EnvironmentStatus::Lost]))
            .group_by(environment::Column::NodeId)
            .into_model::<PerNode>()
            .all(conn)
            .await?,
    ))
}

/// Agents recorded as starting or running on each node.
pub async fn live_executions_per_node<C: ConnectionTrait>(conn: &C) -> Result<HashMap<String, u64>> {
    Ok(per_node(
        execution::Entity::find()
            .select_only()
            .column(execution::Column::NodeId)
            .column_as(execution::Column::Id.count(), "n")
            .filter(execution::Column::State.is_in([ExecutionState::Starting, ExecutionState::Running]))
            .group_by(execution::Column::NodeId)
            .into_model::<PerNode>()
            .all(conn)
            .await?,
    ))
}

/// Cleanup jobs not yet over on each node (they run there).
pub async fn open_jobs_per_node<C: ConnectionTrait>(conn: &C) -> Result<HashMap<String, u64>> {
    Ok(per_node(
        job::Entity::find()
            .select_only()
            .column(job::Column::NodeId)
            .column_as(job::Column::Id.count(), "n")
            .filter(job::Column::State.is_in([
                CleanupJobState::Pending,
                CleanupJobState::Running,
                CleanupJobState::RetryWait,
            ]))
            .group_by(job::Column::NodeId)
            .into_model::<PerNode>()
            .all(conn)
            .await?,
    ))
}

/// Records that an operator gave the node up; false when it already was.
pub async fn mark_decommissioned(
    txn: &sea_orm::DatabaseTransaction,
    id: &str,
    by: Option<String>,
    now: DateTime<Utc>,
) -> Result<bool> {
    let res = node::Entity::update_many()
        .col_expr(node::Column::DecommissionedAt, Expr::value(Some(now)))
        .col_expr(node::Column::DecommissionedBy, Expr::value(by))
        .filter(node::Column::Id.eq(id))
        .filter(node::Column::DecommissionedAt.is_null())
        .exec(txn)
        .await?;
    Ok(res.rows_affected == 1)
}

/// An operator let a decommissioned node start again.
pub async fn readmit<C: ConnectionTrait>(conn: &C, id: &str) -> Result<()> {
    node::Entity::update_many()
        .col_expr(
            node::Column::DecommissionedAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(node::Column::DecommissionedBy, Expr::value(Option::<String>::None))
        .filter(node::Column::Id.eq(id))
        .exec(conn)
        .await?;
    Ok(())
}

/// The node's environments that still count (not superseded, not lost), locked.
pub async fn environments_on(txn: &sea_orm::DatabaseTransaction, node_id: &str) -> Result<Vec<environment::Model>> {
    use sea_orm::QuerySelect;
    Ok(environment::Entity::find()
        .filter(environment::Column::NodeId.eq(node_id))
        .filter(environment::Column::Status.is_not_in([EnvironmentStatus::Superseded, EnvironmentStatus::Lost]))
        .lock_exclusive()
        .all(txn)
        .await?)
}

pub async fn mark_lost(txn: &sea_orm::DatabaseTransaction, ids: &[EnvironmentId], now: DateTime<Utc>) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    environment::Entity::update_many()
        .col_expr(environment::Column::Status, Expr::value(EnvironmentStatus::Lost))
        .col_expr(environment::Column::UpdatedAt, Expr::value(now))
        .filter(environment::Column::Id.is_in(ids.iter().copied()))
        .exec(txn)
        .await?;
    Ok(())
}

/// The node's cleanup jobs not yet over.
pub async fn open_jobs_on<C: ConnectionTrait>(conn: &C, node_id: &str) -> Result<Vec<job::Model>> {
    Ok(job::Entity::find()
        .filter(job::Column::NodeId.eq(node_id))
        .filter(job::Column::State.is_in([
            CleanupJobState::Prepared,
            CleanupJobState::Pending,
            CleanupJobState::Running,
            CleanupJobState::RetryWait,
        ]))
        .all(conn)
        .await?)
}

/// The agents recorded as starting or running on the node.
pub async fn live_executions_on<C: ConnectionTrait>(conn: &C, node_id: &str) -> Result<Vec<execution::Model>> {
    Ok(execution::Entity::find()
        .filter(execution::Column::NodeId.eq(node_id))
        .filter(execution::Column::State.is_in([ExecutionState::Starting, ExecutionState::Running]))
        .all(conn)
        .await?)
}
