//! Launching (or resuming) a session's agent through admission (I15-I17), in named steps: resolve the
//! profile, admit the workspace, record the durable handle, spawn, record it running.

use crate::ids::{ExecutionId, SessionId};

use super::access::{SessionView, project, reload, reload_locked, visible};
use super::conversation;
use super::inbox;
use super::state::{ExecutionEvent, SessionEvent, transition, transition_execution};
use super::{Ctx, environments};
use crate::auth::Principal;
use crate::config::AgentProfile;
use crate::entity::agent_execution::{self as execution, ExecutionState};
use crate::entity::task;
use crate::entity::task_environment::{EnvironmentStatus, ExecutorType};
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result, ReuseCategory};
use crate::executor::admission::{AdmittedWorkspace, Refusal};
use crate::runtime::SpawnError;
use crate::store::environments as env_store;
use crate::store::executions::ExecutionPatch;
use crate::store::sessions::StatePatch;
use crate::store::tasks::{self as task_store, ensure_not_archived_or_cleaning, lock_task, owner_of};

/// Launches (or resumes) a session's agent. A session with a live agent is returned as it is (I27).
pub async fn launch(ctx: &Ctx, p: &Principal, session_id: SessionId, prompt: Option<String>) -> Result<SessionView> {
    let s = visible(&ctx.db.conn, p, session_id).await?;
    launch_session(ctx, s, prompt).await
}

