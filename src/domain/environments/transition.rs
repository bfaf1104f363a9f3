//! Executor transitions (I18): a new environment for another executor is materialized beside the
//! current one, and becomes current only once a launch in it succeeded; otherwise it is abandoned and the
//! previous environment stays current, untouched on disk.
use crate::ids::{EnvironmentId, InstanceId};
use serde_json::json;

use super::lease::{Lease, Running, is_fresh_creating};
use super::state::{Held, settle, supersede, supersede_stale};
use super::{Slots, fail, materialize, new_candidate, plan_slots, record_failure};
use crate::domain::Ctx;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::executor::worktree;
use crate::store::environments::{self as store, Settle};
use crate::store::tasks::{ensure_no_cleanup, ensure_not_archived_or_cleaning, lock_task, owner_of};

/// A staged transition candidate (I18), and what was made for it. It counts as a materialization running
/// here (`Materializing`) until the launch promotes or abandons it and drops this: a delete's job that
/// removed its row waits for that, and not for its lease. Its lease is kept fresh as long (I14): a launch
/// slower than the lease is not taken for an abandoned attempt by another session's election.
pub(crate) struct Candidate {
    pub env: env::Model,
    pub made: Vec<worktree::Materialized>,
    _running: Running,
    _lease: Lease,
}

/// A transition candidate (I18): a new environment for `executor`, materialized with its complete
/// inventory but still `creating`, beside the current one. `promote_transition` makes it current once the
/// launch in it succeeded; `abandon_transition` records it failed otherwise.
pub(crate) async fn prepare_transition(ctx: &Ctx, task: &task::Model, executor: ExecutorType) -> Result<Candidate> {
    let owner = owner_of(&ctx.db.conn, task).await?;
    let (candidate, slots) = elect_candidate(ctx, task, &owner, executor).await?;
    let running = ctx.materializing.hold(candidate.materializer_id);
    let lease = Lease::keep(ctx, &candidate);
    let dir = transition_dir(&owner, &candidate);
    let made = match async { materialize(ctx, &owner, &candidate, &dir, plan_slots(&slots, &dir)?).await }.await {
        Ok(m) => m,
        Err(failed) => return Err(record_failure(ctx, &owner, &candidate, failed).await?),
    };
    let staged: Result<()> = async {
        let txn = ctx.db.begin_write().await?;
        lock_task(&txn, owner.id).await?;
        ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
        made.record_progress(&txn, ctx, &owner, candidate.id).await?;
        store::insert_repo_rows(&txn, candidate.id, made.inventory(&txn, &owner).await?).await?;
        store::set_workspace_path(&txn, candidate.id, made.path.clone()).await?;
        ctx.commit(txn).await
    }
    .await;
    if let Err(e) = staged {
        made.record_unpublished(ctx, &owner, candidate.id).await;
        abandon_transition(
            ctx,
            task,
            &candidate,
            &made.worktrees,
            "staging the new environment failed",
        )
        .await;
        return Err(e);
    }
    Ok(Candidate {
        env: env::Model {
            workspace_path: made.path,
            ..candidate
        },
        made: made.worktrees,
        _running: running,
        _lease: lease,
    })
}

/// Under the owner's lock: supersedes stale attempts (never the current environment) and inserts the
/// `creating` candidate.
async fn elect_candidate(
    ctx: &Ctx,
    task: &task::Model,
    owner: &task::Model,
    executor: ExecutorType,
) -> Result<(env::Model, Slots)> {
    let txn = ctx.db.begin_write().await?;
    lock_task(&txn, owner.id).await?;
    ensure_not_archived_or_cleaning(&txn, &[task.id, owner.id]).await?;
    let envs = store::live_of(&txn, owner.id).await?;
    if envs.iter().any(|e| is_fresh_creating(ctx, e)) {
        return Err(Error::WorkspacePreparing);
    }
    let stale: Vec<env::Model> = envs
        .into_iter()
        .filter(|e| !matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped))
        .collect();
    supersede_stale(&txn, ctx, owner, &stale).await?;
    let (candidate, slots) = new_candidate(&txn, ctx, owner, executor).await?;
    // Running here from before the commit: no mutation sees the row without seeing it here.
    ctx.materializing.register(candidate.materializer_id);
    if let Err(e) = ctx.commit(txn).await {
        ctx.materializing.forget(candidate.materializer_id);
        return Err(e);
    }
    Ok((candidate, slots))
}

/// A transition's directory is its own (I18): never the one an earlier environment of the task left on
/// disk, which must stay untouched and must not be adopted.
pub(crate) fn transition_dir(owner: &task::Model, candidate: &env::Model) -> String {
    let hex = candidate.id.uuid().simple().to_string();
    format!("{}-{}", owner.slug, &hex[hex.len() - 8..])
}

/// The directory under the worktree root that `e`, an environment of `owner`, lives in: its own for what
/// was a transition's candidate (recorded by its workspace path, so also once promoted, or superseded
/// later), the task's for every other one.
pub(crate) fn dir_of(owner: &task::Model, e: &env::Model) -> String {
    let own = transition_dir(owner, e);
    let in_own = e.workspace_path.as_deref().is_some_and(|p| {
        std::path::Path::new(p)
            .components()
            .any(|c| c.as_os_str() == own.as_str())
    });
    if in_own { own } else { owner.slug.clone() }
}

/// The launch in the candidate succeeded: it becomes current; the previous one is kept, superseded and
/// untouched on disk (I18). Runs inside the caller's transaction.
pub(crate) async fn promote_transition(
    txn: &sea_orm::DatabaseTransaction,
    ctx: &Ctx,
    task: &task::Model,
    candidate_id: EnvironmentId,
    materializer_id: Option<InstanceId>,
) -> Result<()> {
    let owner = owner_of(txn, task).await?;
    for old in store::live_of(txn, owner.id)
        .await?
        .into_iter()
        .filter(|e| e.id != candidate_id)
    {
        supersede(txn, ctx, &owner, old.id, "executor_transition").await?;
    }
    let held = Held {
        id: candidate_id,
        materializer_id,
    };
    let ready = Settle {
        status: EnvironmentStatus::Ready,
        workspace_path: None,
        error_message: None,
    };
    let event = (EventType::EnvironmentReady, json!({ "reason": "executor_transition" }));
    // Still ours: a candidate taken over (its lease expired) is not brought back.
    if !settle(txn, ctx, &owner, held, ready, crate::clock::now(), event).await? {
        return Err(Error::Stale(
            "the new environment was taken over while the agent started; retry".into(),
        ));
    }
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
