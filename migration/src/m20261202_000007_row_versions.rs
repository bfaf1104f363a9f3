//! A row version on tasks, sessions, environments and inventory rows, for `ETag` and `If-Match`. A
//! trigger bumps it on every update that sets a column of the resource's representation, so no write
//! path can forget it (heartbeats that set only `last_activity_at` or `agent_state` do not count as a
//! new version).
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// (table, the columns whose change is a new version of the resource)
const TABLES: [(&str, &[&str]); 4] = [
    (
        "tasks",
        &[
            "workspace_id",
            "parent_task_id",
            "title",
            "slug",
            "description",
            "kind",
            "workspace_mode",
            "archived_at",
            "updated_at",
        ],
    ),
    (
        "task_sessions",
        &[
            "task_id",
            "task_environment_id",
            "name",
            "executor_type",
            "agent_profile",
            "state",
            "is_primary",
            "desired_open",
            "execution_id",
            "agent_session_ref",
            "last_error_code",
            "last_error_message",
            "updated_at",
            "started_at",
            "ended_at",
        ],
    ),
    (
        "task_environments",
        &[
            "task_id",
            "executor_type",
            "status",
            "workspace_path",
            "node_id",
            "ownership_generation",
            "materializer_id",
            "error_message",
            "updated_at",
            "superseded_at",
        ],
    ),
    (
        "task_environment_repos",
        &[
            "task_environment_id",
            "repository_id",
            "branch_slug",
            "worktree_id",
            "worktree_path",
            "worktree_branch",
            "base_commit",
            "position",
            "status",
            "error_message",
            "updated_at",
            "merged_at",
            "deleted_at",
        ],
    ),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (table, _) in TABLES {
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .add_column(
                            ColumnDef::new(Alias::new("row_version"))
                                .big_integer()
                                .not_null()
                                .default(1),
                        )
                        .to_owned(),
                )
                .await?;
        }
        let db = manager.get_connection();
        let postgres = manager.get_database_backend() == DbBackend::Postgres;
        if postgres {
            db.execute_unprepared(
                "CREATE OR REPLACE FUNCTION berth_bump_row_version() RETURNS trigger AS $$ \
                 BEGIN \
                   IF NEW.row_version = OLD.row_version THEN NEW.row_version := OLD.row_version + 1; END IF; \
                   RETURN NEW; \
                 END $$ LANGUAGE plpgsql",
            )
            .await?;
        }
        for (table, columns) in TABLES {
            let columns = columns.join(", ");
            let sql = if postgres {
                format!(
                    "CREATE TRIGGER {table}_row_version BEFORE UPDATE OF {columns} ON {table} \
                     FOR EACH ROW EXECUTE FUNCTION berth_bump_row_version()"
                )
            } else {
                // SQLite cannot assign NEW in a BEFORE trigger; recursive triggers are off, and the inner
                // update sets only row_version, which is not in the column list anyway.
                format!(
                    "CREATE TRIGGER {table}_row_version AFTER UPDATE OF {columns} ON {table} \
                     FOR EACH ROW WHEN NEW.row_version = OLD.row_version \
                     BEGIN UPDATE {table} SET row_version = OLD.row_version + 1 WHERE id = NEW.id; END"
                )
            };
            db.execute_unprepared(&sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for (table, _) in TABLES {
            db.execute_unprepared(&format!(
                "DROP TRIGGER IF EXISTS {table}_row_version{}",
                if manager.get_database_backend() == DbBackend::Postgres {
                    format!(" ON {table}")
                } else {
                    String::new()
                }
            ))
            .await?;
            manager
                .alter_table(
                    Table::alter()
                        .table(Alias::new(table))
                        .drop_column(Alias::new("row_version"))
                        .to_owned(),
                )
                .await?;
        }
        if manager.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared("DROP FUNCTION IF EXISTS berth_bump_row_version()")
                .await?;
        }
        Ok(())
    }
}
