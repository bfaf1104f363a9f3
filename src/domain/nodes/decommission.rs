//! Giving a node up: `POST /nodes/{id}/decommission`, for a node that is down and will not come back.
//! What it held is lost: its environments become `lost` (no task's current environment: the next session
//! of the task gets a new one where it is carried out), its sessions `failed` with `node_lost`, its
//! agents' records over, and its waiting cleanup jobs end (`cancelled`) recording what they would have
//! removed (the job view's `would_have_removed`). Nothing is deleted anywhere. A decommissioned node that
//! comes back refuses to start until an operator lets it (`BERTH_NODE_READMIT=true`).
use crate::ids::EnvironmentId;
use serde::Serialize;
use utoipa::ToSchema;

use super::{Ctx, NodeState};
use crate::domain::cleanup::state::{JobEvent, transition};
use crate::domain::cleanup::{Abandoned, Marks, marks_of, snapshot_of, with_marks};
use crate::error::{Error, Result};
use crate::store::cleanup_jobs::JobPatch;
use crate::store::nodes as store;

/// What a decommission ended.
#[derive(Debug, Serialize, ToSchema)]
pub struct Decommissioned {
    pub node_id: String,
    pub decommissioned_at: chrono::DateTime<chrono::Utc>,
    /// Environments now `lost`.
    pub environments: u64,
    /// Sessions now `failed` with `node_lost`.
    pub sessions: u64,
    /// Cleanup jobs ended (`cancelled`, their `last_error` naming what they would have removed).
    pub cleanup_jobs: u64,
}

pub async fn decommission(ctx: &Ctx, by: Option<String>, node_id: &str, repeated: &str) -> Result<Decommissioned> {
    if repeated != node_id {
        return Err(Error::invalid("node_id", "repeat the id of the node to decommission"));
    }
    let node = store::find_node(&ctx.db.conn, node_id)
        .await?
        .ok_or(Error::NotFound("node"))?;
    if node.decommissioned_at.is_some() {
        return Err(Error::InvalidState("the node is decommissioned already".into()));
    }
    // Read now, not from the view: giving up a node that is up is never done on a stale answer.
    super::refresh(ctx).await?;
    if super::state(ctx, node_id).await? == NodeState::Up {
        return Err(Error::InvalidState(
            "the node is up: only a node none of whose instances holds a lease can be decommissioned".into(),
        ));
    }
    let now = crate::clock::now();
    let txn = ctx.db.begin_write().await?;
    if !store::mark_decommissioned(&txn, node_id, by, now).await? {
        return Err(Error::Stale("the node was decommissioned meanwhile".into()));
    }
    let envs = store::environments_on(&txn, node_id).await?;
    let env_ids: Vec<EnvironmentId> = envs.iter().map(|e| e.id).collect();
    store::mark_lost(&txn, &env_ids, now).await?;
    for e in &envs {
        if let Some(owner) = crate::store::tasks::find(&txn, e.task_id).await? {
            crate::events::append(
                &txn,
                ctx.instance_id,
                crate::events::EventType::EnvironmentLost,
                crate::events::Subject {
                    task_environment_id: Some(e.id),
                    ..crate::events::Subject::task(owner.workspace_id, owner.id)
                },
                serde_json::json!({ "node_id": node_id }),
            )
            .await?;
        }
    }
    let jobs = store::open_jobs_on(&txn, node_id).await?;
    for j in &jobs {
        // The job keeps naming the worktrees it would have removed: they are still on that disk.
        let worktree_paths: Vec<String> = snapshot_of(j)
            .map(|s| {
                s.environment
                    .iter()
                    .chain(s.superseded.iter())
                    .flat_map(|e| e.worktrees.iter().map(|w| w.worktree_path.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let marks = Marks {
            abandoned: Some(Abandoned {
                node_id: node_id.to_string(),
                at: now,
                worktree_paths,
            }),
            ..marks_of(j)
        };
        crate::store::cleanup_jobs::set_snapshot(&txn, j.id, with_marks(j.resource_snapshot.clone(), &marks)).await?;
        let would = snapshot_of(j)
            .map(|s| {
                s.environment
                    .iter()
                    .chain(s.superseded.iter())
                    .flat_map(|e| e.worktrees.iter().map(|w| w.worktree_path.clone()))
                    .chain(
                        s.conversations
                            .iter()
                            .map(|id| format!("the conversation of session {id}")),
                    )
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let patch = JobPatch {
            last_error: Some(Some(format!(
                "node {node_id} was decommissioned; the job would have removed: {}",
                if would.is_empty() { "nothing on disk" } else { &would }
            ))),
            lease_owner: Some(None),
            completed_at: Some(Some(now)),
            ..Default::default()
        };
        transition(&txn, ctx, j, JobEvent::NodeDecommissioned, None, patch).await?;
    }
    let live = store::live_executions_on(&txn, node_id).await?;
    for e in &live {
        crate::domain::sessions::end_lost_execution(&txn, e.id).await?;
    }
    ctx.commit(txn).await?;
    let mut sessions = 0;
    for env_id in &env_ids {
        for s in crate::store::sessions::in_environment(&ctx.db.conn, *env_id).await? {
            if !s.state.is_terminal() {
                crate::domain::sessions::fail_node_lost(ctx, s.id, node_id).await?;
                sessions += 1;
            }
        }
    }
    super::refresh(ctx).await?;
    ctx.cleanup_wake.notify_waiters();
    Ok(Decommissioned {
        node_id: node_id.to_string(),
        decommissioned_at: now,
        environments: env_ids.len() as u64,
        sessions,
        cleanup_jobs: jobs.len() as u64,
    })
}
