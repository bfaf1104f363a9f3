//! The session and execution state machines: one transition table each, and the one helper per machine
//! that writes a transition (compare-and-set on the state read; for a session, its event in the same
//! transaction).
use crate::ids::ExecutionId;
use sea_orm::{ConnectionTrait, DatabaseTransaction, Iterable};
use serde_json::json;

use super::Ctx;
pub use crate::domain::transition::InvalidTransition;
use crate::entity::agent_execution::ExecutionState;
use crate::entity::task;
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::store::executions::{self as executions, ExecutionPatch};
use crate::store::sessions::{self as sessions, StatePatch};

/// What can happen to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// The environment of a session created `preparing` (`Prefer: respond-async`) is ready and attached.
    Prepared,
    /// A launch (or resume, or restart) recorded its execution.
    Launch,
    /// The process is up; `working` when a first prompt goes with it.
    Spawned { working: bool },
    /// The agent reported `agent_start`.
    AgentStart,
    /// The agent reported `agent_end` or `agent_settled`.
    AgentEnd,
    /// The agent asked a question (`extension_ui_request`).
    UiRequest,
    /// The last pending question was answered (or expired); `working` when the agent's turn goes on (an
    /// extension command asks outside any turn: then the session is idle again).
    Answered { working: bool },
    /// Stop requested; `live` when a process must be stopped first.
    Stop { live: bool },
    /// The stopped process is gone.
    Settled,
    /// The process of an open session died unasked (I30).
    Crashed,
    /// Startup found the session claiming a process from an earlier one (I29); `open`: `desired_open`.
    Restore { open: bool },
    /// A launch or the agent failed.
    Fail,
    /// Its task was archived.
    Archive,
}

/// What can happen to an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionEvent {
    Spawned,
    SpawnFailed,
    /// The process ended; `expected` when it was asked to.
    Exited {
        expected: bool,
    },
    /// Startup found it recorded by an earlier process generation.
    Orphaned,
}

impl SessionState {
    /// I4: a session in these states has a process being started, working, recovering or stopping.
    pub fn is_busy(self) -> bool {
        matches!(
            self,
            SessionState::Starting | SessionState::Running | SessionState::Recovering | SessionState::Stopping
        )
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            SessionState::Stopped | SessionState::Failed | SessionState::Cancelled
        )
    }

    /// The transition table: the state after `event`, or why there is none.
    pub fn on(self, event: SessionEvent) -> Result<SessionState, InvalidTransition<SessionState, SessionEvent>> {
        use SessionEvent as E;
        use SessionState as S;
        let claimed = matches!(
            self,
            S::Starting | S::Running | S::Idle | S::Attention | S::Recovering | S::Stopping
        );
        let next = match (self, event) {
            (S::Preparing, E::Prepared) => Some(S::Created),
            // I27: one process; a launch under way or a stop in progress is answered by the caller. A
            // preparing session has no environment to launch in yet.
            (S::Starting | S::Stopping | S::Preparing, E::Launch) => None,
            (_, E::Launch) => Some(S::Starting),
            (S::Starting, E::Spawned { working: true }) => Some(S::Running),
            (S::Starting, E::Spawned { working: false }) => Some(S::Idle),
            (S::Idle | S::Attention, E::AgentStart) => Some(S::Running),
            (S::Running | S::Attention, E::AgentEnd) => Some(S::Idle),
            (S::Running | S::Idle, E::UiRequest) => Some(S::Attention),
            (S::Attention, E::Answered { working: true }) => Some(S::Running),
            (S::Attention, E::Answered { working: false }) => Some(S::Idle),
            (S::Stopping, E::Stop { live: true }) => None,
            // I28: whatever it was, a live process is stopped with escalation.
            (_, E::Stop { live: true }) => Some(S::Stopping),
            (s, E::Stop { live: false }) if !s.is_terminal() => Some(S::Stopped),
            (S::Stopping, E::Settled) => Some(S::Stopped),
            (S::Starting | S::Running | S::Idle | S::Attention | S::Stopping, E::Crashed) => Some(S::Recovering),
            (S::Recovering, E::Restore { open: true }) => None,
            (_, E::Restore { open: true }) if claimed => Some(S::Recovering),
            (_, E::Restore { open: false }) if claimed => Some(S::Stopped),
            // A repeated failure replaces the last error; an archive's cancellation is final (a launch or
            // an agent failing after it never rewrites it).
            (S::Cancelled, E::Fail) => None,
            (_, E::Fail) => Some(S::Failed),
            (s, E::Archive) if !s.is_terminal() => Some(S::Cancelled),
            _ => None,
        };
        next.ok_or(InvalidTransition { from: self, event })
    }
}

