//! One integration test binary (so linking happens once). Every test runs through the real HTTP server
//! on SQLite and, when `BERTH_TEST_POSTGRES_URL` is set, on PostgreSQL.
mod git_status;
mod helpers;

mod agents;
mod architecture;
mod async_create;
mod auth;
mod chains;
mod cleanup;
mod conversations;
mod cors;
mod errors;
mod etag;
mod event_filters;
mod events;
mod faults;
mod follow;
mod git_concurrency;
mod hostile;
mod idempotency;
mod inbox;
mod migrations;
mod model_server;
mod openapi;
mod ops;
mod pagination;
mod pi;
mod prune_scope;
mod replicas;
mod repositories;
mod sessions;
mod streaming;
mod tasks;
mod tickets;
mod ui;
mod workspaces;
