//! The task lifecycle operations that own physical cleanup (seed 001, I5-I13): archive, unarchive,
//! delete (and cascades, with transfer to an heir), workspace delete, environment reset and quick-chat
//! expiry. Each follows the barrier (`cleanup::barrier`): prepared jobs, stop the agents, the mutation
//! that activates them, then settle.
mod archive;
mod chain;
mod delete;
mod reset;
mod workspace_delete;

pub use archive::{BranchRecovery, BranchStatus, archive, unarchive};
pub use delete::{DirtyConsent, delete, expire_quick_chats};
pub use reset::reset_environment;
pub use workspace_delete::delete_workspace;
