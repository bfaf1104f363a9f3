//! Agents on sessions: launch and resume through admission (I15-I17), messages, stop (I28), restore
//! after a restart, and what the runtime's reports mean for a session's state.
use std::path::PathBuf;

use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::json;
use uuid::Uuid;

use super::Ctx;
use super::environments;
use super::sessions::{self, SessionView};
use crate::auth::Principal;
use crate::entity::agent_execution as execution;
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::entity::task_environment_repo::{self as env_repo, EnvironmentRepoStatus};
use crate::entity::task_session::{self as session, SessionState};
use crate::entity::{session_message, task};
use crate::error::{Error, Result, ReuseCategory};
use crate::events::{self, Subject};
use crate::executor::admission::{self, AdmittedWorkspace, Candidate, Refusal};
use crate::runtime::{RuntimeEvent, SpawnError};
use crate::store::tasks::{ensure_no_cleanup, lock_task, owner_of};

impl From<Refusal> for ReuseCategory {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::ExecutorMismatch => ReuseCategory::ExecutorMismatch,
            Refusal::InventoryIncomplete => ReuseCategory::InventoryIncomplete,
            Refusal::InventoryAmbiguous => ReuseCategory::InventoryAmbiguous,
            Refusal::WorkspaceMissing => ReuseCategory::WorkspaceMissing,
            Refusal::NotAGitWorktree => ReuseCategory::NotAGitWorktree,
            Refusal::RepositoryMismatch => ReuseCategory::RepositoryMismatch,
            Refusal::EnvironmentNotReady => ReuseCategory::EnvironmentNotReady,
        }
    }
}

/// Launches (or resumes) a session's agent. A session with a live agent is returned as it is (I27).
pub async fn launch(ctx: &Ctx, p: &Principal, session_id: Uuid, prompt: Option<String>) -> Result<SessionView> {
    let s = sessions::visible(&ctx.db.conn, p, session_id).await?;
    launch_session(ctx, s, prompt).await
}

