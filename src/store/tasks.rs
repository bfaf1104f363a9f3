//! Task rows and their slots: locks, ownership walks, listings, archival and deletion, the transfer of
//! an environment between tasks, and the cleanup barrier's check.
use crate::ids::{ColumnId, TaskId, WorkspaceId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, LoaderTrait, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::entity::task::{self, WorkspaceMode};
use crate::entity::task_environment as env;
use crate::entity::{cleanup_job, repository, task_repository};
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
        current = super::by_key(task::Entity::find_by_id(parent_id), conn)
            .await?
            .ok_or(Error::NotFound("parent task"))?;
    }
    Err(Error::Internal(anyhow::anyhow!(
        "task {} inherits through more than 64 ancestors",
        task.id
    )))
}

/// I7: a task with an active lifecycle cleanup job (archive, delete, reset, expiry, a workspace delete)
/// accepts no new session, environment or inventory row. A `superseded_cleanup` job does not count: it
/// removes only what superseded environments left, never the current one, so a new session never waits
/// for it.
pub async fn ensure_no_cleanup<C: ConnectionTrait>(conn: &C, task_ids: &[TaskId]) -> Result<()> {
    active_jobs(conn, task_ids, true).await
}

/// No active cleanup job of any kind, `superseded_cleanup` included: before another job is written for
/// these tasks (two jobs never remove the same environment's worktrees at once). A `session_delete` job
/// counts for neither: it touches no environment, so it never holds a lifecycle up; instead the barrier
/// carries the agents it owes into the lifecycle job's snapshot (`cleanup::barrier::prepare`), and that
/// job ends them before it touches a worktree.
pub async fn ensure_no_cleanup_job<C: ConnectionTrait>(conn: &C, task_ids: &[TaskId]) -> Result<()> {
    active_jobs(conn, task_ids, false).await
}

async fn active_jobs<C: ConnectionTrait>(conn: &C, task_ids: &[TaskId], lifecycle_only: bool) -> Result<()> {
    let mut query = cleanup_job::Entity::find()
        .filter(cleanup_job::Column::TaskId.is_in(task_ids.iter().copied()))
        .filter(cleanup_job::Column::State.is_in(cleanup_job::ACTIVE_STATES))
        .filter(cleanup_job::Column::Trigger.ne(cleanup_job::CleanupTrigger::SessionDelete));
    if lifecycle_only {
        query = query.filter(cleanup_job::Column::Trigger.ne(cleanup_job::CleanupTrigger::SupersededCleanup));
    }
    if query.count(conn).await? > 0 {
        Err(Error::TaskCleanupInProgress)
    } else {
        Ok(())
    }
}

/// I7 for a launch: none of these tasks is archived or has an active cleanup job (a launch admitted
/// before an archive must not start, or go on running, once the archive committed).
pub async fn ensure_not_archived_or_cleaning<C: ConnectionTrait>(conn: &C, task_ids: &[TaskId]) -> Result<()> {
    let archived = task::Entity::find()
        .filter(task::Column::Id.is_in(task_ids.iter().copied()))
        .filter(task::Column::ArchivedAt.is_not_null())
        .count(conn)
        .await?;
    if archived > 0 {
        return Err(Error::TaskArchived);
    }
    ensure_no_cleanup(conn, task_ids).await
}

/// Locks a task row for the rest of the transaction (PostgreSQL; SQLite holds the writer lock already).
pub async fn lock_task(txn: &DatabaseTransaction, id: TaskId) -> Result<task::Model> {
    super::by_key(task::Entity::find_by_id(id).lock_exclusive(), txn)
        .await?
        .ok_or(Error::NotFound("task"))
}

