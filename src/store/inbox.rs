//! A session's inbox (`session_inbox`): messages stored before they are sent, with their delivery state.
use crate::ids::{InboxItemId, SessionId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder};

use crate::entity::session_inbox::{self as inbox, Delivery, InboxState};
use crate::error::Result;

pub async fn insert<C: ConnectionTrait>(
    conn: &C,
    session_id: SessionId,
    text: &str,
    delivery: Delivery,
    now: DateTime<Utc>,
) -> Result<inbox::Model> {
    let row = inbox::Model {
        id: InboxItemId::now_v7(),
        session_id,
        text: text.to_string(),
        delivery,
        state: InboxState::Queued,
        reason: None,
        created_at: now,
        updated_at: now,
    };
    inbox::Entity::insert(inbox::ActiveModel {
        id: Set(row.id),
        session_id: Set(row.session_id),
        text: Set(row.text.clone()),
        delivery: Set(row.delivery),
        state: Set(row.state),
        reason: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .exec_without_returning(conn)
    .await?;
    Ok(row)
}

pub async fn find<C: ConnectionTrait>(
    conn: &C,
    session_id: SessionId,
    id: InboxItemId,
) -> Result<Option<inbox::Model>> {
    Ok(super::by_key(
        inbox::Entity::find_by_id(id).filter(inbox::Column::SessionId.eq(session_id)),
        conn,
    )
    .await?)
}

/// Every message of a session, oldest first (ids are v7: creation order).
pub async fn of_session<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Vec<inbox::Model>> {
    Ok(inbox::Entity::find()
        .filter(inbox::Column::SessionId.eq(session_id))
        .order_by_asc(inbox::Column::Id)
        .all(conn)
        .await?)
}

/// The messages still waiting, oldest first.
pub async fn queued<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Vec<inbox::Model>> {
    Ok(inbox::Entity::find()
        .filter(inbox::Column::SessionId.eq(session_id))
        .filter(inbox::Column::State.eq(InboxState::Queued))
        .order_by_asc(inbox::Column::Id)
        .all(conn)
        .await?)
}

pub async fn count_queued<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<u64> {
    Ok(inbox::Entity::find()
        .filter(inbox::Column::SessionId.eq(session_id))
        .filter(inbox::Column::State.eq(InboxState::Queued))
        .count(conn)
        .await?)
}

/// The sessions among `ids` with something queued.
pub async fn sessions_with_queued<C: ConnectionTrait>(conn: &C, ids: &[SessionId]) -> Result<Vec<SessionId>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows: Vec<SessionId> = inbox::Entity::find()
        .filter(inbox::Column::SessionId.is_in(ids.iter().copied()))
        .filter(inbox::Column::State.eq(InboxState::Queued))
        .all(conn)
        .await?
        .into_iter()
        .map(|m| m.session_id)
        .collect();
    rows.sort();
    rows.dedup();
    Ok(rows)
}

/// `queued` → `next` (with a reason), only if it is still queued: true when this call moved it.
pub async fn settle<C: ConnectionTrait>(
    conn: &C,
    id: InboxItemId,
    next: InboxState,
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<bool> {
    let r = inbox::Entity::update_many()
        .col_expr(inbox::Column::State, Expr::value(next))
        .col_expr(inbox::Column::Reason, Expr::value(reason.map(str::to_string)))
        .col_expr(inbox::Column::UpdatedAt, Expr::value(now))
        .filter(inbox::Column::Id.eq(id))
        .filter(inbox::Column::State.eq(InboxState::Queued))
        .exec(conn)
        .await?;
    Ok(r.rows_affected == 1)
}