pub(crate) async fn launch_session(ctx: &Ctx, s: session::Model, prompt: Option<String>) -> Result<SessionView> {
    let prompt = prompt.filter(|t| !t.trim().is_empty());
    if ctx.runtime.is_live(s.id) {
        if let Some(text) = prompt {
            deliver(ctx, s.id, &text).await?;
        }
        return sessions::project(&ctx.db.conn, reload(ctx, s.id).await?).await;
    }
    let profile_name = s
        .agent_profile
        .clone()
        .ok_or_else(|| Error::invalid("agent_profile", "the session has no agent profile to launch"))?;
    let profile = ctx
        .config
        .agents
        .get(&profile_name)
        .cloned()
        .ok_or_else(|| Error::invalid("agent_profile", "the session's agent profile is no longer configured"))?;
    let task = task::Entity::find_by_id(s.task_id)
        .one(&ctx.db.conn)
        .await?
        .ok_or(Error::NotFound("session"))?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let owner = owner_of(&ctx.db.conn, &task).await?;

    // Admission: read-only, before anything changes or any process exists.
    let (task_ref, s_ref) = (&task, &s);
    let refused = |refusal: Refusal| async move {
        let message = format!("workspace admission refused: {:?}", ReuseCategory::from(refusal));
        record_failure(ctx, task_ref, s_ref, "workspace_reuse_unsafe", &message).await?;
        Err::<SessionView, Error>(Error::WorkspaceReuseUnsafe(refusal.into()))
    };
    let Some(current_env) = environments::current(&ctx.db.conn, owner.id).await? else {
        return refused(Refusal::EnvironmentNotReady).await;
    };
    let mut transition = None;
    let admitted = match admit(ctx, &owner, &current_env, s.executor_type, false).await? {
        Ok(ws) => ws,
        // I18: another executor than the environment's: a fresh environment for it, beside the current one.
        Err(Refusal::ExecutorMismatch) => {
            let (candidate, made) = environments::prepare_transition(ctx, &task, s.executor_type).await?;
            match admit(ctx, &owner, &candidate, s.executor_type, true).await? {
                Ok(ws) => {
                    transition = Some((candidate, made));
                    ws
                }
                Err(refusal) => {
                    environments::abandon_transition(
                        ctx,
                        &task,
                        &candidate,
                        &made,
                        "admission refused the new environment",
                    )
                    .await;
                    return refused(refusal).await;
                }
            }
        }
        Err(refusal) => return refused(refusal).await,
    };
    let abandon = |why: &'static str| {
        let transition = transition.as_ref();
        let task = &task;
        async move {
            if let Some((candidate, made)) = transition {
                environments::abandon_transition(ctx, task, candidate, made, why).await;
            }
        }
    };

    // The durable handle first: a crash after this leaves a record to reap (issue 5: agent_executions).
    let execution_id = Uuid::now_v7();
    let handle: Result<Option<session::Model>> = async {
        let now = crate::clock::now();
        let txn = ctx.db.begin_write().await?;
        if owner.id != task.id {
            lock_task(&txn, owner.id).await?;
        }
        lock_task(&txn, task.id).await?;
        ensure_no_cleanup(&txn, &[task.id, owner.id]).await?;
        let current = session::Entity::find_by_id(s.id)
            .one(&txn)
            .await?
            .ok_or(Error::NotFound("session"))?;
        match current.state {
            // Another launch is under way (I27: one process): answer with it.
            SessionState::Starting => {
                drop(txn);
                return Ok(Some(current));
            }
            SessionState::Stopping => return Err(Error::SessionBusy),
            _ => {}
        }
        // The admitted environment must still be the one to run in, now that the task is locked.
        let still = env::Entity::find_by_id(admitted.environment_id()).one(&txn).await?;
        let valid = match (&still, &transition) {
            (Some(e), None) => matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped),
            (Some(e), Some((c, _))) => {
                e.status == EnvironmentStatus::Creating && e.materializer_id == c.materializer_id
            }
            (None, _) => false,
        };
        if !valid {
            return Err(Error::Conflict(
                "the task's environment changed while the launch was admitted; retry".into(),
            ));
        }
        execution::Entity::insert(execution::ActiveModel {
            id: Set(execution_id),
            session_id: Set(s.id),
            task_environment_id: Set(Some(admitted.environment_id())),
            instance_id: Set(ctx.instance_id),
            node_id: Set(ctx.config.node_id.clone()),
            pid: Set(None),
            state: Set("starting".into()),
            workspace_path: Set(admitted.path().to_string_lossy().into_owned()),
            exit_code: Set(None),
            started_at: Set(now),
            ended_at: Set(None),
            updated_at: Set(now),
        })
        .exec_without_returning(&txn)
        .await
        .map_err(|e| {
            if crate::error::is_unique_violation(&e) {
                Error::SessionBusy
            } else {
                e.into()
            }
        })?;
        session::Entity::update(session::ActiveModel {
            id: Set(s.id),
            state: Set(SessionState::Starting),
            desired_open: Set(true),
            execution_id: Set(Some(execution_id)),
            task_environment_id: Set(Some(admitted.environment_id())),
            last_error_code: Set(None),
            last_error_message: Set(None),
            last_activity_at: Set(now),
            updated_at: Set(now),
            ..Default::default()
        })
        .exec(&txn)
        .await?;
        state_event(
            ctx,
            &txn,
            &task,
            s.id,
            admitted.environment_id(),
            Some(execution_id),
            SessionState::Starting,
        )
        .await?;
        ctx.commit(txn).await?;
        Ok(None)
    }
    .await;
    match handle {
        Ok(None) => {}
        Ok(Some(current)) => {
            abandon("another launch of the session is under way").await;
            return sessions::project(&ctx.db.conn, current).await;
        }
        Err(e) => {
            abandon("the launch could not be recorded").await;
            return Err(e);
        }
    }

    let pid = match ctx.runtime.spawn(&admitted, &profile, s.id, execution_id) {
        Ok(pid) => pid,
        Err(SpawnError::AlreadyRunning) => {
            return sessions::project(&ctx.db.conn, reload(ctx, s.id).await?).await;
        }
        Err(SpawnError::Spawn(e)) => {
            tracing::warn!(session = %s.id, profile = %profile_name, error = %e, "agent did not start");
            abandon("the agent did not start").await;
            finish_execution(ctx, execution_id, "failed", None).await?;
            let s = reload(ctx, s.id).await?;
            record_failure(
                ctx,
                &task,
                &s,
                "agent_start_failed",
                &format!("could not start the command of agent profile {profile_name}"),
            )
            .await?;
            return Err(Error::AgentStartFailed);
        }
    };

    let state = if prompt.is_some() {
        SessionState::Running
    } else {
        SessionState::Idle
    };
    let txn = ctx.db.begin_write().await?;
    if transition.is_some() {
        // Promotion supersedes environments: serialize with other launches and session creation.
        lock_task(&txn, owner.id).await?;
    }
    execution::Entity::update(execution::ActiveModel {
        id: Set(execution_id),
        pid: Set(Some(pid as i32)),
        state: Set("running".into()),
        updated_at: Set(crate::clock::now()),
        ..Default::default()
    })
    .exec(&txn)
    .await?;
    // Only if nothing (an exit already reported) moved the session on meanwhile.
    let moved = session::Entity::update_many()
        .col_expr(session::Column::State, sea_orm::sea_query::Expr::value(state))
        .col_expr(
            session::Column::StartedAt,
            sea_orm::sea_query::Expr::value(Some(crate::clock::now())),
        )
        .col_expr(
            session::Column::UpdatedAt,
            sea_orm::sea_query::Expr::value(crate::clock::now()),
        )
        .filter(session::Column::Id.eq(s.id))
        .filter(session::Column::ExecutionId.eq(execution_id))
        .filter(session::Column::State.eq(SessionState::Starting))
        .exec(&txn)
        .await?;
    if let Some((candidate, _)) = &transition {
        // I18: only now, with the agent running in it, does the new environment become current.
        if let Err(e) =
            environments::promote_transition(&txn, ctx, &task, candidate.id, candidate.materializer_id).await
        {
            drop(txn);
            ctx.runtime.stop(s.id).await;
            abandon("the new environment was taken over").await;
            return Err(e);
        }
    }
    // I19: a successful launch writes the effective workspace back (healing an earlier wrong value).
    env::Entity::update_many()
        .col_expr(
            env::Column::WorkspacePath,
            sea_orm::sea_query::Expr::value(Some(admitted.path().to_string_lossy().into_owned())),
        )
        .filter(env::Column::Id.eq(admitted.environment_id()))
        .filter(
            sea_orm::Condition::any()
                .add(env::Column::WorkspacePath.ne(admitted.path().to_string_lossy().into_owned()))
                .add(env::Column::WorkspacePath.is_null()),
        )
        .exec(&txn)
        .await?;
    if moved.rows_affected == 1 {
        state_event(
            ctx,
            &txn,
            &task,
            s.id,
            admitted.environment_id(),
            Some(execution_id),
            state,
        )
        .await?;
    }
    ctx.commit(txn).await?;
    if let Some(text) = prompt {
        deliver(ctx, s.id, &text).await?;
    }
    sessions::project(&ctx.db.conn, reload(ctx, s.id).await?).await
}

