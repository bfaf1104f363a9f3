//! Cleanup-job rows: inserts, reads, the claim query and the compare-and-set that every state write uses.
use crate::ids::{CleanupJobId, EnvironmentId, InstanceId, TaskId, WorkspaceId};
use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbBackend, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait,
};
use uuid::Uuid;

use crate::entity::cleanup_job::{self as job, CleanupJobState, CleanupTrigger};
use crate::error::Result;
use crate::events::{self, EventType, Subject};

pub async fn insert(txn: &DatabaseTransaction, j: &job::Model) -> Result<()> {
    let am: job::ActiveModel = j.clone().into();
    job::Entity::insert(am).exec_without_returning(txn).await?;
    Ok(())
}

pub async fn find<C: ConnectionTrait>(conn: &C, id: CleanupJobId) -> Result<Option<job::Model>> {
    Ok(super::by_key(job::Entity::find_by_id(id), conn).await?)
}

/// The job, locked for the rest of the transaction (PostgreSQL; SQLite holds the writer lock already).
pub async fn find_locked(txn: &DatabaseTransaction, id: CleanupJobId) -> Result<Option<job::Model>> {
    Ok(super::by_key(job::Entity::find_by_id(id).lock_exclusive(), txn).await?)
}

/// Filters of the operator listing; `None` is "any".
pub struct ListQuery<'a> {
    pub workspaces: Option<&'a [WorkspaceId]>,
    pub state: Option<CleanupJobState>,
    pub task_id: Option<TaskId>,
    pub trigger: Option<CleanupTrigger>,
    pub before: Option<Uuid>,
    pub limit: u64,
}

/// Newest first.
pub async fn list<C: ConnectionTrait>(conn: &C, q: ListQuery<'_>) -> Result<Vec<job::Model>> {
    let mut find = job::Entity::find();
    if let Some(ids) = q.workspaces {
        find = find.filter(job::Column::WorkspaceId.is_in(ids.iter().copied()));
    }
    if let Some(s) = q.state {
        find = find.filter(job::Column::State.eq(s));
    }
    if let Some(t) = q.task_id {
        find = find.filter(job::Column::TaskId.eq(t));
    }
    if let Some(t) = q.trigger {
        find = find.filter(job::Column::Trigger.eq(t));
    }
    if let Some(before) = q.before {
        find = find.filter(job::Column::Id.lt(before));
    }
    Ok(find.order_by_desc(job::Column::Id).limit(q.limit).all(conn).await?)
}

/// The next job this node may claim, locked (SKIP LOCKED on PostgreSQL): one whose worker died (lease
/// expired) first, else the longest-due pending one. Each is one probe of a partial index (migration
/// m20261129_000002), so a claim costs the same with 10 or 10,000 jobs waiting.
pub async fn next_claimable(
    txn: &DatabaseTransaction,
    node_id: &str,
    now: DateTime<Utc>,
) -> Result<Option<job::Model>> {
    let abandoned = job::Entity::find()
        .filter(job::Column::NodeId.eq(node_id))
        .filter(state_in(&[CleanupJobState::Running]))
        .filter(job::Column::LeaseExpiresAt.lt(now))
        .order_by_asc(job::Column::LeaseExpiresAt);
    if let Some(j) = first_locked(txn, abandoned).await? {
        return Ok(Some(j));
    }
    let due = job::Entity::find()
        .filter(job::Column::NodeId.eq(node_id))
        .filter(state_in(&[CleanupJobState::Pending, CleanupJobState::RetryWait]))
        .filter(job::Column::NextAttemptAt.lte(now))
        .order_by_asc(job::Column::NextAttemptAt);
    first_locked(txn, due).await
}

/// `state IN (...)` with the states written into the statement, not bound: only then can a plan made
/// for any bound values (a generic plan) use the partial index whose predicate names those states.
fn state_in(states: &[CleanupJobState]) -> sea_orm::sea_query::SimpleExpr {
    use sea_orm::ActiveEnum;
    let list: Vec<String> = states.iter().map(|s| format!("'{}'", s.to_value())).collect();
    Expr::cust(format!(
        "\"task_resource_cleanup_jobs\".\"state\" IN ({})",
        list.join(", ")
    ))
}