pub(crate) async fn launch_session(ctx: &Ctx, s: session::Model, prompt: Option<String>) -> Result<SessionView> {
    if s.state == SessionState::Preparing {
        // Its environment is still being made; the preparation launches it when it was created to start.
        return Err(Error::WorkspacePreparing);
    }
    let prompt = prompt.filter(|t| !t.trim().is_empty());
    // I27 across replicas: an agent another node runs is returned as it is too (the prompt reaches it
    // through the inbox); a launch racing that node's is refused by the database (`record_handle`). One
    // whose node is down is refused at once (`503 node_unavailable`), its prompt not queued.
    if ctx.runtime.is_live(s.id) || super::routing::runs_reachably_elsewhere(ctx, &s).await? {
        if let Some(text) = prompt {
            let task = task_store::find(&ctx.db.conn, s.task_id)
                .await?
                .ok_or(Error::NotFound("session"))?;
            inbox::enqueue(ctx, &task, &s, &text, Default::default()).await?;
            inbox::wake(ctx, s.id);
        }
        return project(ctx, reload(&ctx.db.conn, s.id).await?).await;
    }
    let (profile_name, profile) = resolve_profile(ctx, &s)?;
    let task = task_store::find(&ctx.db.conn, s.task_id)
        .await?
        .ok_or(Error::NotFound("session"))?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    // Seed 002: a relaunch continues the exact conversation it recorded, or does not start at all.
    if let Some(category) = conversation::check(ctx, &profile, &s).await? {
        let message = format!("the session's agent conversation is unavailable: {category:?}").to_lowercase();
        record_failure(
            ctx,
            &task,
            s.id,
            Seen::exactly(&s),
            "agent_session_unavailable",
            &message,
        )
        .await?;
        return Err(Error::AgentSessionUnavailable(category));
    }
    let profile = conversation::launch_profile(ctx, &profile, s.id)?;
    let owner = owner_of(&ctx.db.conn, &task).await?;

    // Admission: read-only, before anything changes or any process exists.
    let (admitted, transition) = match admit_for_launch(ctx, &task, &owner, s.executor_type).await? {
        Ok(admitted) => admitted,
        Err(category) => {
            let message = format!("workspace admission refused: {category:?}");
            record_failure(ctx, &task, s.id, Seen::exactly(&s), "workspace_reuse_unsafe", &message).await?;
            return Err(Error::WorkspaceReuseUnsafe(category));
        }
    };
    let launch = Launch {
        ctx,
        task: &task,
        owner: &owner,
        session_id: s.id,
        execution_id: ExecutionId::now_v7(),
        admitted,
        transition,
    };

    match launch.record_handle().await {
        Ok(None) => {}
        Ok(Some(current)) => {
            launch.abandon("another launch of the session is under way").await;
            return project(ctx, current).await;
        }
        Err(e) => {
            launch.abandon("the launch could not be recorded").await;
            return Err(e);
        }
    }
    let kept = conversation::kept_in_file(ctx, &profile, s.id);
    let pid = match ctx
        .runtime
        .spawn(&launch.admitted, &profile, s.id, launch.execution_id, kept.as_deref())
    {
        Ok(pid) => pid,
        Err(SpawnError::AlreadyRunning) => {
            return project(ctx, reload(&ctx.db.conn, s.id).await?).await;
        }
        Err(e @ (SpawnError::Spawn(_) | SpawnError::Box(_))) => {
            tracing::warn!(session = %s.id, profile = %profile_name, error = %e, "agent did not start");
            launch.abandon("the agent did not start").await;
            transition_execution(
                &ctx.db.conn,
                launch.execution_id,
                ExecutionEvent::SpawnFailed,
                ExecutionPatch {
                    ended_at: Some(crate::clock::now()),
                    ..Default::default()
                },
            )
            .await?;
            record_failure(
                ctx,
                &task,
                s.id,
                launch.seen_starting(),
                "agent_start_failed",
                &format!("could not start the command of agent profile {profile_name}"),
            )
            .await?;
            return Err(Error::AgentStartFailed);
        }
    };
    // Where the agent keeps the conversation (ACP): it opens it now, in the admitted worktree, or the
    // launch fails with why (a recorded conversation is never replaced by a new one).
    let cwd = launch.workspace_path();
    if let Err(failure) = conversation::open(ctx, &s, &profile, &cwd).await {
        ctx.runtime.stop(s.id).await;
        launch.abandon("the agent did not open its conversation").await;
        let (code, message, error) = match failure {
            conversation::OpenFailure::Unavailable(category, message) => (
                "agent_session_unavailable",
                message,
                Error::AgentSessionUnavailable(category),
            ),
            conversation::OpenFailure::AuthRequired(message) => (
                "agent_auth_required",
                message.clone(),
                Error::AgentAuthRequired(message),
            ),
            conversation::OpenFailure::Failed(message) => ("agent_start_failed", message, Error::AgentStartFailed),
        };
        tracing::warn!(session = %s.id, profile = %profile_name, %message, "agent did not open its conversation");
        // Unless something else (an archive's cancellation, an exit report) moved the session on meanwhile.
        let seen = Seen::on_execution(Some(launch.execution_id));
        record_failure(ctx, &task, s.id, seen, code, &message).await?;
        return Err(error);
    }
    if let Err(e) = launch.record_running(pid, prompt.is_some()).await {
        // A process whose launch cannot be recorded must not run unrecorded (I26, I27): end it, give up a
        // transition's candidate, and say so on the session unless something else moved it on.
        ctx.runtime.stop(s.id).await;
        launch.abandon("the launch could not be recorded").await;
        launch.give_up(&e).await;
        return Err(e);
    }
    if let Some(text) = prompt {
        let current = reload(&ctx.db.conn, s.id).await?;
        inbox::enqueue(ctx, &task, &current, &text, Default::default()).await?;
    }
    // Whatever waited for the agent (the prompt, messages posted while it was recovering) goes now.
    inbox::wake(ctx, s.id);
    if crate::agent::asks_state(profile.protocol) {
        let ctx = ctx.clone();
        crate::actor::spawn(async move {
            if let Err(e) = conversation::learn(&ctx, s.id, true).await {
                tracing::warn!(session = %s.id, error = %e, "could not learn the agent's state");
            }
        });
    }
    project(ctx, reload(&ctx.db.conn, s.id).await?).await
}

