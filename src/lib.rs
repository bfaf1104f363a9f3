//! berth: the control plane for coding agents working in git worktrees.
//!
//! Data flows one way: `api` → `domain` → (`store`, `git`, `events`). A task owns its environment and
//! worktrees; sessions only use them; physical cleanup belongs to task lifecycle operations.
pub mod actor;
pub mod agent;
pub mod api;
pub mod auth;
pub mod clock;
pub mod config;
pub mod domain;
pub mod entity;
pub mod error;
pub mod event_type;
pub mod events;
pub mod executor;
pub mod git;
pub mod graceful;
pub mod healthcheck;
pub mod ids;
pub mod import;
pub mod managed_path;
pub mod metrics;
pub mod outage;
pub mod runtime;
pub mod scope;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod ui;
pub mod version;
pub mod worker;
