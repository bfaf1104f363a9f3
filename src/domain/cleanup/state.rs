//! The cleanup job's state machine: one transition table (`CleanupJobState::on`) and one helper
//! (`transition`) that performs a transition, a compare-and-set on the current state then its
//! `cleanup_job.updated` event, in the caller's transaction. Every job state write goes through it; every
//! new job enters the machine through `create`.
use sea_orm::{ActiveEnum, DatabaseTransaction, Iterable};
use serde_json::json;

use super::Snapshot;
use crate::domain::Ctx;
use crate::entity::cleanup_job::{self as job, CleanupJobState, CleanupTrigger};
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::ids::{CleanupJobId, EnvironmentId, OperationId};
use crate::store::cleanup_jobs::{self as store, JobPatch, LeaseGuard};

/// What happens to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEvent {
    /// Its mutation committed (in the mutation's transaction, or found so by reconciliation, I6).
    Activate,
    /// Its mutation did not commit (it failed, or reconciliation found it never did, I6).
    Abandon,
    /// A worker claims it when due, or rescues it from a worker whose lease expired.
    Claim,
    /// A worker claims it and finds nothing physical to do: done in the claim's transaction.
    ClaimNothingToDo,
    /// The worker's attempt destroyed what the snapshot names.
    Succeed,
    /// The attempt failed in a way another attempt may fix.
    RetryLater,
    /// Retrying cannot help, or the attempts are spent.
    Fail,
    /// The attempt found its reason gone (the task was unarchived) and touched nothing.
    ReasonGone,
    /// The task was unarchived (I10): a job not running is cancelled, a failed one included.
    Unarchive,
    /// An operator gives a failed job a fresh attempt budget.
    OperatorRetry,
    /// An operator cancels a job that is waiting.
    OperatorCancel,
    /// An operator cancels a job whose node is down while it ran there (its worker is gone with the
    /// node; nothing runs it until the node is back).
    OperatorCancelStranded,
    /// The job's node was decommissioned: nothing will ever run it there.
    NodeDecommissioned,
    /// A lifecycle job for the task takes over a waiting `superseded_cleanup` job: its snapshot names the
    /// same superseded environments (background cleanup never blocks a user).
    Subsumed,
}

/// `event` does not apply in a job's state.
pub type InvalidTransition = crate::domain::transition::InvalidTransition<CleanupJobState, JobEvent>;

impl CleanupJobState {
    /// The transition table.
    pub fn on(self, event: JobEvent) -> Result<CleanupJobState, InvalidTransition> {
        use CleanupJobState::*;
        use JobEvent::*;
        match (self, event) {
            (Prepared, Activate) => Ok(Pending),
            (Prepared, Abandon) => Ok(Cancelled),
            (Pending | RetryWait | Running, Claim) => Ok(Running),
            (Pending | RetryWait | Running, ClaimNothingToDo) => Ok(Succeeded),
            (Running, Succeed) => Ok(Succeeded),
            (Running, RetryLater) => Ok(RetryWait),
            (Running, Fail) => Ok(Failed),
            (Running, ReasonGone) => Ok(Cancelled),
            (Prepared | Pending | RetryWait | Failed, Unarchive) => Ok(Cancelled),
            (Failed, OperatorRetry) => Ok(Pending),
            (Prepared | Pending | RetryWait, OperatorCancel) => Ok(Cancelled),
            (Running, OperatorCancelStranded) => Ok(Cancelled),
            (Prepared | Pending | Running | RetryWait, NodeDecommissioned) => Ok(Cancelled),
            (Pending | RetryWait, Subsumed) => Ok(Cancelled),
            (from, event) => Err(InvalidTransition { from, event }),
        }
    }
}

impl JobEvent {
    /// The states this event applies in.
    pub fn sources(self) -> Vec<CleanupJobState> {
        CleanupJobState::iter().filter(|s| s.on(self).is_ok()).collect()
    }
}

impl From<InvalidTransition> for Error {
    fn from(e: InvalidTransition) -> Self {
        let needs: Vec<String> = e.event.sources().iter().map(|s| s.to_value()).collect();
        Error::InvalidState(format!(
            "the job is {}; this needs {}",
            e.from.to_value(),
            needs.join(" or ")
        ))
    }
}

/// Performs `event` on the job as `j` read it: the state table says where it goes, and the store's
/// compare-and-set (`UPDATE .. WHERE id = ? AND state = j.state [AND lease_owner = ? AND attempts = ?]`)
/// writes it with the job's event in the same transaction. `Ok(None)`: the row had moved on (nothing written); the caller decides.
pub(crate) async fn transition(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    j: &job::Model,
    event: JobEvent,
    lease: Option<LeaseGuard<'_>>,
    patch: JobPatch,
) -> Result<Option<job::Model>> {
    let next = j.state.on(event)?;
    let now = crate::clock::now();
    let mut updated = job::Model {
        state: next,
        updated_at: now,
        ..j.clone()
    };
    patch.apply(&mut updated);
    let m = store::Move {
        id: j.id,
        from: j.state,
        to: next,
        lease,
        patch: &patch,
        now,
    };
    if !store::compare_and_set(txn, m, ctx.instance_id, job_event_parts(&updated)).await? {
        return Ok(None);
    }
    ctx.metrics.cleanup_job_moved(Some(j.state), next);
    Ok(Some(updated))
}

