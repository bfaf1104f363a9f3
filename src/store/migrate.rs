//! Schema migrations that fail closed (decision 2, I35).
//!
//! PostgreSQL: every pending migration runs in one transaction holding `pg_advisory_xact_lock` under a
//! `lock_timeout`, so replicas that start together cannot race. SQLite: a `VACUUM INTO` backup, checked
//! with `PRAGMA integrity_check` (the last two kept), is taken before pending migrations run inside one
//! `BEGIN IMMEDIATE` transaction. A database that records a migration this binary does not know is
//! refused.
use std::path::{Path, PathBuf};
use std::time::Duration;

use migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, TransactionTrait};

use super::Db;

/// An arbitrary constant naming berth's migration lock among PostgreSQL advisory locks.
const PG_MIGRATION_LOCK_KEY: i64 = 0x6265_7274_685f_6d67; // "berth_mg"
const BACKUPS_KEPT: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("the database was migrated by a newer berth (unknown migrations: {0}); refusing to start")]
    NewerDatabase(String),
    #[error("could not take the pre-migration backup at {path}: {reason}")]
    Backup { path: PathBuf, reason: String },
    #[error("could not take the migration lock: {0}")]
    Lock(String),
    #[error("migration failed and was rolled back: {0}")]
    Db(#[from] DbErr),
}

#[derive(Debug, PartialEq, Eq)]
pub enum MigrateOutcome {
    UpToDate,
    Applied {
        versions: Vec<String>,
        backup: Option<PathBuf>,
    },
}

pub fn known_versions() -> Vec<String> {
    Migrator::migrations().iter().map(|m| m.name().to_string()).collect()
}

/// Versions recorded in the database (empty when it was never migrated).
pub async fn applied_versions<C: ConnectionTrait>(conn: &C) -> Result<Vec<String>, DbErr> {
    let backend = conn.get_database_backend();
    let exists_sql = match backend {
        DbBackend::Sqlite => {
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = 'seaql_migrations'"
        }
        _ => {
            "SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'seaql_migrations'"
        }
    };
    let row = conn.query_one_raw(Statement::from_string(backend, exists_sql)).await?;
    let n: i64 = row.map(|r| r.try_get("", "n")).transpose()?.unwrap_or(0);
    if n == 0 {
        return Ok(Vec::new());
    }
    let rows = conn
        .query_all_raw(Statement::from_string(
            backend,
            "SELECT version FROM seaql_migrations ORDER BY version",
        ))
        .await?;
    rows.iter().map(|r| r.try_get("", "version")).collect()
}

/// What remains to apply; an error if the database knows migrations this binary does not.
fn pending(applied: &[String]) -> Result<Vec<String>, MigrateError> {
    let known = known_versions();
    let unknown: Vec<&str> = applied
        .iter()
        .filter(|v| !known.contains(v))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(MigrateError::NewerDatabase(unknown.join(", ")));
    }
    Ok(known.into_iter().filter(|v| !applied.contains(v)).collect())
}

/// True when every migration this binary knows is applied (for /readyz).
pub async fn is_current(conn: &DatabaseConnection) -> bool {
    matches!(applied_versions(conn).await.map(|a| pending(&a)), Ok(Ok(p)) if p.is_empty())
}

pub async fn migrate(db: &Db, data_dir: &Path, lock_timeout: Duration) -> Result<MigrateOutcome, MigrateError> {
    match db.backend() {
        DbBackend::Sqlite => migrate_sqlite(db, data_dir).await,
        _ => migrate_postgres(db, lock_timeout).await,
    }
}

