//! Environments: the task-owned workspace (seed 001, seed 000 "canonical environment and inventory").
//!
//! A task owns at most one current environment (I1). The first session that needs one elects itself
//! materializer under the task's lock and commits a `creating` row; the physical worktrees are created
//! outside any transaction; the complete inventory and `ready` are then published together, so nothing
//! can attach to a half-made environment (with the first session that asked, in the same transaction:
//! [`OnPublish`]). Concurrent first sessions get `workspace_preparing` (I14).
//!
//! Executor transitions (I18) live in `transition`, the `creating` lease in `lease`, the takeover of
//! abandoned materializations in `recovery`, the status writes (settle, supersede) in `state`; what other
//! modules call is re-exported here.
use crate::ids::{EnvironmentId, InstanceId, TaskId};
use sea_orm::{ConnectionTrait, DatabaseTransaction};
use serde_json::json;

use super::Ctx;
use crate::auth::Principal;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::{self as env_repo, EnvironmentRepoStatus};
use crate::entity::task_session as session;
use crate::error::{Error, Result};
use crate::events;
use crate::events::EventType;
use crate::executor::worktree;
use crate::managed_path::ManagedRoot;
use crate::store::environments::{self as store, NewRepoRow, Settle};
use crate::store::sessions as sessions_store;
use crate::store::tasks::{ensure_no_cleanup, lock_task, owner_of, slot_at, slots_with_repositories};
use progress::{Stage, append_progress, reporter};
use state::{env_subject, settle, supersede_stale};

mod admit;
mod lease;
mod progress;
mod recovery;
mod state;
mod transition;

pub(crate) use admit::admit;
pub use lease::Materializing;
pub(crate) use lease::{in_flight, is_fresh_creating, still_in_flight};
pub use recovery::recover_abandoned;
pub(crate) use state::{broken_category, mark_broken, mark_recovered, supersede};
pub(crate) use transition::{
    Candidate, abandon_transition, dir_of, prepare_transition, promote_transition, transition_dir,
};

/// An environment with its inventory, in workspace order.
#[derive(Debug, Clone)]
pub struct EnvironmentView {
    pub env: env::Model,
    pub repos: Vec<env_repo::Model>,
}

impl EnvironmentView {
    /// The environment's version together with its inventory's.
    pub fn etag(&self) -> String {
        crate::domain::precondition::environment_etag(self.env.row_version, self.repos.iter().map(|r| r.row_version))
    }
}

/// The current (non-superseded) environment of an owner task.
pub(crate) async fn current<C: ConnectionTrait>(conn: &C, owner_task_id: TaskId) -> Result<Option<env::Model>> {
    let mut envs = store::live_of(conn, owner_task_id).await?;
    // The ready one is current; without one, the one being made; else the newest failed attempt.
    let rank = |e: &env::Model| match e.status {
        EnvironmentStatus::Ready | EnvironmentStatus::Stopped | EnvironmentStatus::Broken => 0,
        EnvironmentStatus::Creating => 1,
        _ => 2,
    };
    envs.sort_by_key(|e| rank(e));
    Ok(envs.into_iter().next())
}

enum Election {
    Ready(env::Model),
    /// This request materializes the environment, with the owner's slots as the election read them.
    Elected(env::Model, Slots),
}

/// A task's repository slots with their repositories, in workspace order.
pub(super) type Slots = Vec<(
    crate::entity::task_repository::Model,
    Option<crate::entity::repository::Model>,
)>;

/// Returns the task's ready environment for `executor`, materializing it first when there is none.
pub async fn ensure_ready(ctx: &Ctx, task: &task::Model, executor: ExecutorType) -> Result<env::Model> {
    Ok(ensure_ready_then(ctx, task, executor, None).await?.0)
}

/// A write that may ride in the transaction that publishes a new environment, under its locks (the
/// owner's lock taken and the cleanup barriers of the task and its owner checked; it is given the owner's
/// row as locked): the first session of a task is recorded there, one durable commit instead of two. It
/// answers `None` to leave its work to its caller, after the publish; its error fails the publish.
pub type OnPublish = Box<
    dyn for<'t> FnOnce(
            &'t DatabaseTransaction,
            &'t task::Model,
            &'t env::Model,
        ) -> futures_util::future::BoxFuture<'t, Result<Option<session::Model>>>
        + Send,
