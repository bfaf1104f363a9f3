//! Events (decision 6, I32): appended in the same transaction as the change they report, so an event
//! exists if and only if its change committed, and readers see it only once its public `seq` is set.
//!
//! - SQLite (one writer): `seq` comes from the one-row `event_sequence` counter inside the writing
//!   transaction; the writer lock makes seq order commit order.
//! - PostgreSQL: a writer inserts its event with `seq` NULL and touches no shared row. One
//!   sequencer per database (`sequencer`, leadership by advisory lock) stamps committed rows in batches;
//!   each batch commits at once with numbers above every earlier batch, so seq is contiguous among
//!   committed events and equal to visibility order, and an event that commits late is stamped late: a
//!   reader after cursor N never skips it.
//!
//! Live delivery: one tailer per process reads stamped rows after the last one it published and
//! broadcasts them. On SQLite a commit wakes it; on PostgreSQL nothing is visible before its stamp, so a
//! commit wakes the sequencer (or this replica's herald) instead and the stamp wakes the tailers (the
//! leader's directly, the others by `NOTIFY`). A slow poll catches anything else. The rows are the
//! truth; the broadcast is a bounded cache of them.
use crate::ids::{EnvironmentId, ExecutionId, InstanceId, SessionId, TaskId, WorkspaceId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait, QueryFilter, QueryOrder, QuerySelect, Statement,
};
use tokio::sync::{Notify, broadcast, oneshot};

use crate::entity::event;

pub mod sequencer;
pub mod stream;
pub use crate::event_type as types;
pub mod wire;
pub mod written;

pub use types::EventType;

/// PostgreSQL: the sequencer stamped a batch (every replica's tailer reads it).
pub const PG_CHANNEL: &str = "berth_events";
/// PostgreSQL: a replica that does not lead committed events (the leader stamps them).
pub const PG_PENDING_CHANNEL: &str = "berth_events_pending";

/// What an event is about; the ids let streams filter by workspace and session.
#[derive(Debug, Default, Clone)]
pub struct Subject {
    pub workspace_id: Option<WorkspaceId>,
    pub task_id: Option<TaskId>,
    pub session_id: Option<SessionId>,
    pub task_environment_id: Option<EnvironmentId>,
    pub execution_id: Option<ExecutionId>,
}

impl Subject {
    pub fn workspace(id: WorkspaceId) -> Self {
        Subject {
            workspace_id: Some(id),
            ..Default::default()
        }
    }
    pub fn task(workspace_id: WorkspaceId, task_id: TaskId) -> Self {
        Subject {
            workspace_id: Some(workspace_id),
            task_id: Some(task_id),
            ..Default::default()
        }
    }
}

/// Appends one event inside `txn`. On PostgreSQL it gets its `seq` after commit, from the sequencer;
/// a request's commit waits for that (`Ctx::commit`), so what a client wrote is in the log when it is
/// answered.
pub async fn append(
    txn: &DatabaseTransaction,
    instance_id: InstanceId,
    event_type: EventType,
    subject: Subject,
    data: serde_json::Value,
) -> Result<(), DbErr> {
    let backend = txn.get_database_backend();
    if backend == DbBackend::Postgres {
        // One statement, and no shared row: `id` is an identity (a sequence, not held to commit).
        let row = txn
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                format!(
                    "INSERT INTO events ({PG_EVENT_COLUMNS}) VALUES ({}) RETURNING id",
                    pg_placeholders(0)
                ),
                pg_values(instance_id, event_type, subject, data),
            ))
            .await?
            .ok_or_else(|| DbErr::Custom("inserting an event returned no id".into()))?;
        written::appended(row.try_get("", "id")?);
        return Ok(());
    }
    // Whoever the work runs for (the request's token, or a job's requester).
    let actor = crate::actor::current();
    let row = txn
        .query_one_raw(Statement::from_string(
            backend,
            "UPDATE event_sequence SET last_seq = last_seq + 1 WHERE id = 1 RETURNING last_seq",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("event_sequence has no row".into()))?;
    let seq: i64 = row.try_get("", "last_seq")?;
    event::Entity::insert(event::ActiveModel {
        seq: Set(seq),
        instance_id: Set(instance_id),
        event_type: Set(event_type),
        workspace_id: Set(subject.workspace_id),
        task_id: Set(subject.task_id),
        session_id: Set(subject.session_id),
        task_environment_id: Set(subject.task_environment_id),
        execution_id: Set(subject.execution_id),
        data: Set(data),
        created_at: Set(crate::clock::now()),
        actor_sub: Set(actor.as_ref().map(|a| a.sub.clone())),
        actor_session_id: Set(actor.and_then(|a| a.session_id)),
        id: Set(None),
    })
    .exec_without_returning(txn)
    .await?;
    Ok(())
}