/// The first row of `select`, locked (PostgreSQL skips rows other workers hold; SQLite's writer lock is
/// held already), with `LIMIT 1` written into the statement, not bound. With a bound limit (and bound
/// states) PostgreSQL judged a generic plan costlier than a custom one and planned both claim reads
/// again at every claim (about 100 µs each, a quarter of the claim's time in the database); SQLite
/// plans by a bound `LIMIT` and prepared them again every time.
async fn first_locked(txn: &DatabaseTransaction, select: sea_orm::Select<job::Entity>) -> Result<Option<job::Model>> {
    let backend = txn.get_database_backend();
    let mut statement = select.build(backend);
    statement.sql.push_str(match backend {
        sea_orm::DbBackend::Postgres => " LIMIT 1 FOR UPDATE SKIP LOCKED",
        _ => " LIMIT 1",
    });
    Ok(job::Entity::find().from_raw_sql(statement).one(txn).await?)
}

/// The columns a transition sets besides `state` and `updated_at`; `None` leaves a column as it is.
#[derive(Debug, Default, Clone)]
pub struct JobPatch {
    pub attempts: Option<i32>,
    pub next_attempt_at: Option<Option<DateTime<Utc>>>,
    pub last_error: Option<Option<String>>,
    pub lease_owner: Option<Option<String>>,
    pub lease_expires_at: Option<Option<DateTime<Utc>>>,
    pub completed_at: Option<Option<DateTime<Utc>>>,
}

impl JobPatch {
    /// The row as it reads after the patch.
    pub fn apply(&self, j: &mut job::Model) {
        if let Some(v) = self.attempts {
            j.attempts = v;
        }
        if let Some(v) = &self.next_attempt_at {
            j.next_attempt_at = *v;
        }
        if let Some(v) = &self.last_error {
            j.last_error = v.clone();
        }
        if let Some(v) = &self.lease_owner {
            j.lease_owner = v.clone();
        }
        if let Some(v) = &self.lease_expires_at {
            j.lease_expires_at = *v;
        }
        if let Some(v) = &self.completed_at {
            j.completed_at = *v;
        }
    }
}

/// Who holds a running job: the compare-and-set also checks these when given.
#[derive(Debug, Clone, Copy)]
pub struct LeaseGuard<'a> {
    pub owner: &'a str,
    pub attempts: i32,
}

/// A job's move as `domain::cleanup::state::transition` decided it: from the state the caller read, to
/// the next, with its patch, and the event that says so.
pub struct Move<'a> {
    pub id: CleanupJobId,
    pub from: CleanupJobState,
    pub to: CleanupJobState,
    pub lease: Option<LeaseGuard<'a>>,
    pub patch: &'a JobPatch,
    pub now: DateTime<Utc>,
}

/// The compare-and-set every job state write uses, and its event in the same transaction: `UPDATE ..
/// SET state = to, .. WHERE id = ? AND state = from [AND lease_owner = ? AND attempts = ?]`. On
/// PostgreSQL the update and its event are one statement (one round trip). `false`: the row had moved
/// on, and nothing was written.
pub async fn compare_and_set(
    txn: &DatabaseTransaction,
    m: Move<'_>,
    instance_id: InstanceId,
    (event_type, subject, data): (EventType, Subject, serde_json::Value),
) -> Result<bool> {
    let update = compare_and_set_update(m.id, m.from, m.lease, m.to, m.patch, m.now);
    if txn.get_database_backend() == DbBackend::Postgres {
        let update = update.build(DbBackend::Postgres);
        return Ok(events::append_on_change(txn, update, instance_id, event_type, subject, data).await?);
    }
    if update.exec(txn).await?.rows_affected != 1 {
        return Ok(false);
    }
    events::append(txn, instance_id, event_type, subject, data).await?;
    Ok(true)
}

