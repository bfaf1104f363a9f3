//! Registered repositories: queries only; who may register or deregister is `domain::repositories`.
use crate::ids::{RepositoryId, WorkspaceId};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, JoinType, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect, RelationTrait,
};
use uuid::Uuid;

use crate::entity::{repository, task, task_repository};
use crate::error::Result;

/// A repository row, registered or not (archived tasks keep referring to a deregistered one).
pub async fn find<C: ConnectionTrait>(conn: &C, id: RepositoryId) -> Result<Option<repository::Model>> {
    Ok(super::by_key(repository::Entity::find_by_id(id), conn).await?)
}

/// A registered (not deregistered) repository.
pub async fn find_registered<C: ConnectionTrait>(conn: &C, id: RepositoryId) -> Result<Option<repository::Model>> {
    Ok(super::by_key(
        repository::Entity::find_by_id(id).filter(repository::Column::DeletedAt.is_null()),
        conn,
    )
    .await?)
}

/// A registered repository, locked for the rest of the transaction (PostgreSQL).
pub async fn lock_registered(txn: &DatabaseTransaction, id: RepositoryId) -> Result<Option<repository::Model>> {
    Ok(super::by_key(
        repository::Entity::find_by_id(id)
            .filter(repository::Column::DeletedAt.is_null())
            .lock_exclusive(),
        txn,
    )
    .await?)
}

/// Share-locks (PostgreSQL) the registered repositories of `workspace_id` among `ids`, and returns their ids.
pub async fn lock_shared_registered_in(
    txn: &DatabaseTransaction,
    workspace_id: WorkspaceId,
    ids: &[RepositoryId],
) -> Result<Vec<repository::Model>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(repository::Entity::find()
        .filter(repository::Column::Id.is_in(ids.iter().copied()))
        .filter(repository::Column::WorkspaceId.eq(workspace_id))
        .filter(repository::Column::DeletedAt.is_null())
        .lock_shared()
        .all(txn)
        .await?)
}

/// Inserts a repository row; the caller maps unique and foreign-key violations.
pub async fn insert(txn: &DatabaseTransaction, model: &repository::Model) -> std::result::Result<(), sea_orm::DbErr> {
    let am: repository::ActiveModel = model.clone().into();
    repository::Entity::insert(am).exec_without_returning(txn).await?;
    Ok(())
}

/// A page of a workspace's registered repositories, newest first, ids below `before`.
pub async fn page_of_workspace<C: ConnectionTrait>(
    conn: &C,
    workspace_id: WorkspaceId,
    before: Option<Uuid>,
    limit: u64,
) -> Result<Vec<repository::Model>> {
    let mut q = repository::Entity::find()
        .filter(repository::Column::WorkspaceId.eq(workspace_id))
        .filter(repository::Column::DeletedAt.is_null());
    if let Some(before) = before {
        q = q.filter(repository::Column::Id.lt(before));
    }
    Ok(q.order_by_desc(repository::Column::Id).limit(limit).all(conn).await?)
}

/// How many live (unarchived) tasks have a slot on the repository.
pub async fn live_task_slots<C: ConnectionTrait>(conn: &C, id: RepositoryId) -> Result<u64> {
    Ok(task_repository::Entity::find()
        .join(JoinType::InnerJoin, task_repository::Relation::Task.def())
        .filter(task_repository::Column::RepositoryId.eq(id))
        .filter(task::Column::ArchivedAt.is_null())
        .count(conn)
        .await?)
}

/// Soft-deletes a repository: archived tasks keep referring to it.
pub async fn mark_deleted(
    txn: &DatabaseTransaction,
    id: RepositoryId,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    repository::Entity::update(repository::ActiveModel {
        id: Set(id),
        deleted_at: Set(Some(now)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}
