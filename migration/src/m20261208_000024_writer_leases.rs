//! One writer at a time per environment: the row a writer holds while it changes the environment's
//! worktrees (an agent's turn, a restore, a landing, a cleanup). Taken by compare-and-set (an insert
//! that finds the row there takes nothing), held as long as its instance holds the instance lease, and
//! deleted by the one token that took it. No foreign key: a cleanup holds it while the environment's row
//! goes.
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
                    .table(Alias::new("writer_leases"))
                    .col(col("task_environment_id").uuid().not_null().primary_key().take())
                    .col(col("token").uuid().not_null().take())
                    .col(col("holder").string().not_null().take())
                    .col(col("holder_id").uuid().null().take())
                    .col(col("node_id").string().not_null().take())
                    .col(col("instance_id").uuid().not_null().take())
                    .col(col("acquired_at").timestamp_with_time_zone().not_null().take())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("writer_leases")).to_owned())
            .await
    }
}
