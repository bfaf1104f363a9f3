//! Queries of the task lifecycle and of cleanup execution over tables of other families (tasks,
//! sessions, environments, inventory, workspaces): what a snapshot reads, what a lifecycle mutation
//! writes, and what a cleanup re-checks before it destroys anything.
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, JoinType, QueryFilter,
    QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::entity::task::{self, WorkspaceMode};
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::entity::task_environment_repo::{self as env_repo, EnvironmentRepoStatus};
use crate::entity::task_session::{self as session, SessionState};
use crate::entity::{repository, task_repository, workspace};
use crate::error::Result;

const ENDED: [SessionState; 3] = [SessionState::Stopped, SessionState::Failed, SessionState::Cancelled];

// ---- Tasks ----

pub async fn task<C: ConnectionTrait>(conn: &C, id: Uuid) -> Result<Option<task::Model>> {
    Ok(task::Entity::find_by_id(id).one(conn).await?)
}

/// Sets or clears `archived_at`.
pub async fn set_archived(
    txn: &DatabaseTransaction,
    id: Uuid,
    at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<()> {
    task::Entity::update(task::ActiveModel {
        id: Set(id),
        archived_at: Set(at),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

pub async fn delete_task(txn: &DatabaseTransaction, id: Uuid) -> Result<()> {
    task::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}

/// Quick chats not archived, idle since before `cutoff`.
pub async fn idle_quick_chats<C: ConnectionTrait>(conn: &C, cutoff: DateTime<Utc>) -> Result<Vec<task::Model>> {
    Ok(task::Entity::find()
        .filter(task::Column::Kind.eq(task::TaskKind::QuickChat))
        .filter(task::Column::ArchivedAt.is_null())
        .filter(task::Column::LastActivityAt.lt(cutoff))
        .all(conn)
        .await?)
}

pub async fn repository_slots<C: ConnectionTrait>(conn: &C, task_id: Uuid) -> Result<Vec<task_repository::Model>> {
    Ok(task_repository::Entity::find()
        .filter(task_repository::Column::TaskId.eq(task_id))
        .all(conn)
        .await?)
}

pub async fn repository<C: ConnectionTrait>(conn: &C, id: Uuid) -> Result<Option<repository::Model>> {
    Ok(repository::Entity::find_by_id(id).one(conn).await?)
}

/// Hands an environment to `heir`: a new ownership generation, the heir a task of its own (with the old
/// owner's slug), and the old owner's other children inheriting through the heir.
pub async fn transfer_environment(
    txn: &DatabaseTransaction,
    e: &env::Model,
    from: &task::Model,
    heir: &task::Model,
    now: DateTime<Utc>,
) -> Result<()> {
    env::Entity::update(env::ActiveModel {
        id: Set(e.id),
        task_id: Set(heir.id),
        ownership_generation: Set(e.ownership_generation + 1),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    task::Entity::update(task::ActiveModel {
        id: Set(heir.id),
        workspace_mode: Set(WorkspaceMode::NewWorkspace),
        parent_task_id: Set(None),
        slug: Set(from.slug.clone()),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    task::Entity::update_many()
        .col_expr(task::Column::ParentTaskId, Expr::value(Some(heir.id)))
        .filter(task::Column::ParentTaskId.eq(from.id))
        .filter(task::Column::Id.ne(heir.id))
        .exec(txn)
        .await?;
    Ok(())
}

// ---- Sessions ----

pub async fn session_ids_of_task<C: ConnectionTrait>(conn: &C, task_id: Uuid) -> Result<Vec<Uuid>> {
    Ok(session::Entity::find()
        .select_only()
        .column(session::Column::Id)
        .filter(session::Column::TaskId.eq(task_id))
        .into_tuple()
        .all(conn)
        .await?)
}

pub async fn sessions_of_task<C: ConnectionTrait>(conn: &C, task_id: Uuid) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .all(conn)
        .await?)
}

pub async fn sessions_in_environment<C: ConnectionTrait>(conn: &C, env_id: Uuid) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskEnvironmentId.eq(env_id))
        .all(conn)
        .await?)
}

/// Sessions of other tasks, not ended, that borrow this environment.
pub async fn live_borrowers<C: ConnectionTrait>(conn: &C, env_id: Uuid, owner_id: Uuid) -> Result<Vec<session::Model>> {
    Ok(session::Entity::find()
        .filter(session::Column::TaskEnvironmentId.eq(env_id))
        .filter(session::Column::TaskId.ne(owner_id))
        .filter(session::Column::State.is_not_in(ENDED))
        .all(conn)
        .await?)
}

// ---- Environments and their inventory ----

pub async fn environment<C: ConnectionTrait>(conn: &C, id: Uuid) -> Result<Option<env::Model>> {
    Ok(env::Entity::find_by_id(id).one(conn).await?)
}

/// An environment's active inventory rows, each with its repository (rows whose repository is gone are
/// left out): one join.
pub async fn active_worktrees<C: ConnectionTrait>(
    conn: &C,
    env_id: Uuid,
) -> Result<Vec<(env_repo::Model, repository::Model)>> {
    // Declared here until the inventory entity declares its relation to repositories.
    let to_repository = env_repo::Entity::belongs_to(repository::Entity)
        .from(env_repo::Column::RepositoryId)
        .to(repository::Column::Id)
        .into();
    Ok(env_repo::Entity::find()
        .select_also(repository::Entity)
        .join(JoinType::InnerJoin, to_repository)
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .all(conn)
        .await?
        .into_iter()
        .filter_map(|(r, repo)| Some((r, repo?)))
        .collect())
}

/// The environments, other than `env_id`, whose active inventory names `path`.
pub async fn environments_naming<C: ConnectionTrait>(conn: &C, path: &str, env_id: Uuid) -> Result<Vec<env::Model>> {
    let to_environment = env_repo::Entity::belongs_to(env::Entity)
        .from(env_repo::Column::TaskEnvironmentId)
        .to(env::Column::Id)
        .into();
    Ok(env_repo::Entity::find()
        .select_also(env::Entity)
        .join(JoinType::InnerJoin, to_environment)
        .filter(env_repo::Column::WorktreePath.eq(path))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .filter(env_repo::Column::TaskEnvironmentId.ne(env_id))
        .all(conn)
        .await?
        .into_iter()
        .filter_map(|(_, e)| e)
        .collect())
}

/// Marks an environment superseded (an explicit reset).
pub async fn mark_superseded(txn: &DatabaseTransaction, env_id: Uuid, now: DateTime<Utc>) -> Result<()> {
    env::Entity::update(env::ActiveModel {
        id: Set(env_id),
        status: Set(EnvironmentStatus::Superseded),
        superseded_at: Set(Some(now)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// The environment's active inventory rows become `deleted`.
pub async fn delete_inventory(txn: &DatabaseTransaction, env_id: Uuid, now: DateTime<Utc>) -> Result<()> {
    env_repo::Entity::update_many()
        .col_expr(env_repo::Column::Status, Expr::value(EnvironmentRepoStatus::Deleted))
        .col_expr(env_repo::Column::DeletedAt, Expr::value(Some(now)))
        .col_expr(env_repo::Column::UpdatedAt, Expr::value(now))
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .exec(txn)
        .await?;
    Ok(())
}

// ---- Workspaces ----

/// Locks the workspace row; `None` if it is gone.
pub async fn lock_workspace(txn: &DatabaseTransaction, id: Uuid) -> Result<Option<workspace::Model>> {
    Ok(workspace::Entity::find_by_id(id).lock_exclusive().one(txn).await?)
}

/// Every task of the workspace, in id order.
pub async fn tasks_of_workspace<C: ConnectionTrait>(conn: &C, workspace_id: Uuid) -> Result<Vec<task::Model>> {
    Ok(task::Entity::find()
        .filter(task::Column::WorkspaceId.eq(workspace_id))
        .order_by_asc(task::Column::Id)
        .all(conn)
        .await?)
}

/// Task creation refuses a `deleting` workspace.
pub async fn mark_workspace_deleting(txn: &DatabaseTransaction, id: Uuid, now: DateTime<Utc>) -> Result<()> {
    workspace::Entity::update(workspace::ActiveModel {
        id: Set(id),
        status: Set(crate::entity::workspace::WorkspaceStatus::Deleting),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// The workspace and its children of the cascade: tasks (with their environments) first, then
/// repositories, then the row.
pub async fn delete_workspace(txn: &DatabaseTransaction, id: Uuid) -> Result<()> {
    task::Entity::delete_many()
        .filter(task::Column::WorkspaceId.eq(id))
        .exec(txn)
        .await?;
    repository::Entity::delete_many()
        .filter(repository::Column::WorkspaceId.eq(id))
        .exec(txn)
        .await?;
    workspace::Entity::delete_by_id(id).exec(txn).await?;
    Ok(())
}
