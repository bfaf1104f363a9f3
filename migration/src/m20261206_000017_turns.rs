//! A checkpoint per turn. A checkpoint is the complete state of an environment's worktrees at one
//! moment, one git tree per repository slot (`trees`), kept alive by a berth-owned ref in the
//! repository (`refs/berth/checkpoints/<environment>/<checkpoint>-<position>`). A turn is one prompt of
//! a session, from its delivery to its settling, with the checkpoints at both ends.
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
                    .table(Alias::new("checkpoints"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("task_environment_id").uuid().not_null().take())
                    .col(col("session_id").uuid().null().take())
                    // [{repository_id, position, tree}]
                    .col(col("trees").json().not_null().take())
                    .col(col("created_at").timestamp_with_time_zone().not_null().take())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_checkpoints_environment")
                    .table(Alias::new("checkpoints"))
                    .col(Alias::new("task_environment_id"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("session_turns"))
                    .col(col("id").uuid().not_null().primary_key().take())
                    .col(col("session_id").uuid().not_null().take())
                    .col(col("task_environment_id").uuid().null().take())
                    .col(col("number").integer().not_null().take())
                    .col(col("prompt").text().not_null().take())
                    .col(col("started_at").timestamp_with_time_zone().not_null().take())
                    .col(col("settled_at").timestamp_with_time_zone().null().take())
                    .col(col("start_checkpoint_id").uuid().null().take())
                    .col(col("end_checkpoint_id").uuid().null().take())
                    .col(col("files_changed").integer().null().take())
                    .foreign_key(
                        &mut ForeignKey::create()
                            .from(Alias::new("session_turns"), Alias::new("session_id"))
                            .to(Alias::new("task_sessions"), Alias::new("id"))
                            .on_delete(ForeignKeyAction::Cascade)
                            .to_owned(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ux_session_turns_number")
                    .table(Alias::new("session_turns"))
                    .col(Alias::new("session_id"))
                    .col(Alias::new("number"))
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alias::new("session_turns")).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Alias::new("checkpoints")).to_owned())
            .await
    }
}
