//! Where kandev's database is (`--from`) and how it is read: a SQLite file, opened read-only (`mode=ro`, no
//! `immutable`, so the WAL is seen; nothing is checkpointed or written), or a PostgreSQL database
//! (`postgres://...`), read in one read-only repeatable-read transaction. Both answer the same three
//! questions (which tables, which columns, every row of a table as a JSON object), so one reader
//! (`reader`) serves both. A database another process is writing is refused on both.
use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use sea_orm::sqlx::postgres::PgConnectOptions;
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteRow};
use sea_orm::sqlx::{AssertSqlSafe, Column, Connection, Executor, PgConnection, Row as _, SqliteConnection, ValueRef};
use serde_json::{Map, Value};

/// One row, by column name. SQLite's storage classes and PostgreSQL's `to_jsonb` both land here:
/// text as strings, integers as numbers, PostgreSQL's booleans as booleans and `timestamptz` as RFC 3339
/// strings, a `jsonb` column as the JSON itself.
pub type Row = Map<String, Value>;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}: no such file")]
    Missing(PathBuf),
    #[error(
        "{0} is being written by another process (kandev is probably running): stop kandev and run the import again"
    )]
    WriteLocked(String),
    #[error("{path} is not a kandev database: {reason}")]
    NotKandev { path: String, reason: String },
    #[error("cannot read {path}: {reason}")]
    Database { path: String, reason: String },
    #[error("{table}.{column} of row {id} holds an unreadable timestamp {value:?}")]
    Timestamp {
        table: &'static str,
        column: &'static str,
        id: String,
        value: String,
    },
}

pub type Result<T> = std::result::Result<T, ReadError>;

/// `--from`: a kandev SQLite file (or one of its backups), or a `postgres://` / `postgresql://` URL.
#[derive(Debug, Clone)]
pub enum Location {
    File(PathBuf),
    Postgres(String),
}

impl FromStr for Location {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Location, String> {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            PgConnectOptions::from_str(s).map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
            return Ok(Location::Postgres(s.to_string()));
        }
        if s.is_empty() {
            return Err("give kandev's database file or a postgres:// URL".into());
        }
        Ok(Location::File(PathBuf::from(s)))
    }
}

impl std::fmt::Display for Location {
    /// A URL is shown without its password (and without its query string, which may hold one).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::File(p) => write!(f, "{}", p.display()),
            Location::Postgres(url) => match PgConnectOptions::from_str(url) {
                Ok(o) => write!(
                    f,
                    "postgres://{}@{}:{}/{}",
                    o.get_username(),
                    o.get_host(),
                    o.get_port(),
                    o.get_database().unwrap_or("")
                ),
                Err(_) => write!(f, "(a PostgreSQL URL)"),
            },
        }
    }
}

/// An open kandev database.
pub enum KandevDb {
    Sqlite { conn: SqliteConnection, name: String },
    Postgres { conn: PgConnection, name: String },
}

