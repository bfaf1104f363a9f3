//! Stream tickets (`event_tickets`): stored by hash, redeemed at most once by any replica.
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Query;
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use crate::entity::event_ticket as ticket;
use crate::error::Result;

pub async fn insert<C: ConnectionTrait>(conn: &C, row: ticket::Model) -> Result<()> {
    ticket::Entity::insert(ticket::ActiveModel {
        ticket_hash: Set(row.ticket_hash),
        sub: Set(row.sub),
        scopes: Set(row.scopes),
        workspaces: Set(row.workspaces),
        session_id: Set(row.session_id),
        created_at: Set(row.created_at),
        expires_at: Set(row.expires_at),
        used_at: Set(None),
    })
    .exec_without_returning(conn)
    .await?;
    Ok(())
}

/// Marks the ticket used and returns it, if it exists, is unused and has not expired at `now`. One
/// conditional `UPDATE ... RETURNING`: of two replicas redeeming the same ticket, exactly one gets it.
pub async fn redeem<C: ConnectionTrait>(conn: &C, hash: &str, now: DateTime<Utc>) -> Result<Option<ticket::Model>> {
    let stmt = Query::update()
        .table(ticket::Entity)
        .value(ticket::Column::UsedAt, now)
        .and_where(ticket::Column::TicketHash.eq(hash))
        .and_where(ticket::Column::UsedAt.is_null())
        .and_where(ticket::Column::ExpiresAt.gt(now))
        .returning_all()
        .to_owned();
    let stmt = conn.get_database_backend().build(&stmt);
    Ok(ticket::Entity::find().from_raw_sql(stmt).one(conn).await?)
}

/// Deletes the tickets that expired before `now` (used or not): nothing can redeem them any more.
pub async fn delete_expired<C: ConnectionTrait>(conn: &C, now: DateTime<Utc>) -> Result<u64> {
    Ok(ticket::Entity::delete_many()
        .filter(ticket::Column::ExpiresAt.lte(now))
        .exec(conn)
        .await?
        .rows_affected)
}