fn compare_and_set_update(
    id: CleanupJobId,
    from: CleanupJobState,
    lease: Option<LeaseGuard<'_>>,
    to: CleanupJobState,
    patch: &JobPatch,
    now: DateTime<Utc>,
) -> sea_orm::UpdateMany<job::Entity> {
    let mut q = job::Entity::update_many()
        .col_expr(job::Column::State, Expr::value(to))
        .col_expr(job::Column::UpdatedAt, Expr::value(now));
    if let Some(v) = patch.attempts {
        q = q.col_expr(job::Column::Attempts, Expr::value(v));
    }
    if let Some(v) = patch.next_attempt_at {
        q = q.col_expr(job::Column::NextAttemptAt, Expr::value(v));
    }
    if let Some(v) = &patch.last_error {
        q = q.col_expr(job::Column::LastError, Expr::value(v.clone()));
    }
    if let Some(v) = &patch.lease_owner {
        q = q.col_expr(job::Column::LeaseOwner, Expr::value(v.clone()));
    }
    if let Some(v) = patch.lease_expires_at {
        q = q.col_expr(job::Column::LeaseExpiresAt, Expr::value(v));
    }
    if let Some(v) = patch.completed_at {
        q = q.col_expr(job::Column::CompletedAt, Expr::value(v));
    }
    q = q.filter(job::Column::Id.eq(id)).filter(job::Column::State.eq(from));
    if let Some(g) = lease {
        q = q
            .filter(job::Column::LeaseOwner.eq(g.owner))
            .filter(job::Column::Attempts.eq(g.attempts));
    }
    q
}

/// The heartbeat: a later lease expiry for a job still running under this owner and attempt. Writes no
/// state, so it is not a transition.
pub async fn extend_lease<C: ConnectionTrait>(
    conn: &C,
    id: CleanupJobId,
    lease: LeaseGuard<'_>,
    until: DateTime<Utc>,
) -> Result<bool> {
    let r = job::Entity::update_many()
        .col_expr(job::Column::LeaseExpiresAt, Expr::value(Some(until)))
        .filter(job::Column::Id.eq(id))
        .filter(job::Column::LeaseOwner.eq(lease.owner))
        .filter(job::Column::Attempts.eq(lease.attempts))
        .filter(job::Column::State.eq(CleanupJobState::Running))
        .exec(conn)
        .await?;
    Ok(r.rows_affected == 1)
}

/// `prepared` jobs older than `created_before`: their operation may have crashed (I6).
pub async fn prepared_before<C: ConnectionTrait>(conn: &C, created_before: DateTime<Utc>) -> Result<Vec<job::Model>> {
    Ok(job::Entity::find()
        .filter(job::Column::State.eq(CleanupJobState::Prepared))
        .filter(job::Column::CreatedAt.lt(created_before))
        .all(conn)
        .await?)
}

/// A task's jobs with one of `triggers` in one of `states`.
pub async fn of_task<C: ConnectionTrait>(
    conn: &C,
    task_id: TaskId,
    triggers: &[CleanupTrigger],
    states: &[CleanupJobState],
) -> Result<Vec<job::Model>> {
    Ok(job::Entity::find()
        .filter(job::Column::TaskId.eq(task_id))
        .filter(job::Column::Trigger.is_in(triggers.iter().copied()))
        .filter(job::Column::State.is_in(states.iter().copied()))
        .all(conn)
        .await?)
}

/// The jobs of `trigger` about one environment, in any state.
pub async fn of_environment<C: ConnectionTrait>(
    conn: &C,
    env_id: EnvironmentId,
    trigger: CleanupTrigger,
) -> Result<Vec<job::Model>> {
    Ok(job::Entity::find()
        .filter(job::Column::TaskEnvironmentId.eq(env_id))
        .filter(job::Column::Trigger.eq(trigger))
        .all(conn)
        .await?)
}

/// Rewrites a job's snapshot (its environment passed to an heir, I8); not a state change.
pub async fn set_snapshot(txn: &DatabaseTransaction, id: CleanupJobId, snapshot: serde_json::Value) -> Result<()> {
    job::Entity::update_many()
        .col_expr(job::Column::ResourceSnapshot, Expr::value(snapshot))
        .filter(job::Column::Id.eq(id))
        .exec(txn)
        .await?;
    Ok(())
}

/// How many jobs are in each state (for /metrics).
pub async fn count_by_state<C: ConnectionTrait>(conn: &C) -> Result<Vec<(CleanupJobState, i64)>> {
    Ok(job::Entity::find()
        .select_only()
        .column(job::Column::State)
        .column_as(job::Column::Id.count(), "n")
        .group_by(job::Column::State)
        .into_tuple()
        .all(conn)
        .await?)
}
