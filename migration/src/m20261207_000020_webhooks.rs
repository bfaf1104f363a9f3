//! Webhook subscriptions, each a durable cursor over the event log with its retry state and the
//! lease of the one replica that delivers it, and the recent attempts of each.
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
                    .table(Alias::new("webhooks"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("url").string().not_null().take())
                    // The entries as given (exact types and `prefix.`); null: every type.
                    .col(col("types").json().null().take())
                    .col(col("workspace_id").uuid().null().take())
                    .col(col("description").string().not_null().take())
                    .col(col("enabled").boolean().not_null().take())
                    .col(col("disabled_reason").string().null().take())
                    .col(col("secret").string().not_null().take())
                    .col(col("previous_secret").string().null().take())
                    .col(
                        col("previous_secret_expires_at")
                            .timestamp_with_time_zone()
                            .null()
                            .take(),
                    )
                    // The last seq passed (delivered, or not of this subscription).
                    .col(col("cursor").big_integer().not_null().take())
                    // The retry state of the event after the cursor that this subscription takes.
                    .col(col("attempts").integer().not_null().take())
                    .col(col("failing_since").timestamp_with_time_zone().null().take())
                    .col(col("next_attempt_at").timestamp_with_time_zone().null().take())
                    .col(col("lease_owner").uuid().null().take())
                    .col(col("lease_expires_at").timestamp_with_time_zone().null().take())
                    .col(col("created_by").string().null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .col(col("updated_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        &mut ForeignKey::create()
                            .from(Alias::new("webhooks"), Alias::new("workspace_id"))
                            .to(Alias::new("workspaces"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade)
                            .to_owned(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("webhook_deliveries"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("webhook_id").uuid().not_null().take())
                    // The `webhook-id` header: the same for every attempt of one event.
                    .col(col("message_id").string().not_null().take())
                    .col(col("event_seq").big_integer().null().take())
                    .col(col("event_type").string().not_null().take())
                    .col(col("attempt").integer().not_null().take())
                    .col(col("status_code").integer().null().take())
                    .col(col("succeeded").boolean().not_null().take())
                    .col(col("latency_ms").big_integer().not_null().take())
                    .col(col("error").string().null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        &mut ForeignKey::create()
                            .from(Alias::new("webhook_deliveries"), Alias::new("webhook_id"))
                            .to(Alias::new("webhooks"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade)
                            .to_owned(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_webhook_deliveries_webhook")
                    .table(Alias::new("webhook_deliveries"))
                    .col(Alias::new("webhook_id"))
                    .col(Alias::new("id"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("webhook_deliveries")).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Alias::new("webhooks")).to_owned())
            .await
    }
}
