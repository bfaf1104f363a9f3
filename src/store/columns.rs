//! Workspace columns: queries only.
use crate::ids::{ColumnId, TaskId, WorkspaceId};
use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder,
};

use crate::entity::task;
use crate::entity::workspace_column::{self as column, MovesInOn};
use crate::error::Result;

/// A workspace's columns, first to last.
pub async fn of_workspace<C: ConnectionTrait>(conn: &C, workspace_id: WorkspaceId) -> Result<Vec<column::Model>> {
    Ok(column::Entity::find()
        .filter(column::Column::WorkspaceId.eq(workspace_id))
        .order_by_asc(column::Column::Position)
        .all(conn)
        .await?)
}

/// A new workspace's columns (`Backlog`, `In progress`, `In review`, `Done`).
pub async fn insert_defaults(txn: &DatabaseTransaction, workspace_id: WorkspaceId, now: DateTime<Utc>) -> Result<()> {
    for (position, (name, moves)) in migration::m20261206_000016_columns::DEFAULT_COLUMNS.iter().enumerate() {
        let c = column::Model {
            id: ColumnId::now_v7(),
            workspace_id,
            name: (*name).to_string(),
            position: position as i32,
            moves_in_on: moves.map(|m| match m {
                "merged" => MovesInOn::Merged,
                _ => MovesInOn::SessionStarted,
            }),
            created_at: now,
            updated_at: now,
        };
        insert(txn, &c).await?;
    }
    Ok(())
}

pub async fn insert(txn: &DatabaseTransaction, c: &column::Model) -> std::result::Result<(), sea_orm::DbErr> {
    let am: column::ActiveModel = c.clone().into();
    column::Entity::insert(am).exec_without_returning(txn).await?;
    Ok(())
}

/// Writes a column's name, position and rule as given.
pub async fn save(txn: &DatabaseTransaction, c: &column::Model) -> std::result::Result<(), sea_orm::DbErr> {
    column::Entity::update(column::ActiveModel {
        id: Set(c.id),
        name: Set(c.name.clone()),
        position: Set(c.position),
        moves_in_on: Set(c.moves_in_on),
        updated_at: Set(c.updated_at),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

pub async fn delete(txn: &DatabaseTransaction, id: ColumnId) -> Result<()> {
    column::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}

/// How many tasks (archived ones included) are in the column.
pub async fn task_count<C: ConnectionTrait>(conn: &C, column_id: ColumnId) -> Result<u64> {
    Ok(task::Entity::find()
        .filter(task::Column::ColumnId.eq(column_id))
        .count(conn)
        .await?)
}

/// The first column of the workspace whose rule is `on`.
pub async fn moving_in_on<C: ConnectionTrait>(
    conn: &C,
    workspace_id: WorkspaceId,
    on: MovesInOn,
) -> Result<Option<column::Model>> {
    Ok(column::Entity::find()
        .filter(column::Column::WorkspaceId.eq(workspace_id))
        .filter(column::Column::MovesInOn.eq(on))
        .order_by_asc(column::Column::Position)
        .one(conn)
        .await?)
}

/// Puts the task in the column.
pub async fn move_task(
    txn: &DatabaseTransaction,
    task_id: TaskId,
    column_id: ColumnId,
    now: DateTime<Utc>,
) -> Result<()> {
    task::Entity::update(task::ActiveModel {
        id: Set(task_id),
        column_id: Set(Some(column_id)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}
