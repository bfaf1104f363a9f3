//! Review comments that go back to the agent. A review is a person's answer to an environment's diff: a
//! body and comments on lines of it (`comments`: `[{repository_id, path, line, side, body, quote}]`,
//! each line checked against the diff when the review was made), and, when it was sent to a session,
//! the inbox message that carried it. It goes with its task.
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
                    .table(Alias::new("reviews"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("task_id").uuid().not_null().take())
                    .col(col("task_environment_id").uuid().not_null().take())
                    .col(col("body").text().not_null().take())
                    .col(col("comments").json().not_null().take())
                    .col(col("session_id").uuid().null().take())
                    .col(col("message_id").uuid().null().take())
                    .col(col("created_by").string().null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        &mut ForeignKey::create()
                            .from(Alias::new("reviews"), Alias::new("task_id"))
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
                    .name("ix_reviews_environment")
                    .table(Alias::new("reviews"))
                    .col(Alias::new("task_environment_id"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("reviews")).to_owned())
            .await
    }
}
