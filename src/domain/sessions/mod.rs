//! Sessions: agent conversations that use their task's environment and own nothing physical.
//!
//! Where things are: who may see a session and how it is shown (`access`), create/list/delete/primary
//! (`lifecycle`), launching an agent through admission (`launch`), messages, stop and answers
//! (`control`), what the agent's reports do (`reports`), restore after a restart or a crash
//! (`restore`), streamed deltas coalesced before they are written (`stream`), the snapshot a client loads
//! (`snapshot`), and the state machines with the one helper that writes a state change (`state`).
mod access;
mod control;
mod launch;
mod lifecycle;
mod reports;
mod restore;
mod snapshot;
pub mod state;
mod stream;

use super::Ctx;
use super::environments;

pub use access::SessionView;
pub(crate) use access::visible;
pub use control::{Answer, answer_attention, send_message, stop};
pub use launch::launch;
pub use lifecycle::{NewSession, create, delete, get, list, make_primary};
pub use reports::consume;
pub use restore::restore;
pub use snapshot::{SessionSnapshot, snapshot};
pub use state::{ExecutionEvent, InvalidTransition, SessionEvent};
