//! Session rows (`task_sessions`), with the task and environment rows a session is read with: the
//! sessions of a task, of an environment and of a workspace, and a session's state compare-and-set.
use crate::ids::{EnvironmentId, ExecutionId, SessionId, TaskId, WorkspaceId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, LockType};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, JoinType, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect, RelationTrait,
};
use uuid::Uuid;

use crate::entity::task;
use crate::entity::task_environment as env;
use crate::entity::task_session::{self as session, SessionState};
use crate::error::Result;

/// The states a session does not leave.
const ENDED: [SessionState; 3] = [SessionState::Stopped, SessionState::Failed, SessionState::Cancelled];

pub async fn find<C: ConnectionTrait>(conn: &C, id: SessionId) -> Result<Option<session::Model>> {
    Ok(super::by_key(session::Entity::find_by_id(id), conn).await?)
}

/// A session, its row locked for the rest of the transaction as an UPDATE would (PostgreSQL).
pub async fn find_locked(txn: &DatabaseTransaction, id: SessionId) -> Result<Option<session::Model>> {
    Ok(super::by_key(session::Entity::find_by_id(id).lock(LockType::NoKeyUpdate), txn).await?)
}

/// A session with its task, in one query.
pub async fn find_with_task<C: ConnectionTrait>(
    conn: &C,
    id: SessionId,
) -> Result<Option<(session::Model, Option<task::Model>)>> {
    Ok(session::Entity::find_by_id(id)
        .find_also_related(task::Entity)
        .all(conn) // no LIMIT: see `super::by_key`
        .await?
        .pop())
}

/// One page of a task's sessions, newest first, each with its environment.
pub async fn page_of_task<C: ConnectionTrait>(
    conn: &C,
    task_id: TaskId,
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

pub async fn primary_of<C: ConnectionTrait>(conn: &C, task_id: TaskId) -> Result<Option<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .filter(session::Column::IsPrimary.eq(true))
        .one(conn)
        .await?)
}

/// A task's sessions, most recently active first.
pub async fn by_activity(txn: &DatabaseTransaction, task_id: TaskId) -> Result<Vec<session::Model>> {
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
/// Locked for the rest of the transaction, so a concurrent report cannot move one between the read and the
/// write (PostgreSQL; SQLite holds the writer lock already).
pub async fn not_over_of_task_locked(txn: &DatabaseTransaction, task_id: TaskId) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .filter(session::Column::State.is_not_in(ENDED))
        .order_by_asc(session::Column::Id)
        .lock(LockType::NoKeyUpdate)
        .all(txn)
        .await?)
}

/// Every session of a task.
pub async fn of_task<C: ConnectionTrait>(conn: &C, task_id: TaskId) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .all(conn)
        .await?)
}

/// The ids of a task's sessions.
pub async fn ids_of_task<C: ConnectionTrait>(conn: &C, task_id: TaskId) -> Result<Vec<SessionId>> {
    Ok(session::Entity::find()
        .select_only()
        .column(session::Column::Id)
        .filter(session::Column::TaskId.eq(task_id))
        .into_tuple()
        .all(conn)
        .await?)
}

/// (task id, session id, is primary) of every session of the given tasks.
pub async fn facts_of_tasks<C: ConnectionTrait>(
    conn: &C,
    task_ids: &[TaskId],
) -> Result<Vec<(TaskId, SessionId, bool)>> {
    Ok(session::Entity::find()
        .select_only()
        .column(session::Column::TaskId)
        .column(session::Column::Id)
        .column(session::Column::IsPrimary)
        .filter(session::Column::TaskId.is_in(task_ids.iter().copied()))
        .into_tuple()
        .all(conn)
        .await?)
}

/// Whether the session belongs to the task (a session-bound token's reach).
pub async fn belongs_to_task<C: ConnectionTrait>(conn: &C, session_id: SessionId, task_id: TaskId) -> Result<bool> {
    Ok(session::Entity::find_by_id(session_id)
        .filter(session::Column::TaskId.eq(task_id))
        .count(conn)
        .await?
        > 0)
}

/// Every session of the workspace's tasks, in one join.
pub async fn of_workspace<C: ConnectionTrait>(conn: &C, workspace_id: WorkspaceId) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .join(JoinType::InnerJoin, session::Relation::Task.def())
        .filter(task::Column::WorkspaceId.eq(workspace_id))
        .all(conn)
        .await?)
}

/// Every session attached to an environment.
pub async fn in_environment<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskEnvironmentId.eq(env_id))
        .all(conn)
        .await?)
}

/// The ids of the sessions attached to an environment.
pub async fn ids_in_environment<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId) -> Result<Vec<SessionId>> {
    Ok(session::Entity::find()
        .select_only()
        .column(session::Column::Id)
        .filter(session::Column::TaskEnvironmentId.eq(env_id))
        .into_tuple()
        .all(conn)
        .await?)
}

/// Sessions of other tasks, not ended, that borrow this environment.
pub async fn live_borrowers<C: ConnectionTrait>(
    conn: &C,
    env_id: EnvironmentId,
    owner_id: TaskId,
) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskEnvironmentId.eq(env_id))
        .filter(session::Column::TaskId.ne(owner_id))
        .filter(session::Column::State.is_not_in(ENDED))
        .all(conn)
        .await?)
}

