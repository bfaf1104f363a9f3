//! Which branches berth created. `task_environment_repos.branch_origin` says, per inventory row, whether
//! berth created the worktree's branch (`created`), or it was a branch the user named that already
//! existed (`user_named`), or a default `berth/<task>` branch that existed before the task
//! (`existed_before`). Rows from before this migration stay null: their origin is unknown, and an
//! unknown branch is never deleted (nothing here can prove berth made it; a migration runs no git).
//!
//! `task_branches` is the ledger of branches berth created, written when `git worktree add -b` made one.
//! It outlives the task (no foreign key to it), so a branch kept after its task was deleted is still
//! listed; it goes with its repository.
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
            .alter_table(
                Table::alter()
                    .table(Alias::new("task_environment_repos"))
                    .add_column(
                        col("branch_origin")
                            .text()
                            .null()
                            .check(Expr::col(Alias::new("branch_origin")).is_in([
                                "created",
                                "user_named",
                                "existed_before",
                            ]))
                            .take(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("task_branches"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("workspace_id").uuid().not_null().take())
                    .col(col("repository_id").uuid().not_null().take())
                    .col(col("branch").text().not_null().take())
                    // What "fully merged" is measured against.
                    .col(col("base_branch").text().not_null().take())
                    // The task that owns it; no foreign key: the row outlives the task.
                    .col(col("task_id").uuid().null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_task_branches_repository_id")
                            .from(Alias::new("task_branches"), Alias::new("repository_id"))
                            .to(Alias::new("repositories"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_task_branches_repository_branch")
                    .table(Alias::new("task_branches"))
                    .col(Alias::new("repository_id"))
                    .col(Alias::new("branch"))
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_task_branches_workspace")
                    .table(Alias::new("task_branches"))
                    .col(Alias::new("workspace_id"))
                    .col(Alias::new("id"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("task_branches")).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("task_environment_repos"))
                    .drop_column(Alias::new("branch_origin"))
                    .to_owned(),
            )
            .await
    }
}
