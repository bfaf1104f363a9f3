//! The pull requests berth opened for a task, with their state as last read from their host. They go
//! with their task.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

fn col(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("pull_requests"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("task_id").uuid().not_null().take())
                    .col(col("task_environment_id").uuid().not_null().take())
                    .col(col("repository_id").uuid().not_null().take())
                    .col(col("api_url").string().not_null().take())
                    .col(col("owner").string().not_null().take())
                    .col(col("repo").string().not_null().take())
                    .col(col("number").big_integer().not_null().take())
                    .col(col("url").string().not_null().take())
                    // open | closed | merged
                    .col(col("state").string().not_null().take())
                    .col(col("draft").boolean().not_null().take())
                    .col(col("head").string().not_null().take())
                    .col(col("base").string().not_null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .col(col("updated_at").timestamp_with_time_zone().not_null().take())
                    .col(col("checked_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        &mut ForeignKey::create()
                            .from(Alias::new("pull_requests"), Alias::new("task_id"))
                            .to(Alias::new("tasks"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade)
                            .to_owned(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_pull_requests_task")
                    .table(Alias::new("pull_requests"))
                    .col(Alias::new("task_id"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("pull_requests")).to_owned())
            .await
    }
}