/// Builds the admission candidate from the canonical inventory (never from a session's copy) and
/// validates it off the async threads.
async fn admit(
    ctx: &Ctx,
    owner: &task::Model,
    current: &env::Model,
    requested: ExecutorType,
    // A transition candidate is admitted while still `creating` (it becomes current only after its launch).
    candidate: bool,
) -> Result<std::result::Result<AdmittedWorkspace, Refusal>> {
    let rows = env_repo::Entity::find()
        .filter(env_repo::Column::TaskEnvironmentId.eq(current.id))
        .filter(env_repo::Column::Status.eq(EnvironmentRepoStatus::Active))
        .all(&ctx.db.conn)
        .await?;
    let slots: Vec<admission::Slot> = environments::slots_with_repositories(&ctx.db.conn, owner.id)
        .await?
        .iter()
        .filter_map(|(slot, repo)| {
            repo.as_ref().map(|r| admission::Slot {
                repository_id: slot.repository_id,
                branch_slug: slot.branch_slug.clone(),
                common_git_dir: PathBuf::from(&r.common_git_dir),
                source_path: PathBuf::from(&r.path),
            })
        })
        .collect();
    let rows: Vec<admission::Row> = rows
        .into_iter()
        .map(|r| admission::Row {
            repository_id: r.repository_id,
            branch_slug: r.branch_slug,
            worktree_path: r.worktree_path.map(PathBuf::from),
            worktree_id: r.worktree_id,
        })
        .collect();
    // This environment's own directory: the one its rows live in (a transition has its own), which must
    // be a directory of this task directly under the managed root.
    let root = &ctx.config.worktree_root;
    let task_root = rows
        .iter()
        .filter_map(|r| r.worktree_path.as_ref().and_then(|p| p.parent()).map(PathBuf::from))
        .next()
        .filter(|dir| {
            dir.parent() == Some(root.as_path())
                && dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n == owner.slug || n.starts_with(&format!("{}-", owner.slug)))
        })
        .unwrap_or_else(|| root.join(&owner.slug));
    let environment_id = current.id;
    let executor = current.executor_type;
    let ready = matches!(current.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped)
        || (candidate && current.status == EnvironmentStatus::Creating);
    tokio::task::spawn_blocking(move || {
        admission::admit(
            &Candidate {
                environment_id,
                executor,
                ready,
                task_root: &task_root,
                slots: &slots,
                rows: &rows,
            },
            requested,
        )
    })
    .await
    .map_err(|e| Error::Internal(e.into()))
}

