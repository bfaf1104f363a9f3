//! Sessions: agent conversations that use their task's environment and own nothing physical.
//!
//! Where things are: who may see a session and how it is shown (`access`), create/list/primary
//! (`lifecycle`), delete (`delete`), launching an agent through admission (`launch`), a Pi agent's conversation file
//! (`conversation`), the durable inbox of messages and abort (`inbox`), stop and answers (`control`),
//! what the agent's reports do (`reports`), streamed deltas coalesced before they are written (`stream`),
//! restore after a restart or a crash (`restore`), requests routed to the node that runs the agent
//! (`routing`, and `commands` on that node), the snapshot a client loads (`snapshot`), and the state
//! machines with the one helper that writes a state change (`state`).
mod access;
mod commands;
mod control;
mod conversation;
mod delete;
mod inbox;
mod launch;
mod lifecycle;
mod reports;
mod restore;
mod routing;
mod settings;
mod snapshot;
pub mod state;
mod stream;
pub mod turns;

use super::Ctx;
use super::environments;

pub(crate) use access::visible;
pub use access::{SessionNode, SessionView};
pub use commands::serve_routed;
pub(crate) use control::end_agent;
pub use control::{Answer, answer_attention, parse_answer, stop};
pub(crate) use conversation::remove as remove_conversation;
pub use delete::delete;
pub use inbox::{abort, cancel as cancel_message, list as list_messages, post as post_message, view as message_view};
pub(crate) use inbox::{enqueue_in as enqueue_message_in, taking_messages, wake as wake_inbox};
pub(crate) use launch::fail_node_lost;
pub use launch::{Seen, launch, record_failure};
pub use lifecycle::{NewSession, create, create_async, get, list, make_primary, resume_preparing};
pub use reports::consume;
pub(crate) use restore::end_lost_execution;
pub use restore::{end_orphans, restore, take_over};
pub use settings::{Setting, configure};
pub use snapshot::{SessionSnapshot, snapshot};
pub use state::{ExecutionEvent, InvalidTransition, SessionEvent};
