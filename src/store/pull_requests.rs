//! Pull requests: queries only.
use crate::ids::{PullRequestId, TaskId};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};

use crate::entity::pull_request as pr;
use crate::error::Result;

pub async fn insert<C: ConnectionTrait>(conn: &C, r: pr::Model) -> Result<()> {
    let am: pr::ActiveModel = r.into();
    pr::Entity::insert(am).exec_without_returning(conn).await?;
    Ok(())
}

/// The pull requests of these tasks, oldest first.
pub async fn of_tasks<C: ConnectionTrait>(conn: &C, task_ids: &[TaskId]) -> Result<Vec<pr::Model>> {
    if task_ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(pr::Entity::find()
        .filter(pr::Column::TaskId.is_in(task_ids.to_vec()))
        .order_by_asc(pr::Column::Id)
        .all(conn)
        .await?)
}

/// Open pull requests, least recently checked first.
pub async fn open_ones<C: ConnectionTrait>(conn: &C) -> Result<Vec<pr::Model>> {
    Ok(pr::Entity::find()
        .filter(pr::Column::State.eq("open"))
        .order_by_asc(pr::Column::CheckedAt)
        .all(conn)
        .await?)
}

/// Records what the host says now; whether anything changed.
pub async fn record_state<C: ConnectionTrait>(
    conn: &C,
    id: PullRequestId,
    state: &str,
    draft: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    pr::Entity::update_many()
        .col_expr(pr::Column::State, state.into())
        .col_expr(pr::Column::Draft, draft.into())
        .col_expr(pr::Column::UpdatedAt, now.into())
        .col_expr(pr::Column::CheckedAt, now.into())
        .filter(pr::Column::Id.eq(id))
        .exec(conn)
        .await?;
    Ok(())
}

/// Only the time it was read (nothing changed).
pub async fn checked<C: ConnectionTrait>(
    conn: &C,
    id: PullRequestId,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let am = pr::ActiveModel {
        id: Set(id),
        checked_at: Set(now),
        ..Default::default()
    };
    pr::Entity::update(am).exec(conn).await?;
    Ok(())
}