/// Sends a prompt, recording it in the transcript first.
async fn deliver(ctx: &Ctx, session_id: Uuid, text: &str) -> Result<()> {
    session_message::Entity::insert(session_message::ActiveModel {
        session_id: Set(session_id),
        role: Set("user".into()),
        content: Set(json!({ "text": text })),
        created_at: Set(crate::clock::now()),
        ..Default::default()
    })
    .exec_without_returning(&ctx.db.conn)
    .await?;
    if !ctx
        .runtime
        .send(session_id, json!({ "type": "prompt", "message": text }))
    {
        return Err(Error::Conflict(
            "the session has no running agent; launch or resume it".into(),
        ));
    }
    Ok(())
}

pub async fn send_message(ctx: &Ctx, p: &Principal, session_id: Uuid, text: &str) -> Result<()> {
    if text.trim().is_empty() || text.len() > 200_000 {
        return Err(Error::invalid("text", "must be 1 to 200000 bytes"));
    }
    let s = sessions::visible(&ctx.db.conn, p, session_id).await?;
    if !ctx.runtime.is_live(s.id) {
        return Err(Error::Conflict(
            "the session has no running agent; launch or resume it".into(),
        ));
    }
    deliver(ctx, s.id, text).await
}

/// I28: clear `desired_open` first, then stop the process with escalation; the transcript stays.
pub async fn stop(ctx: &Ctx, p: &Principal, session_id: Uuid) -> Result<SessionView> {
    let s = sessions::visible(&ctx.db.conn, p, session_id).await?;
    stop_session(ctx, &s).await?;
    sessions::project(&ctx.db.conn, reload(ctx, s.id).await?).await
}

pub(crate) async fn stop_session(ctx: &Ctx, s: &session::Model) -> Result<()> {
    let task = task::Entity::find_by_id(s.task_id)
        .one(&ctx.db.conn)
        .await?
        .ok_or(Error::NotFound("session"))?;
    let live = ctx.runtime.is_live(s.id);
    let txn = ctx.db.begin_write().await?;
    let current = session::Entity::find_by_id(s.id)
        .one(&txn)
        .await?
        .ok_or(Error::NotFound("session"))?;
    let next = if live {
        SessionState::Stopping
    } else if current.state.is_terminal() {
        current.state
    } else {
        SessionState::Stopped
    };
    session::Entity::update(session::ActiveModel {
        id: Set(s.id),
        desired_open: Set(false),
        state: Set(next),
        updated_at: Set(crate::clock::now()),
        ..Default::default()
    })
    .exec(&txn)
    .await?;
    if next != current.state {
        state_event(
            ctx,
            &txn,
            &task,
            s.id,
            current.task_environment_id.unwrap_or_default(),
            current.execution_id,
            next,
        )
        .await?;
    }
    ctx.commit(txn).await?;
    if live {
        ctx.runtime.stop(s.id).await;
        settle_stopped(ctx, &task, s.id).await?;
    }
    Ok(())
}

