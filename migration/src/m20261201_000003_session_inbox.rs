//! A durable inbox per session (a message is stored before anything is sent to the agent, and every
//! change of its state is kept), and what berth last learned from the agent about itself.
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
                    .table(Alias::new("session_inbox"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("session_id").uuid().not_null().take())
                    .col(col("text").text().not_null().take())
                    .col(col("delivery").text().not_null().take())
                    .col(col("state").text().not_null().take())
                    .col(col("reason").text().null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .col(col("updated_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_session_inbox_session_id")
                            .from(Alias::new("session_inbox"), Alias::new("session_id"))
                            .to(Alias::new("task_sessions"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_session_inbox_session_state")
                    .table(Alias::new("session_inbox"))
                    .col(Alias::new("session_id"))
                    .col(Alias::new("state"))
                    .to_owned(),
            )
            .await?;
        // Model, thinking level, commands, models, status lines, title, notifications: what a snapshot shows
        // of the agent, kept so any replica (and a stopped session) can show it.
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("task_sessions"))
                    .add_column(col("agent_state").json_binary().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("task_sessions"))
                    .drop_column(Alias::new("agent_state"))
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(Alias::new("session_inbox")).to_owned())
            .await
    }
}
