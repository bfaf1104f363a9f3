//! Reads a kandev SQLite file of either generation, read-only (`mode=ro`, no `immutable`, so the WAL is
//! seen; nothing is checkpointed or written). A file whose write lock another process holds is refused.
use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use chrono::{NaiveDateTime, TimeZone, Utc};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteRow};
use sea_orm::sqlx::{Connection, Row, SqliteConnection};

use super::model::*;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}: no such file")]
    Missing(PathBuf),
    #[error(
        "{0} is being written by another process (kandev is probably running): stop kandev and run the import again"
    )]
    WriteLocked(PathBuf),
    #[error("{path} is not a kandev database: {reason}")]
    NotKandev { path: PathBuf, reason: String },
    #[error("cannot read {path}: {reason}")]
    Sqlite { path: PathBuf, reason: String },
    #[error("{table}.{column} of row {id} holds an unreadable timestamp {value:?}")]
    Timestamp {
        table: &'static str,
        column: &'static str,
        id: String,
        value: String,
    },
}

type Result<T> = std::result::Result<T, ReadError>;

/// The whole kandev file, read in one read transaction (one consistent snapshot).
pub async fn read(path: &Path) -> Result<Source> {
    if !path.is_file() {
        return Err(ReadError::Missing(path.to_path_buf()));
    }
    if write_locked(path) {
        return Err(ReadError::WriteLocked(path.to_path_buf()));
    }
    let sql_err = |e: sea_orm::sqlx::Error| ReadError::Sqlite {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let opts = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .create_if_missing(false);
    let mut conn = SqliteConnection::connect_with(&opts).await.map_err(sql_err)?;
    let mut reader = Reader {
        conn: &mut conn,
        path,
        tables: HashSet::new(),
    };
    let out = reader.read_all().await;
    conn.close().await.ok();
    out
}

struct Reader<'a> {
    conn: &'a mut SqliteConnection,
    path: &'a Path,
    tables: HashSet<String>,
}