/// The session's agent profile, from the config file only.
fn resolve_profile(ctx: &Ctx, s: &session::Model) -> Result<(String, AgentProfile)> {
    let name = s
        .agent_profile
        .clone()
        .ok_or_else(|| Error::invalid("agent_profile", "the session has no agent profile to launch"))?;
    let profile = ctx
        .config
        .agents
        .get(&name)
        .cloned()
        .ok_or_else(|| Error::invalid("agent_profile", "the session's agent profile is no longer configured"))?;
    Ok((name, profile))
}

/// A fresh environment for another executor than the current one's (I18), and what was made for it.
type Transition = environments::Candidate;

/// Admits the current environment; for another executor, a fresh transition candidate beside it.
async fn admit_for_launch(
    ctx: &Ctx,
    task: &task::Model,
    owner: &task::Model,
    requested: ExecutorType,
) -> Result<std::result::Result<(AdmittedWorkspace, Option<Transition>), ReuseCategory>> {
    let current = match environments::current(&ctx.db.conn, owner.id).await? {
        // A broken environment is proven again at every launch; a reset replaces it.
        Some(e)
            if matches!(
                e.status,
                EnvironmentStatus::Ready | EnvironmentStatus::Stopped | EnvironmentStatus::Broken
            ) =>
        {
            e
        }
        // After a reset or an archive cleanup (or a failed or abandoned attempt) an old session gets a
        // fresh environment through the normal election (I14): materialized here, or
        // `409 workspace_preparing` while another request materializes it.
        _ => environments::ensure_ready(ctx, task, requested).await?,
    };
    match environments::admit(ctx, owner, &current, requested, false).await? {
        Ok(ws) => {
            if current.status == EnvironmentStatus::Broken {
                // Mended (a drive back, a worktree restored): admission proved it, so it is ready again.
                environments::mark_recovered(ctx, owner, current.id).await?;
            }
            Ok(Ok((ws, None)))
        }
        // I18: another executor than the environment's: a fresh environment for it, beside the current one.
        Err(Refusal::ExecutorMismatch) => {
            let candidate = environments::prepare_transition(ctx, task, requested).await?;
            match environments::admit(ctx, owner, &candidate.env, requested, true).await? {
                Ok(ws) => Ok(Ok((ws, Some(candidate)))),
                Err(refusal) => {
                    environments::abandon_transition(
                        ctx,
                        task,
                        &candidate.env,
                        &candidate.made,
                        "admission refused the new environment",
                    )
                    .await;
                    Ok(Err(refusal.into()))
                }
            }
        }
        Err(refusal) => {
            // The current environment is unsafe to work in; it says so until a reset.
            let category = ReuseCategory::from(refusal);
            environments::mark_broken(ctx, task.id, owner, current.id, category).await?;
            Ok(Err(category))
        }
    }
}

/// A launch past admission.
struct Launch<'a> {
    ctx: &'a Ctx,
    task: &'a task::Model,
    owner: &'a task::Model,
    session_id: SessionId,
    execution_id: ExecutionId,
    admitted: AdmittedWorkspace,
    transition: Option<Transition>,
}

