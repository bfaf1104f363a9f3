//! Issue 39 item 1: nodes and instances are visible. Every berth process is an instance of a node (the
//! filesystem it reaches, `BERTH_NODE_ID`): it records itself at start and renews a lease while it runs;
//! a node is up while any instance holds a lease. A node row outlives its instances and records whether an
//! operator gave it up (decommission). No foreign keys: executions, environments and jobs name a node by
//! id, as before.
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
                    .table(Alias::new("nodes"))
                    .col(col("id").text().not_null().primary_key().take())
                    .col(col("first_seen_at").timestamp_with_time_zone().not_null().take())
                    .col(col("decommissioned_at").timestamp_with_time_zone().null().take())
                    .col(col("decommissioned_by").text().null().take())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("instances"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("node_id").text().not_null().take())
                    .col(col("pid").integer().not_null().take())
                    .col(col("host").text().not_null().take())
                    .col(col("version").text().not_null().take())
                    // The connections this process may open (BERTH_DB_MAX_CONNECTIONS, issue 39 item 7).
                    .col(col("db_max_connections").integer().not_null().take())
                    .col(col("started_at").timestamp_with_time_zone().not_null().take())
                    .col(col("renewed_at").timestamp_with_time_zone().not_null().take())
                    .col(col("lease_until").timestamp_with_time_zone().not_null().take())
                    // Set by a clean shutdown: the lease is given back at once.
                    .col(col("ended_at").timestamp_with_time_zone().null().take())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_instances_node")
                    .table(Alias::new("instances"))
                    .col(Alias::new("node_id"))
                    .col(Alias::new("lease_until"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("instances")).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Alias::new("nodes")).to_owned())
            .await
    }
}
