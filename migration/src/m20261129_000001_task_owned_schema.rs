//! The whole task-owned model (seed 001): a task owns its environment and worktree inventory; sessions
//! only reference it; cleanup jobs outlive tasks; events carry one global sequence.
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, Statement};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn id(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name)).uuid().not_null().primary_key().take()
}
fn uuid(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name)).uuid().not_null().take()
}
fn uuid_null(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name)).uuid().null().take()
}
fn text(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name)).text().not_null().take()
}
fn text_null(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name)).text().null().take()
}
fn ts(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
        .timestamp_with_time_zone()
        .not_null()
        .take()
}
fn ts_null(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
        .timestamp_with_time_zone()
        .null()
        .take()
}
fn int(name: &str, default: i32) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
        .integer()
        .not_null()
        .default(default)
        .take()
}
fn boolean(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
        .boolean()
        .not_null()
        .default(false)
        .take()
}
fn json(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name)).json_binary().not_null().take()
}
/// A text column restricted to the given values (a CHECK constraint on both backends).
fn one_of(name: &str, values: &[&str]) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
        .text()
        .not_null()
        .check(Expr::col(Alias::new(name)).is_in(values.iter().copied()))
        .take()
}
fn fk(from_table: &str, col: &str, to_table: &str, on_delete: ForeignKeyAction) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(format!("fk_{from_table}_{col}"))
        .from(Alias::new(from_table), Alias::new(col))
        .to(Alias::new(to_table), Alias::new("id"))
        .on_delete(on_delete)
        .take()
}

const CASCADE: ForeignKeyAction = ForeignKeyAction::Cascade;
const RESTRICT: ForeignKeyAction = ForeignKeyAction::Restrict;
const SET_NULL: ForeignKeyAction = ForeignKeyAction::SetNull;

