//! Commands routed to the node that runs a session's agent (`session_commands`), and the wake-up that
//! tells it (PostgreSQL `NOTIFY`; on SQLite the owner's poll finds them).
use crate::ids::{CommandId, ExecutionId, SessionId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait, QueryFilter,
    QueryOrder, Statement,
};

use crate::entity::session_command::{self as command, CommandKind, CommandState};
use crate::error::Result;

/// The channel a node LISTENs on for commands and messages routed to its agents.
pub const PG_CHANNEL: &str = "berth_session_commands";

pub async fn insert<C: ConnectionTrait>(
    conn: &C,
    session_id: SessionId,
    execution_id: ExecutionId,
    kind: CommandKind,
    payload: serde_json::Value,
    actor: Option<crate::actor::Actor>,
    now: DateTime<Utc>,
) -> Result<CommandId> {
    let id = CommandId::now_v7();
    command::Entity::insert(command::ActiveModel {
        id: Set(id),
        session_id: Set(session_id),
        execution_id: Set(execution_id),
        kind: Set(kind),
        payload: Set(payload),
        state: Set(CommandState::Pending),
        result: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
        actor_sub: Set(actor.as_ref().map(|a| a.sub.clone())),
        actor_session_id: Set(actor.and_then(|a| a.session_id)),
    })
    .exec_without_returning(conn)
    .await?;
    Ok(id)
}

pub async fn find<C: ConnectionTrait>(conn: &C, id: CommandId) -> Result<Option<command::Model>> {
    Ok(super::by_key(command::Entity::find_by_id(id), conn).await?)
}

/// The pending commands of the given sessions, oldest first.
pub async fn pending_for<C: ConnectionTrait>(conn: &C, session_ids: &[SessionId]) -> Result<Vec<command::Model>> {
    if session_ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(command::Entity::find()
        .filter(command::Column::State.eq(CommandState::Pending))
        .filter(command::Column::SessionId.is_in(session_ids.iter().copied()))
        .order_by_asc(command::Column::Id)
        .all(conn)
        .await?)
}

/// `pending` → `next` with its result, only if still pending: true when this call moved it.
pub async fn finish<C: ConnectionTrait>(
    conn: &C,
    id: CommandId,
    next: CommandState,
    result: serde_json::Value,
    now: DateTime<Utc>,
) -> Result<bool> {
    let r = command::Entity::update_many()
        .col_expr(command::Column::State, Expr::value(next))
        .col_expr(command::Column::Result, Expr::value(Some(result)))
        .col_expr(command::Column::UpdatedAt, Expr::value(now))
        .filter(command::Column::Id.eq(id))
        .filter(command::Column::State.eq(CommandState::Pending))
        .exec(conn)
        .await?;
    Ok(r.rows_affected == 1)
}

/// Finished commands older than `before` go (their callers have read them long ago).
pub async fn delete_finished_before<C: ConnectionTrait>(conn: &C, before: DateTime<Utc>) -> Result<u64> {
    let r = command::Entity::delete_many()
        .filter(command::Column::State.ne(CommandState::Pending))
        .filter(command::Column::UpdatedAt.lt(before))
        .exec(conn)
        .await?;
    Ok(r.rows_affected)
}

/// Wakes the nodes listening for routed work about this session (PostgreSQL only; a no-op on SQLite).
pub async fn notify(conn: &DatabaseConnection, session_id: SessionId) -> Result<()> {
    if conn.get_database_backend() != DbBackend::Postgres {
        return Ok(());
    }
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT pg_notify($1, $2)",
        [PG_CHANNEL.into(), session_id.to_string().into()],
    ))
    .await?;
    Ok(())
}
