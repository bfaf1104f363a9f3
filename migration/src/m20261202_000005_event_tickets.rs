//! Stream tickets. A browser's `EventSource` cannot send `Authorization`, so a token holder mints a
//! single-use ticket that `GET /events/stream?ticket=` accepts instead. Only the SHA-256 of the ticket
//! is stored, with the principal it stands for; any replica can redeem it, once.
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
                    .table(Alias::new("event_tickets"))
                    // Hex SHA-256 of the ticket: the ticket itself is never stored.
                    .col(col("ticket_hash").text().not_null().primary_key().take())
                    .col(col("sub").text().not_null().take())
                    // Space-separated scope names, as in a token's `scope` claim.
                    .col(col("scopes").text().not_null().take())
                    // A JSON list of workspace ids, or null for every workspace.
                    .col(col("workspaces").json_binary().null().take())
                    .col(col("session_id").uuid().null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .col(col("expires_at").timestamp_with_time_zone().not_null().take())
                    .col(col("used_at").timestamp_with_time_zone().null().take())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_event_tickets_expires_at")
                    .table(Alias::new("event_tickets"))
                    .col(Alias::new("expires_at"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("event_tickets")).to_owned())
            .await
    }
}