/// Whether the session is attached to the environment (a session-bound token's reach).
pub async fn is_attached<C: ConnectionTrait>(conn: &C, session_id: SessionId, env_id: EnvironmentId) -> Result<bool> {
    Ok(session::Entity::find_by_id(session_id)
        .filter(session::Column::TaskEnvironmentId.eq(env_id))
        .count(conn)
        .await?
        > 0)
}

/// The environment a session is attached to, if it exists and is attached.
pub async fn environment_of<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Option<EnvironmentId>> {
    let env: Option<Option<EnvironmentId>> = session::Entity::find_by_id(session_id)
        .select_only()
        .column(session::Column::TaskEnvironmentId)
        .into_tuple()
        .all(conn) // no LIMIT: see `super::by_key`
        .await?
        .pop();
    Ok(env.flatten())
}

pub async fn insert(txn: &DatabaseTransaction, model: session::Model) -> Result<()> {
    let am: session::ActiveModel = model.into();
    session::Entity::insert(am).exec_without_returning(txn).await?;
    Ok(())
}

pub async fn delete(txn: &DatabaseTransaction, id: SessionId) -> Result<()> {
    session::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}

/// Clears the task's primary flag, wherever it is.
pub async fn clear_primary(txn: &DatabaseTransaction, task_id: TaskId) -> Result<()> {
    session::Entity::update_many()
        .col_expr(session::Column::IsPrimary, Expr::value(false))
        .filter(session::Column::TaskId.eq(task_id))
        .filter(session::Column::IsPrimary.eq(true))
        .exec(txn)
        .await?;
    Ok(())
}

pub async fn set_primary(txn: &DatabaseTransaction, id: SessionId, now: DateTime<Utc>) -> Result<()> {
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

pub async fn clear_desired_open(txn: &DatabaseTransaction, id: SessionId, now: DateTime<Utc>) -> Result<()> {
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

pub async fn touch(txn: &DatabaseTransaction, id: SessionId, now: DateTime<Utc>) -> Result<()> {
    touch_with(txn, id, now, None).await
}

/// `touch`, writing what the agent told about itself in the same single UPDATE of the row.
pub async fn touch_with(
    txn: &DatabaseTransaction,
    id: SessionId,
    now: DateTime<Utc>,
    agent_state: Option<serde_json::Value>,
) -> Result<()> {
    session::Entity::update(session::ActiveModel {
        id: Set(id),
        last_activity_at: Set(now),
        agent_state: match agent_state {
            Some(v) => Set(Some(v)),
            None => sea_orm::ActiveValue::NotSet,
        },
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// Records the agent's own conversation identity and what it told about itself.
pub async fn record_agent<C: ConnectionTrait>(
    conn: &C,
    id: SessionId,
    agent_session_ref: Option<&str>,
    agent_state: serde_json::Value,
) -> Result<()> {
    let mut q = session::Entity::update_many().col_expr(session::Column::AgentState, Expr::value(agent_state));
    if let Some(r) = agent_session_ref {
        q = q.col_expr(session::Column::AgentSessionRef, Expr::value(r.to_string()));
    }
    q.filter(session::Column::Id.eq(id)).exec(conn).await?;
    Ok(())
}

/// Other sessions, in a state that claims a process, recorded as continuing the conversation `r`.
pub async fn holding_conversation<C: ConnectionTrait>(conn: &C, id: SessionId, r: &str) -> Result<u64> {
    Ok(session::Entity::find()
        .filter(session::Column::AgentSessionRef.eq(r))
        .filter(session::Column::Id.ne(id))
        .filter(session::Column::State.is_in([
            SessionState::Starting,
            SessionState::Running,
            SessionState::Idle,
            SessionState::Attention,
            SessionState::Recovering,
            SessionState::Stopping,
        ]))
        .count(conn)
        .await?)
}

/// The columns a state transition writes besides `state` and `updated_at` (`None`: left as it is).
#[derive(Debug, Default, Clone)]
pub struct StatePatch {
    pub desired_open: Option<bool>,
    pub execution_id: Option<Option<ExecutionId>>,
    pub task_environment_id: Option<Option<EnvironmentId>>,
    /// `(code, message)`, or `Some(None)` to clear it.
    pub last_error: Option<Option<(String, String)>>,
    pub last_activity_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// What the agent told about itself (for snapshots), when it changed.
    pub agent_state: Option<serde_json::Value>,
}

/// `UPDATE task_sessions SET state = next, .. WHERE id = ? AND state = from AND execution_id IS NOT
/// DISTINCT FROM ?`: true if the row was still as read.
pub(crate) async fn compare_and_set_state(
    txn: &DatabaseTransaction,
    id: SessionId,
    from: SessionState,
    from_execution: Option<ExecutionId>,
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
    if let Some(v) = &patch.agent_state {
        q = q.col_expr(session::Column::AgentState, Expr::value(v.clone()));
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
