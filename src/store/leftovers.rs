//! What berth kept on disk (`leftovers`): queries only; what is kept and how it is disposed of is
//! `domain::cleanup::kept`.
use crate::ids::{LeftoverId, WorkspaceId};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};

use crate::entity::leftover;
use crate::error::Result;

/// Records a kept directory; one already recorded at that path keeps its row (and its `created_at`:
/// kept since then).
pub async fn record<C: ConnectionTrait>(conn: &C, row: leftover::Model) -> Result<()> {
    let row = leftover::ActiveModel {
        id: Set(row.id),
        workspace_id: Set(row.workspace_id),
        task_id: Set(row.task_id),
        task_environment_id: Set(row.task_environment_id),
        repository_id: Set(row.repository_id),
        path: Set(row.path),
        original_path: Set(row.original_path),
        reason: Set(row.reason),
        detail: Set(row.detail),
        worktree: Set(row.worktree),
        created_at: Set(row.created_at),
        node_id: Set(row.node_id),
    };
    leftover::Entity::insert(row)
        .on_conflict(
            OnConflict::column(leftover::Column::Path)
                .update_column(leftover::Column::Detail)
                .to_owned(),
        )
        .exec_without_returning(conn)
        .await?;
    Ok(())
}

pub async fn of_workspace<C: ConnectionTrait>(conn: &C, workspace_id: WorkspaceId) -> Result<Vec<leftover::Model>> {
    Ok(leftover::Entity::find()
        .filter(leftover::Column::WorkspaceId.eq(workspace_id))
        .order_by_asc(leftover::Column::Id)
        .all(conn)
        .await?)
}

pub async fn find<C: ConnectionTrait>(conn: &C, id: LeftoverId) -> Result<Option<leftover::Model>> {
    Ok(super::by_key(leftover::Entity::find_by_id(id), conn).await?)
}

/// The directory is gone (disposed of, or found gone): it leaves the list.
pub async fn forget<C: ConnectionTrait>(conn: &C, id: LeftoverId) -> Result<()> {
    leftover::Entity::delete_by_id(id).exec(conn).await?;
    Ok(())
}

/// A worktree at `path` is in use again (a fresh environment adopted it): it is no longer left over.
pub async fn forget_path<C: ConnectionTrait>(conn: &C, path: &str) -> Result<()> {
    leftover::Entity::delete_many()
        .filter(leftover::Column::Path.eq(path))
        .exec(conn)
        .await?;
    Ok(())
}
