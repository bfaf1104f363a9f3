//! Task rows: locks, ownership walks and the cleanup barrier's check.
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

use crate::entity::cleanup_job;
use crate::entity::task::{self, WorkspaceMode};
use crate::error::{Error, Result};

/// The task whose environment `task` uses: itself, or for an `inherit_parent` subtask its nearest
/// ancestor with a workspace of its own.
pub async fn owner_of<C: ConnectionTrait>(conn: &C, task: &task::Model) -> Result<task::Model> {
    let mut current = task.clone();
    for _ in 0..64 {
        if current.workspace_mode != WorkspaceMode::InheritParent {
            return Ok(current);
        }
        let parent_id = current.parent_task_id.ok_or(Error::NotFound("parent task"))?;
        current = task::Entity::find_by_id(parent_id)
            .one(conn)
            .await?
            .ok_or(Error::NotFound("parent task"))?;
    }
    Err(Error::Internal(anyhow::anyhow!(
        "task {} inherits through more than 64 ancestors",
        task.id
    )))
}

/// I7: a task with an active cleanup job accepts no new session, environment or inventory row.
pub async fn ensure_no_cleanup<C: ConnectionTrait>(conn: &C, task_ids: &[Uuid]) -> Result<()> {
    let active = cleanup_job::Entity::find()
        .filter(cleanup_job::Column::TaskId.is_in(task_ids.iter().copied()))
        .filter(cleanup_job::Column::State.is_in(cleanup_job::ACTIVE_STATES))
        .count(conn)
        .await?;
    if active > 0 {
        Err(Error::TaskCleanupInProgress)
    } else {
        Ok(())
    }
}

/// Locks a task row for the rest of the transaction (PostgreSQL; SQLite holds the writer lock already).
pub async fn lock_task(txn: &DatabaseTransaction, id: Uuid) -> Result<task::Model> {
    task::Entity::find_by_id(id)
        .lock_exclusive()
        .one(txn)
        .await?
        .ok_or(Error::NotFound("task"))
}

/// Locks tasks in ascending id order, the order every writer uses (an owner is older than its
/// subtasks), so cascades and session creation cannot deadlock on PostgreSQL.
pub async fn lock_in_order(txn: &DatabaseTransaction, tasks: &[task::Model]) -> Result<()> {
    let mut ids: Vec<Uuid> = tasks.iter().map(|t| t.id).collect();
    ids.sort();
    for id in ids {
        lock_task(txn, id).await?;
    }
    Ok(())
}

/// The task and, with `cascade`, its live descendants (children before parents).
pub async fn subtree<C: ConnectionTrait>(
    conn: &C,
    root: &task::Model,
    cascade: bool,
    include_archived: bool,
) -> Result<Vec<task::Model>> {
    let mut out = vec![root.clone()];
    if cascade {
        let mut frontier = vec![root.id];
        while let Some(id) = frontier.pop() {
            let mut q = task::Entity::find().filter(task::Column::ParentTaskId.eq(id));
            if !include_archived {
                q = q.filter(task::Column::ArchivedAt.is_null());
            }
            for child in q.all(conn).await? {
                frontier.push(child.id);
                out.push(child);
            }
        }
    }
    out.reverse();
    Ok(out)
}

/// Every live task that works in `owner_id`'s environment through a chain of `inherit_parent` links (an
/// archived link in the chain does not cut it), nearest first.
pub async fn live_inheritors<C: ConnectionTrait>(conn: &C, owner_id: Uuid) -> Result<Vec<task::Model>> {
    let mut out = Vec::new();
    let mut frontier = vec![owner_id];
    while !frontier.is_empty() {
        let children = task::Entity::find()
            .filter(task::Column::ParentTaskId.is_in(frontier.clone()))
            .filter(task::Column::WorkspaceMode.eq(WorkspaceMode::InheritParent))
            .order_by_asc(task::Column::Id)
            .all(conn)
            .await?;
        frontier = children.iter().map(|c| c.id).collect();
        out.extend(children.into_iter().filter(|c| c.archived_at.is_none()));
    }
    Ok(out)
}
