//! Git status observations: queries only; which observation is current and what a new one replaces are
//! the domain's rules (`domain::git_status`, I22/I23).
use crate::ids::{EnvironmentId, ObservationId, RepositoryId};
use sea_orm::{ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::entity::git_status_observation::{self as obs, ObservationKind};
use crate::error::Result;

fn of_pair(env_id: EnvironmentId, repository_id: RepositoryId) -> sea_orm::Select<obs::Entity> {
    obs::Entity::find()
        .filter(obs::Column::TaskEnvironmentId.eq(env_id))
        .filter(obs::Column::RepositoryId.eq(repository_id))
}

/// The newest observation of (environment, repository): one index probe on `ix_git_status_current`.
pub async fn newest<C: ConnectionTrait>(
    conn: &C,
    env_id: EnvironmentId,
    repository_id: RepositoryId,
) -> Result<Option<obs::Model>> {
    Ok(of_pair(env_id, repository_id)
        .order_by_desc(obs::Column::ObservedAt)
        .order_by_desc(obs::Column::Id)
        .limit(1)
        .one(conn)
        .await?)
}

/// The newest observation of the pair, locked for the rest of the transaction (PostgreSQL).
pub async fn newest_locked(
    txn: &DatabaseTransaction,
    env_id: EnvironmentId,
    repository_id: RepositoryId,
) -> Result<Option<obs::Model>> {
    Ok(of_pair(env_id, repository_id)
        .order_by_desc(obs::Column::ObservedAt)
        .order_by_desc(obs::Column::Id)
        .lock_exclusive()
        .one(txn)
        .await?)
}

/// The pair's live row (I23: at most one).
pub async fn live_row(
    txn: &DatabaseTransaction,
    env_id: EnvironmentId,
    repository_id: RepositoryId,
) -> Result<Option<obs::Model>> {
    Ok(of_pair(env_id, repository_id)
        .filter(obs::Column::Kind.eq(ObservationKind::Live))
        .one(txn)
        .await?)
}

pub async fn insert(txn: &DatabaseTransaction, model: &obs::Model) -> std::result::Result<(), sea_orm::DbErr> {
    obs::Entity::insert(obs::ActiveModel::from(model.clone()))
        .exec_without_returning(txn)
        .await?;
    Ok(())
}

pub async fn delete(txn: &DatabaseTransaction, id: ObservationId) -> Result<()> {
    obs::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}

/// Deletes the pair's observations of `kinds` observed at or before `up_to`.
pub async fn delete_kinds_up_to(
    txn: &DatabaseTransaction,
    env_id: EnvironmentId,
    repository_id: RepositoryId,
    kinds: &[ObservationKind],
    up_to: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    obs::Entity::delete_many()
        .filter(obs::Column::TaskEnvironmentId.eq(env_id))
        .filter(obs::Column::RepositoryId.eq(repository_id))
        .filter(obs::Column::Kind.is_in(kinds.iter().copied()))
        .filter(obs::Column::ObservedAt.lte(up_to))
        .exec(txn)
        .await?;
    Ok(())
}