/// Inserts a new job in `prepared` for what `snapshot` names, on `node_id` (where it is carried out),
/// with its event, in the caller's transaction (I6: the snapshot is taken before the mutation).
pub(super) async fn create(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    snapshot: &Snapshot,
    trigger: CleanupTrigger,
    environment: Option<EnvironmentId>,
    node_id: String,
) -> Result<job::Model> {
    let now = crate::clock::now();
    let actor = crate::actor::current();
    let model = job::Model {
        id: CleanupJobId::now_v7(),
        operation_id: OperationId::now_v7(),
        task_id: snapshot.task_id,
        workspace_id: snapshot.workspace_id,
        task_environment_id: environment,
        trigger,
        state: CleanupJobState::Prepared,
        attempts: 0,
        max_attempts: ctx.config.cleanup_max_attempts as i32,
        next_attempt_at: None,
        last_error: None,
        resource_snapshot: serde_json::to_value(snapshot).map_err(|e| Error::Internal(e.into()))?,
        node_id,
        lease_owner: None,
        lease_expires_at: None,
        created_at: now,
        updated_at: now,
        completed_at: None,
        actor_sub: actor.as_ref().map(|a| a.sub.clone()),
        actor_session_id: actor.and_then(|a| a.session_id),
    };
    store::insert(txn, &model).await?;
    ctx.metrics.cleanup_job_moved(None, model.state);
    job_event(txn, ctx, &model).await?;
    Ok(model)
}

/// `cleanup_job.updated`: a job was written (inserted, or moved by `transition`).
pub(super) async fn job_event(txn: &DatabaseTransaction, ctx: &Ctx, j: &job::Model) -> Result<()> {
    let (event_type, subject, data) = job_event_parts(j);
    events::append(txn, ctx.instance_id, event_type, subject, data).await?;
    Ok(())
}

fn job_event_parts(j: &job::Model) -> (EventType, Subject, serde_json::Value) {
    let subject = Subject {
        task_environment_id: j.task_environment_id,
        ..Subject::task(j.workspace_id, j.task_id)
    };
    let data = json!({ "cleanup_job_id": j.id, "state": j.state, "trigger": j.trigger });
    (EventType::CleanupJobUpdated, subject, data)
}

#[cfg(test)]
mod tests {
    use super::JobEvent::{self, *};
    use crate::entity::cleanup_job::CleanupJobState::{self, *};
    use sea_orm::Iterable;

    const EVENTS: [JobEvent; 12] = [
        Activate,
        Abandon,
        Claim,
        ClaimNothingToDo,
        Succeed,
        RetryLater,
        Fail,
        ReasonGone,
        Unarchive,
        OperatorRetry,
        OperatorCancel,
        Subsumed,
    ];

    /// Every legal transition, line by line.
    const LEGAL: [(CleanupJobState, JobEvent, CleanupJobState); 22] = [
        // The barrier (I6).
        (Prepared, Activate, Pending),
        (Prepared, Abandon, Cancelled),
        (Prepared, Unarchive, Cancelled),
        (Prepared, OperatorCancel, Cancelled),
        // Waiting for a worker.
        (Pending, Claim, Running),
        (Pending, ClaimNothingToDo, Succeeded),
        (Pending, Unarchive, Cancelled),
        (Pending, OperatorCancel, Cancelled),
        (RetryWait, Claim, Running),
        (RetryWait, ClaimNothingToDo, Succeeded),
        (RetryWait, Unarchive, Cancelled),
        (RetryWait, OperatorCancel, Cancelled),
        // A lifecycle job takes over a waiting superseded cleanup.
        (Pending, Subsumed, Cancelled),
        (RetryWait, Subsumed, Cancelled),
        // A worker's attempt, and the rescue of an expired lease.
        (Running, Claim, Running),
        (Running, ClaimNothingToDo, Succeeded),
        (Running, Succeed, Succeeded),
        (Running, RetryLater, RetryWait),
        (Running, Fail, Failed),
        (Running, ReasonGone, Cancelled),
        // Failed: an operator retries it, or unarchive cancels it (I10).
        (Failed, OperatorRetry, Pending),
        (Failed, Unarchive, Cancelled),
    ];

    #[test]
    fn every_legal_transition_lands_where_the_table_says() {
        for (from, event, to) in LEGAL {
            assert_eq!(from.on(event), Ok(to), "{from:?} on {event:?}");
        }
    }

    #[test]
    fn the_refusals_that_protect_work() {
        // A running attempt finishes; neither an operator nor unarchive cuts it off (I10 waits for it).
        assert!(Running.on(OperatorCancel).is_err());
        assert!(Running.on(Unarchive).is_err());
        // A prepared job runs nothing before its mutation committed (I6).
        assert!(Prepared.on(Claim).is_err());
        assert!(Prepared.on(ClaimNothingToDo).is_err());
        // Only a failed job is retried; finished jobs stay finished.
        assert!(Pending.on(OperatorRetry).is_err());
        for done in [Succeeded, Cancelled] {
            for event in EVENTS {
                assert!(done.on(event).is_err(), "{done:?} on {event:?}");
            }
        }
        assert!(Failed.on(Claim).is_err());
        assert!(Pending.on(Activate).is_err());
    }

    #[test]
    fn a_refusal_names_the_states_the_event_needs() {
        let e: crate::error::Error = Running.on(OperatorCancel).unwrap_err().into();
        assert_eq!(
            e.to_string(),
            "invalid state: the job is running; this needs prepared or pending or retry_wait"
        );
    }

    #[test]
    fn everything_else_is_refused() {
        for from in CleanupJobState::iter() {
            for event in EVENTS {
                if LEGAL.iter().any(|(f, e, _)| *f == from && *e == event) {
                    continue;
                }
                assert_eq!(
                    from.on(event),
                    Err(super::InvalidTransition { from, event }),
                    "{from:?} on {event:?}"
                );
            }
        }
    }
}
