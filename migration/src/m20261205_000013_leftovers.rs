//! What berth had to leave on disk is listed, never only mentioned in a job's `last_error`. A row per
//! directory berth kept: a superseded environment's worktree holding changes nobody consented to discard
//! (kept where it is), or what a reset, archive or delete found in a worktree's place that admission
//! refused (a directory that is no longer the worktree, or no longer the repository's: set aside under
//! `BERTH_WORKTREE_ROOT/.berth-leftovers/`, never run git in, never removed without consent). No foreign
//! keys: a row outlives its task and environment; it goes when disposed of.
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
                    .table(Alias::new("leftovers"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("workspace_id").uuid().not_null().take())
                    .col(col("task_id").uuid().null().take())
                    .col(col("task_environment_id").uuid().null().take())
                    .col(col("repository_id").uuid().null().take())
                    // Where it is now, and where it was (the same for a worktree kept in place).
                    .col(col("path").text().not_null().take())
                    .col(col("original_path").text().not_null().take())
                    .col(
                        col("reason")
                            .text()
                            .not_null()
                            .check(Expr::col(Alias::new("reason")).is_in(["dirty_worktree", "set_aside"]))
                            .take(),
                    )
                    .col(col("detail").text().not_null().take())
                    // The worktree as the job's snapshot named it (JSON): what a disposal proves it against.
                    .col(col("worktree").json().not_null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_leftovers_path")
                    .table(Alias::new("leftovers"))
                    .col(Alias::new("path"))
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_leftovers_workspace")
                    .table(Alias::new("leftovers"))
                    .col(Alias::new("workspace_id"))
                    .col(Alias::new("id"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("leftovers")).to_owned())
            .await
    }
}
