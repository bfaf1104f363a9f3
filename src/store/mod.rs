//! Connections and the per-backend write strategy (decision 1).
//!
//! SQLite: WAL, busy timeout, foreign keys, a pool of several connections, and `BEGIN IMMEDIATE` for
//! every write transaction, because a deferred transaction that reads then writes fails with "database
//! is locked" under concurrency and sea-orm drops `FOR UPDATE` there. PostgreSQL: a pool, and row locks.
pub mod branches;
pub mod cleanup_jobs;
pub mod columns;
pub mod environments;
pub mod event_tickets;
pub mod executions;
pub mod idempotency;
pub mod import;
pub mod inbox;
pub mod leftovers;
pub mod messages;
pub mod migrate;
pub mod nodes;
pub mod observations;
pub mod pull_requests;
pub mod repositories;
pub mod reviews;
pub mod session_commands;
pub mod sessions;
pub mod tasks;
pub mod turns;
pub mod usage;
pub mod webhooks;
pub mod workspaces;
pub mod writer_leases;

use std::time::Duration;

use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{
    ConnectOptions, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, SqliteTransactionMode,
    TransactionOptions, TransactionTrait,
};

/// The row a primary-key select finds, if any: `.one()` without its `LIMIT`. `.one()` binds `LIMIT 1`
/// as a parameter, and SQLite (3.51) plans `LIMIT ?` by the value bound, so a statement with one is
/// parsed and planned again on every execution (`sqlite3Reprepare`, about one GET's in twelve of its
/// CPU; BENCHMARKS.md). A primary key matches at most one row, so no limit is needed. Selects of other
/// shapes (a join, a tuple) read by key the same way: `.all(conn).await?.pop()`.
pub async fn by_key<E: sea_orm::EntityTrait, C: sea_orm::ConnectionTrait>(
    select: sea_orm::Select<E>,
    conn: &C,
) -> Result<Option<E::Model>, DbErr> {
    Ok(select.all(conn).await?.pop())
}

/// How one process divides its connections (`BERTH_DB_MAX_CONNECTIONS`) between the shared pool and, on
/// PostgreSQL, the pools of its HTTP worker threads (a request's round trips driven by the thread that
/// awaits them). Whatever the core count, the pools together never open more than the setting: half of it
/// goes to the workers, at least two connections each, or none at all (every worker then uses the shared
/// pool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    pub shared: u32,
    /// Each HTTP worker's own pool, when there are such pools.
    pub per_worker: Option<u32>,
}

impl PoolPlan {
    pub fn new(max_connections: u32, workers: usize, postgres: bool) -> PoolPlan {
        let workers = workers.max(1) as u32;
        let per_worker = max_connections / 2 / workers;
        if !postgres || per_worker < 2 {
            return PoolPlan {
                shared: max_connections,
                per_worker: None,
            };
        }
        PoolPlan {
            shared: max_connections - per_worker * workers,
            per_worker: Some(per_worker),
        }
    }

