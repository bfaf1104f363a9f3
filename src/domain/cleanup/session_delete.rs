//! The `session_delete` job: what a session delete accepted while the session's node was down owes that
//! node. It names no environment and no worktree: only the agent the session's row named (ended if its
//! process group is proven to be that agent's) and the conversation berth keeps for the session. Written
//! `pending` in the delete's own transaction, for the session's node. The task's lifecycle never waits for
//! it (`store::tasks::ensure_no_cleanup`), but a lifecycle job's barrier copies the agents it owes into
//! its own snapshot (`barrier::prepare`) and ends them before touching a worktree (I8): when the node is
//! back both jobs may run at once. Why seed 001's "no cleanup job" allows it: decision 11.
use crate::ids::SessionId;
use sea_orm::DatabaseTransaction;

use super::state::{JobEvent, transition};
use super::{AgentProcess, Snapshot};
use crate::domain::Ctx;
use crate::entity::cleanup_job::{self as job, CleanupTrigger};
use crate::entity::task::Model as Task;
use crate::error::{Error, Result};
use crate::store::cleanup_jobs::JobPatch;

pub(crate) async fn write(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    task: &Task,
    session_id: SessionId,
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
    let model = super::state::create(txn, ctx, &snapshot, CleanupTrigger::SessionDelete, None, node_id).await?;
    // The delete commits with it: pending at once, nothing else to wait for.
    let patch = JobPatch {
        next_attempt_at: Some(Some(model.created_at)),
        ..Default::default()
    };
    transition(txn, ctx, &model, JobEvent::Activate, None, patch)
        .await?
        .ok_or_else(|| Error::Internal(anyhow::anyhow!("a new job could not be activated")))
}
