//! Session rows (`task_sessions`), with the task and environment rows a session is read with.
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, LockType};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::entity::task_environment_repo::{self as env_repo, EnvironmentRepoStatus};
use crate::entity::task_session::{self as session, SessionState};
use crate::error::Result;

pub async fn find<C: ConnectionTrait>(conn: &C, id: Uuid) -> Result<Option<session::Model>> {
    Ok(session::Entity::find_by_id(id).one(conn).await?)
}

/// A session, its row locked for the rest of the transaction as an UPDATE would (PostgreSQL).
pub async fn find_locked(txn: &DatabaseTransaction, id: Uuid) -> Result<Option<session::Model>> {
    Ok(session::Entity::find_by_id(id)
        .lock(LockType::NoKeyUpdate)
        .one(txn)
        .await?)
}

/// A session with its task, in one query.
pub async fn find_with_task<C: ConnectionTrait>(
    conn: &C,
    id: Uuid,
) -> Result<Option<(session::Model, Option<task::Model>)>> {
    Ok(session::Entity::find_by_id(id)
        .find_also_related(task::Entity)
        .one(conn)
        .await?)
}

/// The task a session belongs to.
pub async fn task_of<C: ConnectionTrait>(conn: &C, s: &session::Model) -> Result<Option<task::Model>> {
    Ok(task::Entity::find_by_id(s.task_id).one(conn).await?)
}

/// The workspace path of the environment a session uses, if it has one.
pub async fn environment_path<C: ConnectionTrait>(conn: &C, s: &session::Model) -> Result<Option<String>> {
    let Some(env_id) = s.task_environment_id else {
        return Ok(None);
    };
    Ok(env::Entity::find_by_id(env_id)
        .one(conn)
        .await?
        .and_then(|e| e.workspace_path))
}

/// One page of a task's sessions, newest first, each with its environment.
pub async fn page_of_task<C: ConnectionTrait>(
    conn: &C,
    task_id: Uuid,
    before: Option<Uuid>,
    limit: u64,
) -> Result<Vec<(session::Model, Option<env::Model>)>> {
    let mut q = session::Entity::find().filter(session::Column::TaskId.eq(task_id));
    if let Some(before) = before {
        q = q.filter(session::Column::Id.lt(before));
    }
    Ok(q.order_by_desc(session::Column::Id)
        .limit(limit)
        .find_also_related(env::Entity)
        .all(conn)
        .await?)
}

pub async fn primary_of<C: ConnectionTrait>(conn: &C, task_id: Uuid) -> Result<Option<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .filter(session::Column::IsPrimary.eq(true))
        .one(conn)
        .await?)
}

/// A task's sessions, most recently active first.
pub async fn by_activity(txn: &DatabaseTransaction, task_id: Uuid) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .order_by_desc(session::Column::LastActivityAt)
        .order_by_desc(session::Column::Id)
        .all(txn)
        .await?)
}

/// Sessions in one of `states`, everywhere.
pub async fn in_states<C: ConnectionTrait>(conn: &C, states: &[SessionState]) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::State.is_in(states.iter().copied()))
        .all(conn)
        .await?)
}

/// A task's sessions that are not stopped, failed or cancelled.
pub async fn not_over_of_task<C: ConnectionTrait>(conn: &C, task_id: Uuid) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .filter(session::Column::State.is_not_in([
            SessionState::Stopped,
            SessionState::Failed,
            SessionState::Cancelled,
        ]))
        .all(conn)
        .await?)
}

pub async fn insert(txn: &DatabaseTransaction, model: session::Model) -> Result<()> {
    let am: session::ActiveModel = model.into();
    session::Entity::insert(am).exec_without_returning(txn).await?;
    Ok(())
}

pub async fn delete(txn: &DatabaseTransaction, id: Uuid) -> Result<()> {
    session::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}

/// Clears the task's primary flag, wherever it is.
pub async fn clear_primary(txn: &DatabaseTransaction, task_id: Uuid) -> Result<()> {
    session::Entity::update_many()
        .col_expr(session::Column::IsPrimary, Expr::value(false))
        .filter(session::Column::TaskId.eq(task_id))
        .filter(session::Column::IsPrimary.eq(true))
        .exec(txn)
        .await?;
    Ok(())
}

