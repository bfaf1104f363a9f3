//! Environment rows and their inventory: queries only; which environment is current, and when a
//! materializer may write, are the domain's rules (`domain::environments`).
use crate::ids::{EnvironmentId, EnvironmentRepoId, InstanceId, RepositoryId, TaskId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DatabaseTransaction, EntityTrait, JoinType, QueryFilter,
    QueryOrder, QuerySelect, RelationTrait,
};

use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::entity::task_environment_repo::{self as env_repo, BranchOrigin, EnvironmentRepoStatus};
use crate::entity::{repository, task};
use crate::error::Result;

/// One inventory row to insert.
#[derive(Debug, Clone)]
pub struct NewRepoRow {
    pub repository_id: RepositoryId,
    pub branch_slug: String,
    pub position: i32,
    pub worktree_id: Option<String>,
    pub worktree_path: Option<String>,
    pub worktree_branch: Option<String>,
    pub status: EnvironmentRepoStatus,
    pub error_message: Option<String>,
    pub branch_origin: Option<BranchOrigin>,
}

pub async fn find<C: ConnectionTrait>(conn: &C, id: EnvironmentId) -> Result<Option<env::Model>> {
    Ok(super::by_key(env::Entity::find_by_id(id), conn).await?)
}

/// The environment with its owner task, in one query.
pub async fn find_with_owner<C: ConnectionTrait>(
    conn: &C,
    id: EnvironmentId,
) -> Result<Option<(env::Model, Option<task::Model>)>> {
    Ok(env::Entity::find_by_id(id)
        .find_also_related(task::Entity)
        .all(conn) // no LIMIT: see `super::by_key`
        .await?
        .pop())
}

/// An environment a session may attach to: ready or stopped.
pub async fn find_attachable(txn: &DatabaseTransaction, id: EnvironmentId) -> Result<Option<env::Model>> {
    Ok(super::by_key(
        env::Entity::find_by_id(id)
            .filter(env::Column::Status.is_in([EnvironmentStatus::Ready, EnvironmentStatus::Stopped])),
        txn,
    )
    .await?)
}

/// Locks an environment row for the rest of the transaction (PostgreSQL).
pub async fn lock(txn: &DatabaseTransaction, id: EnvironmentId) -> Result<Option<env::Model>> {
    Ok(super::by_key(env::Entity::find_by_id(id).lock_exclusive(), txn).await?)
}

/// The owner's environments that are not superseded, newest first.
pub async fn live_of<C: ConnectionTrait>(conn: &C, owner_id: TaskId) -> Result<Vec<env::Model>> {
    Ok(env::Entity::find()
        .filter(env::Column::TaskId.eq(owner_id))
        .filter(env::Column::Status.is_not_in([EnvironmentStatus::Superseded, EnvironmentStatus::Lost]))
        .order_by_desc(env::Column::CreatedAt)
        .all(conn)
        .await?)
}

/// Every environment the owner ever had, newest first (superseded ones included).
pub async fn all_of<C: ConnectionTrait>(conn: &C, owner_id: TaskId) -> Result<Vec<env::Model>> {
    Ok(env::Entity::find()
        .filter(env::Column::TaskId.eq(owner_id))
        .order_by_desc(env::Column::CreatedAt)
        .all(conn)
        .await?)
}