/// PostgreSQL: `change`, an UPDATE of at most one row (without `RETURNING`), and, only when it changed
/// that row, its event: one statement, so one round trip where `append` after the update would be two.
/// Returns whether the row changed (nothing is written when it did not). The event is the one `append`
/// would insert, in the same transaction (I32).
pub async fn append_on_change(
    txn: &DatabaseTransaction,
    change: Statement,
    instance_id: InstanceId,
    event_type: EventType,
    subject: Subject,
    data: serde_json::Value,
) -> Result<bool, DbErr> {
    debug_assert_eq!(txn.get_database_backend(), DbBackend::Postgres);
    let mut values = change.values.map(|v| v.0).unwrap_or_default();
    let sql = format!(
        "WITH changed AS ({} RETURNING 1) INSERT INTO events ({PG_EVENT_COLUMNS}) SELECT {} FROM changed RETURNING id",
        change.sql,
        pg_placeholders(values.len())
    );
    values.extend(pg_values(instance_id, event_type, subject, data));
    let Some(row) = txn
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values))
        .await?
    else {
        return Ok(false);
    };
    written::appended(row.try_get("", "id")?);
    Ok(true)
}

/// The columns a PostgreSQL event insert sets (`id` is an identity, `seq` the sequencer's).
const PG_EVENT_COLUMNS: &str = "instance_id, type, workspace_id, task_id, session_id, task_environment_id, \
     execution_id, data, created_at, actor_sub, actor_session_id";

/// `$n+1, ..., $n+11`: the places of [`pg_values`] after `n` other values.
fn pg_placeholders(n: usize) -> String {
    let list: Vec<String> = (n + 1..=n + 11).map(|i| format!("${i}")).collect();
    list.join(", ")
}

fn pg_values(
    instance_id: InstanceId,
    event_type: EventType,
    subject: Subject,
    data: serde_json::Value,
) -> Vec<sea_orm::Value> {
    let actor = crate::actor::current();
    vec![
        instance_id.into(),
        event_type.as_str().into(),
        subject.workspace_id.into(),
        subject.task_id.into(),
        subject.session_id.into(),
        subject.task_environment_id.into(),
        subject.execution_id.into(),
        data.into(),
        crate::clock::now().into(),
        actor.as_ref().map(|a| a.sub.clone()).into(),
        actor.as_ref().and_then(|a| a.session_id).into(),
    ]
}

/// The newest seq ever stamped (committed), and the oldest still retained.
pub async fn bounds<C: ConnectionTrait>(conn: &C) -> Result<(i64, i64), DbErr> {
    let backend = conn.get_database_backend();
    let row = conn
        .query_one_raw(Statement::from_string(
            backend,
            "SELECT s.last_seq AS latest, (SELECT MIN(seq) FROM events) AS first FROM event_sequence s WHERE s.id = 1",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("event_sequence has no row".into()))?;
    let latest: i64 = row.try_get("", "latest")?;
    let first: Option<i64> = row.try_get("", "first")?;
    Ok((first.unwrap_or(latest + 1), latest))
}

/// Committed events after `after`, oldest first.
pub async fn after<C: ConnectionTrait>(
    conn: &C,
    after: i64,
    limit: u64,
    filter: &Filter,
) -> Result<Vec<event::Model>, DbErr> {
    let mut q = event::Entity::find().filter(event::Column::Seq.gt(after));
    if let Some(ids) = &filter.workspaces {
        q = q.filter(event::Column::WorkspaceId.is_in(ids.iter().copied()));
    }
    if let Some(session) = filter.session_id {
        let mut scope = sea_orm::Condition::any().add(event::Column::SessionId.eq(session));
        if let Some(env) = filter.environment_id {
            let mut types = sea_orm::Condition::any();
            for prefix in ENVIRONMENT_SCOPED {
                types = types.add(event::Column::EventType.starts_with(prefix));
            }
            scope = scope.add(
                sea_orm::Condition::all()
                    .add(event::Column::TaskEnvironmentId.eq(env))
                    .add(types),
            );
        }
        q = q.filter(scope);
    }
    let n = &filter.narrow;
    if let Some(ws) = n.workspace_id {
        q = q.filter(event::Column::WorkspaceId.eq(ws));
    }
    if let Some(task) = n.task_id {
        q = q.filter(event::Column::TaskId.eq(task));
    }
    if let Some(session) = n.session_id {
        q = q.filter(event::Column::SessionId.eq(session));
    }
    if let Some(types) = &n.types {
        q = q.filter(event::Column::EventType.is_in(types.iter().copied()));
    }
    if let Some(actor) = &n.actor {
        q = q.filter(event::Column::ActorSub.eq(actor.as_str()));
    }
    q.order_by_asc(event::Column::Seq).limit(limit).all(conn).await
}

/// Event types about an environment as a whole, which an agent's token sees for its session's
/// environment (not its sibling sessions' own events).
const ENVIRONMENT_SCOPED: [&str; 2] = ["git_status.", "environment."];

/// Which events a reader may see: its token's workspaces, and for an agent's token its session only.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub workspaces: Option<Vec<WorkspaceId>>,
    pub session_id: Option<SessionId>,
    /// For an agent's token: its session's environment, whose events (git status from siblings or a
    /// refresh) concern it too.
    pub environment_id: Option<EnvironmentId>,
    /// What the reader asked for, within what its token sees.
    pub narrow: Narrowing,
}

