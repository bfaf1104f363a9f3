//! Reviews: queries only.
use crate::ids::{EnvironmentId, ReviewId};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};

use crate::entity::review;
use crate::error::Result;

pub async fn insert<C: ConnectionTrait>(conn: &C, r: review::Model) -> Result<()> {
    let am: review::ActiveModel = r.into();
    review::Entity::insert(am).exec_without_returning(conn).await?;
    Ok(())
}

pub async fn find<C: ConnectionTrait>(conn: &C, id: ReviewId) -> Result<Option<review::Model>> {
    Ok(review::Entity::find_by_id(id).one(conn).await?)
}

/// An environment's reviews, oldest first.
pub async fn of_environment<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId) -> Result<Vec<review::Model>> {
    Ok(review::Entity::find()
        .filter(review::Column::TaskEnvironmentId.eq(env_id))
        .order_by_asc(review::Column::Id)
        .all(conn)
        .await?)
}
