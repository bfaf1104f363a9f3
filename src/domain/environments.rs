//! Environments: the task-owned workspace (seed 001, seed 000 "canonical environment and inventory").
//!
//! A task owns at most one current environment (I1). The first session that needs one elects itself
//! materializer under the task's lock and commits a `creating` row; the physical worktrees are created
//! outside any transaction; the complete inventory and `ready` are then published together, so nothing
//! can attach to a half-made environment. Concurrent first sessions get `workspace_preparing` (I14).
use std::collections::HashMap;

use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder,
};
use serde_json::json;
use uuid::Uuid;

use super::Ctx;
use crate::auth::Principal;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::{self as env_repo, EnvironmentRepoStatus};
use crate::entity::{repository, task_repository, task_session};
use crate::error::{Error, Result};
use crate::events::{self, Subject};
use crate::executor::worktree;
use crate::managed_path::ManagedRoot;
use crate::store::tasks::{ensure_no_cleanup, lock_task, owner_of};

/// An environment with its inventory, in workspace order.
#[derive(Debug, Clone)]
pub struct EnvironmentView {
    pub env: env::Model,
    pub repos: Vec<env_repo::Model>,
}

/// The current (non-superseded) environment of an owner task.
pub(crate) async fn current<C: ConnectionTrait>(conn: &C, owner_task_id: Uuid) -> Result<Option<env::Model>> {
    let mut envs = env::Entity::find()
        .filter(env::Column::TaskId.eq(owner_task_id))
        .filter(env::Column::Status.ne(EnvironmentStatus::Superseded))
        .order_by_desc(env::Column::CreatedAt)
        .all(conn)
        .await?;
    // The ready one is current; without one, the one being made; else the newest failed attempt.
    let rank = |e: &env::Model| match e.status {
        EnvironmentStatus::Ready | EnvironmentStatus::Stopped => 0,
        EnvironmentStatus::Creating => 1,
        _ => 2,
    };
    envs.sort_by_key(|e| rank(e));
    Ok(envs.into_iter().next())
}

/// Supersedes what is left of earlier attempts (failed, or creating with an expired lease), keeping
/// them recorded for diagnostics; a new attempt adopts any worktree they left in place.
async fn supersede_stale(txn: &DatabaseTransaction, ctx: &Ctx, owner: &task::Model, envs: &[env::Model]) -> Result<()> {
    for stale in envs
        .iter()
        .filter(|e| matches!(e.status, EnvironmentStatus::Failed | EnvironmentStatus::Creating))
    {
        supersede(txn, ctx, owner, stale.id, "retry").await?;
    }
    Ok(())
}

