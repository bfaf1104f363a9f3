//! A workspace has ordered columns a task moves through (a board). Each workspace gets the default four
//! (`Backlog`, `In progress`, `In review`, `Done`); a column may say which event moves tasks into it
//! (`moves_in_on`: `session_started`, `merged`). A task records its column (`column_id`; no foreign key:
//! a column is removed only while empty). Existing workspaces get the defaults and their tasks start in
//! `Backlog`.
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn col(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
}

/// The columns a workspace starts with: name, and what moves tasks into it.
pub const DEFAULT_COLUMNS: [(&str, Option<&str>); 4] = [
    ("Backlog", None),
    ("In progress", Some("session_started")),
    ("In review", None),
    ("Done", Some("merged")),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("workspace_columns"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("workspace_id").uuid().not_null().take())
                    .col(col("name").text().not_null().take())
                    .col(col("position").integer().not_null().take())
                    .col(
                        col("moves_in_on")
                            .text()
                            .null()
                            .check(Expr::col(Alias::new("moves_in_on")).is_in(["session_started", "merged"]))
                            .take(),
                    )
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .col(col("updated_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        &mut ForeignKey::create()
                            .from(Alias::new("workspace_columns"), Alias::new("workspace_id"))
                            .to(Alias::new("workspaces"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade)
                            .to_owned(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_workspace_columns_name")
                    .table(Alias::new("workspace_columns"))
                    .col(Alias::new("workspace_id"))
                    .col(Alias::new("name"))
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("tasks"))
                    .add_column(col("column_id").uuid().null().take())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_tasks_column")
                    .table(Alias::new("tasks"))
                    .col(Alias::new("column_id"))
                    .to_owned(),
            )
            .await?;
        // The defaults for every workspace there is, in SQL (ids are stored as the database stores them:
        // a row's workspace id is copied, never decoded); its tasks start in the first.
        let db = manager.get_connection();
        let backend = db.get_database_backend();
        let (new_id, at) = match backend {
            DbBackend::Postgres => ("gen_random_uuid()", ["$1", "$2"]),
            _ => ("randomblob(16)", ["?", "?"]),
        };
        let now = chrono::Utc::now();
        for (position, (name, moves)) in DEFAULT_COLUMNS.iter().enumerate() {
            let moves = moves.map_or("NULL".to_string(), |m| format!("'{m}'"));
            let sql = format!(
                "INSERT INTO workspace_columns (id, workspace_id, name, position, moves_in_on, created_at, updated_at) \
                 SELECT {new_id}, id, '{name}', {position}, {moves}, {}, {} FROM workspaces",
                at[0], at[1]
            );
            db.execute_raw(Statement::from_sql_and_values(backend, sql, [now.into(), now.into()]))
                .await?;
        }
        db.execute_unprepared(
            "UPDATE tasks SET column_id = (SELECT c.id FROM workspace_columns c \
             WHERE c.workspace_id = tasks.workspace_id AND c.position = 0)",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("ix_tasks_column")
                    .table(Alias::new("tasks"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("tasks"))
                    .drop_column(Alias::new("column_id"))
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(Alias::new("workspace_columns")).to_owned())
            .await
    }
}