impl Launch<'_> {
    /// Gives up a transition candidate, if the launch made one.
    async fn abandon(&self, why: &str) {
        if let Some(c) = &self.transition {
            environments::abandon_transition(self.ctx, self.task, &c.env, &c.made, why).await;
        }
    }

    /// The launch was not recorded running (its process is stopped): the session says why, unless
    /// something else (an archive's cancellation, an exit report) moved it on meanwhile.
    async fn give_up(&self, e: &Error) {
        let ctx = self.ctx;
        let message = format!("the launch could not be recorded: {e}");
        let seen = self.seen_starting();
        if let Err(e) = record_failure(ctx, self.task, self.session_id, seen, "agent_start_failed", &message).await {
            tracing::warn!(session = %self.session_id, error = %e, "could not record a launch given up");
        }
    }

    /// The session as this launch left it: starting, on its execution.
    fn seen_starting(&self) -> Seen {
        Seen {
            state: Some(SessionState::Starting),
            execution_id: Some(self.execution_id),
        }
    }

    fn workspace_path(&self) -> String {
        self.admitted.path().to_string_lossy().into_owned()
    }

    /// The durable handle first: a crash after this leaves a record to reap (agent_executions).
    /// `Some(session)`: another launch is under way, answer with it.
    async fn record_handle(&self) -> Result<Option<session::Model>> {
        let (ctx, task, owner) = (self.ctx, self.task, self.owner);
        let now = crate::clock::now();
        let txn = ctx.db.begin_write().await?;
        if owner.id != task.id {
            lock_task(&txn, owner.id).await?;
        }
        lock_task(&txn, task.id).await?;
        ensure_not_archived_or_cleaning(&txn, &[task.id, owner.id]).await?;
        let current = reload_locked(&txn, self.session_id).await?;
        match current.state {
            // Another launch is under way (I27: one process): answer with it.
            SessionState::Starting => return Ok(Some(current)),
            SessionState::Stopping => return Err(Error::SessionBusy),
            _ => {}
        }
        // The admitted environment must still be the one to run in, now that the task is locked.
        let still = env_store::find(&txn, self.admitted.environment_id()).await?;
        let valid = match (&still, &self.transition) {
            (Some(e), None) => matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped),
            (Some(e), Some(c)) => e.status == EnvironmentStatus::Creating && e.materializer_id == c.env.materializer_id,
            (None, _) => false,
        };
        if !valid {
            return Err(Error::Stale(
                "the task's environment changed while the launch was admitted; retry".into(),
            ));
        }
        crate::store::executions::insert(
            &txn,
            execution::Model {
                id: self.execution_id,
                session_id: self.session_id,
                task_environment_id: Some(self.admitted.environment_id()),
                instance_id: ctx.instance_id,
                node_id: ctx.config.node_id.clone(),
                pid: None,
                state: ExecutionState::Starting,
                workspace_path: self.workspace_path(),
                exit_code: None,
                started_at: now,
                ended_at: None,
                updated_at: now,
            },
        )
        .await?;
        let patch = StatePatch {
            desired_open: Some(true),
            execution_id: Some(Some(self.execution_id)),
            task_environment_id: Some(Some(self.admitted.environment_id())),
            last_error: Some(None),
            last_activity_at: Some(now),
            ..Default::default()
        };
        if transition(&txn, ctx, task, &current, SessionEvent::Launch, patch)
            .await?
            .is_none()
        {
            return Err(Error::Stale("the session changed meanwhile; retry".into()));
        }
        // A started session moves its task on the board where the workspace says so.
        crate::domain::columns::on_session_started(&txn, ctx, task).await?;
        ctx.commit(txn).await?;
        Ok(None)
    }

    /// The process is up: the execution runs, a transition's environment becomes current, and the session
    /// runs.
    async fn record_running(&self, pid: u32, working: bool) -> Result<()> {
        let ctx = self.ctx;
        let txn = ctx.db.begin_write().await?;
        if self.transition.is_some() {
            // Promotion supersedes environments: serialize with other launches and session creation.
            lock_task(&txn, self.owner.id).await?;
        }
        // I7, I8: an archive, delete or reset that began (or even finished) after the handle was recorded
        // owns the task now,
        // and its stop may have come before the spawn: this agent must not run, nor its environment become
        // current. (Its barrier commits before it stops agents, and the spawn came before this read: either
        // this sees the job, or the stop sees the agent.)
        ensure_not_archived_or_cleaning(&txn, &[self.task.id, self.owner.id]).await?;
        // The session row before anything appends an event (promotion does): the order every session
        // writer takes, so this cannot deadlock with an agent report.
        let current = reload_locked(&txn, self.session_id).await?;
        transition_execution(
            &txn,
            self.execution_id,
            ExecutionEvent::Spawned,
            ExecutionPatch {
                pid: Some(pid as i32),
                ..Default::default()
            },
        )
        .await?;
        if let Some(environments::Candidate { env: candidate, .. }) = &self.transition {
            // I18: only now, with the agent running in it, does the new environment become current.
            environments::promote_transition(&txn, ctx, self.task, candidate.id, candidate.materializer_id).await?;
        }
        // I19: a successful launch writes the effective workspace back (healing an earlier wrong value).
        env_store::heal_workspace_path(&txn, self.admitted.environment_id(), &self.workspace_path()).await?;
        // Only if nothing (an exit already reported) moved the session on meanwhile.
        if current.execution_id == Some(self.execution_id) && current.state == SessionState::Starting {
            let patch = StatePatch {
                started_at: Some(crate::clock::now()),
                ..Default::default()
            };
            transition(&txn, ctx, self.task, &current, SessionEvent::Spawned { working }, patch).await?;
        }
        ctx.commit(txn).await
    }
}

