//! `berth import kandev`: every imported row keeps its kandev id in `imported_from`, and a unique index
//! on it makes a second import of the same database a no-op (each kandev row maps to at most one berth
//! row). Rows berth created itself keep it null. Repositories also get a `status`: a kandev repository
//! whose path is not a git repository is imported as `missing` rather than dropped.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The tables that receive imported rows.
const TABLES: [&str; 7] = [
    "repositories",
    "tasks",
    "task_environments",
    "task_environment_repos",
    "task_sessions",
    "session_messages",
    "git_status_observations",
];

fn index_name(table: &str) -> String {
    format!("ux_{table}_imported_from")
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .add_column(ColumnDef::new(Alias::new("imported_from")).text().null())
                        .to_owned(),
                )
                .await?;
            // NULLs are distinct in a unique index on both backends: only imported rows are constrained.
            manager
                .create_index(
                    Index::create()
                        .name(index_name(table))
                        .table(Alias::new(table))
                        .col(Alias::new("imported_from"))
                        .unique()
                        .to_owned(),
                )
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("repositories"))
                    .add_column(
                        ColumnDef::new(Alias::new("status"))
                            .text()
                            .not_null()
                            .default("available")
                            .check(Expr::col(Alias::new("status")).is_in(["available", "missing"]))
                            .take(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("repositories"))
                    .drop_column(Alias::new("status"))
                    .to_owned(),
            )
            .await?;
        for table in TABLES {
            manager
                .drop_index(
                    Index::drop()
                        .name(index_name(table))
                        .table(Alias::new(table))
                        .to_owned(),
                )
                .await?;
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .drop_column(Alias::new("imported_from"))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
