//! Reads a kandev database of either generation, SQLite or PostgreSQL (`connection`), in one snapshot
//! and read-only, into plain rows (`model`). The schema is the same on both; what differs is how values
//! come back, which the helpers below absorb: PostgreSQL's `timestamptz` is RFC 3339, a boolean may be a
//! real boolean, a JSON column may be `jsonb` (docs/kandev-schema.md §1).
use std::collections::HashSet;

use chrono::{NaiveDateTime, TimeZone, Utc};
use serde_json::Value;

use super::connection::{KandevDb, Result, Row};
pub use super::connection::{Location, ReadError};
use super::model::*;

/// The whole kandev database, read in one read transaction (one consistent snapshot).
pub async fn read(at: &Location) -> Result<Source> {
    let mut db = KandevDb::open(at).await?;
    let mut reader = Reader {
        db: &mut db,
        tables: HashSet::new(),
    };
    let out = reader.read_all().await;
    db.close().await;
    out
}

struct Reader<'a> {
    db: &'a mut KandevDb,
    tables: HashSet<String>,
}

impl Reader<'_> {
    /// Every row of a table, or none when the table does not exist in this generation.
    async fn table(&mut self, table: &str, order: &str) -> Result<Vec<Row>> {
        if !self.tables.contains(table) {
            return Ok(Vec::new());
        }
        self.db.rows(table, order).await
    }

    async fn read_all(&mut self) -> Result<Source> {
        self.db.begin().await?;
        self.tables = self.db.tables().await?;
        for required in ["tasks", "task_sessions", "repositories"] {
            if !self.tables.contains(required) {
                return Err(ReadError::NotKandev {
                    path: self.db.name().to_string(),
                    reason: format!("it has no `{required}` table"),
                });
            }
        }
        let env_cols = self.db.columns("task_environments").await?;
        let repo_cols = self.db.columns("task_environment_repos").await?;
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
        src.kandev_version = self
            .table("kandev_meta", "key")
            .await?
            .iter()
            .find(|r| text(r, "key").as_deref() == Some("kandev_version"))
            .and_then(|r| text(r, "value"));
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
            let id = req(&r, "id");
            src.cleanup_jobs.push(CleanupJob {
                task_id: text(&r, "task_id"),
                trigger: text(&r, "trigger").unwrap_or_default(),
                state: text(&r, "state"),
                snapshot: json(&r, "resource_snapshot"),
                last_error: text(&r, "last_error"),
                created_at: ts(&r, "task_resource_cleanup_jobs", "created_at", &id)?,
                id,
            });
        }
        self.db.commit().await?;
        Ok(src)
    }
}

/// Optional text: NULL, `''` and a missing column all read as absent. A number (a TEXT column SQLite
/// let hold one) reads as its digits.
fn text(r: &Row, col: &str) -> Option<String> {
    match r.get(col)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn req(r: &Row, col: &str) -> String {
    text(r, col).unwrap_or_default()
}

/// An INTEGER (kandev's booleans are 0/1 on both databases), or a PostgreSQL boolean; absent is 0.
fn int(r: &Row, col: &str) -> i64 {
    match r.get(col) {
        Some(Value::Number(n)) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)).unwrap_or(0),
        Some(Value::Bool(b)) => i64::from(*b),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        _ => 0,
    }
}

/// A JSON column: TEXT holding JSON (both databases), or `jsonb`, which arrives as the JSON itself.
fn json(r: &Row, col: &str) -> Value {
    match r.get(col) {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::Null),
        Some(v @ (Value::Object(_) | Value::Array(_))) => v.clone(),
        _ => Value::Null,
    }
}

fn opt_ts(r: &Row, table: &'static str, column: &'static str, id: &str) -> Result<Option<Ts>> {
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

fn ts(r: &Row, table: &'static str, column: &'static str, id: &str) -> Result<Ts> {
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

    /// What PostgreSQL's `to_jsonb` makes of kandev's columns there: `timestamptz` in RFC 3339 (and a
    /// zone-less `timestamp` without offset), a boolean as a boolean, a `jsonb` column as JSON.
    #[test]
    fn postgres_values_read_as_sqlite_ones_do() {
        let row: Row = serde_json::from_value(serde_json::json!({
            "at": "2026-08-09T10:11:12.5+00:00",
            "naive": "2026-08-09T10:11:12",
            "flag": true,
            "zero": 0,
            "meta": {"workspace": {"mode": "inherit_parent"}},
            "text_meta": "{\"a\": 1}",
            "empty": "",
            "position": 3
        }))
        .unwrap();
        let want = Utc.with_ymd_and_hms(2026, 8, 9, 10, 11, 12).unwrap();
        assert_eq!(
            opt_ts(&row, "t", "at", "x").unwrap(),
            Some(want + chrono::Duration::milliseconds(500))
        );
        assert_eq!(ts(&row, "t", "naive", "x").unwrap(), want);
        assert_eq!((int(&row, "flag"), int(&row, "zero"), int(&row, "missing")), (1, 0, 0));
        assert_eq!(json(&row, "meta")["workspace"]["mode"], "inherit_parent");
        assert_eq!(json(&row, "text_meta")["a"], 1);
        assert_eq!((text(&row, "empty"), text(&row, "missing")), (None, None));
        assert_eq!(text(&row, "position").as_deref(), Some("3"));
    }
}
