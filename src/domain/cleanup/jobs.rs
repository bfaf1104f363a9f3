//! What operators see and do with cleanup jobs: list, get, retry a failed one, cancel a waiting one.
use crate::ids::{CleanupJobId, TaskId};
use sea_orm::ActiveEnum;

use super::state::{JobEvent, transition};
use crate::auth::UnboundPrincipal;
use crate::domain::Ctx;
use crate::domain::pagination::{Page, PageRequest};
use crate::entity::cleanup_job::{self as job, CleanupJobState, CleanupTrigger};
use crate::error::{Error, Result};
use crate::store::cleanup_jobs::{self as store, JobPatch, ListQuery};
use crate::store::tasks as task_store;

/// A filter on a vocabulary. A value outside it matches no job (an empty page, as when the column held
/// free strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter<T> {
    Is(T),
    Unknown,
}

impl<T: ActiveEnum<Value = String>> Filter<T> {
    pub fn parse(value: &str) -> Filter<T> {
        T::try_from_value(&value.to_string()).map_or(Filter::Unknown, Filter::Is)
    }
}

/// `None`: the filter names a value outside the vocabulary.
fn known<T>(filter: Option<Filter<T>>) -> Option<Option<T>> {
    match filter {
        None => Some(None),
        Some(Filter::Is(v)) => Some(Some(v)),
        Some(Filter::Unknown) => None,
    }
}

/// Why a job that is not over does not run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// Only its node may run it, and no instance of that node holds a lease.
    NodeUnavailable,
}

/// What a job waits for before it can run.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct WaitingFor {
    pub reason: WaitReason,
    /// The node whose disk the job needs.
    pub node_id: String,
    /// Since when the node is unreachable (its last lease ran out or was given back), when known.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
}

/// Which of these jobs (not over yet) wait for a node that is down, read from its instances' leases.
pub async fn waiting_for(
    ctx: &Ctx,
    jobs: &[job::Model],
) -> Result<std::collections::HashMap<CleanupJobId, WaitingFor>> {
    use crate::domain::nodes::{self, NodeState};
    let open = |j: &&job::Model| {
        matches!(
            j.state,
            CleanupJobState::Pending | CleanupJobState::Running | CleanupJobState::RetryWait
        ) && j.node_id != ctx.config.node_id
    };
    if !jobs.iter().any(|j| open(&j)) {
        return Ok(Default::default());
    }
    // Read now: the view may still call a node up for a renewal period after its lease ran out.
    nodes::refresh(ctx).await?;
    let mut down: std::collections::HashMap<String, Option<WaitingFor>> = std::collections::HashMap::new();
    let mut out = std::collections::HashMap::new();
    for j in jobs.iter().filter(open) {
        if !down.contains_key(&j.node_id) {
            let waiting = match ctx.nodes.cached(&j.node_id) {
                NodeState::Down => Some(WaitingFor {
                    reason: WaitReason::NodeUnavailable,
                    node_id: j.node_id.clone(),
                    since: crate::store::nodes::unreachable_since(&ctx.db.conn, &j.node_id).await?,
                }),
                NodeState::Up | NodeState::Decommissioned => None,
            };
            down.insert(j.node_id.clone(), waiting);
        }
        if let Some(Some(w)) = down.get(&j.node_id) {
            out.insert(j.id, w.clone());
        }
    }
    Ok(out)
}

pub struct JobFilter {
    pub state: Option<Filter<CleanupJobState>>,
    pub task_id: Option<TaskId>,
    pub trigger: Option<Filter<CleanupTrigger>>,
}

pub async fn list(ctx: &Ctx, p: &UnboundPrincipal, filter: JobFilter, page: PageRequest) -> Result<Page<job::Model>> {
    let (Some(state), Some(trigger)) = (known(filter.state), known(filter.trigger)) else {
        return Ok(Page::from_rows(Vec::new(), &page, |j: &job::Model| j.id));
    };
    let rows = store::list(
        &ctx.db.conn,
        ListQuery {
            workspaces: p.workspace_filter(),
            state,
            task_id: filter.task_id,
            trigger,
            before: page.before,
            limit: page.fetch(),
        },
    )
    .await?;
    Ok(Page::from_rows(rows, &page, |j| j.id))
}

pub async fn get(ctx: &Ctx, p: &UnboundPrincipal, id: CleanupJobId) -> Result<job::Model> {
    store::find(&ctx.db.conn, id)
        .await?
        .filter(|j| p.sees_workspace(j.workspace_id))
        .ok_or(Error::NotFound("cleanup job"))
}

/// A `failed` job gets a fresh attempt budget, if what it would remove is still meant to go.
pub async fn retry(ctx: &Ctx, p: &UnboundPrincipal, id: CleanupJobId) -> Result<job::Model> {
    let j = get(ctx, p, id).await?;
    if j.trigger.is_archive() {
        let archived = task_store::find(&ctx.db.conn, j.task_id)
            .await?
            .is_some_and(|t| t.archived_at.is_some());
        if !archived {
            return Err(Error::InvalidState(
                "the task is no longer archived; its worktrees are in use".into(),
            ));
        }
    }
    let now = crate::clock::now();
    let patch = JobPatch {
        attempts: Some(0),
        next_attempt_at: Some(Some(now)),
        lease_owner: Some(None),
        completed_at: Some(None),
        ..Default::default()
    };
    operate(ctx, p, id, JobEvent::OperatorRetry, patch).await
}

/// Only a waiting job can be cancelled; a running one finishes its attempt, unless its node is down
/// (nothing runs it until the node is back; cancelled, its next instance leaves it).
pub async fn cancel(ctx: &Ctx, p: &UnboundPrincipal, id: CleanupJobId) -> Result<job::Model> {
    let patch = JobPatch {
        completed_at: Some(Some(crate::clock::now())),
        lease_owner: Some(None),
        ..Default::default()
    };
    let j = get(ctx, p, id).await?;
    let event = if j.state == crate::entity::cleanup_job::CleanupJobState::Running
        && crate::domain::nodes::state(ctx, &j.node_id).await? != crate::domain::nodes::NodeState::Up
    {
        JobEvent::OperatorCancelStranded
    } else {
        JobEvent::OperatorCancel
    };
    operate(ctx, p, id, event, patch).await
}

/// An operator's transition, on the job as it is now (locked).
async fn operate(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    id: CleanupJobId,
    event: JobEvent,
    patch: JobPatch,
) -> Result<job::Model> {
    get(ctx, p, id).await?;
    let txn = ctx.db.begin_write().await?;
    let j = store::find_locked(&txn, id)
        .await?
        .ok_or(Error::NotFound("cleanup job"))?;
    if transition(&txn, ctx, &j, event, None, patch).await?.is_none() {
        return Err(Error::Stale(format!(
            "the job is {}; it changed meanwhile, retry",
            j.state.to_value()
        )));
    }
    // As stored (timestamps at the database's precision).
    let updated = store::find(&txn, id).await?.ok_or(Error::NotFound("cleanup job"))?;
    ctx.commit(txn).await?;
    ctx.cleanup_wake.notify_waiters();
    Ok(updated)
}