    /// The most connections the plan opens.
    pub fn total(&self, workers: usize) -> u32 {
        self.shared + self.per_worker.unwrap_or(0) * workers.max(1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::PoolPlan;

    #[test]
    fn a_process_never_opens_more_connections_than_the_setting() {
        for max in 1..=64 {
            for workers in 1..=64 {
                for postgres in [false, true] {
                    let plan = PoolPlan::new(max, workers, postgres);
                    assert!(plan.total(workers) <= max, "{max} {workers} {plan:?}");
                    assert!(plan.shared >= 1, "{max} {workers} {plan:?}");
                }
            }
        }
        // This machine's default: two workers keep pools of two each, the rest is shared.
        assert_eq!(
            PoolPlan::new(10, 2, true),
            PoolPlan {
                shared: 6,
                per_worker: Some(2)
            }
        );
        // Sixteen cores and the default: one shared pool of ten, not 170 connections.
        assert_eq!(
            PoolPlan::new(10, 16, true),
            PoolPlan {
                shared: 10,
                per_worker: None
            }
        );
        assert_eq!(PoolPlan::new(10, 2, false).per_worker, None);
    }
}

#[derive(Clone)]
pub struct Db {
    pub conn: DatabaseConnection,
}

impl Db {
    /// The settings every pool shares.
    fn options(url: &str, max_connections: u32) -> ConnectOptions {
        let mut opts = ConnectOptions::new(url.to_string());
        opts.max_connections(max_connections)
            // A database outage answers 503 within seconds instead of holding requests for long.
            .acquire_timeout(Duration::from_secs(5))
            // sqlx pings every connection as it returns to the pool (its release check, which cannot be
            // turned off); its default ping on every acquire too was one more round trip (PostgreSQL)
            // or worker-thread hop (SQLite) in front of every statement outside a transaction and every
            // BEGIN. A connection idle long enough for the server or a proxy to have dropped it is
            // still pinged before use.
            .test_before_acquire_if_idle_for(Duration::from_secs(30))
            .sqlx_logging(false);
        // PostgreSQL pools only (sea-orm's PostgreSQL driver alone reads it): after an outage, a
        // connection that predates it is pinged too; a dead one is replaced.
        opts.map_sqlx_postgres_before_acquire(|conn, meta| {
            Box::pin(async move {
                if crate::outage::predates_last(meta.idle_for) {
                    return Ok(sea_orm::sqlx::Connection::ping(conn).await.is_ok());
                }
                Ok(true)
            })
        });
        opts
    }

    pub async fn connect(url: &str, max_connections: u32) -> Result<Db, DbErr> {
        let mut opts = Self::options(url, max_connections);
        opts.min_connections(1);
        if url.starts_with("sqlite:") {
            // A COMMIT that fails (a full disk) leaves SQLite's transaction open on that connection; reused,
            // the next BEGIN would become a savepoint whose "commit" never reaches the file (a write
            // answered 201 was lost). Such a connection is discarded; closing it rolls back.
            opts.map_sqlx_sqlite_before_acquire(|conn, _| {
                Box::pin(async move { Ok(!sea_orm::sqlx::Connection::is_in_transaction(conn)) })
            });
            opts.map_sqlx_sqlite_opts(|o| {
                o.journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(30))
                    .foreign_keys(true)
                    .create_if_missing(true)
            });
        }
        let conn = Database::connect(opts).await?;
        Ok(Db { conn })
    }

    /// PostgreSQL: a pool with `connect`'s settings whose connections open only when first used, so that
    /// they belong to the runtime that uses them. Each HTTP worker thread has one: a connection opened on
    /// another thread's runtime is driven by that runtime's reactor, so every round trip of a request
    /// would first wake that other thread. Call inside the worker's runtime.
    pub fn connect_lazy_postgres(url: &str, max_connections: u32) -> Result<Db, DbErr> {
        use futures_util::FutureExt;
        let mut opts = Self::options(url, max_connections);
        opts.min_connections(0).connect_lazy(true);
        // Lazy: nothing is awaited (no connection is opened), so the first poll completes it.
        let conn = Database::connect(opts)
            .now_or_never()
            .ok_or_else(|| DbErr::Custom("a lazy pool did not open at once".into()))??;
        Ok(Db { conn })
    }

    pub fn backend(&self) -> DbBackend {
        self.conn.get_database_backend()
    }

    pub fn is_sqlite(&self) -> bool {
        self.backend() == DbBackend::Sqlite
    }

    /// A transaction that will write: `BEGIN IMMEDIATE` on SQLite (the writer lock up front), a plain
    /// transaction on PostgreSQL (callers lock rows they read before writing).
    pub async fn begin_write(&self) -> Result<DatabaseTransaction, DbErr> {
        // A transaction dropped without commit left its events' ids behind: nothing waits for them.
        crate::events::written::take_appended();
        self.conn
            .begin_with_options(TransactionOptions {
                sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                ..Default::default()
            })
            .await
    }

    /// PostgreSQL: this transaction's commit returns without waiting for the log flush
    /// (`synchronous_commit = off` for it alone); a no-op on SQLite, whose WAL commits do not sync.
    ///
    /// Only for a transaction whose loss in a database crash harms nothing, because nothing outside
    /// the database acts on it before a later, flushed commit: the log is one sequence, so the next
    /// synchronous commit of any transaction (the sequencer's stamp of an event, say) flushes it first.
    /// Events qualify: nobody reads one before its stamp. A crash before then loses the transaction,
    /// and nothing anyone saw. It saves the flush (about 3 ms on this machine's disk) and keeps it from
    /// queueing before the flushes that do matter.
    pub async fn unflushed(txn: &DatabaseTransaction) -> Result<(), DbErr> {
        use sea_orm::ConnectionTrait;
        if txn.get_database_backend() == DbBackend::Postgres {
            txn.execute_unprepared("SET LOCAL synchronous_commit TO OFF").await?;
        }
        Ok(())
    }

    /// Whether the database answers (readiness).
    pub async fn ping(&self) -> bool {
        let ok = self.conn.ping().await.is_ok();
        if !ok {
            crate::outage::note();
        }
        ok
    }

    /// Pool usage for /metrics: (connections open, idle).
    pub fn pool_usage(&self) -> (u32, u32) {
        match self.backend() {
            DbBackend::Sqlite => {
                let pool = self.conn.get_sqlite_connection_pool();
                (pool.size(), pool.num_idle() as u32)
            }
            DbBackend::Postgres => {
                let pool = self.conn.get_postgres_connection_pool();
                (pool.size(), pool.num_idle() as u32)
            }
            _ => (0, 0),
        }
    }
}
