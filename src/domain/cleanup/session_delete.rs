//! The `session_delete` job: what a session delete accepted while the session's node was down owes that
//! node. It names no environment and no worktree: only the agent the session's row named (ended if its
//! process group is proven to be that agent's) and the conversation berth keeps for the session. Written
//! `pending` in the delete's own transaction, for the session's node; the task's lifecycle never waits for
//! it (`store::tasks::ensure_no_cleanup`).
use sea_orm::DatabaseTransaction;
use uuid::Uuid;

use super::state::{JobEvent, job_event, transition};
use super::{AgentProcess, Snapshot};
use crate::domain::Ctx;
use crate::entity::cleanup_job::{self as job, CleanupJobState, CleanupTrigger};
use crate::entity::task::Model as Task;
use crate::error::{Error, Result};
use crate::store::cleanup_jobs::{self as store, JobPatch};

pub(crate) async fn write(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    task: &Task,
    session_id: Uuid,
    node_id: String,
    agents: Vec<AgentProcess>,
) -> Result<job::Model> {
    let snapshot = Snapshot {
        task_id: task.id,
        workspace_id: task.workspace_id,
        environment: None,
        superseded: Vec::new(),
        sessions: Vec::new(),
        agents,
        conversations: vec![session_id],
        discard_worktree_changes: None,
        delete_branches: None,
        branches: Vec::new(),
    };
    let now = crate::clock::now();
    let actor = crate::actor::current();
    let model = job::Model {
        id: Uuid::now_v7(),
        operation_id: Uuid::now_v7(),
        task_id: task.id,
        workspace_id: task.workspace_id,
        task_environment_id: None,
        trigger: CleanupTrigger::SessionDelete,
        state: CleanupJobState::Prepared,
        attempts: 0,
        max_attempts: ctx.config.cleanup_max_attempts as i32,
        next_attempt_at: None,
        last_error: None,
        resource_snapshot: serde_json::to_value(&snapshot).map_err(|e| Error::Internal(e.into()))?,
        node_id,
        lease_owner: None,
        lease_expires_at: None,
        created_at: now,
        updated_at: now,
        completed_at: None,
        actor_sub: actor.as_ref().map(|a| a.sub.clone()),
        actor_session_id: actor.and_then(|a| a.session_id),
    };
    store::insert(txn, &model).await?;
    ctx.metrics.cleanup_job_moved(None, model.state);
    job_event(txn, ctx, &model).await?;
    // The delete commits with it: pending at once, nothing else to wait for.
    let patch = JobPatch {
        next_attempt_at: Some(Some(now)),
        ..Default::default()
    };
    transition(txn, ctx, &model, JobEvent::Activate, None, patch)
        .await?
        .ok_or_else(|| Error::Internal(anyhow::anyhow!("a new job could not be activated")))
}