impl KandevDb {
    /// Opens it read-only, refusing one that another process is writing.
    pub async fn open(at: &Location) -> Result<KandevDb> {
        let name = at.to_string();
        let err = |e: sea_orm::sqlx::Error| ReadError::Database {
            path: name.clone(),
            reason: e.to_string(),
        };
        match at {
            Location::File(path) => {
                if !path.is_file() {
                    return Err(ReadError::Missing(path.clone()));
                }
                if write_locked(path) {
                    return Err(ReadError::WriteLocked(name));
                }
                let opts = SqliteConnectOptions::new()
                    .filename(path)
                    .read_only(true)
                    .create_if_missing(false);
                let conn = SqliteConnection::connect_with(&opts).await.map_err(err)?;
                Ok(KandevDb::Sqlite { conn, name })
            }
            Location::Postgres(url) => {
                let opts = PgConnectOptions::from_str(url)
                    .map_err(err)?
                    .application_name("berth import kandev")
                    // Belt and braces beside the read-only transaction; instants are rendered in UTC.
                    .options([("default_transaction_read_only", "on"), ("TimeZone", "UTC")]);
                let mut conn = PgConnection::connect_with(&opts).await.map_err(err)?;
                // The counterpart of SQLite's write lock: another session of this database holds a
                // transaction that wrote (it has a transaction id).
                let writers: i64 = sea_orm::sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL",
                )
                .fetch_one(&mut conn)
                .await
                .map_err(err)?;
                if writers > 0 {
                    conn.close().await.ok();
                    return Err(ReadError::WriteLocked(name));
                }
                Ok(KandevDb::Postgres { conn, name })
            }
        }
    }

    pub fn name(&self) -> &str {
        match self {
            KandevDb::Sqlite { name, .. } | KandevDb::Postgres { name, .. } => name,
        }
    }

    fn err(&self, e: sea_orm::sqlx::Error) -> ReadError {
        ReadError::Database {
            path: self.name().to_string(),
            reason: e.to_string(),
        }
    }

    async fn execute(&mut self, sql: &str) -> Result<()> {
        let sql = AssertSqlSafe(sql.to_string());
        let out = match self {
            KandevDb::Sqlite { conn, .. } => conn.execute(sql).await.map(|_| ()),
            KandevDb::Postgres { conn, .. } => conn.execute(sql).await.map(|_| ()),
        };
        out.map_err(|e| self.err(e))
    }

    /// One snapshot for every table: SQLite's read transaction takes no write lock; PostgreSQL's
    /// repeatable read sees one snapshot and cannot write.
    pub async fn begin(&mut self) -> Result<()> {
        match self {
            KandevDb::Sqlite { .. } => self.execute("BEGIN").await,
            KandevDb::Postgres { .. } => self.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await,
        }
    }

    pub async fn commit(&mut self) -> Result<()> {
        self.execute("COMMIT").await
    }

    /// The names of one column of a query's rows.
    async fn names(&mut self, sql: String) -> Result<HashSet<String>> {
        let sql = AssertSqlSafe(sql);
        let out = match self {
            KandevDb::Sqlite { conn, .. } => sea_orm::sqlx::query_scalar::<_, String>(sql).fetch_all(conn).await,
            KandevDb::Postgres { conn, .. } => sea_orm::sqlx::query_scalar::<_, String>(sql).fetch_all(conn).await,
        };
        out.map(|v| v.into_iter().collect()).map_err(|e| self.err(e))
    }

    pub async fn tables(&mut self) -> Result<HashSet<String>> {
        let sql = match self {
            KandevDb::Sqlite { .. } => "SELECT name FROM sqlite_master WHERE type = 'table'",
            KandevDb::Postgres { .. } => {
                "SELECT table_name::text FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
            }
        };
        self.names(sql.into()).await
    }

    /// `table` is one of the importer's own table names, never input.
    pub async fn columns(&mut self, table: &str) -> Result<HashSet<String>> {
        let sql = match self {
            KandevDb::Sqlite { .. } => format!("SELECT name FROM pragma_table_info('{table}')"),
            KandevDb::Postgres { .. } => format!(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = '{table}'"
            ),
        };
        self.names(sql).await
    }

    /// Every row of `table` in `order` (the importer's own names and columns, never input).
    pub async fn rows(&mut self, table: &str, order: &str) -> Result<Vec<Row>> {
        let out = match self {
            KandevDb::Sqlite { conn, .. } => {
                let sql = AssertSqlSafe(format!("SELECT * FROM {table} ORDER BY {order}"));
                sea_orm::sqlx::query(sql)
                    .fetch_all(conn)
                    .await
                    .map(|rows| rows.iter().map(sqlite_row).collect())
            }
            KandevDb::Postgres { conn, .. } => {
                let sql = AssertSqlSafe(format!("SELECT to_jsonb(t)::text FROM {table} t ORDER BY {order}"));
                sea_orm::sqlx::query_scalar::<_, String>(sql)
                    .fetch_all(conn)
                    .await
                    .map(|rows| rows.iter().filter_map(|r| serde_json::from_str(r).ok()).collect())
            }
        };
        out.map_err(|e| self.err(e))
    }

    pub async fn close(self) {
        match self {
            KandevDb::Sqlite { conn, .. } => conn.close().await.ok(),
            KandevDb::Postgres { conn, .. } => conn.close().await.ok(),
        };
    }
}

/// A SQLite row by each value's storage class (a column's declared type does not bind its values).
fn sqlite_row(r: &SqliteRow) -> Row {
    let mut out = Map::new();
    for (i, c) in r.columns().iter().enumerate() {
        let null = r.try_get_raw(i).map_or(true, |v| v.is_null());
        let v = if null {
            Value::Null
        } else if let Ok(n) = r.try_get::<i64, _>(i) {
            Value::from(n)
        } else if let Ok(x) = r.try_get::<f64, _>(i) {
            Value::from(x)
        } else if let Ok(s) = r.try_get::<String, _>(i) {
            Value::String(s)
        } else if let Ok(b) = r.try_get::<Vec<u8>, _>(i) {
            Value::String(String::from_utf8_lossy(&b).into_owned())
        } else {
            Value::Null
        };
        out.insert(c.name().to_string(), v);
    }
    out
}

/// True when another process holds SQLite's write lock on the file, asked with `F_GETLK` (which takes no
/// lock): the RESERVED/PENDING bytes of the database (rollback journal) or the WAL write lock in `-shm`.
fn write_locked(path: &Path) -> bool {
    const PENDING_BYTE: i64 = 0x4000_0000;
    const WAL_WRITE_LOCK: i64 = 120;
    let held = |file: &Path, start: i64, len: i64| File::open(file).is_ok_and(|f| lock_held(&f, start, len));
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    held(path, PENDING_BYTE, 2) || held(Path::new(&shm), WAL_WRITE_LOCK, 1)
}

fn lock_held(file: &File, start: i64, len: i64) -> bool {
    // SAFETY: a zeroed `flock` is a valid value; `fcntl(F_GETLK)` only writes into it.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start as _;
    fl.l_len = len as _;
    // SAFETY: the descriptor is open for the call's duration and `fl` outlives it.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) };
    rc == 0 && i32::from(fl.l_type) != libc::F_UNLCK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_url_is_a_database_and_is_shown_without_its_password() {
        let at: Location = "postgres://kandev:s3cret@db.example:6543/kandev?sslmode=disable"
            .parse()
            .unwrap();
        assert!(matches!(at, Location::Postgres(_)));
        assert_eq!(at.to_string(), "postgres://kandev@db.example:6543/kandev");
        assert!(matches!(
            "postgresql://h/k".parse::<Location>(),
            Ok(Location::Postgres(_))
        ));
        let file: Location = "/home/me/.kandev/data/kandev.db".parse().unwrap();
        assert!(matches!(&file, Location::File(p) if p == Path::new("/home/me/.kandev/data/kandev.db")));
        assert!("postgres://h:notaport/k".parse::<Location>().is_err());
    }
}