/// Records an environment as superseded (kept for diagnostics, untouched on disk), with its event.
pub(crate) async fn supersede(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    owner: &task::Model,
    env_id: Uuid,
    reason: &str,
) -> Result<()> {
    let now = crate::clock::now();
    env::Entity::update(env::ActiveModel {
        id: Set(env_id),
        status: Set(EnvironmentStatus::Superseded),
        materializer_id: Set(None),
        superseded_at: Set(Some(now)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    events::append(
        txn,
        ctx.instance_id,
        "environment.superseded",
        env_subject(owner, env_id),
        json!({ "reason": reason }),
    )
    .await?;
    Ok(())
}

enum Election {
    Ready(env::Model),
    Elected(env::Model),
}

/// Returns the task's ready environment for `executor`, materializing it first when there is none.
pub async fn ensure_ready(ctx: &Ctx, task: &task::Model, executor: ExecutorType) -> Result<env::Model> {
    let owner = owner_of(&ctx.db.conn, task).await?;
    let env = match elect(ctx, task, &owner, executor).await? {
        Election::Ready(env) => return Ok(env),
        Election::Elected(env) => env,
    };
    // In a task of its own: a client that disconnects mid-way does not strand a `creating` environment.
    let (ctx, task) = (ctx.clone(), task.clone());
    tokio::spawn(async move { prepare(&ctx, &task, &owner, &env).await })
        .await
        .map_err(|e| Error::Internal(anyhow::anyhow!("materialization task failed: {e}")))?
}

/// Materializes and publishes an elected environment, keeping its lease alive meanwhile. Every way out
/// other than success records the attempt as failed, so nobody waits on it.
async fn prepare(ctx: &Ctx, task: &task::Model, owner: &task::Model, e: &env::Model) -> Result<env::Model> {
    let heartbeat = tokio::spawn(heartbeat(ctx.clone(), e.clone())).abort_handle();
    let outcome = materialize_and_publish(ctx, task, owner, e).await;
    heartbeat.abort();
    match outcome {
        Ok(ready) => Ok(ready),
        Err(Failed::Slot(failure)) => {
            fail(
                ctx,
                owner,
                e,
                Some(&failure),
                &format!("preparing repository {} failed", failure.repository_name),
            )
            .await?;
            Err(Error::MaterializationFailed {
                environment_id: e.id,
                repository_name: failure.repository_name,
            })
        }
        Err(Failed::Other(err)) => {
            if let Err(record) = fail(ctx, owner, e, None, "preparing the workspace was abandoned").await {
                tracing::warn!(error = %record, environment = %e.id, "could not record an abandoned materialization");
            }
            Err(err)
        }
    }
}

enum Failed {
    Slot(worktree::SlotFailure),
    Other(Error),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Other(e)
    }
}

async fn materialize_and_publish(
    ctx: &Ctx,
    task: &task::Model,
    owner: &task::Model,
    e: &env::Model,
) -> Result<env::Model, Failed> {
    let (rows, path, made) = materialize(ctx, owner, e, &owner.slug).await?;
    let published = publish(ctx, task, owner, e, rows, path).await;
    if let Err(Error::TaskCleanupInProgress | Error::NotFound(_)) = published {
        // A lifecycle operation won (its barrier stands, or the task is gone): what this attempt created
        // never became task state, and nobody can adopt it; remove it (I7).
        worktree::compensate(ctx.git.as_ref(), &made).await;
    }
    // Otherwise (taken over, or the database failed) the worktrees stay for the next attempt to adopt:
    // removing them could remove what a new materializer already adopted.
    Ok(published?)
}

/// Makes the environment's files exist: worktrees for `worktree`, nothing for `local`.
async fn materialize(
    ctx: &Ctx,
    owner: &task::Model,
    e: &env::Model,
    task_dir: &str,
) -> Result<(Vec<Done>, Option<String>, Vec<worktree::Materialized>), Failed> {
    let plans = plans(&ctx.db.conn, owner, task_dir).await?;
    match e.executor_type {
        ExecutorType::Local => {
            // The registered repository itself: no worktree, and no path berth could ever remove (I13).
            let rows = plans
                .iter()
                .map(|p| Done {
                    repository_id: p.repository_id,
                    branch_slug: p.branch_slug.clone(),
                    position: p.position,
                    worktree_id: None,
                    worktree_path: None,
                    worktree_branch: None,
                })
                .collect();
            let path = plans.first().map(|p| p.repository_path.to_string_lossy().into_owned());
            Ok((rows, path, Vec::new()))
        }
        ExecutorType::Worktree => {
            let root = ManagedRoot::from_config(&ctx.config);
            let made = worktree::materialize(ctx.git.as_ref(), &root, task_dir, &plans)
                .await
                .map_err(Failed::Slot)?;
            let rows = made
                .iter()
                .map(|m| Done {
                    repository_id: m.repository_id,
                    branch_slug: m.branch_slug.clone(),
                    position: m.position,
                    worktree_id: m.worktree_id.clone(),
                    worktree_path: Some(m.worktree_path.clone()),
                    worktree_branch: m.worktree_branch.clone(),
                })
                .collect::<Vec<_>>();
            // I19: one repository works in its worktree; several in the task root.
            let path = match made.as_slice() {
                [one] => Some(one.worktree_path.clone()),
                _ => Some(root.path().join(task_dir).to_string_lossy().into_owned()),
            };
            Ok((rows, path, made))
        }
    }
}

/// Keeps a `creating` environment's lease fresh while its materializer works.
async fn heartbeat(ctx: Ctx, e: env::Model) {
    let every = (ctx.config.materialize_lease / 4).max(std::time::Duration::from_millis(200));
    loop {
        tokio::time::sleep(every).await;
        let res = env::Entity::update_many()
            .col_expr(
                env::Column::UpdatedAt,
                sea_orm::sea_query::Expr::value(crate::clock::now()),
            )
            .filter(env::Column::Id.eq(e.id))
            .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
            .filter(env::Column::MaterializerId.eq(e.materializer_id))
            .exec(&ctx.db.conn)
            .await;
        if !matches!(res, Ok(r) if r.rows_affected == 1) {
            return;
        }
    }
}

/// Under the owner's lock: select a ready environment, or elect this request to materialize one.
async fn elect(ctx: &Ctx, task: &task::Model, owner: &task::Model, executor: ExecutorType) -> Result<Election> {
    let txn = ctx.db.begin_write().await?;
    let owner_row = lock_task(&txn, owner.id).await?;
    if owner_row.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
    let envs = live_envs(&txn, owner.id).await?;
    if envs.iter().any(|e| is_fresh_creating(ctx, e)) {
        // Someone is materializing, and its lease is fresh.
        return Err(Error::WorkspacePreparing);
    }
    if let Some(ready) = envs
        .iter()
        .find(|e| matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped))
    {
        // With another executor, the session attaches here and its launch performs the transition (I18):
        // the current environment changes only once the new launch succeeded.
        return Ok(Election::Ready(ready.clone()));
    }
    supersede_stale(&txn, ctx, owner, &envs).await?;
    let model = new_candidate(&txn, ctx, owner, executor).await?;
    ctx.commit(txn).await?;
    Ok(Election::Elected(model))
}

async fn live_envs(txn: &DatabaseTransaction, owner_id: Uuid) -> Result<Vec<env::Model>> {
    Ok(env::Entity::find()
        .filter(env::Column::TaskId.eq(owner_id))
        .filter(env::Column::Status.ne(EnvironmentStatus::Superseded))
        .all(txn)
        .await?)
}

pub(crate) fn is_fresh_creating(ctx: &Ctx, e: &env::Model) -> bool {
    let lease = chrono::Duration::from_std(ctx.config.materialize_lease).unwrap_or(chrono::Duration::minutes(5));
    e.status == EnvironmentStatus::Creating && e.updated_at > crate::clock::now() - lease
}

/// Inserts a `creating` environment whose materializer is this request (under the owner's lock).
async fn new_candidate(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    owner: &task::Model,
    executor: ExecutorType,
) -> Result<env::Model> {
    let slots = task_repository::Entity::find()
        .filter(task_repository::Column::TaskId.eq(owner.id))
        .count(txn)
        .await?;
    if executor == ExecutorType::Worktree && slots == 0 {
        return Err(Error::invalid(
            "executor_type",
            "the task has no repository to make a worktree of",
        ));
    }
    if executor == ExecutorType::Local && slots > 1 {
        return Err(Error::WorkspaceReuseUnsupported(
            "the local executor works in one repository; use the worktree executor for several",
        ));
    }
    let now = crate::clock::now();
    let model = env::Model {
        id: Uuid::now_v7(),
        task_id: owner.id,
        executor_type: executor,
        status: EnvironmentStatus::Creating,
        workspace_path: None,
        node_id: ctx.config.node_id.clone(),
        ownership_generation: 1,
        materializer_id: Some(Uuid::now_v7()),
        error_message: None,
        created_at: now,
        updated_at: now,
        superseded_at: None,
    };
    let am: env::ActiveModel = model.clone().into();
    match env::Entity::insert(am).exec_without_returning(txn).await {
        // The partial unique index is the backstop: someone else is materializing.
        Err(e) if crate::error::is_unique_violation(&e) => return Err(Error::WorkspacePreparing),
        other => other?,
    };
    events::append(
        txn,
        ctx.instance_id,
        "environment.created",
        env_subject(owner, model.id),
        json!({ "executor_type": executor, "status": "creating" }),
    )
    .await?;
    Ok(model)
}

/// A transition candidate (I18): a new environment for `executor`, materialized with its complete
/// inventory but still `creating`, beside the current one. `promote_transition` makes it current once the
/// launch in it succeeded; `abandon_transition` records it failed otherwise.
pub(crate) async fn prepare_transition(
    ctx: &Ctx,
    task: &task::Model,
    executor: ExecutorType,
) -> Result<(env::Model, Vec<worktree::Materialized>)> {
    let owner = owner_of(&ctx.db.conn, task).await?;
    let txn = ctx.db.begin_write().await?;
    lock_task(&txn, owner.id).await?;
    ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
    let envs = live_envs(&txn, owner.id).await?;
    if envs.iter().any(|e| is_fresh_creating(ctx, e)) {
        return Err(Error::WorkspacePreparing);
    }
    let stale: Vec<env::Model> = envs
        .into_iter()
        .filter(|e| !matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped))
        .collect();
    supersede_stale(&txn, ctx, &owner, &stale).await?;
    let candidate = new_candidate(&txn, ctx, &owner, executor).await?;
    ctx.commit(txn).await?;

    let (rows, path, made) = match materialize(ctx, &owner, &candidate, &transition_dir(&owner, &candidate)).await {
        Ok(m) => m,
        Err(Failed::Slot(failure)) => {
            fail(
                ctx,
                &owner,
                &candidate,
                Some(&failure),
                &format!("preparing repository {} failed", failure.repository_name),
            )
            .await?;
            return Err(Error::MaterializationFailed {
                environment_id: candidate.id,
                repository_name: failure.repository_name,
            });
        }
        Err(Failed::Other(e)) => {
            let _ = fail(ctx, &owner, &candidate, None, "preparing the workspace was abandoned").await;
            return Err(e);
        }
    };
    let staged: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lock_task(&txn, owner.id).await?;
        ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
        insert_rows(&txn, candidate.id, rows).await?;
        env::Entity::update(env::ActiveModel {
            id: Set(candidate.id),
            workspace_path: Set(path.clone()),
            updated_at: Set(crate::clock::now()),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        ctx.commit(txn).await
    }
    .await;
    if let Err(e) = staged {
        abandon_transition(ctx, task, &candidate, &made, "staging the new environment failed").await;
        return Err(e);
    }
    Ok((
        env::Model {
            workspace_path: path,
            ..candidate
        },
        made,
    ))
}

/// A transition's directory is its own (I18): never the one an earlier environment of the task left on
/// disk, which must stay untouched and must not be adopted.
fn transition_dir(owner: &task::Model, candidate: &env::Model) -> String {
    let hex = candidate.id.simple().to_string();
    format!("{}-{}", owner.slug, &hex[hex.len() - 8..])
}

/// The launch in the candidate succeeded: it becomes current; the previous one is kept, superseded and
/// untouched on disk (I18). Runs inside the caller's transaction.
pub(crate) async fn promote_transition(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    task: &task::Model,
    candidate_id: Uuid,
    materializer_id: Option<Uuid>,
) -> Result<()> {
    let owner = owner_of(txn, task).await?;
    let now = crate::clock::now();
    for old in live_envs(txn, owner.id)
        .await?
        .into_iter()
        .filter(|e| e.id != candidate_id)
    {
        supersede(txn, ctx, &owner, old.id, "executor_transition").await?;
    }
    // Still ours: a candidate taken over (its lease expired) is not brought back.
    let promoted = env::Entity::update_many()
        .col_expr(
            env::Column::Status,
            sea_orm::sea_query::Expr::value(EnvironmentStatus::Ready),
        )
        .col_expr(
            env::Column::MaterializerId,
            sea_orm::sea_query::Expr::value(Option::<Uuid>::None),
        )
        .col_expr(env::Column::UpdatedAt, sea_orm::sea_query::Expr::value(now))
        .filter(env::Column::Id.eq(candidate_id))
        .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
        .filter(env::Column::MaterializerId.eq(materializer_id))
        .exec(txn)
        .await?;
    if promoted.rows_affected == 0 {
        return Err(Error::Conflict(
            "the new environment was taken over while the agent started; retry".into(),
        ));
    }
    events::append(
        txn,
        ctx.instance_id,
        "environment.ready",
        env_subject(&owner, candidate_id),
        json!({ "reason": "executor_transition" }),
    )
    .await?;
    Ok(())
}

/// The launch in the candidate failed: remove what the candidate's attempt created, record it failed; the
/// previous environment stays current.
pub(crate) async fn abandon_transition(
    ctx: &Ctx,
    task: &task::Model,
    candidate: &env::Model,
    made: &[worktree::Materialized],
    why: &str,
) {
    worktree::compensate(ctx.git.as_ref(), made).await;
    if let Ok(owner) = owner_of(&ctx.db.conn, task).await
        && let Err(e) = fail(ctx, &owner, candidate, None, why).await
    {
        tracing::warn!(environment = %candidate.id, error = %e, "could not record an abandoned transition");
    }
}

/// One inventory row to publish.
struct Done {
    repository_id: Uuid,
    branch_slug: String,
    position: i32,
    worktree_id: Option<String>,
    worktree_path: Option<String>,
    worktree_branch: Option<String>,
}

/// Publishes the complete inventory and `ready` in one transaction, if this request still owns the
/// `creating` environment and no cleanup barrier appeared meanwhile.
async fn publish(
    ctx: &Ctx,
    task: &task::Model,
    owner: &task::Model,
    e: &env::Model,
    rows: Vec<Done>,
    workspace_path: Option<String>,
) -> Result<env::Model> {
    let txn = ctx.db.begin_write().await?;
    lock_task(&txn, owner.id).await?;
    ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
    let still_ours = env::Entity::find_by_id(e.id)
        .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
        .filter(env::Column::MaterializerId.eq(e.materializer_id))
        .one(&txn)
        .await?;
    if still_ours.is_none() {
        return Err(Error::Conflict(
            "the environment changed while it was being prepared; retry".into(),
        ));
    }
    let now = crate::clock::now();
    insert_rows(&txn, e.id, rows).await?;
    env::Entity::update(env::ActiveModel {
        id: Set(e.id),
        status: Set(EnvironmentStatus::Ready),
        workspace_path: Set(workspace_path.clone()),
        materializer_id: Set(None),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(&txn)
    .await?;
    events::append(
        &txn,
        ctx.instance_id,
        "environment.ready",
        env_subject(owner, e.id),
        json!({ "executor_type": e.executor_type }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(env::Model {
        status: EnvironmentStatus::Ready,
        workspace_path,
        materializer_id: None,
        updated_at: now,
        ..e.clone()
    })
}

/// The inventory rows of a materialized environment, all active.
async fn insert_rows(txn: &DatabaseTransaction, env_id: Uuid, rows: Vec<Done>) -> Result<()> {
    let now = crate::clock::now();
    let models: Vec<env_repo::ActiveModel> = rows
        .into_iter()
        .map(|r| env_repo::ActiveModel {
            id: Set(Uuid::now_v7()),
            task_environment_id: Set(env_id),
            repository_id: Set(r.repository_id),
            branch_slug: Set(r.branch_slug),
            worktree_id: Set(r.worktree_id),
            worktree_path: Set(r.worktree_path),
            worktree_branch: Set(r.worktree_branch),
            base_commit: Set(None),
            position: Set(r.position),
            status: Set(EnvironmentRepoStatus::Active),
            error_message: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            merged_at: Set(None),
            deleted_at: Set(None),
        })
        .collect();
    if !models.is_empty() {
        env_repo::Entity::insert_many(models)
            .exec_without_returning(txn)
            .await?;
    }
    Ok(())
}

/// Records a failed materialization if this attempt still owns the environment: `failed`, with the
/// failing slot's row and message when one slot failed.
async fn fail(
    ctx: &Ctx,
    owner: &task::Model,
    e: &env::Model,
    failure: Option<&worktree::SlotFailure>,
    message: &str,
) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    lock_task(&txn, owner.id).await?;
    let now = crate::clock::now();
    let updated = env::Entity::update_many()
        .col_expr(
            env::Column::Status,
            sea_orm::sea_query::Expr::value(EnvironmentStatus::Failed),
        )
        .col_expr(
            env::Column::MaterializerId,
            sea_orm::sea_query::Expr::value(Option::<Uuid>::None),
        )
        .col_expr(env::Column::ErrorMessage, sea_orm::sea_query::Expr::value(message))
        .col_expr(env::Column::UpdatedAt, sea_orm::sea_query::Expr::value(now))
        .filter(env::Column::Id.eq(e.id))
        .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
        .filter(env::Column::MaterializerId.eq(e.materializer_id))
        .exec(&txn)
        .await?;
    if updated.rows_affected == 0 {
        // Taken over (lease expired) or settled meanwhile: not ours to record.
        return Ok(());
    }
    if let Some(failure) = failure {
        let slot = task_repository::Entity::find()
            .filter(task_repository::Column::TaskId.eq(owner.id))
            .filter(task_repository::Column::Position.eq(failure.position))
            .one(&txn)
            .await?;
        env_repo::Entity::insert(env_repo::ActiveModel {
            id: Set(Uuid::now_v7()),
            task_environment_id: Set(e.id),
            repository_id: Set(failure.repository_id),
            branch_slug: Set(slot.map(|s| s.branch_slug).unwrap_or_default()),
            worktree_id: Set(None),
            worktree_path: Set(None),
            worktree_branch: Set(None),
            base_commit: Set(None),
            position: Set(failure.position),
            status: Set(EnvironmentRepoStatus::Failed),
            error_message: Set(Some(failure.message.clone())),
            created_at: Set(now),
            updated_at: Set(now),
            merged_at: Set(None),
            deleted_at: Set(None),
        })
        .exec_without_returning(&txn)
        .await?;
    }
    events::append(
        &txn,
        ctx.instance_id,
        "environment.failed",
        env_subject(owner, e.id),
        json!({ "repository_id": failure.map(|f| f.repository_id) }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(())
}

/// A task's repository slots in workspace order, each with its repository (if still registered).
pub(crate) async fn slots_with_repositories<C: ConnectionTrait>(
    conn: &C,
    task_id: Uuid,
) -> Result<Vec<(task_repository::Model, Option<repository::Model>)>> {
    let slots = task_repository::Entity::find()
        .filter(task_repository::Column::TaskId.eq(task_id))
        .order_by_asc(task_repository::Column::Position)
        .all(conn)
        .await?;
    let repos: HashMap<Uuid, repository::Model> = repository::Entity::find()
        .filter(repository::Column::Id.is_in(slots.iter().map(|s| s.repository_id)))
        .all(conn)
        .await?
        .into_iter()
        .map(|r| (r.id, r))
        .collect();
    Ok(slots
        .into_iter()
        .map(|s| {
            let repo = repos.get(&s.repository_id).cloned();
            (s, repo)
        })
        .collect())
}

/// The slots of the owner task, resolved against their repositories, in workspace order.
pub(crate) async fn plans<C: ConnectionTrait>(
    conn: &C,
    owner: &task::Model,
    task_dir: &str,
) -> Result<Vec<worktree::SlotPlan>> {
    let slots = slots_with_repositories(conn, owner.id).await?;
    let mut plans = Vec::with_capacity(slots.len());
    for (slot, repo) in &slots {
        let repo = repo.as_ref().ok_or(Error::NotFound("repository"))?;
        let repeated = slots
            .iter()
            .filter(|(s, _)| s.repository_id == slot.repository_id)
            .count()
            > 1;
        plans.push(worktree::SlotPlan {
            repository_id: repo.id,
            repository_name: repo.name.clone(),
            repository_path: repo.path.clone().into(),
            common_git_dir: repo.common_git_dir.clone().into(),
            branch_slug: slot.branch_slug.clone(),
            branch: slot.branch.clone().unwrap_or_else(|| format!("berth/{task_dir}")),
            base: slot.base_branch.clone().unwrap_or_else(|| repo.default_branch.clone()),
            dir: if repeated {
                format!("{}-{}", repo.name, slot.position)
            } else {
                repo.name.clone()
            },
            position: slot.position,
        });
    }
    Ok(plans)
}

/// Materializations this node abandoned (the process died mid-way: `creating`, lease expired) are taken
/// over for tasks that still want them, so a worktree git finished after the crash is adopted into the
/// inventory instead of lying on disk unrecorded. Tasks being cleaned up are left to their job, whose
/// snapshot names the planned paths. Run at startup and by the sweep.
pub async fn recover_abandoned(ctx: &Ctx) -> Result<usize> {
    let lease = chrono::Duration::from_std(ctx.config.materialize_lease).unwrap_or(chrono::Duration::minutes(5));
    let stale = env::Entity::find()
        .filter(env::Column::Status.eq(EnvironmentStatus::Creating))
        .filter(env::Column::NodeId.eq(ctx.config.node_id.clone()))
        .filter(env::Column::UpdatedAt.lt(crate::clock::now() - lease))
        .all(&ctx.db.conn)
        .await?;
    let mut recovered = 0;
    for e in stale {
        let Some(owner) = task::Entity::find_by_id(e.task_id).one(&ctx.db.conn).await? else {
            continue;
        };
        if owner.archived_at.is_some() || ensure_no_cleanup(&ctx.db.conn, &[owner.id]).await.is_err() {
            continue;
        }
        match ensure_ready(ctx, &owner, e.executor_type).await {
            Ok(_) => recovered += 1,
            Err(err) => {
                tracing::warn!(environment = %e.id, error = %err, "could not take over an abandoned materialization")
            }
        }
    }
    Ok(recovered)
}

fn env_subject(owner: &task::Model, env_id: Uuid) -> Subject {
    Subject {
        task_environment_id: Some(env_id),
        ..Subject::task(owner.workspace_id, owner.id)
    }
}

/// The current environment of a task (its owner's, for an `inherit_parent` subtask).
pub async fn of_task(ctx: &Ctx, p: &Principal, task_id: Uuid) -> Result<EnvironmentView> {
    let task = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    let owner = owner_of(&ctx.db.conn, &task).await?;
    let e = current(&ctx.db.conn, owner.id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    view(&ctx.db.conn, e).await
}

pub async fn get(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<EnvironmentView> {
    let e = env::Entity::find_by_id(id)
        .one(&ctx.db.conn)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    let owner = task::Entity::find_by_id(e.task_id)
        .one(&ctx.db.conn)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    if !p.sees_workspace(owner.workspace_id) {
        return Err(Error::NotFound("environment"));
    }
    if let Some(session_id) = p.session_id {
        let bound = task_session::Entity::find_by_id(session_id)
            .filter(task_session::Column::TaskEnvironmentId.eq(id))
            .count(&ctx.db.conn)
            .await?;
        if bound == 0 {
            return Err(Error::NotFound("environment"));
        }
    }
    view(&ctx.db.conn, e).await
}

pub(crate) async fn view<C: ConnectionTrait>(conn: &C, e: env::Model) -> Result<EnvironmentView> {
    let repos = env_repo::Entity::find()
        .filter(env_repo::Column::TaskEnvironmentId.eq(e.id))
        .order_by_asc(env_repo::Column::Position)
        .order_by_asc(env_repo::Column::Id)
        .all(conn)
        .await?;
    Ok(EnvironmentView { env: e, repos })
}
