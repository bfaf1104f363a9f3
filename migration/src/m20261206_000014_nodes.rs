//! Nodes and instances are visible. Every berth process is an instance of a node (the filesystem it
//! reaches, `BERTH_NODE_ID`): it records itself at start and renews a lease while it runs; a node is up
//! while any instance holds a lease. A node row outlives its instances and records whether an operator
//! gave it up (decommission). No foreign keys: executions, environments and jobs name a node by id, as
//! before. A repository records the node that registered it (a task's repositories share a node, and its
//! work happens there); one registered before has none. An environment may be `lost`: its node was
//! decommissioned; it is no task's current environment any more.
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

use super::m20261203_000009_actors_and_broken::set_check;

const ENV_STATUSES: &str = "'creating', 'ready', 'stopped', 'failed', 'superseded', 'broken'";

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
                    // Where the other instances reach it (BERTH_ADVERTISE_URL): requests that need this
                    // node's disk or agents are forwarded there.
                    .col(col("url").text().not_null().take())
                    .col(col("version").text().not_null().take())
                    // The connections this process may open (BERTH_DB_MAX_CONNECTIONS).
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
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("repositories"))
                    .add_column(col("node_id").text().null().take())
                    .to_owned(),
            )
            .await?;
        // What berth kept on disk is on one node's disk: only that node looks at it or removes it.
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("leftovers"))
                    .add_column(col("node_id").text().null().take())
                    .to_owned(),
            )
            .await?;
        set_check(
            manager,
            "task_environments",
            "status",
            ENV_STATUSES,
            &format!("{ENV_STATUSES}, 'lost'"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared("UPDATE task_environments SET status = 'superseded' WHERE status = 'lost'")
            .await?;
        set_check(
            manager,
            "task_environments",
            "status",
            &format!("{ENV_STATUSES}, 'lost'"),
            ENV_STATUSES,
        )
        .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("leftovers"))
                    .drop_column(Alias::new("node_id"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("repositories"))
                    .drop_column(Alias::new("node_id"))
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(Alias::new("instances")).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Alias::new("nodes")).to_owned())
            .await
    }
}
