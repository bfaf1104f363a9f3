//! Transcript rows (`session_messages`).
use crate::ids::SessionId;
use chrono::{DateTime, Utc};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};

use crate::entity::session_message::{self as message, MessageRole};
use crate::error::Result;

pub async fn append<C: ConnectionTrait>(
    conn: &C,
    session_id: SessionId,
    role: MessageRole,
    content: serde_json::Value,
    now: DateTime<Utc>,
) -> Result<i64> {
    let r = message::Entity::insert(message::ActiveModel {
        session_id: Set(session_id),
        role: Set(role),
        content: Set(content),
        created_at: Set(now),
        ..Default::default()
    })
    .exec(conn)
    .await?;
    Ok(r.last_insert_id)
}

/// Takes back a transcript entry (a prompt the agent refused).
pub async fn remove<C: ConnectionTrait>(conn: &C, id: i64) -> Result<()> {
    message::Entity::delete_by_id(id).exec(conn).await?;
    Ok(())
}

/// A session's transcript, oldest first.
pub async fn transcript<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Vec<message::Model>> {
    Ok(message::Entity::find()
        .filter(message::Column::SessionId.eq(session_id))
        .order_by_asc(message::Column::Id)
        .all(conn)
        .await?)
}
