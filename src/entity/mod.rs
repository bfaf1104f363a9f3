//! sea-orm entities: one file per table. Column enums that the API also shows derive `ToSchema`.
pub mod agent_execution;
pub mod cleanup_job;
pub mod event;
pub mod event_ticket;
pub mod git_status_observation;
pub mod idempotency_key;
pub mod repository;
pub mod session_command;
pub mod session_inbox;
pub mod session_message;
pub mod task;
pub mod task_environment;
pub mod task_environment_repo;
pub mod task_repository;
pub mod task_session;
pub mod workspace;
