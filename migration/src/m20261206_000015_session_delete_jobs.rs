//! A session delete whose node is down is accepted; what the delete owes that node's disk (ending the
//! session's agent if it still runs there, removing the conversation berth keeps for it) waits as a
//! `session_delete` cleanup job for that node, and runs when it is back.
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

use super::m20261203_000009_actors_and_broken::set_check;

const TRIGGERS: &str = "'archive', 'delete', 'cascade_archive', 'cascade_delete', 'workspace_delete', \
                        'quick_chat_expire', 'environment_reset', 'superseded_cleanup'";

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        set_check(
            manager,
            "task_resource_cleanup_jobs",
            "trigger",
            TRIGGERS,
            &format!("{TRIGGERS}, 'session_delete'"),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Rows the narrower CHECK would refuse: the older code cannot run them.
        manager
            .get_connection()
            .execute_unprepared("DELETE FROM task_resource_cleanup_jobs WHERE trigger = 'session_delete'")
            .await?;
        set_check(
            manager,
            "task_resource_cleanup_jobs",
            "trigger",
            &format!("{TRIGGERS}, 'session_delete'"),
            TRIGGERS,
        )
        .await
    }
}