/// A reader's own filters: exact matches on the event's fields, and a set of types. They only narrow:
/// an event must pass both these and the token's view.
#[derive(Debug, Clone, Default)]
pub struct Narrowing {
    pub workspace_id: Option<WorkspaceId>,
    pub task_id: Option<TaskId>,
    pub session_id: Option<SessionId>,
    /// `None`: every type.
    pub types: Option<Vec<EventType>>,
    /// Only what this token `sub` did.
    pub actor: Option<String>,
}

impl Narrowing {
    pub fn admits(&self, e: &event::Model) -> bool {
        fn exact<T: PartialEq>(want: Option<T>, got: Option<T>) -> bool {
            want.is_none() || want == got
        }
        exact(self.workspace_id, e.workspace_id)
            && exact(self.task_id, e.task_id)
            && exact(self.session_id, e.session_id)
            && self.types.as_ref().is_none_or(|t| t.contains(&e.event_type))
            && self.actor.as_ref().is_none_or(|a| e.actor_sub.as_ref() == Some(a))
    }
}

impl Filter {
    pub fn admits(&self, e: &event::Model) -> bool {
        if !self.narrow.admits(e) {
            return false;
        }
        let ws_ok = match (&self.workspaces, e.workspace_id) {
            (None, _) => true,
            (Some(ids), Some(ws)) => ids.contains(&ws),
            (Some(_), None) => false,
        };
        let scope_ok = match self.session_id {
            None => true,
            Some(s) => {
                e.session_id == Some(s)
                    || (self.environment_id.is_some()
                        && e.task_environment_id == self.environment_id
                        && ENVIRONMENT_SCOPED.iter().any(|p| e.event_type.as_str().starts_with(p)))
            }
        };
        ws_ok && scope_ok
    }
}

/// In-process fan-out of committed events.
pub struct Hub {
    tx: broadcast::Sender<Arc<event::Model>>,
    wake: Notify,
    published: AtomicI64,
    /// PostgreSQL: whether this replica holds sequencing leadership.
    leading: AtomicBool,
    /// PostgreSQL: events become visible only when stamped, so a commit need not wake the tailer (the
    /// stamp does). Set when the sequencer starts.
    stamped: AtomicBool,
    /// Wakes this replica's sequencer (when it leads).
    stamp: Notify,
    /// Wakes this replica's herald, which tells the leader (when another replica leads).
    herald: Notify,
    /// Writes waiting for their event to be published, by event id (PostgreSQL).
    waiters: Mutex<HashMap<i64, oneshot::Sender<()>>>,
    /// A replica that does not lead has writes waiting for their events (its herald said so): the
    /// leader's next round does not wait for its pace.
    remote_waiting: AtomicBool,
}

impl Hub {
    /// `capacity` bounds how far a subscriber may fall behind before it is told to reset.
    pub fn new(capacity: usize) -> Arc<Hub> {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Arc::new(Hub {
            tx,
            wake: Notify::new(),
            published: AtomicI64::new(-1),
            leading: AtomicBool::new(false),
            stamped: AtomicBool::new(false),
            stamp: Notify::new(),
            herald: Notify::new(),
            waiters: Mutex::new(HashMap::new()),
            remote_waiting: AtomicBool::new(false),
        })
    }

    /// Whether a write on this replica is waiting for its event to be published.
    pub fn has_waiters(&self) -> bool {
        !self.waiters.lock().unwrap().is_empty()
    }

    /// Whether someone is waiting for a stamp (here, or on a replica whose herald said so); clears the
    /// remote flag, which one round answers.
    fn stamp_awaited(&self) -> bool {
        self.remote_waiting.swap(false, Ordering::AcqRel) | self.has_waiters()
    }

    /// Tells the tailer that something committed, and on PostgreSQL whoever stamps it: this replica's
    /// sequencer when it leads, else the leader (through the herald, coalesced).
    pub fn wake(&self) {
        if !self.stamped.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
        if self.leading.load(Ordering::Acquire) {
            self.stamp.notify_one();
        } else {
            self.herald.notify_one();
        }
    }

