//! What each assistant message cost, as its agent reported it. No foreign key to the task or the
//! session: deleting them deletes the conversation, not the money it spent (the workspace's rollups
//! keep it); a workspace's records go with the workspace.
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
                    .table(Alias::new("usage_records"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("workspace_id").uuid().not_null().take())
                    .col(col("task_id").uuid().not_null().take())
                    .col(col("session_id").uuid().not_null().take())
                    .col(col("turn").integer().null().take())
                    .col(col("agent_profile").string().not_null().take())
                    .col(col("model").string().not_null().take())
                    .col(col("input_tokens").big_integer().not_null().take())
                    .col(col("output_tokens").big_integer().not_null().take())
                    .col(col("cache_read_tokens").big_integer().not_null().take())
                    .col(col("cache_write_tokens").big_integer().not_null().take())
                    // Billionths of the currency's unit; null when the agent named no cost.
                    .col(col("cost_nanos").big_integer().null().take())
                    .col(col("currency").string().null().take())
                    // What an agent that reports a running total (ACP's usage_update) said last.
                    .col(col("cumulative_cost_nanos").big_integer().null().take())
                    // The UTC day (YYYY-MM-DD), the rollups' `group_by=day`.
                    .col(col("day").string().not_null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        &mut ForeignKey::create()
                            .from(Alias::new("usage_records"), Alias::new("workspace_id"))
                            .to(Alias::new("workspaces"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade)
                            .to_owned(),
                    )
                    .to_owned(),
            )
            .await?;
        for (name, cols) in [
            ("ix_usage_records_workspace_day", ["workspace_id", "day"]),
            ("ix_usage_records_task", ["task_id", "id"]),
            ("ix_usage_records_session", ["session_id", "id"]),
        ] {
            let mut index = Index::create();
            index.name(name).table(Alias::new("usage_records"));
            for c in cols {
                index.col(Alias::new(c));
            }
            manager.create_index(index.to_owned()).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("usage_records")).to_owned())
            .await
    }
}
