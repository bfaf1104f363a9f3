//! A webhook subscription too far behind no longer holds event retention: `lagging` marks it.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("webhooks"))
                    .add_column(
                        ColumnDef::new(Alias::new("lagging"))
                            .boolean()
                            .not_null()
                            .default(false),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("webhooks"))
                    .drop_column(Alias::new("lagging"))
                    .to_owned(),
            )
            .await
    }
}
