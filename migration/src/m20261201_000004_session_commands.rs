//! Commands for a session's agent that arrive at a replica which does not run it (abort, stop, an answer
//! to a question) are stored here; the node that runs the agent carries them out and records the result,
//! which the waiting replica reads back.
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
                    .table(Alias::new("session_commands"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("session_id").uuid().not_null().take())
                    .col(col("execution_id").uuid().not_null().take())
                    .col(col("kind").text().not_null().take())
                    .col(col("payload").json_binary().not_null().take())
                    .col(col("state").text().not_null().take())
                    .col(col("result").json_binary().null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .col(col("updated_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_session_commands_session_id")
                            .from(Alias::new("session_commands"), Alias::new("session_id"))
                            .to(Alias::new("task_sessions"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_session_commands_state_session")
                    .table(Alias::new("session_commands"))
                    .col(Alias::new("state"))
                    .col(Alias::new("session_id"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("session_commands")).to_owned())
            .await
    }
}
