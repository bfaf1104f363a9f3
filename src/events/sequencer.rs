//! PostgreSQL event sequencing without a hot row.
//!
//! Writers insert events with `seq` NULL (`events::append`); nothing they do touches a shared row, so
//! writers of every replica commit in parallel. Exactly one replica at a time leads: it holds a
//! session-level advisory lock on a connection of its own, and stamps on that same connection, so a
//! leader whose process or connection dies loses the lock and can stamp nothing more; another replica's
//! campaign (every `TAKEOVER`) takes over.
//!
//! A stamp is one statement: it numbers the committed unstamped rows (in `id` order, which keeps the
//! order of one transaction's events), advances the counter (only the leader writes it) and notifies the
//! tailers, atomically. Why this keeps I32 with no horizon to compute: a row is invisible to readers
//! until stamped (they select `seq > cursor`); the statement sees only committed rows; each batch's
//! numbers follow the previous batch's and become visible together at its commit. So `seq` is contiguous
//! among committed events, and visibility order is `seq` order: a transaction that commits late is
//! stamped late, above every cursor a reader already holds. A rolled-back transaction's rows never
//! become visible, so they take no number.
//!
//! Wake-ups: a commit on the leader wakes its sequencer directly; a commit elsewhere wakes that replica's
//! herald, which sends one `NOTIFY` to the leader for however many commits arrived meanwhile (outside
//! the writers' transactions: a `NOTIFY` inside them would serialize their commits on PostgreSQL's
//! notification lock). A poll catches anything a lost notification missed. Both are paced (`PACE`), so
//! a busy database pays one stamping round per interval, not one per commit, unless a write is waiting
//! for its event (a request about to answer, `Ctx::commit`): then the round runs at once, also when the
//! write commits in the middle of an interval (`gather`), so a client that writes one request after
//! another is not held to one write per interval, nor behind the background writes of one.
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sea_orm::sqlx::{self, Row};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement};

use super::{Hub, PG_CHANNEL, PG_PENDING_CHANNEL};
use crate::metrics::Metrics;

/// The advisory lock key of sequencing leadership ("berthseq").
const LEADER_KEY: i64 = 0x6265_7274_6873_6571;
/// How often a replica that does not lead tries to.
pub const TAKEOVER: Duration = Duration::from_millis(250);
/// Rows per stamping statement.
const BATCH: i64 = 5000;
/// At most one stamping round (and one herald `NOTIFY`) per this interval, unless a write waits for its
/// event: idle, the first commit is stamped at once; busy, the commits of the interval share one
/// statement, one log flush, one notification and one read by each replica's tailer, instead of one
/// each. 25 ms, not 10: under a steady stream of writes nobody waits for (cleanup claims), each round
/// costs a flush and a scan of the unstamped index that grows with the rows stamped since the last
/// vacuum (BENCHMARKS.md); a board sees such events at most this much later.
const PACE: Duration = Duration::from_millis(25);
/// The payload of a herald's `NOTIFY` when writes on its replica wait for their events.
pub const AWAITED: &str = "awaited";

/// Numbers the oldest committed unstamped events after the counter, advances it, and notifies the
/// tailers when it stamped anything: one statement, one transaction.
const STAMP: &str = "WITH pending AS (\
       SELECT id, row_number() OVER (ORDER BY id) AS n \
       FROM (SELECT id FROM events WHERE seq IS NULL ORDER BY id LIMIT $1) oldest), \
     counter AS (\
       UPDATE event_sequence SET last_seq = last_seq + (SELECT count(*) FROM pending) \
       WHERE id = 1 AND EXISTS (SELECT 1 FROM pending) \
       RETURNING last_seq - (SELECT count(*) FROM pending) AS base), \
     stamped AS (\
       UPDATE events e SET seq = counter.base + pending.n FROM pending, counter \
       WHERE e.id = pending.id RETURNING e.seq), \
     total AS (SELECT count(*) AS n FROM stamped) \
     SELECT total.n FROM total LEFT JOIN LATERAL \
       (SELECT pg_notify('berth_events', '') WHERE total.n > 0) AS notified ON true";

/// Campaigns for leadership and, while leading, stamps; forever. Run once per process on PostgreSQL.
pub async fn run(hub: Arc<Hub>, db: DatabaseConnection, poll: Duration, metrics: Arc<Metrics>) {
    debug_assert_eq!(PG_CHANNEL, "berth_events", "STAMP notifies this channel by name");
    hub.stamped.store(true, Ordering::Release);
    loop {
        match lead(&hub, &db, poll, &metrics).await {
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "event sequencing connection failed; campaigning again"),
        }
        if hub.leading.swap(false, Ordering::AcqRel) {
            metrics.set_sequencer_leader(false);
            tracing::warn!("this replica no longer stamps events");
        }
        tokio::time::sleep(TAKEOVER).await;
    }
}

