//! The ledger of branches berth created (`task_branches`): queries only; what may be deleted is
//! `domain::branches`.
use crate::ids::{RepositoryId, TaskBranchId, TaskId, WorkspaceId};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};

use crate::entity::task_branch as ledger;
use crate::error::Result;

/// Records that berth created `branch` in the repository for `task_id` (a row left by an earlier task for
/// a branch of the same name, since deleted outside berth, is taken over: berth just made this one).
pub async fn record_created<C: ConnectionTrait>(
    conn: &C,
    workspace_id: WorkspaceId,
    repository_id: RepositoryId,
    branch: &str,
    base_branch: &str,
    task_id: TaskId,
) -> Result<()> {
    let row = ledger::ActiveModel {
        id: Set(TaskBranchId::now_v7()),
        workspace_id: Set(workspace_id),
        repository_id: Set(repository_id),
        branch: Set(branch.to_string()),
        base_branch: Set(base_branch.to_string()),
        task_id: Set(Some(task_id)),
        created_at: Set(crate::clock::now()),
    };
    ledger::Entity::insert(row)
        .on_conflict(
            OnConflict::columns([ledger::Column::RepositoryId, ledger::Column::Branch])
                .update_columns([ledger::Column::TaskId, ledger::Column::BaseBranch])
                .to_owned(),
        )
        .exec_without_returning(conn)
        .await?;
    Ok(())
}

pub async fn find<C: ConnectionTrait>(
    conn: &C,
    repository_id: RepositoryId,
    branch: &str,
) -> Result<Option<ledger::Model>> {
    Ok(ledger::Entity::find()
        .filter(ledger::Column::RepositoryId.eq(repository_id))
        .filter(ledger::Column::Branch.eq(branch))
        .one(conn)
        .await?)
}

/// The branch is gone (berth deleted it, or found it deleted): it leaves the ledger.
pub async fn forget<C: ConnectionTrait>(conn: &C, repository_id: RepositoryId, branch: &str) -> Result<()> {
    ledger::Entity::delete_many()
        .filter(ledger::Column::RepositoryId.eq(repository_id))
        .filter(ledger::Column::Branch.eq(branch))
        .exec(conn)
        .await?;
    Ok(())
}

/// An environment passed to an heir: so do the branches berth created for it.
pub async fn transfer<C: ConnectionTrait>(conn: &C, from: TaskId, to: TaskId) -> Result<()> {
    ledger::Entity::update_many()
        .col_expr(ledger::Column::TaskId, Expr::value(Some(to)))
        .filter(ledger::Column::TaskId.eq(from))
        .exec(conn)
        .await?;
    Ok(())
}

/// The branches berth created for a task (the ledger outlives the task row).
pub async fn of_task<C: ConnectionTrait>(conn: &C, task_id: TaskId) -> Result<Vec<ledger::Model>> {
    Ok(ledger::Entity::find()
        .filter(ledger::Column::TaskId.eq(task_id))
        .order_by_asc(ledger::Column::Id)
        .all(conn)
        .await?)
}

pub async fn of_workspace<C: ConnectionTrait>(conn: &C, workspace_id: WorkspaceId) -> Result<Vec<ledger::Model>> {
    Ok(ledger::Entity::find()
        .filter(ledger::Column::WorkspaceId.eq(workspace_id))
        .order_by_asc(ledger::Column::Id)
        .all(conn)
        .await?)
}