/// Superseded environments of `node_id`, superseded before `before`, whose inventory still names a
/// worktree (what the reconcile pass looks at), oldest first, at most `limit`.
pub async fn superseded_with_worktrees<C: ConnectionTrait>(
    conn: &C,
    node_id: &str,
    before: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<env::Model>> {
    use sea_orm::sea_query::Query;
    let named = Query::select()
        .column(env_repo::Column::TaskEnvironmentId)
        .from(env_repo::Entity)
        .and_where(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .and_where(env_repo::Column::WorktreePath.is_not_null())
        .to_owned();
    Ok(env::Entity::find()
        .filter(env::Column::Status.eq(EnvironmentStatus::Superseded))
        .filter(env::Column::NodeId.eq(node_id))
        .filter(env::Column::SupersededAt.lt(before))
        .filter(env::Column::Id.in_subquery(named))
        .order_by_asc(env::Column::SupersededAt)
        .limit(limit)
        .all(conn)
        .await?)
}

/// `creating` environments of `node_id` last touched before `before`.
pub async fn creating_untouched_since<C: ConnectionTrait>(
    conn: &C,
    node_id: &str,
    before: DateTime<Utc>,
) -> Result<Vec<env::Model>> {
    Ok(env::Entity::find()
        .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
        .filter(env::Column::NodeId.eq(node_id))
        .filter(env::Column::UpdatedAt.lt(before))
        .all(conn)
        .await?)
}

/// Inserts an environment row; the caller maps a unique violation (I14's backstop).
pub async fn insert(txn: &DatabaseTransaction, model: &env::Model) -> std::result::Result<(), sea_orm::DbErr> {
    let am: env::ActiveModel = model.clone().into();
    env::Entity::insert(am).exec_without_returning(txn).await?;
    Ok(())
}

/// Marks an environment superseded (kept for diagnostics).
pub async fn mark_superseded(txn: &DatabaseTransaction, id: EnvironmentId, now: DateTime<Utc>) -> Result<()> {
    env::Entity::update(env::ActiveModel {
        id: Set(id),
        status: Set(EnvironmentStatus::Superseded),
        materializer_id: Set(None),
        superseded_at: Set(Some(now)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// Sets the effective workspace path of an environment.
pub async fn set_workspace_path(txn: &DatabaseTransaction, id: EnvironmentId, path: Option<String>) -> Result<()> {
    env::Entity::update(env::ActiveModel {
        id: Set(id),
        workspace_path: Set(path),
        updated_at: Set(crate::clock::now()),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// I19: writes the effective workspace path back if it differs.
pub async fn heal_workspace_path(txn: &DatabaseTransaction, id: EnvironmentId, path: &str) -> Result<()> {
    env::Entity::update_many()
        .col_expr(env::Column::WorkspacePath, Expr::value(Some(path.to_string())))
        .filter(env::Column::Id.eq(id))
        .filter(
            Condition::any()
                .add(env::Column::WorkspacePath.ne(path.to_string()))
                .add(env::Column::WorkspacePath.is_null()),
        )
        .exec(txn)
        .await?;
    Ok(())
}

/// The effective workspace path of an environment, if it exists and has one.
pub async fn workspace_path<C: ConnectionTrait>(conn: &C, id: EnvironmentId) -> Result<Option<String>> {
    Ok(super::by_key(env::Entity::find_by_id(id), conn)
        .await?
        .and_then(|e| e.workspace_path))
}

/// A `ready`, `stopped` or `broken` environment becomes `broken` with this category. False when
/// nothing changed (another state, or already broken for this reason).
pub async fn mark_broken(
    txn: &DatabaseTransaction,
    id: EnvironmentId,
    category: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    let changes = Condition::any()
        .add(env::Column::Status.ne(EnvironmentStatus::Broken))
        .add(env::Column::BrokenCategory.is_null())
        .add(env::Column::BrokenCategory.ne(category.to_string()));
    let r = env::Entity::update_many()
        .col_expr(env::Column::Status, Expr::value(EnvironmentStatus::Broken))
        .col_expr(env::Column::BrokenCategory, Expr::value(Some(category.to_string())))
        .col_expr(env::Column::UpdatedAt, Expr::value(now))
        .filter(env::Column::Id.eq(id))
        .filter(env::Column::Status.is_in([
            EnvironmentStatus::Ready,
            EnvironmentStatus::Stopped,
            EnvironmentStatus::Broken,
        ]))
        .filter(changes)
        .exec(txn)
        .await?;
    Ok(r.rows_affected == 1)
}

/// A `broken` environment admission proved again becomes `ready`. False when it was not broken.
pub async fn mark_recovered(txn: &DatabaseTransaction, id: EnvironmentId, now: DateTime<Utc>) -> Result<bool> {
    let r = env::Entity::update_many()
        .col_expr(env::Column::Status, Expr::value(EnvironmentStatus::Ready))
        .col_expr(env::Column::BrokenCategory, Expr::value(Option::<String>::None))
        .col_expr(env::Column::UpdatedAt, Expr::value(now))
        .filter(env::Column::Id.eq(id))
        .filter(env::Column::Status.eq(EnvironmentStatus::Broken))
        .exec(txn)
        .await?;
    Ok(r.rows_affected == 1)
}

/// What a settled materialization writes over its `creating` row.
pub struct Settle {
    pub status: EnvironmentStatus,
    pub workspace_path: Option<Option<String>>,
    pub error_message: Option<String>,
}

/// Compare-and-set on a `creating` row still held by `materializer_id`: `settle` replaces it (and
/// releases the materializer). Returns whether the row was still held.
pub async fn settle_held(
    txn: &DatabaseTransaction,
    id: EnvironmentId,
    materializer_id: Option<InstanceId>,
    settle: Settle,
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut q = env::Entity::update_many()
        .col_expr(env::Column::Status, Expr::value(settle.status))
        .col_expr(env::Column::MaterializerId, Expr::value(Option::<InstanceId>::None))
        .col_expr(env::Column::UpdatedAt, Expr::value(now));
    if let Some(path) = settle.workspace_path {
        q = q.col_expr(env::Column::WorkspacePath, Expr::value(path));
    }
    if let Some(message) = settle.error_message {
        q = q.col_expr(env::Column::ErrorMessage, Expr::value(message));
    }
    let res = q
        .filter(env::Column::Id.eq(id))
        .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
        .filter(env::Column::MaterializerId.eq(materializer_id))
        .exec(txn)
        .await?;
    Ok(res.rows_affected == 1)
}

/// Refreshes the lease of a `creating` row still held by `materializer_id`; false once it is not.
pub async fn touch_held<C: ConnectionTrait>(
    conn: &C,
    id: EnvironmentId,
    materializer_id: Option<InstanceId>,
) -> Result<bool> {
    let res = env::Entity::update_many()
        .col_expr(env::Column::UpdatedAt, Expr::value(crate::clock::now()))
        .filter(env::Column::Id.eq(id))
        .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
        .filter(env::Column::MaterializerId.eq(materializer_id))
        .exec(conn)
        .await?;
    Ok(res.rows_affected == 1)
}

/// Inserts inventory rows for an environment.
pub async fn insert_repo_rows(txn: &DatabaseTransaction, env_id: EnvironmentId, rows: Vec<NewRepoRow>) -> Result<()> {
    let now = crate::clock::now();
    let models: Vec<env_repo::ActiveModel> = rows
        .into_iter()
        .map(|r| env_repo::ActiveModel {
            id: Set(EnvironmentRepoId::now_v7()),
            task_environment_id: Set(env_id),
            repository_id: Set(r.repository_id),
            branch_slug: Set(r.branch_slug),
            worktree_id: Set(r.worktree_id),
            worktree_path: Set(r.worktree_path),
            worktree_branch: Set(r.worktree_branch),
            base_commit: Set(None),
            position: Set(r.position),
            status: Set(r.status),
            error_message: Set(r.error_message),
            created_at: Set(now),
            updated_at: Set(now),
            merged_at: Set(None),
            row_version: Set(1),
            deleted_at: Set(None),
            branch_origin: Set(r.branch_origin),
            imported_from: Set(None),
        })
        .collect();
    if !models.is_empty() {
        env_repo::Entity::insert_many(models)
            .exec_without_returning(txn)
            .await?;
    }
    Ok(())
}

/// An environment's inventory in workspace order.
pub async fn repos_of<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId) -> Result<Vec<env_repo::Model>> {
    Ok(env_repo::Entity::find()
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .order_by_asc(env_repo::Column::Position)
        .order_by_asc(env_repo::Column::Id)
        .all(conn)
        .await?)
}

/// The active inventory rows of an environment (the canonical inventory admission reads).
pub async fn active_repos<C: ConnectionTrait>(conn: &C, env_id: EnvironmentId) -> Result<Vec<env_repo::Model>> {
    Ok(env_repo::Entity::find()
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .all(conn)
        .await?)
}

/// An environment's active inventory rows, each with its repository (if still registered).
pub async fn active_repos_with_repository<C: ConnectionTrait>(
    conn: &C,
    env_id: EnvironmentId,
) -> Result<Vec<(env_repo::Model, Option<repository::Model>)>> {
    Ok(env_repo::Entity::find()
        .find_also_related(repository::Entity)
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .all(conn)
        .await?)
}

/// The environments, other than `env_id`, whose active inventory names `path`.
pub async fn others_naming<C: ConnectionTrait>(conn: &C, path: &str, env_id: EnvironmentId) -> Result<Vec<env::Model>> {
    Ok(env_repo::Entity::find()
        .select_also(env::Entity)
        .join(JoinType::InnerJoin, env_repo::Relation::Environment.def())
        .filter(env_repo::Column::WorktreePath.eq(path))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .filter(env_repo::Column::TaskEnvironmentId.ne(env_id))
        .all(conn)
        .await?
        .into_iter()
        .filter_map(|(_, e)| e)
        .collect())
}

/// The environment's active inventory rows become `deleted`.
pub async fn delete_inventory(txn: &DatabaseTransaction, env_id: EnvironmentId, now: DateTime<Utc>) -> Result<()> {
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

/// The inventory rows of the environment naming these worktree paths become `deleted` (the others stay).
pub async fn delete_inventory_paths(
    txn: &DatabaseTransaction,
    env_id: EnvironmentId,
    paths: &[String],
    now: DateTime<Utc>,
) -> Result<()> {
    if paths.is_empty() {
        return Ok(());
    }
    env_repo::Entity::update_many()
        .col_expr(env_repo::Column::Status, Expr::value(EnvironmentRepoStatus::Deleted))
        .col_expr(env_repo::Column::DeletedAt, Expr::value(Some(now)))
        .col_expr(env_repo::Column::UpdatedAt, Expr::value(now))
        .filter(env_repo::Column::TaskEnvironmentId.eq(env_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .filter(env_repo::Column::WorktreePath.is_in(paths.iter().cloned()))
        .exec(txn)
        .await?;
    Ok(())
}

/// Effective workspace paths of the given environments.
pub async fn workspace_paths<C: ConnectionTrait>(
    conn: &C,
    ids: impl IntoIterator<Item = EnvironmentId>,
) -> Result<Vec<(EnvironmentId, Option<String>)>> {
    Ok(env::Entity::find()
        .select_only()
        .column(env::Column::Id)
        .column(env::Column::WorkspacePath)
        .filter(env::Column::Id.is_in(ids))
        .into_tuple()
        .all(conn)
        .await?)
}

/// The `local` environments still their task's that work in the repository's own checkout.
pub async fn local_on<C: ConnectionTrait>(conn: &C, repository_id: RepositoryId) -> Result<Vec<env::Model>> {
    let mut out: Vec<env::Model> = env_repo::Entity::find()
        .select_also(env::Entity)
        .join(JoinType::InnerJoin, env_repo::Relation::Environment.def())
        .filter(env_repo::Column::RepositoryId.eq(repository_id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .filter(env::Column::ExecutorType.eq(crate::entity::task_environment::ExecutorType::Local))
        .filter(env::Column::Status.is_not_in([
            EnvironmentStatus::Superseded,
            EnvironmentStatus::Lost,
            EnvironmentStatus::Failed,
        ]))
        .all(conn)
        .await?
        .into_iter()
        .filter_map(|(_, e)| e)
        .collect();
    out.sort_by_key(|e| e.id);
    out.dedup_by_key(|e| e.id);
    Ok(out)
}