>;

/// [`ensure_ready`], and `then`'s result when this call published the environment (`None` when the
/// environment was ready already, or `then` left its work to the caller).
pub async fn ensure_ready_then(
    ctx: &Ctx,
    task: &task::Model,
    executor: ExecutorType,
    then: Option<OnPublish>,
) -> Result<(env::Model, Option<session::Model>)> {
    let owner = owner_of(&ctx.db.conn, task).await?;
    let (env, slots) = match elect(ctx, task, &owner, executor).await? {
        Election::Ready(env) => return Ok((env, None)),
        Election::Elected(env, slots) => (env, slots),
    };
    // In a task of its own: a client that disconnects mid-way does not strand a `creating` environment.
    // The request still waits for what it publishes (`events::written`).
    let (ctx, task) = (ctx.clone(), task.clone());
    let work = crate::events::written::handed(async move { prepare(&ctx, &task, &owner, &env, slots, then).await });
    let (out, handoff) = crate::actor::spawn(work)
        .await
        .map_err(|e| Error::Internal(anyhow::anyhow!("materialization task failed: {e}")))?;
    crate::events::written::adopt(handoff);
    out
}

/// Materializes and publishes an elected environment, keeping its lease alive meanwhile. Every way out
/// other than success records the attempt as failed, so nobody waits on it.
async fn prepare(
    ctx: &Ctx,
    task: &task::Model,
    owner: &task::Model,
    e: &env::Model,
    slots: Slots,
    then: Option<OnPublish>,
) -> Result<(env::Model, Option<session::Model>)> {
    let _running = ctx.materializing.hold(e.materializer_id);
    let lease = lease::Lease::keep(ctx, e);
    let outcome = materialize_and_publish(ctx, task, owner, e, slots, then).await;
    drop(lease);
    match outcome {
        Ok(ready) => Ok(ready),
        Err(failed) => Err(record_failure(ctx, owner, e, failed).await?),
    }
}

/// Why a materialization did not finish.
pub(super) enum Failed {
    Slot(worktree::SlotFailure),
    Other(Error),
}

impl From<Error> for Failed {
    fn from(e: Error) -> Self {
        Failed::Other(e)
    }
}

/// Records a failed attempt and returns the error its caller answers with.
pub(super) async fn record_failure(ctx: &Ctx, owner: &task::Model, e: &env::Model, failed: Failed) -> Result<Error> {
    match failed {
        Failed::Slot(failure) => {
            let message = format!("preparing repository {} failed", failure.repository_name);
            fail(ctx, owner, e, Some(&failure), &message).await?;
            Ok(Error::MaterializationFailed {
                environment_id: e.id,
                repository_name: failure.repository_name,
            })
        }
        Failed::Other(err) => {
            if let Err(record) = fail(ctx, owner, e, None, "preparing the workspace was abandoned").await {
                tracing::warn!(error = %record, environment = %e.id, "could not record an abandoned materialization");
            }
            Ok(err)
        }
    }
}

async fn materialize_and_publish(
    ctx: &Ctx,
    task: &task::Model,
    owner: &task::Model,
    e: &env::Model,
    slots: Slots,
    then: Option<OnPublish>,
) -> Result<(env::Model, Option<session::Model>), Failed> {
    let made = materialize(ctx, owner, e, &owner.slug, plan_slots(&slots, &owner.slug)?).await?;
    let published = publish(ctx, task, owner, e, &made, then).await;
    if published.is_err() {
        made.record_unpublished(ctx, owner, e.id).await;
    }
    if let Err(Error::TaskCleanupInProgress | Error::NotFound(_)) = published {
        // A lifecycle operation won (its barrier stands, or the task is gone): what this attempt created
        // never became task state, and nobody can adopt it; remove it (I7).
        worktree::compensate(ctx.git.as_ref(), &made.worktrees).await;
    }
    // Otherwise (taken over, or the database failed) the worktrees stay for the next attempt to adopt:
    // removing them could remove what a new materializer already adopted.
    Ok(published?)
}

