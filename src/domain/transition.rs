//! What every state machine here refuses with: an event that does not apply in the current state.

/// `event` does not apply in state `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no transition from {from:?} on {event:?}")]
pub struct InvalidTransition<S: std::fmt::Debug, E: std::fmt::Debug> {
    pub from: S,
    pub event: E,
}