impl ExecutionState {
    pub fn on(
        self,
        event: ExecutionEvent,
    ) -> Result<ExecutionState, InvalidTransition<ExecutionState, ExecutionEvent>> {
        use ExecutionEvent as E;
        use ExecutionState as S;
        let next = match (self, event) {
            (S::Starting, E::Spawned) => Some(S::Running),
            (S::Starting, E::SpawnFailed) => Some(S::Failed),
            (S::Starting | S::Running, E::Exited { expected: true }) => Some(S::Exited),
            (S::Starting | S::Running, E::Exited { expected: false }) => Some(S::Failed),
            (S::Starting | S::Running, E::Orphaned) => Some(S::Exited),
            _ => None,
        };
        next.ok_or(InvalidTransition { from: self, event })
    }
}

/// The one session state write: moves `current` (read in `txn`) on `event` with a compare-and-set on
/// the state and execution read, then appends `session.state_changed` in the same transaction.
/// `Ok(None)`: the row changed since it was read, and nothing was written.
pub(crate) async fn transition(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    task: &task::Model,
    current: &session::Model,
    event: SessionEvent,
    patch: StatePatch,
) -> Result<Option<SessionState>> {
    let next = current
        .state
        .on(event)
        .map_err(|e| Error::InvalidState(format!("the session's state does not allow this: {e}")))?;
    let moved = sessions::compare_and_set_state(
        txn,
        current.id,
        current.state,
        current.execution_id,
        next,
        &patch,
        crate::clock::now(),
    )
    .await?;
    if !moved {
        return Ok(None);
    }
    // A turn holds the environment's writer lease until it settled: one that ends in `idle` gives it
    // back after its end checkpoint (`turns::settled`); one that ends any other way (stopped, crashed,
    // failed, cancelled) gives it back here.
    if !matches!(
        next,
        SessionState::Running | SessionState::Attention | SessionState::Stopping | SessionState::Idle
    ) {
        crate::domain::writer::end_turn(txn, current.id).await?;
    }
    let subject = Subject {
        session_id: Some(current.id),
        task_environment_id: patch.task_environment_id.unwrap_or(current.task_environment_id),
        execution_id: patch.execution_id.unwrap_or(current.execution_id),
        ..Subject::task(task.workspace_id, task.id)
    };
    events::append(
        txn,
        ctx.instance_id,
        EventType::SessionStateChanged,
        subject,
        json!({ "state": next }),
    )
    .await?;
    Ok(Some(next))
}

/// The one execution state write: from any state the table allows `event` in. No event of its own: the
/// session's reports it.
pub(crate) async fn transition_execution<C: ConnectionTrait>(
    conn: &C,
    id: ExecutionId,
    event: ExecutionEvent,
    patch: ExecutionPatch,
) -> Result<bool> {
    let (from, next) = execution_moves(event);
    executions::compare_and_set_state(conn, id, &from, next, patch, crate::clock::now()).await
}