/// What a materialization made on disk: the worktrees (none for `local`) and the effective path, with
/// the plans they were made from.
pub(super) struct Made {
    plans: Vec<worktree::SlotPlan>,
    pub(super) worktrees: Vec<worktree::Materialized>,
    pub(super) path: Option<String>,
    /// Stages reported but not yet recorded: the transaction that follows appends them.
    progress: Vec<Stage>,
}

impl Made {
    /// What the publish would have recorded besides the environment, when it failed: the progress
    /// still unrecorded (before the failure is), and the branches this attempt created (the worktrees
    /// may stay for another attempt to adopt, and compensation keeps the branches: the ledger is what
    /// tells berth's branches from the user's). In a transaction of its own; a failure only goes to the
    /// log.
    pub(super) async fn record_unpublished(&self, ctx: &Ctx, owner: &task::Model, env_id: EnvironmentId) {
        let recorded = async {
            let txn = ctx.db.begin_write().await?;
            self.record_progress(&txn, ctx, owner, env_id).await?;
            if !self.worktrees.is_empty() {
                crate::domain::branches::record_origins(&txn, owner, &self.plans, &self.worktrees).await?;
            }
            ctx.commit(txn).await
        };
        if let Err(e) = recorded.await {
            tracing::warn!(error = %e, environment = %env_id, "could not record what an unpublished materialization made");
        }
    }

    /// Appends the progress still unrecorded, before the outcome's event.
    pub(super) async fn record_progress(
        &self,
        txn: &DatabaseTransaction,
        ctx: &Ctx,
        owner: &task::Model,
        env_id: EnvironmentId,
    ) -> Result<()> {
        let subject = env_subject(owner, env_id);
        append_progress(txn, ctx, &subject, self.progress.iter().copied()).await
    }

    /// The inventory rows to publish. The branches this attempt created are recorded in `txn` (issue
    /// 17), so they commit with the inventory that names them: one commit fewer on the way to the
    /// answer. A publish that fails loses that record with the rest; an attempt that adopts the
    /// worktree later counts the branch as the user's and keeps it: the safe side.
    pub(super) async fn inventory(&self, txn: &DatabaseTransaction, owner: &task::Model) -> Result<Vec<NewRepoRow>> {
        let row =
            |repository_id, branch_slug, position, made: Option<&worktree::Materialized>, branch_origin| NewRepoRow {
                repository_id,
                branch_slug,
                position,
                worktree_id: made.and_then(|m| m.worktree_id.clone()),
                worktree_path: made.map(|m| m.worktree_path.clone()),
                worktree_branch: made.and_then(|m| m.worktree_branch.clone()),
                status: EnvironmentRepoStatus::Active,
                error_message: None,
                branch_origin,
            };
        if self.worktrees.is_empty() {
            // `local`: the registered repositories themselves (a `worktree` environment has a worktree
            // for each of its slots, and at least one slot).
            let local = |p: &worktree::SlotPlan| row(p.repository_id, p.branch_slug.clone(), p.position, None, None);
            return Ok(self.plans.iter().map(local).collect());
        }
        let origins = crate::domain::branches::record_origins(txn, owner, &self.plans, &self.worktrees).await?;
        let made = |(m, origin): (&worktree::Materialized, _)| {
            row(m.repository_id, m.branch_slug.clone(), m.position, Some(m), origin)
        };
        Ok(self.worktrees.iter().zip(origins).map(made).collect())
    }
}

