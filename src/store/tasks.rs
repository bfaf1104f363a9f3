//! Task rows and their slots: locks, ownership walks, listings and the cleanup barrier's check.
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, LoaderTrait, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::entity::task::{self, WorkspaceMode};
use crate::entity::{cleanup_job, task_repository, task_session};
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

pub async fn find<C: ConnectionTrait>(conn: &C, id: Uuid) -> Result<Option<task::Model>> {
    Ok(task::Entity::find_by_id(id).one(conn).await?)
}

/// Share-locks a task row (PostgreSQL) for the rest of the transaction.
pub async fn lock_shared(txn: &DatabaseTransaction, id: Uuid) -> Result<Option<task::Model>> {
    Ok(task::Entity::find_by_id(id).lock_shared().one(txn).await?)
}

/// Inserts a task with its repository slots.
pub async fn insert_with_slots(
    txn: &DatabaseTransaction,
    model: &task::Model,
    slots: &[task_repository::Model],
) -> Result<()> {
    let am: task::ActiveModel = model.clone().into();
    task::Entity::insert(am).exec_without_returning(txn).await?;
    if !slots.is_empty() {
        task_repository::Entity::insert_many(slots.iter().cloned().map(task_repository::ActiveModel::from))
            .exec_without_returning(txn)
            .await?;
    }
    Ok(())
}

/// Writes a task's title and description, each only when given.
pub async fn update_text(
    txn: &DatabaseTransaction,
    id: Uuid,
    title: Option<String>,
    description: Option<String>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let mut am = task::ActiveModel {
        id: Set(id),
        updated_at: Set(now),
        ..Default::default()
    };
    if let Some(title) = title {
        am.title = Set(title);
    }
    if let Some(description) = description {
        am.description = Set(description);
    }
    task::Entity::update(am).exec(txn).await?;
    Ok(())
}

/// Which tasks of a workspace a listing selects.
pub struct TaskQuery {
    pub workspace_id: Uuid,
    pub archived: bool,
    pub parent_task_id: Option<Uuid>,
    pub before: Option<Uuid>,
    pub limit: u64,
}

/// A page of a workspace's tasks, newest first.
pub async fn page<C: ConnectionTrait>(conn: &C, q: TaskQuery) -> Result<Vec<task::Model>> {
    let mut s = task::Entity::find().filter(task::Column::WorkspaceId.eq(q.workspace_id));
    s = if q.archived {
        s.filter(task::Column::ArchivedAt.is_not_null())
    } else {
        s.filter(task::Column::ArchivedAt.is_null())
    };
    if let Some(parent) = q.parent_task_id {
        s = s.filter(task::Column::ParentTaskId.eq(parent));
    }
    if let Some(before) = q.before {
        s = s.filter(task::Column::Id.lt(before));
    }
    Ok(s.order_by_desc(task::Column::Id).limit(q.limit).all(conn).await?)
}

/// A task's repository slots in workspace order.
pub async fn slots_of<C: ConnectionTrait>(conn: &C, task_id: Uuid) -> Result<Vec<task_repository::Model>> {
    Ok(task_repository::Entity::find()
        .filter(task_repository::Column::TaskId.eq(task_id))
        .order_by_asc(task_repository::Column::Position)
        .all(conn)
        .await?)
}

/// The repository slots of each task, in workspace order, in one relation query.
pub async fn slots_of_each<C: ConnectionTrait>(
    conn: &C,
    tasks: &[task::Model],
) -> Result<Vec<Vec<task_repository::Model>>> {
    Ok(tasks
        .load_many(
            task_repository::Entity::find().order_by_asc(task_repository::Column::Position),
            conn,
        )
        .await?)
}

/// (task id, session id, is primary) of every session of the given tasks.
pub async fn session_facts<C: ConnectionTrait>(conn: &C, task_ids: &[Uuid]) -> Result<Vec<(Uuid, Uuid, bool)>> {
    Ok(task_session::Entity::find()
        .select_only()
        .column(task_session::Column::TaskId)
        .column(task_session::Column::Id)
        .column(task_session::Column::IsPrimary)
        .filter(task_session::Column::TaskId.is_in(task_ids.iter().copied()))
        .into_tuple()
        .all(conn)
        .await?)
}

/// Whether the session belongs to the task (a session-bound token's reach).
pub async fn session_belongs<C: ConnectionTrait>(conn: &C, session_id: Uuid, task_id: Uuid) -> Result<bool> {
    Ok(task_session::Entity::find_by_id(session_id)
        .filter(task_session::Column::TaskId.eq(task_id))
        .count(conn)
        .await?
        > 0)
}
