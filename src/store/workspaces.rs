//! Workspace rows and the facts the summary counts: queries only.
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, JoinType, QueryFilter, QueryOrder, QuerySelect,
    RelationDef,
};
use uuid::Uuid;

use crate::entity::{task, task_session, workspace};
use crate::error::Result;

pub async fn find<C: ConnectionTrait>(conn: &C, id: Uuid) -> Result<Option<workspace::Model>> {
    Ok(workspace::Entity::find_by_id(id).one(conn).await?)
}

/// Share-locks a workspace row (PostgreSQL) so its deletion waits for the caller's transaction.
pub async fn lock_shared(txn: &DatabaseTransaction, id: Uuid) -> Result<Option<workspace::Model>> {
    Ok(workspace::Entity::find_by_id(id).lock_shared().one(txn).await?)
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
    only: Option<&[Uuid]>,
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

/// Each task of the workspace with when it was archived.
pub async fn task_archival<C: ConnectionTrait>(
    conn: &C,
    workspace_id: Uuid,
) -> Result<Vec<(Uuid, Option<chrono::DateTime<chrono::Utc>>)>> {
    Ok(task::Entity::find()
        .select_only()
        .column(task::Column::Id)
        .column(task::Column::ArchivedAt)
        .filter(task::Column::WorkspaceId.eq(workspace_id))
        .into_tuple()
        .all(conn)
        .await?)
}

fn session_task() -> RelationDef {
    task_session::Entity::belongs_to(task::Entity)
        .from(task_session::Column::TaskId)
        .to(task::Column::Id)
        .into()
}

/// Every session of the workspace's tasks, in one join.
pub async fn sessions_of<C: ConnectionTrait>(conn: &C, workspace_id: Uuid) -> Result<Vec<task_session::Model>> {
    Ok(task_session::Entity::find()
        .join(JoinType::InnerJoin, session_task())
        .filter(task::Column::WorkspaceId.eq(workspace_id))
        .all(conn)
        .await?)
}