/// Indexes, including the partial unique indexes that hold the ownership invariants in the database.
/// The same SQL is valid on SQLite and PostgreSQL.
const INDEXES: &[&str] = &[
    // A workspace name is how an operator confirms its deletion.
    "CREATE UNIQUE INDEX ux_workspaces_name ON workspaces (name)",
    // Repositories are soft-deleted so archived tasks keep their slots; one live registration per path.
    "CREATE UNIQUE INDEX ux_repositories_path ON repositories (workspace_id, path) WHERE deleted_at IS NULL",
    // The repository name names its worktree directory inside a task root.
    "CREATE UNIQUE INDEX ux_repositories_name ON repositories (workspace_id, name) WHERE deleted_at IS NULL",
    "CREATE INDEX ix_repositories_workspace ON repositories (workspace_id, id)",
    "CREATE INDEX ix_tasks_workspace ON tasks (workspace_id, id)",
    "CREATE INDEX ix_tasks_parent ON tasks (parent_task_id)",
    "CREATE UNIQUE INDEX ux_task_repositories_slot ON task_repositories (task_id, repository_id, branch_slug)",
    "CREATE INDEX ix_task_repositories_repository ON task_repositories (repository_id)",
    // I1: at most one current (ready) environment per task, and (I14) at most one being materialized. An
    // executor transition (I18) materializes the next one beside the current until its launch succeeds.
    "CREATE UNIQUE INDEX ux_task_environments_current ON task_environments (task_id) WHERE status IN ('ready', 'stopped')",
    "CREATE UNIQUE INDEX ux_task_environments_creating ON task_environments (task_id) WHERE status = 'creating'",
    "CREATE INDEX ix_task_environments_task ON task_environments (task_id)",
    // I1/I14: exactly one active inventory row per environment, repository and branch slot.
    "CREATE UNIQUE INDEX ux_task_environment_repos_active ON task_environment_repos (task_environment_id, repository_id, branch_slug) WHERE status = 'active'",
    "CREATE INDEX ix_task_environment_repos_env ON task_environment_repos (task_environment_id, position)",
    // One primary session per task.
    "CREATE UNIQUE INDEX ux_task_sessions_primary ON task_sessions (task_id) WHERE is_primary = TRUE",
    "CREATE INDEX ix_task_sessions_task ON task_sessions (task_id, id)",
    "CREATE INDEX ix_task_sessions_environment ON task_sessions (task_environment_id)",
    "CREATE INDEX ix_task_sessions_desired_open ON task_sessions (desired_open)",
    "CREATE INDEX ix_session_messages_session ON session_messages (session_id, id)",
    // I27: at most one live agent process per session.
    "CREATE UNIQUE INDEX ux_agent_executions_live ON agent_executions (session_id) WHERE state IN ('starting', 'running')",
    "CREATE INDEX ix_agent_executions_environment ON agent_executions (task_environment_id, state)",
    // I21/I22: current status is per (environment, repository), newest first; I23: one live row per pair.
    "CREATE INDEX ix_git_status_current ON git_status_observations (task_environment_id, repository_id, observed_at, id)",
    "CREATE UNIQUE INDEX ux_git_status_live ON git_status_observations (task_environment_id, repository_id) WHERE kind = 'live'",
    "CREATE INDEX ix_git_status_session ON git_status_observations (session_id)",
    // Cleanup jobs: claim by due time, find by task, filter by trigger.
    "CREATE INDEX ix_cleanup_jobs_due ON task_resource_cleanup_jobs (state, next_attempt_at)",
    "CREATE INDEX ix_cleanup_jobs_task ON task_resource_cleanup_jobs (task_id, state)",
    "CREATE INDEX ix_cleanup_jobs_trigger ON task_resource_cleanup_jobs (trigger, id)",
    "CREATE INDEX ix_cleanup_jobs_lease ON task_resource_cleanup_jobs (state, lease_expires_at)",
    "CREATE INDEX ix_events_created ON events (created_at)",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let tables = [
            Table::create()
                .table(Alias::new("workspaces"))
                .col(id("id"))
                .col(text("name"))
                .col(one_of("status", &["active", "deleting"]).default("active").take())
                .col(ts("created_at"))
                .col(ts("updated_at"))
                .take(),
            Table::create()
                .table(Alias::new("repositories"))
                .col(id("id"))
                .col(uuid("workspace_id"))
                .col(text("name"))
                .col(text("path"))
                .col(text("common_git_dir"))
                .col(text("default_branch"))
                .col(ts("created_at"))
                .col(ts("updated_at"))
                .col(ts_null("deleted_at"))
                .foreign_key(&mut fk("repositories", "workspace_id", "workspaces", CASCADE))
                .take(),
            Table::create()
                .table(Alias::new("tasks"))
                .col(id("id"))
                .col(uuid("workspace_id"))
                .col(uuid_null("parent_task_id"))
                .col(text("title"))
                // Fixed at creation: it names the task's worktree directory and default branch, which
                // must not move when the title is edited.
                .col(text("slug"))
                .col(text("description").default("").take())
                .col(one_of("kind", &["standard", "quick_chat"]))
                .col(one_of("workspace_mode", &["new_workspace", "inherit_parent"]))
                .col(ts_null("archived_at"))
                .col(ts("last_activity_at"))
                .col(ts("created_at"))
                .col(ts("updated_at"))
                .foreign_key(&mut fk("tasks", "workspace_id", "workspaces", CASCADE))
                .foreign_key(&mut fk("tasks", "parent_task_id", "tasks", SET_NULL))
                .take(),
            // The repository slots a task asks for; the physical inventory is task_environment_repos.
            Table::create()
                .table(Alias::new("task_repositories"))
                .col(id("id"))
                .col(uuid("task_id"))
                .col(uuid("repository_id"))
                .col(text("branch_slug").default("").take())
                .col(text_null("base_branch"))
                .col(text_null("branch"))
                .col(int("position", 0))
                .col(ts("created_at"))
                .foreign_key(&mut fk("task_repositories", "task_id", "tasks", CASCADE))
                .foreign_key(&mut fk("task_repositories", "repository_id", "repositories", RESTRICT))
                .take(),
            Table::create()
                .table(Alias::new("task_environments"))
                .col(id("id"))
                .col(uuid("task_id"))
                .col(one_of("executor_type", &["local", "worktree"]))
                .col(one_of(
                    "status",
                    &["creating", "ready", "stopped", "failed", "superseded"],
                ))
                .col(text_null("workspace_path"))
                .col(text("node_id"))
                .col(
                    ColumnDef::new(Alias::new("ownership_generation"))
                        .big_integer()
                        .not_null()
                        .default(1),
                )
                .col(uuid_null("materializer_id"))
                .col(text_null("error_message"))
                .col(ts("created_at"))
                .col(ts("updated_at"))
                .col(ts_null("superseded_at"))
                .foreign_key(&mut fk("task_environments", "task_id", "tasks", CASCADE))
                .take(),
            Table::create()
                .table(Alias::new("task_environment_repos"))
                .col(id("id"))
                .col(uuid("task_environment_id"))
                .col(uuid("repository_id"))
                .col(text("branch_slug").default("").take())
                .col(text_null("worktree_id"))
                .col(text_null("worktree_path"))
                .col(text_null("worktree_branch"))
                .col(text_null("base_commit"))
                .col(int("position", 0))
                .col(one_of("status", &["active", "merged", "deleted", "failed"]))
                .col(text_null("error_message"))
                .col(ts("created_at"))
                .col(ts("updated_at"))
                .col(ts_null("merged_at"))
                .col(ts_null("deleted_at"))
                .foreign_key(&mut fk(
                    "task_environment_repos",
                    "task_environment_id",
                    "task_environments",
                    CASCADE,
                ))
                .foreign_key(&mut fk(
                    "task_environment_repos",
                    "repository_id",
                    "repositories",
                    RESTRICT,
                ))
                .take(),
            Table::create()
                .table(Alias::new("task_sessions"))
                .col(id("id"))
                .col(uuid("task_id"))
                .col(uuid_null("task_environment_id"))
                .col(text("name").default("").take())
                .col(one_of("executor_type", &["local", "worktree"]))
                .col(text_null("agent_profile"))
                .col(one_of(
                    "state",
                    &[
                        "created",
                        "starting",
                        "running",
                        "idle",
                        "attention",
                        "recovering",
                        "stopping",
                        "stopped",
                        "failed",
                        "cancelled",
                    ],
                ))
                .col(boolean("is_primary"))
                .col(boolean("desired_open"))
                .col(uuid_null("execution_id"))
                .col(text_null("agent_session_ref"))
                .col(text_null("last_error_code"))
                .col(text_null("last_error_message"))
                .col(ts("last_activity_at"))
                .col(ts("created_at"))
                .col(ts("updated_at"))
                .col(ts_null("started_at"))
                .col(ts_null("ended_at"))
                .foreign_key(&mut fk("task_sessions", "task_id", "tasks", CASCADE))
                .foreign_key(&mut fk(
                    "task_sessions",
                    "task_environment_id",
                    "task_environments",
                    SET_NULL,
                ))
                .take(),
            // The conversation history: the only thing besides the row that a session delete removes (I2).
            Table::create()
                .table(Alias::new("session_messages"))
                .col(
                    ColumnDef::new(Alias::new("id"))
                        .big_integer()
                        .not_null()
                        .primary_key()
                        .auto_increment(),
                )
                .col(uuid("session_id"))
                .col(text("role"))
                .col(json("content"))
                .col(ts("created_at"))
                .foreign_key(&mut fk("session_messages", "session_id", "task_sessions", CASCADE))
                .take(),
            // The durable handle of one live agent process (the execution id changes per process, I26).
            Table::create()
                .table(Alias::new("agent_executions"))
                .col(id("id"))
                .col(uuid("session_id"))
                .col(uuid_null("task_environment_id"))
                .col(uuid("instance_id"))
                .col(text("node_id"))
                .col(ColumnDef::new(Alias::new("pid")).integer().null())
                .col(one_of("state", &["starting", "running", "exited", "failed"]))
                .col(text("workspace_path"))
                .col(ColumnDef::new(Alias::new("exit_code")).integer().null())
                .col(ts("started_at"))
                .col(ts_null("ended_at"))
                .col(ts("updated_at"))
                .foreign_key(&mut fk("agent_executions", "session_id", "task_sessions", CASCADE))
                .foreign_key(&mut fk(
                    "agent_executions",
                    "task_environment_id",
                    "task_environments",
                    SET_NULL,
                ))
                .take(),
            // I21: keyed by environment and repository; the session is nullable provenance.
            Table::create()
                .table(Alias::new("git_status_observations"))
                .col(id("id"))
                .col(uuid("task_environment_id"))
                .col(uuid("repository_id"))
                .col(uuid_null("session_id"))
                .col(one_of("kind", &["live", "completion", "archive"]))
                .col(ts("observed_at"))
                .col(text_null("branch"))
                .col(text_null("head_commit"))
                .col(text_null("upstream"))
                .col(int("ahead", 0))
                .col(int("behind", 0))
                .col(json("files"))
                .col(ts("created_at"))
                .foreign_key(&mut fk(
                    "git_status_observations",
                    "task_environment_id",
                    "task_environments",
                    CASCADE,
                ))
                .foreign_key(&mut fk(
                    "git_status_observations",
                    "repository_id",
                    "repositories",
                    RESTRICT,
                ))
                .foreign_key(&mut fk(
                    "git_status_observations",
                    "session_id",
                    "task_sessions",
                    SET_NULL,
                ))
                .take(),
            // No foreign key to tasks or workspaces: a job outlives what it cleans up (I9).
            Table::create()
                .table(Alias::new("task_resource_cleanup_jobs"))
                .col(id("id"))
                .col(
                    ColumnDef::new(Alias::new("operation_id"))
                        .uuid()
                        .not_null()
                        .unique_key(),
                )
                .col(uuid("task_id"))
                .col(uuid("workspace_id"))
                .col(uuid_null("task_environment_id"))
                .col(one_of(
                    "trigger",
                    &[
                        "archive",
                        "delete",
                        "cascade_archive",
                        "cascade_delete",
                        "workspace_delete",
                        "quick_chat_expire",
                        "environment_reset",
                    ],
                ))
                .col(one_of(
                    "state",
                    &[
                        "prepared",
                        "pending",
                        "running",
                        "retry_wait",
                        "succeeded",
                        "failed",
                        "cancelled",
                    ],
                ))
                .col(int("attempts", 0))
                .col(int("max_attempts", 8))
                .col(ts_null("next_attempt_at"))
                .col(text_null("last_error"))
                .col(json("resource_snapshot"))
                .col(text("node_id"))
                .col(text_null("lease_owner"))
                .col(ts_null("lease_expires_at"))
                .col(ts("created_at"))
                .col(ts("updated_at"))
                .col(ts_null("completed_at"))
                .take(),
            // I32: seq is assigned from event_sequence inside the writing transaction, so seq order is
            // commit order on both backends and replay never sees a gap that later fills.
            Table::create()
                .table(Alias::new("events"))
                .col(ColumnDef::new(Alias::new("seq")).big_integer().not_null().primary_key())
                .col(uuid("instance_id"))
                .col(text("type"))
                .col(uuid_null("workspace_id"))
                .col(uuid_null("task_id"))
                .col(uuid_null("session_id"))
                .col(uuid_null("task_environment_id"))
                .col(uuid_null("execution_id"))
                .col(json("data"))
                .col(ts("created_at"))
                .take(),
            Table::create()
                .table(Alias::new("event_sequence"))
                .col(ColumnDef::new(Alias::new("id")).integer().not_null().primary_key())
                .col(ColumnDef::new(Alias::new("last_seq")).big_integer().not_null())
                .take(),
        ];
        for table in tables {
            manager.create_table(table).await?;
        }
        let db = manager.get_connection();
        let backend = db.get_database_backend();
        for sql in INDEXES {
            db.execute_raw(Statement::from_string(backend, *sql)).await?;
        }
        db.execute_raw(Statement::from_string(
            backend,
            "INSERT INTO event_sequence (id, last_seq) VALUES (1, 0)",
        ))
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "event_sequence",
            "events",
            "task_resource_cleanup_jobs",
            "git_status_observations",
            "agent_executions",
            "session_messages",
            "task_sessions",
            "task_environment_repos",
            "task_environments",
            "task_repositories",
            "tasks",
            "repositories",
            "workspaces",
        ] {
            manager
                .drop_table(Table::drop().table(Alias::new(table)).to_owned())
                .await?;
        }
        Ok(())
    }
}