/// `stopping` → `stopped`, once (the exit report may get there first).
async fn settle_stopped(ctx: &Ctx, task: &task::Model, session_id: Uuid) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    let now = crate::clock::now();
    let res = session::Entity::update_many()
        .col_expr(
            session::Column::State,
            sea_orm::sea_query::Expr::value(SessionState::Stopped),
        )
        .col_expr(session::Column::EndedAt, sea_orm::sea_query::Expr::value(Some(now)))
        .col_expr(session::Column::UpdatedAt, sea_orm::sea_query::Expr::value(now))
        .filter(session::Column::Id.eq(session_id))
        .filter(session::Column::State.eq(SessionState::Stopping))
        .exec(&txn)
        .await?;
    if res.rows_affected == 1 {
        let s = session::Entity::find_by_id(session_id)
            .one(&txn)
            .await?
            .ok_or(Error::NotFound("session"))?;
        state_event(
            ctx,
            &txn,
            task,
            session_id,
            s.task_environment_id.unwrap_or_default(),
            s.execution_id,
            SessionState::Stopped,
        )
        .await?;
    }
    ctx.commit(txn).await
}

/// Applies the runtime's reports, in order, forever.
pub async fn consume(ctx: Ctx, mut rx: tokio::sync::mpsc::Receiver<RuntimeEvent>) {
    while let Some(report) = rx.recv().await {
        let result = match report {
            RuntimeEvent::Output {
                session_id,
                execution_id,
                event,
            } => on_output(&ctx, session_id, execution_id, event).await,
            RuntimeEvent::Exited {
                session_id,
                execution_id,
                code,
                expected,
                stderr_tail,
            } => {
                let r = on_exit(&ctx, session_id, execution_id, code, expected, &stderr_tail).await;
                ctx.runtime.forget(session_id, execution_id);
                r
            }
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not record an agent report");
        }
    }
}

async fn on_output(ctx: &Ctx, session_id: Uuid, execution_id: Uuid, event: serde_json::Value) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    let Some(s) = session::Entity::find_by_id(session_id).one(&txn).await? else {
        return Ok(());
    };
    if s.execution_id != Some(execution_id) {
        return Ok(());
    }
    let Some(task) = task::Entity::find_by_id(s.task_id).one(&txn).await? else {
        return Ok(());
    };
    let now = crate::clock::now();
    let next = match event["type"].as_str() {
        Some("agent_start") => Some(SessionState::Running),
        Some("agent_end" | "agent_settled") => Some(SessionState::Idle),
        Some("extension_ui_request") => Some(SessionState::Attention),
        _ => None,
    }
    .filter(|n| {
        *n != s.state
            && matches!(
                s.state,
                SessionState::Running | SessionState::Idle | SessionState::Attention
            )
    });
    if event["type"] == "message_end" && event["message"]["role"] == "assistant" {
        session_message::Entity::insert(session_message::ActiveModel {
            session_id: Set(session_id),
            role: Set("assistant".into()),
            content: Set(event["message"].clone()),
            created_at: Set(now),
            ..Default::default()
        })
        .exec_without_returning(&txn)
        .await?;
    }
    let mut am = session::ActiveModel {
        id: Set(session_id),
        last_activity_at: Set(now),
        ..Default::default()
    };
    if let Some(n) = next {
        am.state = Set(n);
        am.updated_at = Set(now);
    }
    session::Entity::update(am).exec(&txn).await?;
    let subject = Subject {
        session_id: Some(session_id),
        task_environment_id: s.task_environment_id,
        execution_id: Some(execution_id),
        ..Subject::task(task.workspace_id, task.id)
    };
    events::append(
        &txn,
        ctx.instance_id,
        "runtime.output",
        subject,
        json!({ "event": event }),
    )
    .await?;
    if let Some(n) = next {
        state_event(
            ctx,
            &txn,
            &task,
            session_id,
            s.task_environment_id.unwrap_or_default(),
            Some(execution_id),
            n,
        )
        .await?;
    }
    ctx.commit(txn).await?;
    if matches!(event["type"].as_str(), Some("agent_end" | "agent_settled")) {
        // Seed 004: a finished turn is captured as a completion observation of the environment.
        let ctx = ctx.clone();
        tokio::spawn(async move { super::git_status::capture_completion(&ctx, session_id).await });
    }
    Ok(())
}

