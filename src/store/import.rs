//! The rows a kandev import writes, and what it reads of berth's own to avoid writing them twice: all in
//! the import's one transaction.
use crate::ids::{OperationId, WorkspaceId};
use std::collections::HashMap;

use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QuerySelect};

use crate::entity::{cleanup_job as job, repository, workspace};
use crate::error::Result;

/// `imported_from` → berth id, for the rows of a table that already came from kandev.
pub async fn imported<E: EntityTrait, Id: sea_orm::TryGetable + sea_orm::sea_query::ValueType>(
    txn: &DatabaseTransaction,
    imported_from: E::Column,
    id: E::Column,
) -> Result<HashMap<String, Id>> {
    let rows: Vec<(Option<String>, Id)> = E::find()
        .select_only()
        .column(imported_from)
        .column(id)
        .filter(imported_from.is_not_null())
        .into_tuple()
        .all(txn)
        .await?;
    Ok(rows.into_iter().filter_map(|(k, v)| k.map(|k| (k, v))).collect())
}

/// Inserts `rows` 200 at a time (a statement stays under both backends' parameter limits).
pub async fn insert_chunked<A, C>(conn: &C, rows: Vec<A>) -> Result<()>
where
    A: sea_orm::ActiveModelTrait,
    C: ConnectionTrait,
{
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let chunk: Vec<A> = rows.by_ref().take(200).collect();
        A::Entity::insert_many(chunk).exec_without_returning(conn).await?;
    }
    Ok(())
}

/// The workspace of that name, whatever its status.
pub async fn workspace_named(txn: &DatabaseTransaction, name: &str) -> Result<Option<workspace::Model>> {
    Ok(workspace::Entity::find()
        .filter(workspace::Column::Name.eq(name))
        .one(txn)
        .await?)
}

/// The workspace's repositories not deleted.
pub async fn live_repositories(txn: &DatabaseTransaction, workspace_id: WorkspaceId) -> Result<Vec<repository::Model>> {
    Ok(repository::Entity::find()
        .filter(repository::Column::WorkspaceId.eq(workspace_id))
        .filter(repository::Column::DeletedAt.is_null())
        .all(txn)
        .await?)
}

/// Whether a cleanup job of that operation exists (an import carries each kandev job once).
pub async fn job_of_operation(txn: &DatabaseTransaction, operation_id: OperationId) -> Result<bool> {
    Ok(job::Entity::find()
        .filter(job::Column::OperationId.eq(operation_id))
        .one(txn)
        .await?
        .is_some())
}
