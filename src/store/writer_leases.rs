//! Writer leases: queries only (the rule is `domain::writer`).
use crate::ids::{EnvironmentId, SessionId};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

use crate::entity::writer_lease::{self as lease, Writer};
use crate::error::Result;

/// Takes the environment's lease if no one holds a row for it: true when this insert took it.
pub async fn insert_if_free<C: ConnectionTrait>(conn: &C, row: lease::Model) -> Result<bool> {
    let am: lease::ActiveModel = row.into();
    let inserted = lease::Entity::insert(am)
        .on_conflict(
            OnConflict::column(lease::Column::TaskEnvironmentId)
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(conn)
        .await?;
    Ok(inserted == 1)
}

pub async fn find<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId) -> Result<Option<lease::Model>> {
    Ok(lease::Entity::find_by_id(env_id).one(conn).await?)
}

/// Deletes the row only while `token` holds it: true when it did.
pub async fn delete_held<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId, token: Uuid) -> Result<bool> {
    let gone = lease::Entity::delete_many()
        .filter(lease::Column::TaskEnvironmentId.eq(env_id))
        .filter(lease::Column::Token.eq(token))
        .exec(conn)
        .await?;
    Ok(gone.rows_affected == 1)
}

/// The lease a session's turn holds, whichever environment it is of.
pub async fn held_by_turn<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Option<lease::Model>> {
    Ok(lease::Entity::find()
        .filter(lease::Column::Holder.eq(Writer::Turn))
        .filter(lease::Column::HolderId.eq(session_id.uuid()))
        .one(conn)
        .await?)
}

/// Releases a session's turn lease, if it holds one (its turn ended without settling: the agent
/// stopped, failed or was lost).
pub async fn release_turn<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<bool> {
    let gone = lease::Entity::delete_many()
        .filter(lease::Column::Holder.eq(Writer::Turn))
        .filter(lease::Column::HolderId.eq(session_id.uuid()))
        .exec(conn)
        .await?;
    Ok(gone.rows_affected > 0)
}