/// Locks tasks in ascending id order, the order every writer uses (an owner is older than its
/// subtasks), so cascades and session creation cannot deadlock on PostgreSQL.
pub async fn lock_in_order(txn: &DatabaseTransaction, tasks: &[task::Model]) -> Result<()> {
    let mut ids: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
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
pub async fn live_inheritors<C: ConnectionTrait>(conn: &C, owner_id: TaskId) -> Result<Vec<task::Model>> {
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

pub async fn find<C: ConnectionTrait>(conn: &C, id: TaskId) -> Result<Option<task::Model>> {
    Ok(super::by_key(task::Entity::find_by_id(id), conn).await?)
}

/// Share-locks a task row (PostgreSQL) for the rest of the transaction.
pub async fn lock_shared(txn: &DatabaseTransaction, id: TaskId) -> Result<Option<task::Model>> {
    Ok(super::by_key(task::Entity::find_by_id(id).lock_shared(), txn).await?)
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
    id: TaskId,
    title: Option<String>,
    description: Option<String>,
    now: DateTime<Utc>,
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
    pub workspace_id: WorkspaceId,
    pub archived: bool,
    pub parent_task_id: Option<TaskId>,
    pub column_id: Option<ColumnId>,
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
    if let Some(column) = q.column_id {
        s = s.filter(task::Column::ColumnId.eq(column));
    }
    if let Some(before) = q.before {
        s = s.filter(task::Column::Id.lt(before));
    }
    Ok(s.order_by_desc(task::Column::Id).limit(q.limit).all(conn).await?)
}

/// A task's repository slots in workspace order.
pub async fn slots_of<C: ConnectionTrait>(conn: &C, task_id: TaskId) -> Result<Vec<task_repository::Model>> {
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

/// A task's repository slots in workspace order, each with its repository (if still registered).
pub async fn slots_with_repositories<C: ConnectionTrait>(
    conn: &C,
    task_id: TaskId,
) -> Result<Vec<(task_repository::Model, Option<repository::Model>)>> {
    Ok(task_repository::Entity::find()
        .find_also_related(repository::Entity)
        .filter(task_repository::Column::TaskId.eq(task_id))
        .order_by_asc(task_repository::Column::Position)
        .all(conn)
        .await?)
}

/// A task's slot at `position`.
pub async fn slot_at<C: ConnectionTrait>(
    conn: &C,
    task_id: TaskId,
    position: i32,
) -> Result<Option<task_repository::Model>> {
    Ok(task_repository::Entity::find()
        .filter(task_repository::Column::TaskId.eq(task_id))
        .filter(task_repository::Column::Position.eq(position))
        .one(conn)
        .await?)
}

/// Every task of the workspace, in id order.
pub async fn of_workspace<C: ConnectionTrait>(conn: &C, workspace_id: WorkspaceId) -> Result<Vec<task::Model>> {
    Ok(task::Entity::find()
        .filter(task::Column::WorkspaceId.eq(workspace_id))
        .order_by_asc(task::Column::Id)
        .all(conn)
        .await?)
}

/// Each task of the workspace with when it was archived.
pub async fn archival_of_workspace<C: ConnectionTrait>(
    conn: &C,
    workspace_id: WorkspaceId,
) -> Result<Vec<(TaskId, Option<DateTime<Utc>>)>> {
    Ok(task::Entity::find()
        .select_only()
        .column(task::Column::Id)
        .column(task::Column::ArchivedAt)
        .filter(task::Column::WorkspaceId.eq(workspace_id))
        .into_tuple()
        .all(conn)
        .await?)
}

/// Quick chats not archived, idle since before `cutoff`.
pub async fn idle_quick_chats<C: ConnectionTrait>(conn: &C, cutoff: DateTime<Utc>) -> Result<Vec<task::Model>> {
    Ok(task::Entity::find()
        .filter(task::Column::Kind.eq(task::TaskKind::QuickChat))
        .filter(task::Column::ArchivedAt.is_null())
        .filter(task::Column::LastActivityAt.lt(cutoff))
        .all(conn)
        .await?)
}

/// A new session is activity on its task.
pub async fn touch(txn: &DatabaseTransaction, id: TaskId, now: DateTime<Utc>) -> Result<()> {
    task::Entity::update(task::ActiveModel {
        id: Set(id),
        last_activity_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// Sets or clears `archived_at`.
pub async fn set_archived(
    txn: &DatabaseTransaction,
    id: TaskId,
    at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<()> {
    task::Entity::update(task::ActiveModel {
        id: Set(id),
        archived_at: Set(at),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

pub async fn delete(txn: &DatabaseTransaction, id: TaskId) -> Result<()> {
    task::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}

/// Hands `from`'s place in its inherit chain to `heir`: the heir becomes a task of its own under
/// `heir_parent`, and owns `e` (a new ownership generation) when `from` had one, taking `from`'s slug with
/// it (the directory and default branch the worktrees carry; `from` gets the heir's, so two tasks never
/// name one directory). Every other task that inherited through `from`, archived links included, now
/// inherits through the heir; with `all_children` (delete) `from`'s other children move too. Returns the
/// tasks re-parented besides the heir.
pub async fn transfer_environment(
    txn: &DatabaseTransaction,
    e: Option<&env::Model>,
    from: &task::Model,
    heir: &task::Model,
    heir_parent: Option<TaskId>,
    all_children: bool,
    now: DateTime<Utc>,
) -> Result<Vec<task::Model>> {
    let mut heir_row = task::ActiveModel {
        id: Set(heir.id),
        workspace_mode: Set(WorkspaceMode::NewWorkspace),
        parent_task_id: Set(heir_parent),
        updated_at: Set(now),
        ..Default::default()
    };
    if let Some(e) = e {
        env::Entity::update(env::ActiveModel {
            id: Set(e.id),
            task_id: Set(heir.id),
            ownership_generation: Set(e.ownership_generation + 1),
            updated_at: Set(now),
            ..Default::default()
        })
        .exec(txn)
        .await?;
        task::Entity::update(task::ActiveModel {
            id: Set(from.id),
            slug: Set(heir.slug.clone()),
            updated_at: Set(now),
            ..Default::default()
        })
        .exec(txn)
        .await?;
        heir_row.slug = Set(from.slug.clone());
    }
    task::Entity::update(heir_row).exec(txn).await?;
    let mut moved = task::Entity::find()
        .filter(task::Column::ParentTaskId.eq(from.id))
        .filter(task::Column::Id.ne(heir.id));
    if !all_children {
        moved = moved.filter(task::Column::WorkspaceMode.eq(WorkspaceMode::InheritParent));
    }
    let moved = moved.all(txn).await?;
    reparent(txn, &moved, Some(heir.id), now).await?;
    Ok(moved)
}

/// Points each of `tasks` at `parent`.
pub async fn reparent(
    txn: &DatabaseTransaction,
    tasks: &[task::Model],
    parent: Option<TaskId>,
    now: DateTime<Utc>,
) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    task::Entity::update_many()
        .col_expr(task::Column::ParentTaskId, Expr::value(parent))
        .col_expr(task::Column::UpdatedAt, Expr::value(now))
        .filter(task::Column::Id.is_in(tasks.iter().map(|t| t.id)))
        .exec(txn)
        .await?;
    Ok(())
}

/// Makes an `inherit_parent` task one of its own (no environment yet) under `parent`: the root of what
/// is left of a chain whose owner went away with no live inheritor.
pub async fn reroot(txn: &DatabaseTransaction, id: TaskId, parent: Option<TaskId>, now: DateTime<Utc>) -> Result<()> {
    task::Entity::update(task::ActiveModel {
        id: Set(id),
        workspace_mode: Set(WorkspaceMode::NewWorkspace),
        parent_task_id: Set(parent),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// The children of a task, in id order.
pub async fn children_of<C: ConnectionTrait>(conn: &C, id: TaskId) -> Result<Vec<task::Model>> {
    Ok(task::Entity::find()
        .filter(task::Column::ParentTaskId.eq(id))
        .order_by_asc(task::Column::Id)
        .all(conn)
        .await?)
}