    /// Whether this replica stamps events now (PostgreSQL).
    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    /// Resolves when the event with this `id` has been published here (registered before its commit,
    /// so the publication cannot be missed). Dropping the returned value unregisters it.
    pub fn published_id(self: &Arc<Self>, id: i64) -> PublishedId {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap().insert(id, tx);
        PublishedId {
            hub: self.clone(),
            id,
            rx,
        }
    }

    fn publish(&self, e: event::Model) {
        let (seq, id) = (e.seq, e.id);
        let _ = self.tx.send(Arc::new(e));
        self.published.store(seq, Ordering::Release);
        if let Some(id) = id
            && let Some(waiter) = self.waiters.lock().unwrap().remove(&id)
        {
            let _ = waiter.send(());
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<event::Model>> {
        self.tx.subscribe()
    }

    /// The highest seq broadcast so far.
    pub fn published(&self) -> i64 {
        self.published.load(Ordering::Acquire)
    }

    /// Sets where live delivery starts: the newest committed seq. Call before serving, so that every
    /// event committed afterwards is broadcast (earlier ones are served by replay).
    pub async fn start_at_current(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let (_, latest) = bounds(db).await?;
        self.published.store(latest, Ordering::Release);
        Ok(())
    }

    /// Reads committed events after the last one published and broadcasts them, in seq order, forever.
    pub async fn tail(self: Arc<Self>, db: DatabaseConnection, poll: Duration) {
        assert!(self.published() >= 0, "start_at_current must run before the tailer");
        loop {
            let _ = tokio::time::timeout(poll, self.wake.notified()).await;
            loop {
                let from = self.published();
                match after(&db, from, 1000, &Filter::default()).await {
                    Ok(batch) if batch.is_empty() => break,
                    Ok(batch) => {
                        let full = batch.len() == 1000;
                        for e in batch {
                            self.publish(e);
                        }
                        if !full {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "event tailer read failed; retrying");
                        break;
                    }
                }
            }
        }
    }
}

/// A write's wait for its event to reach this replica's streams (`Hub::published_id`).
pub struct PublishedId {
    hub: Arc<Hub>,
    id: i64,
    rx: oneshot::Receiver<()>,
}

impl PublishedId {
    /// True when published within `limit`.
    pub async fn within(mut self, limit: Duration) -> bool {
        matches!(tokio::time::timeout(limit, &mut self.rx).await, Ok(Ok(())))
    }
}

impl Drop for PublishedId {
    fn drop(&mut self) {
        self.hub.waiters.lock().unwrap().remove(&self.id);
    }
}

/// On PostgreSQL: wake the tailer whenever the sequencer stamped a batch, and this replica's sequencer
/// whenever another replica committed events (it stamps them if it leads).
pub async fn listen_postgres(hub: Arc<Hub>, db: DatabaseConnection) {
    use sea_orm::sqlx::postgres::PgListener;
    loop {
        let pool = db.get_postgres_connection_pool().clone();
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => {
                if let Err(e) = listener.listen_all([PG_CHANNEL, PG_PENDING_CHANNEL]).await {
                    tracing::warn!(error = %e, "LISTEN failed; relying on polling");
                } else {
                    loop {
                        match listener.recv().await {
                            Ok(n) if n.channel() == PG_PENDING_CHANNEL => {
                                if n.payload() == sequencer::AWAITED {
                                    hub.remote_waiting.store(true, Ordering::Release);
                                }
                                hub.stamp.notify_one()
                            }
                            // The leader's own stamps woke its tailer already.
                            Ok(_) if hub.leading() => {}
                            Ok(_) => hub.wake.notify_one(),
                            Err(e) => {
                                tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot open a LISTEN connection; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Retention: keeps the newest `keep` events and none older than `max_age`, and every event after
/// `undelivered` (the lowest cursor of an enabled webhook subscription: a subscription never loses an
/// event to retention). Returns how many went.
pub async fn trim<C: ConnectionTrait>(
    conn: &C,
    keep: i64,
    max_age: Duration,
    undelivered: Option<i64>,
) -> Result<u64, DbErr> {
    let (_, latest) = bounds(conn).await?;
    let cutoff_seq = latest - keep;
    let cutoff_time =
        crate::clock::now() - chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::days(36500));
    // Never an unstamped row (PostgreSQL): its transaction committed, and it has not been delivered.
    let mut delete = event::Entity::delete_many().filter(event::Column::Seq.is_not_null());
    if let Some(cursor) = undelivered {
        delete = delete.filter(event::Column::Seq.lte(cursor));
    }
    let res = delete
        .filter(
            sea_orm::Condition::any()
                .add(event::Column::Seq.lte(cutoff_seq))
                .add(event::Column::CreatedAt.lt(cutoff_time)),
        )
        .exec(conn)
        .await?;
    Ok(res.rows_affected)
}