/// Makes the environment's files exist from its `plans`: worktrees for `worktree`, nothing for `local`.
pub(super) async fn materialize(
    ctx: &Ctx,
    owner: &task::Model,
    e: &env::Model,
    task_dir: &str,
    plans: Vec<worktree::SlotPlan>,
) -> Result<Made, Failed> {
    let (report, written) = reporter(ctx, owner, e.id);
    let made: Result<_, Failed> = async {
        match e.executor_type {
            ExecutorType::Local => {
                // The registered repository itself: no worktree, and no path berth could ever remove (I13).
                for p in &plans {
                    report(p.repository_id, worktree::Stage::Ready).await;
                }
                let path = plans.first().map(|p| p.repository_path.to_string_lossy().into_owned());
                Ok((Vec::new(), path))
            }
            ExecutorType::Worktree => {
                let root = ManagedRoot::from_config(&ctx.config);
                let made = worktree::materialize(ctx.git.as_ref(), &root, task_dir, &plans, &report)
                    .await
                    .map_err(Failed::Slot)?;
                // I19: one repository works in its worktree; several in the task root.
                let path = match made.as_slice() {
                    [one] => Some(one.worktree_path.clone()),
                    _ => Some(root.path().join(task_dir).to_string_lossy().into_owned()),
                };
                Ok((made, path))
            }
        }
    }
    .await;
    // Every progress event commits before the outcome's (`environment.ready`, or `failed`): the stages
    // still queued after a success are appended by the publish, before its `environment.ready`, or, if
    // the publish fails, recorded before the failure is (`Made::record_unpublished`).
    drop(report);
    let (worktrees, path) = match made {
        Ok(made) => made,
        Err(failed) => {
            written.finish(e.id).await;
            return Err(failed);
        }
    };
    let progress = written.hand_over(e.id).await;
    Ok(Made {
        plans,
        worktrees,
        path,
        progress,
    })
}

/// Under the owner's lock: select a ready environment, or elect this request to materialize one.
async fn elect(ctx: &Ctx, task: &task::Model, owner: &task::Model, executor: ExecutorType) -> Result<Election> {
    let txn = ctx.db.begin_write().await?;
    let owner_row = lock_task(&txn, owner.id).await?;
    if owner_row.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
    let envs = store::live_of(&txn, owner.id).await?;
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
    if let Some(broken) = envs.iter().find(|e| e.status == EnvironmentStatus::Broken) {
        // A broken environment is still the task's; nothing replaces it but a reset.
        return Err(Error::WorkspaceReuseUnsafe(state::broken_category(broken)));
    }
    supersede_stale(&txn, ctx, owner, &envs).await?;
    let (model, slots) = new_candidate(&txn, ctx, owner, executor).await?;
    ctx.materializing.register(model.materializer_id);
    if let Err(e) = ctx.commit(txn).await {
        ctx.materializing.forget(model.materializer_id);
        return Err(e);
    }
    Ok(Election::Elected(model, slots))
}

/// Inserts a `creating` environment whose materializer is this request (under the owner's lock), and
/// returns it with the slots it is made of (read here, under the lock, rather than again afterwards).
pub(super) async fn new_candidate(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    owner: &task::Model,
    executor: ExecutorType,
) -> Result<(env::Model, Slots)> {
    let slot_rows = slots_with_repositories(txn, owner.id).await?;
    let slots = slot_rows.len();
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
        id: EnvironmentId::now_v7(),
        task_id: owner.id,
        executor_type: executor,
        status: EnvironmentStatus::Creating,
        workspace_path: None,
        node_id: ctx.config.node_id.clone(),
        ownership_generation: 1,
        materializer_id: Some(InstanceId::now_v7()),
        error_message: None,
        created_at: now,
        updated_at: now,
        superseded_at: None,
        row_version: 1,
        broken_category: None,
        imported_from: None,
    };
    match store::insert(txn, &model).await {
        // The partial unique index is the backstop: someone else is materializing.
        Err(e) if crate::error::is_unique_violation(&e) => return Err(Error::WorkspacePreparing),
        other => other?,
    };
    events::append(
        txn,
        ctx.instance_id,
        EventType::EnvironmentCreated,
        env_subject(owner, model.id),
        json!({ "executor_type": executor, "status": "creating" }),
    )
    .await?;
    Ok((model, slot_rows))
}