async fn migrate_postgres(db: &Db, lock_timeout: Duration) -> Result<MigrateOutcome, MigrateError> {
    let txn = db.conn.begin().await?;
    let backend = DbBackend::Postgres;
    txn.execute_raw(Statement::from_string(
        backend,
        format!("SET LOCAL lock_timeout = '{}ms'", lock_timeout.as_millis()),
    ))
    .await?;
    txn.execute_raw(Statement::from_string(
        backend,
        format!("SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK_KEY})"),
    ))
    .await?;
    let todo = pending(&applied_versions(&txn).await?)?;
    if todo.is_empty() {
        txn.rollback().await?;
        return Ok(MigrateOutcome::UpToDate);
    }
    Migrator::up(&txn, None).await?;
    txn.commit().await?;
    Ok(MigrateOutcome::Applied {
        versions: todo,
        backup: None,
    })
}

async fn migrate_sqlite(db: &Db, data_dir: &Path) -> Result<MigrateOutcome, MigrateError> {
    // One migrating process at a time, from the pending check through backup, commit and pruning: only
    // the process that applies migrations takes (and prunes) backups, so none is lost to a race.
    let _lock = lock_file(&data_dir.join("migrate.lock")).await?;
    let todo = pending(&applied_versions(&db.conn).await?)?;
    if todo.is_empty() {
        return Ok(MigrateOutcome::UpToDate);
    }
    let backup = backup_sqlite(db, data_dir, &todo[0]).await?;
    let txn = db.begin_write().await?;
    // Another process may have migrated between the check and the writer lock.
    let todo = pending(&applied_versions(&txn).await?)?;
    if todo.is_empty() {
        txn.rollback().await?;
        return Ok(MigrateOutcome::UpToDate);
    }
    Migrator::up(&txn, None).await?;
    txn.commit().await?;
    Ok(MigrateOutcome::Applied {
        versions: todo,
        backup: Some(backup),
    })
}

/// An exclusive advisory lock on a file, held until the returned handle is dropped.
async fn lock_file(path: &Path) -> Result<std::fs::File, MigrateError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| MigrateError::Lock(format!("{}: {e}", path.display())))?;
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .map_err(|e| MigrateError::Lock(e.to_string()))?
        .map_err(|e| MigrateError::Lock(format!("{}: {e}", path.display())))
}

/// `VACUUM INTO` a fresh file, prove it with `PRAGMA integrity_check`, keep the newest two.
async fn backup_sqlite(db: &Db, data_dir: &Path, next_version: &str) -> Result<PathBuf, MigrateError> {
    let dir = data_dir.join("backups");
    let fail = |path: &Path, reason: String| MigrateError::Backup {
        path: path.to_path_buf(),
        reason,
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail(&dir, e.to_string()))?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ");
    let path = dir.join(format!("berth-{stamp}-before-{next_version}.db"));
    let quoted = path.to_string_lossy().replace('\'', "''");
    db.conn
        .execute_raw(Statement::from_string(
            DbBackend::Sqlite,
            format!("VACUUM INTO '{quoted}'"),
        ))
        .await
        .map_err(|e| fail(&path, e.to_string()))?;

    let verdict = integrity_check(&path).await.map_err(|e| fail(&path, e.to_string()))?;
    if verdict != "ok" {
        return Err(fail(&path, format!("integrity_check said {verdict:?}")));
    }
    prune_backups(&dir);
    Ok(path)
}

/// Opens the backup read-only (no journal-mode change) and asks SQLite to verify it.
async fn integrity_check(path: &Path) -> Result<String, sea_orm::sqlx::Error> {
    use sea_orm::sqlx::sqlite::SqliteConnectOptions;
    use sea_orm::sqlx::{ConnectOptions as _, Connection as _};
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await?;
    let verdict: String = sea_orm::sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    Ok(verdict)
}

/// Keeps the newest `BACKUPS_KEPT` backups (names sort by time).
pub fn prune_backups(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut backups: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("berth-") && n.ends_with(".db"))
        })
        .collect();
    backups.sort();
    let excess = backups.len().saturating_sub(BACKUPS_KEPT);
    for old in &backups[..excess] {
        if let Err(e) = std::fs::remove_file(old) {
            tracing::warn!(path = %old.display(), error = %e, "could not remove an old backup");
        }
    }
}
