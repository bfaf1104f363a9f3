//! Checkpoints and session turns: queries only.
use crate::ids::{CheckpointId, EnvironmentId, SessionId, TurnId};
use chrono::{DateTime, Utc};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::entity::{checkpoint, session_turn as turn};
use crate::error::Result;

pub async fn insert_checkpoint<C: ConnectionTrait>(conn: &C, c: checkpoint::Model) -> Result<()> {
    let am: checkpoint::ActiveModel = c.into();
    checkpoint::Entity::insert(am).exec_without_returning(conn).await?;
    Ok(())
}

pub async fn checkpoint<C: ConnectionTrait>(conn: &C, id: CheckpointId) -> Result<Option<checkpoint::Model>> {
    Ok(checkpoint::Entity::find_by_id(id).one(conn).await?)
}

/// The environment's newest checkpoint.
pub async fn latest_checkpoint_of<C: ConnectionTrait>(
    conn: &C,
    env_id: EnvironmentId,
) -> Result<Option<checkpoint::Model>> {
    Ok(checkpoint::Entity::find()
        .filter(checkpoint::Column::TaskEnvironmentId.eq(env_id))
        .order_by_desc(checkpoint::Column::Id)
        .limit(1)
        .one(conn)
        .await?)
}

/// Forgets an environment's checkpoints (their refs went with its cleanup).
pub async fn delete_checkpoints_of<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId) -> Result<()> {
    checkpoint::Entity::delete_many()
        .filter(checkpoint::Column::TaskEnvironmentId.eq(env_id))
        .exec(conn)
        .await?;
    Ok(())
}

/// Records a turn as the session's next (numbered after its last).
pub async fn insert_turn<C: ConnectionTrait>(conn: &C, mut t: turn::Model) -> Result<turn::Model> {
    let last = turn::Entity::find()
        .filter(turn::Column::SessionId.eq(t.session_id))
        .order_by_desc(turn::Column::Number)
        .limit(1)
        .one(conn)
        .await?;
    t.number = last.map_or(1, |l| l.number + 1);
    let am: turn::ActiveModel = t.clone().into();
    turn::Entity::insert(am).exec_without_returning(conn).await?;
    Ok(t)
}

pub async fn delete_turn<C: ConnectionTrait>(conn: &C, id: TurnId) -> Result<()> {
    turn::Entity::delete_by_id(id).exec(conn).await?;
    Ok(())
}

/// The session's newest turn, if it has not settled.
pub async fn open_turn<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Option<turn::Model>> {
    Ok(turn::Entity::find()
        .filter(turn::Column::SessionId.eq(session_id))
        .order_by_desc(turn::Column::Number)
        .limit(1)
        .one(conn)
        .await?
        .filter(|t| t.settled_at.is_none()))
}

pub async fn settle_turn<C: ConnectionTrait>(
    conn: &C,
    id: TurnId,
    at: DateTime<Utc>,
    end_checkpoint_id: Option<CheckpointId>,
    files_changed: Option<i32>,
) -> Result<()> {
    turn::Entity::update(turn::ActiveModel {
        id: Set(id),
        settled_at: Set(Some(at)),
        end_checkpoint_id: Set(end_checkpoint_id),
        files_changed: Set(files_changed),
        ..Default::default()
    })
    .exec(conn)
    .await?;
    Ok(())
}

/// A session's turns, first to last.
pub async fn turns_of<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Vec<turn::Model>> {
    Ok(turn::Entity::find()
        .filter(turn::Column::SessionId.eq(session_id))
        .order_by_asc(turn::Column::Number)
        .all(conn)
        .await?)
}

pub async fn turn<C: ConnectionTrait>(conn: &C, session_id: SessionId, number: i32) -> Result<Option<turn::Model>> {
    Ok(turn::Entity::find()
        .filter(turn::Column::SessionId.eq(session_id))
        .filter(turn::Column::Number.eq(number))
        .one(conn)
        .await?)
}

/// The number of the session's newest turn, settled or not.
pub async fn newest_number<C: ConnectionTrait>(conn: &C, session_id: SessionId) -> Result<Option<i32>> {
    Ok(turn::Entity::find()
        .filter(turn::Column::SessionId.eq(session_id))
        .order_by_desc(turn::Column::Number)
        .one(conn)
        .await?
        .map(|t| t.number))
}