/// Publishes the complete inventory and `ready` in one transaction, if this request still owns the
/// `creating` environment and no cleanup barrier appeared meanwhile.
async fn publish(
    ctx: &Ctx,
    task: &task::Model,
    owner: &task::Model,
    e: &env::Model,
    made: &Made,
    then: Option<OnPublish>,
) -> Result<(env::Model, Option<session::Model>)> {
    let workspace_path = made.path.clone();
    let txn = ctx.db.begin_write().await?;
    let locked_owner = lock_task(&txn, owner.id).await?;
    ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
    made.record_progress(&txn, ctx, owner, e.id).await?;
    let ready = Settle {
        status: EnvironmentStatus::Ready,
        workspace_path: Some(workspace_path.clone()),
        error_message: None,
    };
    let now = crate::clock::now();
    let event = (EventType::EnvironmentReady, json!({ "executor_type": e.executor_type }));
    if !settle(&txn, ctx, owner, e.into(), ready, now, event).await? {
        return Err(Error::Stale(
            "the environment changed while it was being prepared; retry".into(),
        ));
    }
    store::insert_repo_rows(&txn, e.id, made.inventory(&txn, owner).await?).await?;
    let ready = env::Model {
        status: EnvironmentStatus::Ready,
        workspace_path,
        materializer_id: None,
        updated_at: now,
        ..e.clone()
    };
    let also = match then {
        Some(then) => then(&txn, &locked_owner, &ready).await?,
        None => None,
    };
    // What follows is the answer, or a launch, which records its handle (flushed) before it spawns.
    ctx.commit_answered(txn).await?;
    Ok((ready, also))
}

/// Records a failed materialization if this attempt still owns the environment: `failed`, with the
/// failing slot's row and message when one slot failed.
pub(super) async fn fail(
    ctx: &Ctx,
    owner: &task::Model,
    e: &env::Model,
    failure: Option<&worktree::SlotFailure>,
    message: &str,
) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    lock_task(&txn, owner.id).await?;
    let failed = Settle {
        status: EnvironmentStatus::Failed,
        workspace_path: None,
        error_message: Some(message.to_string()),
    };
    let event = (
        EventType::EnvironmentFailed,
        json!({ "repository_id": failure.map(|f| f.repository_id) }),
    );
    if !settle(&txn, ctx, owner, e.into(), failed, crate::clock::now(), event).await? {
        // Taken over (lease expired) or settled meanwhile: not ours to record.
        return Ok(());
    }
    if let Some(failure) = failure {
        let slot = slot_at(&txn, owner.id, failure.position).await?;
        let row = NewRepoRow {
            repository_id: failure.repository_id,
            branch_slug: slot.map(|s| s.branch_slug).unwrap_or_default(),
            position: failure.position,
            worktree_id: None,
            worktree_path: None,
            worktree_branch: None,
            status: EnvironmentRepoStatus::Failed,
            error_message: Some(failure.message.clone()),
            branch_origin: None,
        };
        store::insert_repo_rows(&txn, e.id, vec![row]).await?;
    }
    ctx.commit(txn).await?;
    Ok(())
}

/// The slots of the owner task, resolved against their repositories, in workspace order.
pub(crate) async fn plans<C: ConnectionTrait>(
    conn: &C,
    owner: &task::Model,
    task_dir: &str,
) -> Result<Vec<worktree::SlotPlan>> {
    plan_slots(&slots_with_repositories(conn, owner.id).await?, task_dir)
}

/// The plans of `slots` for a task directory named `task_dir`.
pub(super) fn plan_slots(slots: &Slots, task_dir: &str) -> Result<Vec<worktree::SlotPlan>> {
    let mut plans = Vec::with_capacity(slots.len());
    for (slot, repo) in slots {
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
            branch_named: slot.branch.is_some(),
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

/// The current environment of a task (its owner's, for an `inherit_parent` subtask).
pub async fn of_task(ctx: &Ctx, p: &Principal, task_id: TaskId) -> Result<EnvironmentView> {
    let task = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    let owner = owner_of(&ctx.db.conn, &task).await?;
    let e = current(&ctx.db.conn, owner.id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    view(&ctx.db.conn, e).await
}

pub async fn get(ctx: &Ctx, p: &Principal, id: EnvironmentId) -> Result<EnvironmentView> {
    let (e, owner) = store::find_with_owner(&ctx.db.conn, id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    let owner = owner.ok_or(Error::NotFound("environment"))?;
    if !p.sees_workspace(owner.workspace_id) {
        return Err(Error::NotFound("environment"));
    }
    if let Some(session_id) = p.session_id
        && !sessions_store::is_attached(&ctx.db.conn, session_id, id).await?
    {
        return Err(Error::NotFound("environment"));
    }
    view(&ctx.db.conn, e).await
}

pub(crate) async fn view<C: ConnectionTrait>(conn: &C, e: env::Model) -> Result<EnvironmentView> {
    let repos = store::repos_of(conn, e.id).await?;
    Ok(EnvironmentView { env: e, repos })
}