/// The states `event` applies in, and where it leads (the same from each: tested below).
fn execution_moves(event: ExecutionEvent) -> (Vec<ExecutionState>, ExecutionState) {
    let moves: Vec<(ExecutionState, ExecutionState)> = ExecutionState::iter()
        .filter_map(|s| s.on(event).ok().map(|n| (s, n)))
        .collect();
    let next = moves.first().map(|(_, n)| *n).unwrap_or(ExecutionState::Failed);
    (moves.into_iter().map(|(s, _)| s).collect(), next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecutionEvent as XE;
    use ExecutionState as X;
    use SessionEvent as E;
    use SessionState as S;

    const ALL_EVENTS: [SessionEvent; 17] = [
        E::Prepared,
        E::Launch,
        E::Spawned { working: true },
        E::Spawned { working: false },
        E::AgentStart,
        E::AgentEnd,
        E::UiRequest,
        E::Answered { working: true },
        E::Answered { working: false },
        E::Stop { live: true },
        E::Stop { live: false },
        E::Settled,
        E::Crashed,
        E::Restore { open: true },
        E::Restore { open: false },
        E::Fail,
        E::Archive,
    ];

    /// Every legal session transition, and nothing else.
    fn legal() -> Vec<(SessionState, SessionEvent, SessionState)> {
        let mut t = vec![(S::Preparing, E::Prepared, S::Created)];
        for from in [
            S::Created,
            S::Running,
            S::Idle,
            S::Attention,
            S::Recovering,
            S::Stopped,
            S::Failed,
            S::Cancelled,
        ] {
            t.push((from, E::Launch, S::Starting));
        }
        t.push((S::Starting, E::Spawned { working: true }, S::Running));
        t.push((S::Starting, E::Spawned { working: false }, S::Idle));
        t.push((S::Idle, E::AgentStart, S::Running));
        t.push((S::Attention, E::AgentStart, S::Running));
        t.push((S::Running, E::AgentEnd, S::Idle));
        t.push((S::Attention, E::AgentEnd, S::Idle));
        t.push((S::Running, E::UiRequest, S::Attention));
        t.push((S::Idle, E::UiRequest, S::Attention));
        t.push((S::Attention, E::Answered { working: true }, S::Running));
        t.push((S::Attention, E::Answered { working: false }, S::Idle));
        for from in S::iter().filter(|s| *s != S::Stopping) {
            t.push((from, E::Stop { live: true }, S::Stopping));
        }
        for from in [
            S::Preparing,
            S::Created,
            S::Starting,
            S::Running,
            S::Idle,
            S::Attention,
            S::Recovering,
            S::Stopping,
        ] {
            t.push((from, E::Stop { live: false }, S::Stopped));
        }
        t.push((S::Stopping, E::Settled, S::Stopped));
        for from in [S::Starting, S::Running, S::Idle, S::Attention, S::Stopping] {
            t.push((from, E::Crashed, S::Recovering));
            t.push((from, E::Restore { open: true }, S::Recovering));
        }
        for from in [
            S::Starting,
            S::Running,
            S::Idle,
            S::Attention,
            S::Recovering,
            S::Stopping,
        ] {
            t.push((from, E::Restore { open: false }, S::Stopped));
        }
        for from in S::iter().filter(|s| *s != S::Cancelled) {
            t.push((from, E::Fail, S::Failed));
        }
        for from in [
            S::Preparing,
            S::Created,
            S::Starting,
            S::Running,
            S::Idle,
            S::Attention,
            S::Recovering,
            S::Stopping,
        ] {
            t.push((from, E::Archive, S::Cancelled));
        }
        t
    }

    #[test]
    fn every_legal_session_transition_leads_where_the_table_says() {
        for (from, event, to) in legal() {
            assert_eq!(from.on(event), Ok(to), "{from:?} on {event:?}");
        }
    }

    #[test]
    fn every_other_session_transition_is_refused() {
        let legal = legal();
        for from in S::iter() {
            for event in ALL_EVENTS {
                if legal.iter().any(|(f, e, _)| *f == from && *e == event) {
                    continue;
                }
                assert_eq!(
                    from.on(event),
                    Err(InvalidTransition { from, event }),
                    "{from:?} on {event:?} must be refused"
                );
            }
        }
    }

    #[test]
    fn sample_of_refused_session_transitions() {
        // I27: a second launch while one is under way.
        assert!(S::Starting.on(E::Launch).is_err());
        assert!(S::Stopping.on(E::Launch).is_err());
        // Only a starting session is spawned.
        assert!(S::Idle.on(E::Spawned { working: false }).is_err());
        // An answer with no pending question.
        assert!(S::Running.on(E::Answered { working: true }).is_err());
        // A stopped session has nothing to settle, crash or cancel.
        assert!(S::Stopped.on(E::Settled).is_err());
        assert!(S::Stopped.on(E::Crashed).is_err());
        assert!(S::Cancelled.on(E::Archive).is_err());
        // A cancelled session is never failed after the archive.
        assert!(S::Cancelled.on(E::Fail).is_err());
        // Reports of a finished agent do not revive a session.
        assert!(S::Stopped.on(E::AgentStart).is_err());
        assert!(S::Failed.on(E::AgentEnd).is_err());
        // A session that claims no process is not restored.
        assert!(S::Created.on(E::Restore { open: true }).is_err());
        assert!(S::Stopped.on(E::Restore { open: false }).is_err());
    }

    #[test]
    fn busy_and_terminal_states() {
        let busy: Vec<_> = S::iter().filter(|s| s.is_busy()).collect();
        assert_eq!(busy, [S::Starting, S::Running, S::Recovering, S::Stopping]);
        let terminal: Vec<_> = S::iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [S::Stopped, S::Failed, S::Cancelled]);
    }

    #[test]
    fn execution_transitions() {
        let legal = [
            (X::Starting, XE::Spawned, X::Running),
            (X::Starting, XE::SpawnFailed, X::Failed),
            (X::Starting, XE::Exited { expected: true }, X::Exited),
            (X::Running, XE::Exited { expected: true }, X::Exited),
            (X::Starting, XE::Exited { expected: false }, X::Failed),
            (X::Running, XE::Exited { expected: false }, X::Failed),
            (X::Starting, XE::Orphaned, X::Exited),
            (X::Running, XE::Orphaned, X::Exited),
        ];
        let events = [
            XE::Spawned,
            XE::SpawnFailed,
            XE::Exited { expected: true },
            XE::Exited { expected: false },
            XE::Orphaned,
        ];
        for from in X::iter() {
            for event in events {
                match legal.iter().find(|(f, e, _)| *f == from && *e == event) {
                    Some((_, _, to)) => assert_eq!(from.on(event), Ok(*to), "{from:?} on {event:?}"),
                    None => assert_eq!(from.on(event), Err(InvalidTransition { from, event })),
                }
            }
        }
        // The helper's compare-and-set: every event leads to one state from wherever it applies.
        for event in events {
            let (from, next) = execution_moves(event);
            assert!(!from.is_empty(), "{event:?}");
            assert!(from.iter().all(|s| s.on(event) == Ok(next)), "{event:?}");
        }
        // A finished execution does not start running again.
        assert!(X::Exited.on(XE::Spawned).is_err());
        assert!(X::Failed.on(XE::Exited { expected: true }).is_err());
    }
}