async fn on_exit(
    ctx: &Ctx,
    session_id: Uuid,
    execution_id: Uuid,
    code: Option<i32>,
    expected: bool,
    stderr_tail: &str,
) -> Result<()> {
    finish_execution(ctx, execution_id, if expected { "exited" } else { "failed" }, code).await?;
    if expected {
        return Ok(());
    }
    let Some(s) = session::Entity::find_by_id(session_id).one(&ctx.db.conn).await? else {
        return Ok(());
    };
    if s.execution_id != Some(execution_id) || s.state.is_terminal() {
        return Ok(());
    }
    let Some(task) = task::Entity::find_by_id(s.task_id).one(&ctx.db.conn).await? else {
        return Ok(());
    };
    let last_line = stderr_tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(300)
        .collect::<String>();
    let status = code.map(|c| format!("status {c}")).unwrap_or_else(|| "a signal".into());
    let message = if last_line.is_empty() {
        format!("the agent exited unexpectedly with {status}")
    } else {
        format!("the agent exited unexpectedly with {status}: {last_line}")
    };
    // I30: an open session whose agent died is restarted in the same workspace, with backoff, a bounded
    // number of times in a window; past that it is failed with the reason.
    let window = chrono::Duration::from_std(ctx.config.agent_restart_window).unwrap_or(chrono::Duration::minutes(10));
    let recent_failures = execution::Entity::find()
        .filter(execution::Column::SessionId.eq(session_id))
        .filter(execution::Column::State.eq("failed"))
        .filter(execution::Column::EndedAt.gt(crate::clock::now() - window))
        .count(&ctx.db.conn)
        .await?;
    if !s.desired_open || recent_failures > u64::from(ctx.config.agent_restart_max) {
        let message = if s.desired_open {
            format!("{message}; {recent_failures} failures in the restart window")
        } else {
            message
        };
        return record_failure(ctx, &task, &s, "agent_exited", &message).await;
    }
    let txn = ctx.db.begin_write().await?;
    let moved = session::Entity::update_many()
        .col_expr(
            session::Column::State,
            sea_orm::sea_query::Expr::value(SessionState::Recovering),
        )
        .col_expr(
            session::Column::LastErrorCode,
            sea_orm::sea_query::Expr::value(Some("agent_exited")),
        )
        .col_expr(
            session::Column::LastErrorMessage,
            sea_orm::sea_query::Expr::value(Some(message)),
        )
        .col_expr(
            session::Column::UpdatedAt,
            sea_orm::sea_query::Expr::value(crate::clock::now()),
        )
        .filter(session::Column::Id.eq(session_id))
        .filter(session::Column::ExecutionId.eq(execution_id))
        .exec(&txn)
        .await?;
    if moved.rows_affected == 1 {
        state_event(
            ctx,
            &txn,
            &task,
            session_id,
            s.task_environment_id.unwrap_or_default(),
            Some(execution_id),
            SessionState::Recovering,
        )
        .await?;
    }
    ctx.commit(txn).await?;
    let backoff =
        ctx.config.agent_restart_backoff * 2u32.saturating_pow(recent_failures.saturating_sub(1) as u32).min(64);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(backoff).await;
        // Relaunch only if nothing (a stop, a delete) changed the session meanwhile; through admission.
        let Ok(Some(current)) = session::Entity::find_by_id(session_id).one(&ctx.db.conn).await else {
            return;
        };
        if current.state != SessionState::Recovering
            || current.execution_id != Some(execution_id)
            || !current.desired_open
        {
            return;
        }
        if let Err(e) = launch_session(&ctx, current, None).await {
            tracing::warn!(session = %session_id, error = %e, "restarting a crashed agent failed");
        }
    });
    Ok(())
}