pub async fn set_primary(txn: &DatabaseTransaction, id: Uuid, now: DateTime<Utc>) -> Result<()> {
    session::Entity::update(session::ActiveModel {
        id: Set(id),
        is_primary: Set(true),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

pub async fn clear_desired_open(txn: &DatabaseTransaction, id: Uuid, now: DateTime<Utc>) -> Result<()> {
    session::Entity::update(session::ActiveModel {
        id: Set(id),
        desired_open: Set(false),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

pub async fn touch(txn: &DatabaseTransaction, id: Uuid, now: DateTime<Utc>) -> Result<()> {
    session::Entity::update(session::ActiveModel {
        id: Set(id),
        last_activity_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// A new session is activity on its task.
pub async fn touch_task(txn: &DatabaseTransaction, task_id: Uuid, now: DateTime<Utc>) -> Result<()> {
    task::Entity::update(task::ActiveModel {
        id: Set(task_id),
        last_activity_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// The columns a state transition writes besides `state` and `updated_at` (`None`: left as it is).
#[derive(Debug, Default, Clone)]
pub struct StatePatch {
    pub desired_open: Option<bool>,
    pub execution_id: Option<Option<Uuid>>,
    pub task_environment_id: Option<Option<Uuid>>,
    /// `(code, message)`, or `Some(None)` to clear it.
    pub last_error: Option<Option<(String, String)>>,
    pub last_activity_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// `UPDATE task_sessions SET state = next, .. WHERE id = ? AND state = from AND execution_id IS NOT
/// DISTINCT FROM ?`: true if the row was still as read.
pub async fn compare_and_set_state(
    txn: &DatabaseTransaction,
    id: Uuid,
    from: SessionState,
    from_execution: Option<Uuid>,
    next: SessionState,
    patch: &StatePatch,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut q = session::Entity::update_many()
        .col_expr(session::Column::State, Expr::value(next))
        .col_expr(session::Column::UpdatedAt, Expr::value(now));
    if let Some(v) = patch.desired_open {
        q = q.col_expr(session::Column::DesiredOpen, Expr::value(v));
    }
    if let Some(v) = patch.execution_id {
        q = q.col_expr(session::Column::ExecutionId, Expr::value(v));
    }
    if let Some(v) = patch.task_environment_id {
        q = q.col_expr(session::Column::TaskEnvironmentId, Expr::value(v));
    }
    if let Some(v) = &patch.last_error {
        let (code, message) = v.clone().unzip();
        q = q
            .col_expr(session::Column::LastErrorCode, Expr::value(code))
            .col_expr(session::Column::LastErrorMessage, Expr::value(message));
    }
    if let Some(v) = patch.last_activity_at {
        q = q.col_expr(session::Column::LastActivityAt, Expr::value(v));
    }
    if let Some(v) = patch.started_at {
        q = q.col_expr(session::Column::StartedAt, Expr::value(Some(v)));
    }
    if let Some(v) = patch.ended_at {
        q = q.col_expr(session::Column::EndedAt, Expr::value(Some(v)));
    }
    let execution = match from_execution {
        Some(e) => session::Column::ExecutionId.eq(e),
        None => session::Column::ExecutionId.is_null(),
    };
    let res = q
        .filter(session::Column::Id.eq(id))
        .filter(session::Column::State.eq(from))
        .filter(execution)
        .exec(txn)
        .await?;
    Ok(res.rows_affected == 1)
}

// The environment rows a session attaches to and launches in (to join `store::environments` at merge).

/// An environment a session may attach to: ready or stopped.
pub async fn attachable_environment(txn: &DatabaseTransaction, env_id: Uuid) -> Result<Option<env::Model>> {
    Ok(env::Entity::find_by_id(env_id)
        .filter(env::Column::Status.is_in([EnvironmentStatus::Ready, EnvironmentStatus::Stopped]))
        .one(txn)
        .await?)
}

pub async fn environment<C: ConnectionTrait>(conn: &C, env_id: Uuid) -> Result<Option<env::Model>> {
    Ok(env::Entity::find_by_id(env_id).one(conn).await?)
}

/// The active inventory rows of an environment (the canonical inventory admission reads).
pub async fn active_environment_repos<C: ConnectionTrait>(conn: &C, env_id: Uuid) -> Result<Vec<env_repo::Model>> {
    Ok(env_repo::Entity::find()
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .all(conn)
        .await?)
}

/// I19: writes the effective workspace path back if it differs.
pub async fn heal_workspace_path(txn: &DatabaseTransaction, env_id: Uuid, path: &str) -> Result<()> {
    env::Entity::update_many()
        .col_expr(env::Column::WorkspacePath, Expr::value(Some(path.to_string())))
        .filter(env::Column::Id.eq(env_id))
        .filter(
            Condition::any()
                .add(env::Column::WorkspacePath.ne(path.to_string()))
                .add(env::Column::WorkspacePath.is_null()),
        )
        .exec(txn)
        .await?;
    Ok(())
}