/// One connection's life: campaign on it until it leads, then stamp on it until it fails.
async fn lead(hub: &Hub, db: &DatabaseConnection, poll: Duration, metrics: &Metrics) -> Result<(), sqlx::Error> {
    // A connection of its own: the lock lives and dies with it, and no pooled query can release it.
    let mut conn = db.get_postgres_connection_pool().acquire().await?.detach();
    loop {
        let won: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LEADER_KEY)
            .fetch_one(&mut conn)
            .await?;
        if won {
            break;
        }
        tokio::time::sleep(TAKEOVER).await;
    }
    hub.leading.store(true, Ordering::Release);
    metrics.set_sequencer_leader(true);
    tracing::info!("this replica stamps events (sequencing leadership taken)");
    let mut last = tokio::time::Instant::now() - PACE;
    loop {
        gather(&hub.stamp, last + PACE, || hub.stamp_awaited()).await;
        last = tokio::time::Instant::now();
        // Everything committed so far, in batches, before waiting again.
        loop {
            let n: i64 = sqlx::query(STAMP)
                .bind(BATCH)
                .fetch_one(&mut conn)
                .await?
                .try_get("n")?;
            if n > 0 {
                hub.wake.notify_one();
            }
            if n < BATCH {
                break;
            }
        }
        let _ = tokio::time::timeout(poll, hub.stamp.notified()).await;
    }
}

/// Until `until`, lets the commits nobody waits for gather into one round, woken by each (`wake`); ends at
/// once when `awaited` says a write waits for its event, also one that commits meanwhile (a round in the
/// middle of a pace interval: a request is not held back by the background writes before it).
async fn gather(wake: &tokio::sync::Notify, until: tokio::time::Instant, mut awaited: impl FnMut() -> bool) {
    while !awaited() && tokio::time::Instant::now() < until {
        let _ = tokio::time::timeout_at(until, wake.notified()).await;
    }
}

/// On a replica that does not lead: one `NOTIFY` to the leader per burst of local commits.
pub async fn herald(hub: Arc<Hub>, db: DatabaseConnection) {
    let backend = db.get_database_backend();
    let mut last = tokio::time::Instant::now() - PACE;
    loop {
        hub.herald.notified().await;
        if hub.leading() {
            continue;
        }
        gather(&hub.herald, last + PACE, || hub.has_waiters()).await;
        last = tokio::time::Instant::now();
        let payload = if hub.has_waiters() { AWAITED } else { "" };
        let notify = Statement::from_string(
            backend,
            format!("SELECT pg_notify('{PG_PENDING_CHANNEL}', '{payload}')"),
        );
        if let Err(e) = db.execute_raw(notify).await {
            // The leader's poll stamps it anyway.
            tracing::warn!(error = %e, "could not tell the event sequencer about a commit");
        }
    }
}

/// How long a replay read waits for the events committed before it to be stamped.
const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// Before a replay read on PostgreSQL: waits until every event committed before now is stamped, so that
/// `GET /events` shows whatever a reader saw in the state it read before (a session's `failed`, say,
/// that a worker or a restore committed without a request waiting for its event). Costs one probe of
/// the small unstamped index when nothing is pending. Rows of transactions still open are not waited
/// for: they commit later and are stamped above every cursor.
pub async fn settle(hub: &Hub, db: &DatabaseConnection) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    let pending = |sql: &str| Statement::from_string(backend, sql.to_string());
    let newest = db
        .query_one_raw(pending("SELECT max(id) AS m FROM events WHERE seq IS NULL"))
        .await?
        .and_then(|r| r.try_get::<Option<i64>>("", "m").ok())
        .flatten();
    let Some(newest) = newest else { return Ok(()) };
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    let left = format!("SELECT EXISTS (SELECT 1 FROM events WHERE seq IS NULL AND id <= {newest}) AS n");
    loop {
        hub.wake();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let waiting: bool = db
            .query_one_raw(pending(&left))
            .await?
            .map(|r| r.try_get("", "n"))
            .transpose()?
            .unwrap_or(false);
        if !waiting {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("events committed before a replay are not stamped yet; reading without them");
            return Ok(());
        }
    }
}
