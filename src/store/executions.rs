//! Agent execution rows (`agent_executions`): the durable handle of one agent process.
use crate::ids::{ExecutionId, InstanceId, SessionId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter};

use crate::entity::agent_execution::{self as execution, ExecutionState};
use crate::error::{Error, Result};

/// Records a new execution; a second live one for the session is refused by the database (I27).
pub async fn insert(txn: &DatabaseTransaction, model: execution::Model) -> Result<()> {
    let am: execution::ActiveModel = model.into();
    execution::Entity::insert(am)
        .exec_without_returning(txn)
        .await
        .map_err(|e| {
            if crate::error::is_unique_violation(&e) {
                Error::SessionBusy
            } else {
                e.into()
            }
        })?;
    Ok(())
}

/// The columns an execution transition writes besides `state` and `updated_at`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExecutionPatch {
    pub pid: Option<i32>,
    pub exit_code: Option<Option<i32>>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// `UPDATE agent_executions SET state = next, .. WHERE id = ? AND state IN (from)`: true if it moved.
pub(crate) async fn compare_and_set_state<C: ConnectionTrait>(
    conn: &C,
    id: ExecutionId,
    from: &[ExecutionState],
    next: ExecutionState,
    patch: ExecutionPatch,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut q = execution::Entity::update_many()
        .col_expr(execution::Column::State, Expr::value(next))
        .col_expr(execution::Column::UpdatedAt, Expr::value(now));
    if let Some(pid) = patch.pid {
        q = q.col_expr(execution::Column::Pid, Expr::value(Some(pid)));
    }
    if let Some(code) = patch.exit_code {
        q = q.col_expr(execution::Column::ExitCode, Expr::value(code));
    }
    if let Some(at) = patch.ended_at {
        q = q.col_expr(execution::Column::EndedAt, Expr::value(Some(at)));
    }
    let res = q
        .filter(execution::Column::Id.eq(id))
        .filter(execution::Column::State.is_in(from.iter().copied()))
        .exec(conn)
        .await?;
    Ok(res.rows_affected == 1)
}

pub async fn find<C: ConnectionTrait>(conn: &C, id: ExecutionId) -> Result<Option<execution::Model>> {
    Ok(super::by_key(execution::Entity::find_by_id(id), conn).await?)
}

/// How many of a session's executions failed since `since`.
pub async fn failures_since<C: ConnectionTrait>(conn: &C, session_id: SessionId, since: DateTime<Utc>) -> Result<u64> {
    Ok(execution::Entity::find()
        .filter(execution::Column::SessionId.eq(session_id))
        .filter(execution::Column::State.eq(ExecutionState::Failed))
        .filter(execution::Column::EndedAt.gt(since))
        .count(conn)
        .await?)
}

/// Executions on this node, still starting or running, that another process generation recorded.
pub async fn live_of_other_instances<C: ConnectionTrait>(
    conn: &C,
    node_id: &str,
    instance_id: InstanceId,
) -> Result<Vec<execution::Model>> {
    Ok(execution::Entity::find()
        .filter(execution::Column::State.is_in([ExecutionState::Starting, ExecutionState::Running]))
        .filter(execution::Column::NodeId.eq(node_id))
        .filter(execution::Column::InstanceId.ne(instance_id))
        .all(conn)
        .await?)
}

/// The executions of this node that other instances recorded and that a session in one of `states`
/// still names as its agent (what a dead sibling may have left).
pub async fn claimed_on_node_by_others<C: ConnectionTrait>(
    conn: &C,
    node_id: &str,
    instance_id: InstanceId,
    states: &[crate::entity::task_session::SessionState],
) -> Result<Vec<execution::Model>> {
    use crate::entity::task_session as session;
    use sea_orm::sea_query::Query;
    let named = Query::select()
        .column(session::Column::ExecutionId)
        .from(session::Entity)
        .and_where(session::Column::State.is_in(states.iter().copied()))
        .and_where(session::Column::ExecutionId.is_not_null())
        .to_owned();
    Ok(execution::Entity::find()
        .filter(execution::Column::NodeId.eq(node_id))
        .filter(execution::Column::InstanceId.ne(instance_id))
        .filter(execution::Column::Id.in_subquery(named))
        .all(conn)
        .await?)
}

/// The executions of these sessions still starting or running.
pub async fn live_of_sessions<C: ConnectionTrait>(
    conn: &C,
    session_ids: &[SessionId],
) -> Result<Vec<execution::Model>> {
    if session_ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(execution::Entity::find()
        .filter(execution::Column::SessionId.is_in(session_ids.iter().copied()))
        .filter(execution::Column::State.is_in([ExecutionState::Starting, ExecutionState::Running]))
        .all(conn)
        .await?)
}

/// The executions still starting or running in an environment: recorded for it, or of one of its
/// `sessions` (what a reader asks before it trusts a stored observation, I25).
pub async fn live_in_environment<C: ConnectionTrait>(
    conn: &C,
    env_id: crate::ids::EnvironmentId,
    sessions: &[SessionId],
) -> Result<Vec<execution::Model>> {
    use sea_orm::Condition;
    let mut either = Condition::any().add(execution::Column::TaskEnvironmentId.eq(env_id));
    if !sessions.is_empty() {
        either = either.add(execution::Column::SessionId.is_in(sessions.iter().copied()));
    }
    Ok(execution::Entity::find()
        .filter(either)
        .filter(execution::Column::State.is_in([ExecutionState::Starting, ExecutionState::Running]))
        .all(conn)
        .await?)
}