async fn finish_execution(ctx: &Ctx, execution_id: Uuid, state: &str, code: Option<i32>) -> Result<()> {
    let now = crate::clock::now();
    execution::Entity::update(execution::ActiveModel {
        id: Set(execution_id),
        state: Set(state.to_string()),
        exit_code: Set(code),
        ended_at: Set(Some(now)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(&ctx.db.conn)
    .await?;
    Ok(())
}

/// A launch or an agent failed: the session is `failed` with `last_error`; nothing else changes.
async fn record_failure(ctx: &Ctx, task: &task::Model, s: &session::Model, code: &str, message: &str) -> Result<()> {
    let txn = ctx.db.begin_write().await?;
    let now = crate::clock::now();
    session::Entity::update(session::ActiveModel {
        id: Set(s.id),
        state: Set(SessionState::Failed),
        last_error_code: Set(Some(code.to_string())),
        last_error_message: Set(Some(message.to_string())),
        ended_at: Set(Some(now)),
        updated_at: Set(now),
        ..Default::default()
    })
    .exec(&txn)
    .await?;
    state_event(
        ctx,
        &txn,
        task,
        s.id,
        s.task_environment_id.unwrap_or_default(),
        s.execution_id,
        SessionState::Failed,
    )
    .await?;
    ctx.commit(txn).await
}

async fn state_event(
    ctx: &Ctx,
    txn: &sea_orm::DatabaseTransaction,
    task: &task::Model,
    session_id: Uuid,
    environment_id: Uuid,
    execution_id: Option<Uuid>,
    state: SessionState,
) -> Result<()> {
    let subject = Subject {
        session_id: Some(session_id),
        task_environment_id: (!environment_id.is_nil()).then_some(environment_id),
        execution_id,
        ..Subject::task(task.workspace_id, task.id)
    };
    events::append(
        txn,
        ctx.instance_id,
        "session.state_changed",
        subject,
        json!({ "state": state }),
    )
    .await?;
    Ok(())
}

async fn reload(ctx: &Ctx, id: Uuid) -> Result<session::Model> {
    session::Entity::find_by_id(id)
        .one(&ctx.db.conn)
        .await?
        .ok_or(Error::NotFound("session"))
}

/// At startup: executions of earlier processes are over; sessions that were open are relaunched
/// through admission, two at a time (I29); others that claimed a process are stopped.
pub async fn restore(ctx: &Ctx) -> Result<usize> {
    use futures_util::StreamExt;
    let stale = execution::Entity::find()
        .filter(execution::Column::State.is_in(["starting", "running"]))
        .filter(execution::Column::NodeId.eq(ctx.config.node_id.clone()))
        .filter(execution::Column::InstanceId.ne(ctx.instance_id))
        .all(&ctx.db.conn)
        .await?;
    for e in &stale {
        finish_execution(ctx, e.id, "exited", None).await?;
    }
    let claimed = session::Entity::find()
        .filter(session::Column::State.is_in([
            SessionState::Starting,
            SessionState::Running,
            SessionState::Idle,
            SessionState::Attention,
            SessionState::Recovering,
            SessionState::Stopping,
        ]))
        .all(&ctx.db.conn)
        .await?;
    let mut to_open = Vec::new();
    for s in claimed {
        if ctx.runtime.is_live(s.id) {
            continue;
        }
        if s.desired_open {
            // Whatever state the previous process left (a launch cut off in `starting`, say), the
            // session is recovering now: nothing runs for it in this process yet.
            session::Entity::update(session::ActiveModel {
                id: Set(s.id),
                state: Set(SessionState::Recovering),
                ..Default::default()
            })
            .exec(&ctx.db.conn)
            .await?;
            to_open.push(session::Model {
                state: SessionState::Recovering,
                ..s
            });
        } else if let Some(task) = task::Entity::find_by_id(s.task_id).one(&ctx.db.conn).await? {
            let txn = ctx.db.begin_write().await?;
            session::Entity::update(session::ActiveModel {
                id: Set(s.id),
                state: Set(SessionState::Stopped),
                ..Default::default()
            })
            .exec(&txn)
            .await?;
            state_event(
                ctx,
                &txn,
                &task,
                s.id,
                s.task_environment_id.unwrap_or_default(),
                s.execution_id,
                SessionState::Stopped,
            )
            .await?;
            ctx.commit(txn).await?;
        }
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    let in_flight = AtomicUsize::new(0);
    let opened = futures_util::stream::iter(to_open)
        .map(|s| {
            let in_flight = &in_flight;
            async move {
                let now = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                ctx.restore_stats.max_concurrent.fetch_max(now, Ordering::AcqRel);
                let id = s.id;
                let ok = match launch_session(ctx, s, None).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(session = %id, error = %e, "could not restore a session");
                        false
                    }
                };
                in_flight.fetch_sub(1, Ordering::AcqRel);
                ok
            }
        })
        // I29: two at a time.
        .buffer_unordered(2)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    Ok(opened)
}

/// I31: answers an attention request pending on this session (and no other); the agent works on.
pub async fn answer_attention(
    ctx: &Ctx,
    p: &Principal,
    session_id: Uuid,
    request_id: &str,
    response: serde_json::Value,
) -> Result<SessionView> {
    let s = sessions::visible(&ctx.db.conn, p, session_id).await?;
    if !ctx.runtime.answer(s.id, request_id, response) {
        return Err(Error::NotFound("attention request"));
    }
    if ctx.runtime.attention(s.id).is_empty()
        && let Some(task) = task::Entity::find_by_id(s.task_id).one(&ctx.db.conn).await?
    {
        let txn = ctx.db.begin_write().await?;
        let moved = session::Entity::update_many()
            .col_expr(
                session::Column::State,
                sea_orm::sea_query::Expr::value(SessionState::Running),
            )
            .col_expr(
                session::Column::UpdatedAt,
                sea_orm::sea_query::Expr::value(crate::clock::now()),
            )
            .filter(session::Column::Id.eq(s.id))
            .filter(session::Column::State.eq(SessionState::Attention))
            .exec(&txn)
            .await?;
        if moved.rows_affected == 1 {
            state_event(
                ctx,
                &txn,
                &task,
                s.id,
                s.task_environment_id.unwrap_or_default(),
                s.execution_id,
                SessionState::Running,
            )
            .await?;
        }
        ctx.commit(txn).await?;
    }
    sessions::project(&ctx.db.conn, reload(ctx, s.id).await?).await
}

/// What a client loads before following the stream from `latest_seq` (seed 002 "Snapshot").
pub struct SessionSnapshot {
    pub view: SessionView,
    pub label: String,
    pub transcript: Vec<crate::entity::session_message::Model>,
    pub turns: u64,
    pub messages: u64,
    /// Summed from the agent's `usage` reports, when it makes them.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost: f64,
    pub active_tool: Option<String>,
    pub last_activity_at: chrono::DateTime<chrono::Utc>,
    pub attention_requests: Vec<serde_json::Value>,
    pub instance_id: Uuid,
    pub latest_seq: i64,
}

pub async fn snapshot(ctx: &Ctx, p: &Principal, session_id: Uuid) -> Result<SessionSnapshot> {
    use sea_orm::QueryOrder;
    // The seq first: everything read after it is at least as new, so following from it loses nothing.
    let (_, latest_seq) = events::bounds(&ctx.db.conn).await?;
    let s = sessions::visible(&ctx.db.conn, p, session_id).await?;
    let transcript = session_message::Entity::find()
        .filter(session_message::Column::SessionId.eq(s.id))
        .order_by_asc(session_message::Column::Id)
        .all(&ctx.db.conn)
        .await?;
    let first_prompt = transcript
        .iter()
        .find(|m| m.role == "user")
        .and_then(|m| m.content["text"].as_str().map(str::to_string));
    let label = if !s.name.is_empty() {
        s.name.clone()
    } else {
        first_prompt
            .map(|t| t.chars().take(80).collect())
            .unwrap_or_else(|| "New session".into())
    };
    let turns = transcript.iter().filter(|m| m.role == "assistant").count() as u64;
    let usage = |key: &str| {
        transcript
            .iter()
            .filter_map(|m| m.content["usage"][key].as_u64())
            .sum::<u64>()
    };
    let (input_tokens, output_tokens) = (usage("input"), usage("output"));
    let cost = transcript
        .iter()
        .filter_map(|m| m.content["usage"]["cost"]["total"].as_f64())
        .sum::<f64>();
    let active_tool = ctx.runtime.active_tool(s.id);
    let last_activity_at = s.last_activity_at;
    let messages = transcript.len() as u64;
    let attention_requests = ctx.runtime.attention(s.id);
    let view = sessions::project(&ctx.db.conn, s).await?;
    Ok(SessionSnapshot {
        view,
        label,
        transcript,
        turns,
        messages,
        input_tokens,
        output_tokens,
        cost,
        active_tool,
        last_activity_at,
        attention_requests,
        instance_id: ctx.instance_id,
        latest_seq,
    })
}
