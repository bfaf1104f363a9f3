//! Actors, the reconcile pass's cleanup jobs, and `broken` environments.
//!
//! - `events` and `task_resource_cleanup_jobs` record their actor: the token's `sub` and, for an agent's
//!   token, its session (`actor_sub`, `actor_session_id`). Null on both is berth itself (a worker, a
//!   reconcile pass, crash recovery); rows from before this migration are null too, as nobody recorded them.
//! - A cleanup job may be a `superseded_cleanup`: the reconcile pass removing what a superseded environment
//!   left on disk.
//! - An environment may be `broken`: admission found its workspace unsafe (`broken_category` says how).
//!   It stays the task's current environment (the partial unique index that allows one current row per
//!   task now counts it) until a reset replaces it.
//!
//! Widening a CHECK: PostgreSQL drops and re-adds the named constraint; SQLite rewrites the stored
//! `CREATE TABLE` text through `writable_schema` (see migration 000006 for why not the table rebuild),
//! which is safe because every stored row still satisfies the wider CHECK.
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn col(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
}

const ENV_STATUSES: &str = "'creating', 'ready', 'stopped', 'failed', 'superseded'";
const TRIGGERS: &str = "'archive', 'delete', 'cascade_archive', 'cascade_delete', 'workspace_delete', \
                        'quick_chat_expire', 'environment_reset'";

pub(crate) async fn set_check(
    manager: &SchemaManager<'_>,
    table: &str,
    column: &str,
    from: &str,
    to: &str,
) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = db.get_database_backend();
    let exec = |sql: String| db.execute_raw(Statement::from_string(backend, sql));
    match backend {
        DbBackend::Postgres => {
            exec(format!("ALTER TABLE {table} DROP CONSTRAINT {table}_{column}_check")).await?;
            exec(format!(
                "ALTER TABLE {table} ADD CONSTRAINT {table}_{column}_check CHECK ({column} IN ({to}))"
            ))
            .await?;
        }
        _ => {
            let row = db
                .query_one_raw(Statement::from_sql_and_values(
                    backend,
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                    [table.into()],
                ))
                .await?
                .ok_or_else(|| DbErr::Migration(format!("{table} is missing")))?;
            let sql: String = row.try_get("", "sql")?;
            // sea-query writes `"status" IN ('a', 'b')`; its exact spacing is what migration 000001 stored.
            let old = format!(
                "\"{column}\" IN ({})",
                from.split_whitespace().collect::<Vec<_>>().join(" ")
            );
            if sql.matches(&old).count() != 1 {
                return Err(DbErr::Migration(format!(
                    "{table}'s {column} CHECK is not the expected one: {sql}"
                )));
            }
            let new = format!(
                "\"{column}\" IN ({})",
                to.split_whitespace().collect::<Vec<_>>().join(" ")
            );
            let new_sql = sql.replace(&old, &new);
            let version: i64 = db
                .query_one_raw(Statement::from_string(backend, "PRAGMA schema_version"))
                .await?
                .ok_or_else(|| DbErr::Migration("no schema_version".into()))?
                .try_get_by_index(0)?;
            exec("PRAGMA writable_schema = ON".into()).await?;
            let updated = db
                .execute_raw(Statement::from_sql_and_values(
                    backend,
                    "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?",
                    [new_sql.into(), table.into()],
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

async fn add_actor(manager: &SchemaManager<'_>, table: &str) -> Result<(), DbErr> {
    manager
        .alter_table(
            Table::alter()
                .table(Alias::new(table))
                .add_column(col("actor_sub").text().null().take())
                .to_owned(),
        )
        .await?;
    manager
        .alter_table(
            Table::alter()
                .table(Alias::new(table))
                .add_column(col("actor_session_id").uuid().null().take())
                .to_owned(),
        )
        .await
}

async fn drop_columns(manager: &SchemaManager<'_>, table: &str, columns: &[&str]) -> Result<(), DbErr> {
    for c in columns {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new(table))
                    .drop_column(Alias::new(*c))
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

async fn current_index(manager: &SchemaManager<'_>, statuses: &str) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = db.get_database_backend();
    db.execute_raw(Statement::from_string(
        backend,
        "DROP INDEX ux_task_environments_current",
    ))
    .await?;
    db.execute_raw(Statement::from_string(
        backend,
        format!(
            "CREATE UNIQUE INDEX ux_task_environments_current ON task_environments (task_id) WHERE status IN ({statuses})"
        ),
    ))
    .await?;
    Ok(())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        set_check(
            manager,
            "task_environments",
            "status",
            ENV_STATUSES,
            &format!("{ENV_STATUSES}, 'broken'"),
        )
        .await?;
        current_index(manager, "'ready', 'stopped', 'broken'").await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("task_environments"))
                    .add_column(col("broken_category").text().null().take())
                    .to_owned(),
            )
            .await?;
        set_check(
            manager,
            "task_resource_cleanup_jobs",
            "trigger",
            TRIGGERS,
            &format!("{TRIGGERS}, 'superseded_cleanup'"),
        )
        .await?;
        add_actor(manager, "task_resource_cleanup_jobs").await?;
        add_actor(manager, "events").await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_events_actor")
                    .table(Alias::new("events"))
                    .col(Alias::new("actor_sub"))
                    .col(Alias::new("seq"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("ix_events_actor")
                    .table(Alias::new("events"))
                    .to_owned(),
            )
            .await?;
        drop_columns(manager, "events", &["actor_sub", "actor_session_id"]).await?;
        drop_columns(
            manager,
            "task_resource_cleanup_jobs",
            &["actor_sub", "actor_session_id"],
        )
        .await?;
        let db = manager.get_connection();
        let backend = db.get_database_backend();
        // Rows the narrower CHECKs would refuse become what the older code understood.
        db.execute_raw(Statement::from_string(
            backend,
            "DELETE FROM task_resource_cleanup_jobs WHERE trigger = 'superseded_cleanup'",
        ))
        .await?;
        set_check(
            manager,
            "task_resource_cleanup_jobs",
            "trigger",
            &format!("{TRIGGERS}, 'superseded_cleanup'"),
            TRIGGERS,
        )
        .await?;
        drop_columns(manager, "task_environments", &["broken_category"]).await?;
        db.execute_raw(Statement::from_string(
            backend,
            "UPDATE task_environments SET status = 'ready' WHERE status = 'broken'",
        ))
        .await?;
        current_index(manager, "'ready', 'stopped'").await?;
        set_check(
            manager,
            "task_environments",
            "status",
            &format!("{ENV_STATUSES}, 'broken'"),
            ENV_STATUSES,
        )
        .await
    }
}