impl Reader<'_> {
    fn err(&self, e: sea_orm::sqlx::Error) -> ReadError {
        ReadError::Sqlite {
            path: self.path.to_path_buf(),
            reason: e.to_string(),
        }
    }

    async fn rows(&mut self, sql: &str) -> Result<Vec<SqliteRow>> {
        let out = sea_orm::sqlx::query(sea_orm::sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_all(&mut *self.conn)
            .await;
        out.map_err(|e| self.err(e))
    }

    async fn columns(&mut self, table: &str) -> Result<HashSet<String>> {
        let rows = self
            .rows(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>("name").ok())
            .collect())
    }

    /// Every row of a table, or none when the table does not exist in this generation.
    async fn table(&mut self, table: &str, order: &str) -> Result<Vec<SqliteRow>> {
        if !self.tables.contains(table) {
            return Ok(Vec::new());
        }
        self.rows(&format!("SELECT * FROM {table} ORDER BY {order}")).await
    }

    async fn read_all(&mut self) -> Result<Source> {
        // One snapshot of the file for every table (a read transaction takes no write lock).
        self.rows("BEGIN").await?;
        let tables = self.rows("SELECT name FROM sqlite_master WHERE type = 'table'").await?;
        self.tables = tables
            .iter()
            .filter_map(|r| r.try_get::<String, _>("name").ok())
            .collect();
        for required in ["tasks", "task_sessions", "repositories"] {
            if !self.tables.contains(required) {
                return Err(ReadError::NotKandev {
                    path: self.path.to_path_buf(),
                    reason: format!("it has no `{required}` table"),
                });
            }
        }
        let env_cols = self.columns("task_environments").await?;
        let repo_cols = self.columns("task_environment_repos").await?;
        let legacy_table = self.tables.contains("task_session_worktrees");
        let flat = env_cols.contains("worktree_id");
        let lifecycle = repo_cols.contains("status");
        let generation = match (legacy_table, flat, lifecycle) {
            (true, true, false) => Generation::Legacy,
            (true, true, true) => Generation::LegacyPreview,
            (true, false, _) => Generation::Hybrid,
            (false, _, _) => Generation::Normalized,
        };
        let mut src = Source {
            generation: Some(generation),
            ..Default::default()
        };
        if self.tables.contains("kandev_meta") {
            let rows = self
                .rows("SELECT value FROM kandev_meta WHERE key = 'kandev_version'")
                .await?;
            src.kandev_version = rows.first().and_then(|r| text(r, "value"));
        }
        for r in self.table("repositories", "created_at, id").await? {
            let id = req(&r, "id");
            src.repositories.push(Repository {
                name: text(&r, "name").unwrap_or_else(|| id.clone()),
                local_path: text(&r, "local_path"),
                default_branch: text(&r, "default_branch"),
                deleted_at: opt_ts(&r, "repositories", "deleted_at", &id)?,
                created_at: ts(&r, "repositories", "created_at", &id)?,
                updated_at: ts(&r, "repositories", "updated_at", &id)?,
                id,
            });
        }
        for r in self.table("tasks", "created_at, id").await? {
            let id = req(&r, "id");
            let metadata = json(&r, "metadata");
            src.tasks.push(Task {
                title: text(&r, "title").unwrap_or_else(|| "(untitled)".into()),
                description: text(&r, "description"),
                parent_id: text(&r, "parent_id"),
                ephemeral: int(&r, "is_ephemeral") != 0,
                archived_at: opt_ts(&r, "tasks", "archived_at", &id)?,
                workspace_mode: metadata["workspace"]["mode"].as_str().map(str::to_string),
                created_at: ts(&r, "tasks", "created_at", &id)?,
                updated_at: ts(&r, "tasks", "updated_at", &id)?,
                id,
            });
        }
        for r in self.table("task_repositories", "position, created_at, id").await? {
            src.task_repositories.push(TaskRepository {
                task_id: req(&r, "task_id"),
                repository_id: req(&r, "repository_id"),
                base_branch: text(&r, "base_branch"),
                checkout_branch: text(&r, "checkout_branch"),
                position: int(&r, "position"),
            });
        }
        for r in self.table("executors", "id").await? {
            if let Some(kind) = text(&r, "type") {
                src.executors.push((req(&r, "id"), kind));
            }
        }
        for r in self.table("task_environments", "created_at, id").await? {
            let id = req(&r, "id");
            let flat = if flat {
                text(&r, "worktree_id").map(|worktree_id| FlatWorktree {
                    repository_id: text(&r, "repository_id"),
                    worktree_id,
                    path: text(&r, "worktree_path"),
                    branch: text(&r, "worktree_branch"),
                })
            } else {
                None
            };
            src.environments.push(Environment {
                task_id: req(&r, "task_id"),
                executor_type: text(&r, "executor_type"),
                status: text(&r, "status"),
                workspace_path: text(&r, "workspace_path"),
                flat,
                created_at: ts(&r, "task_environments", "created_at", &id)?,
                updated_at: ts(&r, "task_environments", "updated_at", &id)?,
                id,
            });
        }
        for r in self.table("task_environment_repos", "position, created_at, id").await? {
            let id = req(&r, "id");
            let status = text(&r, "status");
            src.env_repos.push(EnvRepo {
                env_id: req(&r, "task_environment_id"),
                repository_id: req(&r, "repository_id"),
                branch_slug: text(&r, "branch_slug").unwrap_or_default(),
                worktree_id: text(&r, "worktree_id"),
                path: text(&r, "worktree_path"),
                branch: text(&r, "worktree_branch"),
                position: int(&r, "position"),
                error_message: text(&r, "error_message"),
                deleted: status.as_deref() == Some("deleted")
                    || opt_ts(&r, "task_environment_repos", "deleted_at", &id)?.is_some(),
                merged: status.as_deref() == Some("merged"),
                created_at: ts(&r, "task_environment_repos", "created_at", &id)?,
                updated_at: ts(&r, "task_environment_repos", "updated_at", &id)?,
                id,
            });
        }
        for r in self.table("task_sessions", "started_at, id").await? {
            let id = req(&r, "id");
            src.sessions.push(Session {
                task_id: req(&r, "task_id"),
                state: text(&r, "state").unwrap_or_else(|| "CREATED".into()),
                env_id: text(&r, "task_environment_id"),
                executor_id: text(&r, "executor_id"),
                name: text(&r, "name"),
                is_primary: int(&r, "is_primary") != 0,
                started_at: ts(&r, "task_sessions", "started_at", &id)?,
                updated_at: ts(&r, "task_sessions", "updated_at", &id)?,
                completed_at: opt_ts(&r, "task_sessions", "completed_at", &id)?,
                id,
            });
        }
        for r in self.table("task_session_worktrees", "created_at, id").await? {
            let id = req(&r, "id");
            src.session_worktrees.push(SessionWorktree {
                session_id: req(&r, "session_id"),
                worktree_id: text(&r, "worktree_id"),
                repository_id: text(&r, "repository_id"),
                branch_slug: text(&r, "branch_slug").unwrap_or_default(),
                position: int(&r, "position"),
                path: text(&r, "worktree_path"),
                branch: text(&r, "worktree_branch"),
                deleted: text(&r, "status").as_deref() == Some("deleted")
                    || opt_ts(&r, "task_session_worktrees", "deleted_at", &id)?.is_some(),
                created_at: ts(&r, "task_session_worktrees", "created_at", &id)?,
                updated_at: ts(&r, "task_session_worktrees", "updated_at", &id)?,
                id,
            });
        }
        for r in self.table("task_session_messages", "created_at, id").await? {
            let id = req(&r, "id");
            src.messages.push(Message {
                session_id: req(&r, "task_session_id"),
                author_type: text(&r, "author_type").unwrap_or_default(),
                kind: text(&r, "type").unwrap_or_else(|| "message".into()),
                content: text(&r, "content").unwrap_or_default(),
                created_at: ts(&r, "task_session_messages", "created_at", &id)?,
                id,
            });
        }
        for r in self.table("task_session_git_snapshots", "created_at, id").await? {
            let id = req(&r, "id");
            let metadata = json(&r, "metadata");
            src.snapshots.push(GitSnapshot {
                session_id: text(&r, "session_id"),
                env_id: text(&r, "task_environment_id"),
                snapshot_type: text(&r, "snapshot_type"),
                triggered_by: text(&r, "triggered_by"),
                branch: text(&r, "branch"),
                remote_branch: text(&r, "remote_branch"),
                head_commit: text(&r, "head_commit"),
                ahead: int(&r, "ahead"),
                behind: int(&r, "behind"),
                files: json(&r, "files"),
                repository_name: metadata["repository_name"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
                created_at: ts(&r, "task_session_git_snapshots", "created_at", &id)?,
                id,
            });
        }
        for r in self.table("task_resource_cleanup_jobs", "created_at, id").await? {
            src.cleanup_jobs.push(CleanupJob {
                id: req(&r, "id"),
                task_id: text(&r, "task_id"),
                trigger: text(&r, "trigger").unwrap_or_default(),
                state: text(&r, "state"),
            });
        }
        self.rows("COMMIT").await?;
        Ok(src)
    }
}

