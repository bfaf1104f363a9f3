//! Versioned schema migrations. One migration per file: its file name is its version.
pub use sea_orm_migration::prelude::*;

mod m20261129_000001_task_owned_schema;
mod m20261129_000002_claim_indexes;
mod m20261201_000003_session_inbox;
mod m20261201_000004_session_commands;
mod m20261202_000005_event_tickets;
mod m20261202_000006_idempotency_keys;
mod m20261202_000007_row_versions;
mod m20261202_000008_branch_ownership;
mod m20261203_000009_actors_and_broken;
mod m20261203_000010_imported_from;
mod m20261204_000011_event_stamping;
mod m20261205_000012_command_actors;
mod m20261205_000013_leftovers;
mod m20261206_000014_nodes;
mod m20261206_000015_session_delete_jobs;
pub mod m20261206_000016_columns;
mod m20261206_000017_turns;
mod m20261206_000018_reviews;
mod m20261206_000019_pull_requests;
mod m20261207_000020_webhooks;
mod m20261207_000021_usage;
mod m20261207_000022_webhook_lagging;
mod m20261208_000024_writer_leases;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261129_000001_task_owned_schema::Migration),
            Box::new(m20261129_000002_claim_indexes::Migration),
            Box::new(m20261201_000003_session_inbox::Migration),
            Box::new(m20261201_000004_session_commands::Migration),
            Box::new(m20261202_000005_event_tickets::Migration),
            Box::new(m20261202_000006_idempotency_keys::Migration),
            Box::new(m20261202_000007_row_versions::Migration),
            Box::new(m20261202_000008_branch_ownership::Migration),
            Box::new(m20261203_000009_actors_and_broken::Migration),
            Box::new(m20261203_000010_imported_from::Migration),
            Box::new(m20261204_000011_event_stamping::Migration),
            Box::new(m20261205_000012_command_actors::Migration),
            Box::new(m20261205_000013_leftovers::Migration),
            Box::new(m20261206_000014_nodes::Migration),
            Box::new(m20261206_000015_session_delete_jobs::Migration),
            Box::new(m20261206_000016_columns::Migration),
            Box::new(m20261206_000017_turns::Migration),
            Box::new(m20261206_000018_reviews::Migration),
            Box::new(m20261206_000019_pull_requests::Migration),
            Box::new(m20261207_000020_webhooks::Migration),
            Box::new(m20261207_000021_usage::Migration),
            Box::new(m20261207_000022_webhook_lagging::Migration),
            Box::new(m20261208_000024_writer_leases::Migration),
        ]
    }
}