/// A session whose node was decommissioned is failed with `node_lost`.
pub(crate) async fn fail_node_lost(ctx: &Ctx, session_id: SessionId, node_id: &str) -> Result<()> {
    let Some(s) = crate::store::sessions::find(&ctx.db.conn, session_id).await? else {
        return Ok(());
    };
    if s.state.is_terminal() {
        return Ok(());
    }
    let Some(task) = task_store::find(&ctx.db.conn, s.task_id).await? else {
        return Ok(());
    };
    let message = format!("node {node_id}, which held its workspace and ran its agent, was decommissioned");
    record_failure(
        ctx,
        &task,
        session_id,
        Seen::on_execution(s.execution_id),
        "node_lost",
        &message,
    )
    .await?;
    Ok(())
}

/// What a failing party read of the session: its failure is recorded only while the session is still so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// `None`: any state that is not over (an agent's end applies to its execution whatever it was doing).
    pub state: Option<SessionState>,
    pub execution_id: Option<ExecutionId>,
}

impl Seen {
    /// Exactly as read.
    pub fn exactly(s: &session::Model) -> Seen {
        Seen {
            state: Some(s.state),
            execution_id: s.execution_id,
        }
    }

    /// Still on this execution and not over.
    pub fn on_execution(execution_id: Option<ExecutionId>) -> Seen {
        Seen {
            state: None,
            execution_id,
        }
    }

    fn holds(&self, current: &session::Model) -> bool {
        current.execution_id == self.execution_id
            && match self.state {
                Some(state) => current.state == state,
                None => !current.state.is_terminal(),
            }
    }
}

/// A launch or an agent failed: the session is `failed` with `last_error`; nothing else changes. A
/// compare-and-set on what the caller `seen` (state and execution), under the row lock: a session that
/// moved on meanwhile (an archive cancelled it, another launch or an exit report came first) is left as
/// it is, with no event. `Ok(false)`: nothing was recorded.
pub async fn record_failure(
    ctx: &Ctx,
    task: &task::Model,
    session_id: SessionId,
    seen: Seen,
    code: &str,
    message: &str,
) -> Result<bool> {
    let txn = ctx.db.begin_write().await?;
    let current = reload_locked(&txn, session_id).await?;
    if !seen.holds(&current) || current.state.on(SessionEvent::Fail).is_err() {
        txn.rollback().await?;
        return Ok(false);
    }
    // A launch that failed leaves nothing to keep open: only a resume asks for it again. (An archive whose
    // prepared job made the launch fail skips a session that is over already, so this is the one place
    // that clears the wish the launch recorded.)
    let patch = StatePatch {
        desired_open: Some(false),
        last_error: Some(Some((code.to_string(), message.to_string()))),
        ended_at: Some(crate::clock::now()),
        ..Default::default()
    };
    if transition(&txn, ctx, task, &current, SessionEvent::Fail, patch)
        .await?
        .is_none()
    {
        txn.rollback().await?;
        return Ok(false);
    }
    ctx.commit(txn).await?;
    // A failed session's agent will not take what was waiting: cancelled, visibly.
    inbox::cancel_queued(ctx, task, &current, "the session failed").await?;
    Ok(true)
}