/// Optional text: NULL, `''` and a missing column all read as absent.
fn text(r: &SqliteRow, col: &str) -> Option<String> {
    r.try_get::<Option<String>, _>(col)
        .ok()
        .flatten()
        .filter(|s| !s.is_empty())
}

fn req(r: &SqliteRow, col: &str) -> String {
    text(r, col).unwrap_or_default()
}

fn int(r: &SqliteRow, col: &str) -> i64 {
    r.try_get::<Option<i64>, _>(col).ok().flatten().unwrap_or(0)
}

fn json(r: &SqliteRow, col: &str) -> serde_json::Value {
    text(r, col)
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn opt_ts(r: &SqliteRow, table: &'static str, column: &'static str, id: &str) -> Result<Option<Ts>> {
    match text(r, column) {
        None => Ok(None),
        Some(raw) => parse_ts(&raw).map(Some).ok_or_else(|| ReadError::Timestamp {
            table,
            column,
            id: id.to_string(),
            value: raw,
        }),
    }
}

fn ts(r: &SqliteRow, table: &'static str, column: &'static str, id: &str) -> Result<Ts> {
    // A NOT NULL timestamp that an old build left empty reads as the epoch: it only orders rows.
    Ok(opt_ts(r, table, column, id)?.unwrap_or(chrono::DateTime::UNIX_EPOCH))
}

/// The three forms kandev's files hold (§1): the driver's `YYYY-MM-DD HH:MM:SS[.f]+00:00`,
/// `CURRENT_TIMESTAMP`'s zone-less UTC `YYYY-MM-DD HH:MM:SS`, and RFC 3339.
pub fn parse_ts(raw: &str) -> Option<Ts> {
    let raw = raw.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(raw) {
        return Some(t.with_timezone(&Utc));
    }
    let t_form = raw.replacen(' ', "T", 1);
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(&t_form) {
        return Some(t.with_timezone(&Utc));
    }
    for fmt in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(n) = NaiveDateTime::parse_from_str(raw, fmt) {
            return Some(Utc.from_utc_datetime(&n));
        }
    }
    None
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
    fn the_three_timestamp_forms_parse_to_the_same_instant() {
        let want = Utc.with_ymd_and_hms(2026, 8, 9, 10, 11, 12).unwrap();
        assert_eq!(parse_ts("2026-08-09 10:11:12+00:00"), Some(want));
        assert_eq!(parse_ts("2026-08-09 10:11:12"), Some(want));
        assert_eq!(parse_ts("2026-08-09T10:11:12Z"), Some(want));
        assert_eq!(
            parse_ts("2026-08-09 10:11:12.5+00:00"),
            Some(want + chrono::Duration::milliseconds(500))
        );
        assert_eq!(parse_ts("yesterday"), None);
    }
}
