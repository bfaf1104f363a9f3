//! Workspace rows: queries only; the tasks and sessions a summary counts are read from their own
//! families (`store::tasks`, `store::sessions`).
use crate::ids::WorkspaceId;
use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

use crate::entity::workspace::{self, WorkspaceStatus};
use crate::entity::{repository, task};
use crate::error::Result;

pub async fn find<C: ConnectionTrait>(conn: &C, id: WorkspaceId) -> Result<Option<workspace::Model>> {
    Ok(super::by_key(workspace::Entity::find_by_id(id), conn).await?)
}

/// Locks the workspace row; `None` if it is gone.
pub async fn lock(txn: &DatabaseTransaction, id: WorkspaceId) -> Result<Option<workspace::Model>> {
    Ok(super::by_key(workspace::Entity::find_by_id(id).lock_exclusive(), txn).await?)
}

/// Share-locks a workspace row (PostgreSQL) so its deletion waits for the caller's transaction.
pub async fn lock_shared(txn: &DatabaseTransaction, id: WorkspaceId) -> Result<Option<workspace::Model>> {
    Ok(super::by_key(workspace::Entity::find_by_id(id).lock_shared(), txn).await?)
}

/// Inserts a workspace row; the caller maps a unique violation (names are unique).
pub async fn insert(txn: &DatabaseTransaction, model: &workspace::Model) -> std::result::Result<(), sea_orm::DbErr> {
    let am: workspace::ActiveModel = model.clone().into();
    workspace::Entity::insert(am).exec_without_returning(txn).await?;
    Ok(())
}

/// A page of workspaces, newest first, ids below `before`, limited to `only` when given.
pub async fn page<C: ConnectionTrait>(
    conn: &C,
    only: Option<&[WorkspaceId]>,
    before: Option<Uuid>,
    limit: u64,
) -> Result<Vec<workspace::Model>> {
    let mut q = workspace::Entity::find();
    if let Some(ids) = only {
        q = q.filter(workspace::Column::Id.is_in(ids.iter().copied()));
    }
    if let Some(before) = before {
        q = q.filter(workspace::Column::Id.lt(before));
    }
    Ok(q.order_by_desc(workspace::Column::Id).limit(limit).all(conn).await?)
}

/// Task creation refuses a `deleting` workspace.
pub async fn mark_deleting(txn: &DatabaseTransaction, id: WorkspaceId, now: DateTime<Utc>) -> Result<()> {
    set_status(txn, id, WorkspaceStatus::Deleting, now).await
}

/// A workspace whose delete was refused before it changed anything takes tasks again.
pub async fn mark_active(txn: &DatabaseTransaction, id: WorkspaceId, now: DateTime<Utc>) -> Result<()> {
    set_status(txn, id, WorkspaceStatus::Active, now).await
}

async fn set_status(
    txn: &DatabaseTransaction,
    id: WorkspaceId,
    status: WorkspaceStatus,
    now: DateTime<Utc>,
) -> Result<()> {
    workspace::Entity::update(workspace::ActiveModel {
        id: Set(id),
        status: Set(status),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// The workspace and its children of the cascade: tasks (with their environments) first, then
/// repositories, then the row.
pub async fn delete(txn: &DatabaseTransaction, id: WorkspaceId) -> Result<()> {
    task::Entity::delete_many()
        .filter(task::Column::WorkspaceId.eq(id))
        .exec(txn)
        .await?;
    repository::Entity::delete_many()
        .filter(repository::Column::WorkspaceId.eq(id))
        .exec(txn)
        .await?;
    workspace::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}
