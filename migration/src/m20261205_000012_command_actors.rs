//! A command routed to the replica that runs a session's agent (stop, abort, answer, setting) carries
//! who asked for it (`actor_sub`, `actor_session_id`, as events and cleanup jobs record them), so the
//! events it causes there name that caller instead of nobody. Null on both: berth itself, or a command
//! stored before this migration.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            ColumnDef::new(Alias::new("actor_sub")).text().null().take(),
            ColumnDef::new(Alias::new("actor_session_id")).uuid().null().take(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new("session_commands"))
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in ["actor_sub", "actor_session_id"] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new("session_commands"))
                        .drop_column(Alias::new(column))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
