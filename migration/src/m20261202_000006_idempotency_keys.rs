//! Stored answers for `Idempotency-Key` (per token subject and key, kept 24 h), and the session state
//! `preparing` (a session created with `Prefer: respond-async` while its environment is materialized in
//! the background).
//!
//! Widening the `task_sessions.state` CHECK: PostgreSQL drops and re-adds the named constraint. SQLite
//! cannot alter a constraint; the usual twelve-step rebuild needs `PRAGMA foreign_keys=OFF`, which is a
//! silent no-op inside a transaction (and migrations run in one), and with foreign keys on, dropping the old
//! `task_sessions` would cascade into every session's messages, inbox, executions and commands. So SQLite
//! uses the documented `writable_schema` procedure instead: the table's stored `CREATE TABLE` text is
//! rewritten in place, no row is moved or re-checked, no foreign key that points at `task_sessions` is
//! touched, and since the new CHECK only admits one more value every existing row still satisfies it (the
//! procedure is documented as safe for such changes that leave the stored data valid).
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn col(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
}

const STATES: &str =
    "'created', 'starting', 'running', 'idle', 'attention', 'recovering', 'stopping', 'stopped', 'failed', 'cancelled'";

async fn set_session_states(manager: &SchemaManager<'_>, from: &str, to: &str) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = db.get_database_backend();
    let exec = |sql: String| db.execute_raw(Statement::from_string(backend, sql));
    match backend {
        DbBackend::Postgres => {
            exec("ALTER TABLE task_sessions DROP CONSTRAINT task_sessions_state_check".into()).await?;
            exec(format!(
                "ALTER TABLE task_sessions ADD CONSTRAINT task_sessions_state_check CHECK (state IN ({to}))"
            ))
            .await?;
        }
        _ => {
            let row = db
                .query_one_raw(Statement::from_string(
                    backend,
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'task_sessions'",
                ))
                .await?
                .ok_or_else(|| DbErr::Migration("task_sessions is missing".into()))?;
            let sql: String = row.try_get("", "sql")?;
            let old = format!("\"state\" IN ({from})");
            if sql.matches(&old).count() != 1 {
                return Err(DbErr::Migration(format!(
                    "task_sessions' state CHECK is not the expected one: {sql}"
                )));
            }
            let new_sql = sql.replace(&old, &format!("\"state\" IN ({to})"));
            let version: i64 = db
                .query_one_raw(Statement::from_string(backend, "PRAGMA schema_version"))
                .await?
                .ok_or_else(|| DbErr::Migration("no schema_version".into()))?
                .try_get_by_index(0)?;
            exec("PRAGMA writable_schema = ON".into()).await?;
            let updated = db
                .execute_raw(Statement::from_sql_and_values(
                    backend,
                    "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'task_sessions'",
                    [new_sql.into()],
                ))
                .await;
            // Bumping the version makes every connection re-read the schema.
            let bumped = exec(format!("PRAGMA schema_version = {}", version + 1)).await;
            exec("PRAGMA writable_schema = OFF".into()).await?;
            updated?;
            bumped?;
            let check: String = db
                .query_one_raw(Statement::from_string(backend, "PRAGMA quick_check"))
                .await?
                .ok_or_else(|| DbErr::Migration("no quick_check answer".into()))?
                .try_get_by_index(0)?;
            if check != "ok" {
                return Err(DbErr::Migration(format!("quick_check after the CHECK change: {check}")));
            }
        }
    }
    Ok(())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("idempotency_keys"))
                    // The token's `sub`: keys of different callers never meet.
                    .col(col("subject").text().not_null().take())
                    .col(col("key").text().not_null().take())
                    // SHA-256 (hex) of method, path, query and body.
                    .col(col("fingerprint").text().not_null().take())
                    .col(
                        col("state")
                            .text()
                            .not_null()
                            .check(Expr::col(Alias::new("state")).is_in(["in_progress", "done"]))
                            .take(),
                    )
                    .col(col("response_status").integer().null().take())
                    .col(col("response_content_type").text().null().take())
                    .col(col("response_body").blob().null().take())
                    .col(col("response_location").text().null().take())
                    .col(col("response_etag").text().null().take())
                    // Which claim holds the row: only its holder may finish or release it.
                    .col(col("claim_id").uuid().not_null().take())
                    // When the claim was taken (a claim in progress for long is a crashed process's).
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .col(col("expires_at").timestamp_with_time_zone().not_null().take())
                    .primary_key(Index::create().col(Alias::new("subject")).col(Alias::new("key")))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_idempotency_keys_expires")
                    .table(Alias::new("idempotency_keys"))
                    .col(Alias::new("expires_at"))
                    .to_owned(),
            )
            .await?;
        set_session_states(manager, STATES, &format!("{STATES}, 'preparing'")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_raw(Statement::from_string(
            db.get_database_backend(),
            "UPDATE task_sessions SET state = 'failed' WHERE state = 'preparing'",
        ))
        .await?;
        set_session_states(manager, &format!("{STATES}, 'preparing'"), STATES).await?;
        manager
            .drop_table(Table::drop().table(Alias::new("idempotency_keys")).to_owned())
            .await
    }
}
