//! Creating, listing, deleting sessions and choosing the primary.
//!
//! The rule for deleting a session lives here: it removes the session row and its conversation history,
//! and nothing else — no directory, worktree registration, branch or cleanup job (I2, I3) — and it is
//! refused while the session is busy (I4).
use crate::ids::{EnvironmentId, SessionId, TaskId};
use sea_orm::DatabaseTransaction;
use serde_json::json;

use super::access::{SessionView, project, reload, subject, visible};
use super::{Ctx, environments};
use crate::auth::{Principal, UnboundPrincipal};
use crate::domain::pagination::{Page, PageRequest};
use crate::entity::task_environment::ExecutorType;
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result};
use crate::events;
use crate::events::EventType;
use crate::store::environments as env_store;
use crate::store::sessions as store;
use crate::store::tasks::{self as task_store, ensure_no_cleanup, lock_task};

pub struct NewSession {
    pub executor_type: ExecutorType,
    pub agent_profile: Option<String>,
    pub name: Option<String>,
    pub prompt: Option<String>,
    /// Launch after attaching; default: when an agent profile resolves.
    pub start: Option<bool>,
}

/// What a valid [`NewSession`] asks for.
struct Request {
    name: String,
    agent_profile: Option<String>,
    start: bool,
    prompt: Option<String>,
}

fn validate(ctx: &Ctx, input: &NewSession) -> Result<Request> {
    let name = match input.name.as_deref() {
        Some(n) if n.chars().count() > 200 => {
            return Err(Error::invalid("name", "must be at most 200 characters"));
        }
        Some(n) => n.trim().to_string(),
        None => String::new(),
    };
    // The profile named, else the only one configured.
    let agent_profile = match &input.agent_profile {
        Some(name) if ctx.config.agents.contains_key(name) => Some(name.clone()),
        Some(_) => {
            return Err(Error::invalid("agent_profile", "no such agent profile is configured"));
        }
        None if ctx.config.agents.len() == 1 => ctx.config.agents.keys().next().cloned(),
        None => None,
    };
    let start = match input.start {
        Some(true) if agent_profile.is_none() => {
            return Err(Error::invalid(
                "agent_profile",
                "starting an agent needs an agent profile (GET /api/v1/agent-profiles)",
            ));
        }
        Some(start) => start,
        None => agent_profile.is_some(),
    };
    let prompt = input.prompt.clone().filter(|p| !p.trim().is_empty());
    if prompt.is_some() && !start {
        return Err(Error::invalid(
            "prompt",
            "a prompt is delivered only to a started agent",
        ));
    }
    Ok(Request {
        name,
        agent_profile,
        start,
        prompt,
    })
}

/// A session as it is first recorded: no execution, no error, not open; primary when the task has none
/// yet (settled in [`record`]).
fn first_record(
    request: &Request,
    executor_type: ExecutorType,
    task: &crate::entity::task::Model,
    environment_id: Option<EnvironmentId>,
    state: SessionState,
) -> session::Model {
    let now = crate::clock::now();
    session::Model {
        id: SessionId::now_v7(),
        task_id: task.id,
        task_environment_id: environment_id,
        name: request.name.clone(),
        executor_type,
        agent_profile: request.agent_profile.clone(),
        state,
        is_primary: false,
        desired_open: false,
        execution_id: None,
        agent_session_ref: None,
        agent_state: None,
        last_error_code: None,
        last_error_message: None,
        last_activity_at: now,
        created_at: now,
        updated_at: now,
        started_at: None,
        ended_at: None,
        row_version: 1,
        imported_from: None,
    }
}

/// Inserts a new session (primary if its task has none) with its `session.created` event; a new
/// session is activity on its task.
async fn record(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    task: &crate::entity::task::Model,
    mut model: session::Model,
) -> Result<session::Model> {
    model.is_primary = store::primary_of(txn, task.id).await?.is_none();
    store::insert(txn, model.clone()).await?;
    task_store::touch(txn, task.id, model.created_at).await?;
    events::append(
        txn,
        ctx.instance_id,
        EventType::SessionCreated,
        subject(task, &model),
        json!({ "is_primary": model.is_primary, "executor_type": model.executor_type }),
    )
    .await?;
    Ok(model)
}

pub async fn create(ctx: &Ctx, p: &UnboundPrincipal, task_id: TaskId, input: NewSession) -> Result<SessionView> {
    let request = validate(ctx, &input)?;
    let task = crate::domain::tasks::readable(&ctx.db.conn, p, task_id).await?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let draft = first_record(&request, input.executor_type, &task, None, SessionState::Created);
    let on_publish = record_on_publish(ctx, &task, draft.clone());
    let (environment, recorded) =
        environments::ensure_ready_then(ctx, &task, input.executor_type, Some(on_publish)).await?;
    let model = match recorded {
        Some(model) => model,
        None => record_attached(ctx, task_id, &environment, draft).await?,
    };
    if request.start {
        return super::launch::launch_session(ctx, model, request.prompt).await;
    }
    Ok(SessionView {
        session: model,
        node: Some(super::access::node_of(ctx, &environment.node_id)),
        workspace_path: environment.workspace_path,
    })
}

/// The first session of a task whose environment this request makes is recorded in the environment's
/// publish transaction (one durable commit fewer), under the rules of [`record_attached`]: the owner
/// is locked and the barriers of both are checked by the publish; a subtask is locked after its owner
/// and checked again. A task archived, deleted or under cleanup meanwhile leaves the session to
/// [`record_attached`], which refuses it with the usual error, and the environment is published all
/// the same (it is the owner's).
fn record_on_publish(ctx: &Ctx, task: &crate::entity::task::Model, draft: session::Model) -> environments::OnPublish {
    let (ctx, task_id) = (ctx.clone(), task.id);
    Box::new(move |txn, owner, environment| {
        Box::pin(async move {
            let task = if owner.id == task_id {
                owner.clone()
            } else {
                match lock_task(txn, task_id).await {
                    Ok(task) => task,
                    Err(Error::NotFound(_)) => return Ok(None),
                    Err(e) => return Err(e),
                }
            };
            if task.archived_at.is_some() {
                return Ok(None);
            }
            if owner.id != task_id {
                match ensure_no_cleanup(txn, &[task_id]).await {
                    Ok(()) => {}
                    Err(Error::TaskCleanupInProgress) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
            Ok(Some(record(txn, &ctx, &task, attached(draft, environment.id)).await?))
        })
    })
}

/// Records `draft` attached to the ready `environment`, in a transaction of its own.
async fn record_attached(
    ctx: &Ctx,
    task_id: TaskId,
    environment: &crate::entity::task_environment::Model,
    draft: session::Model,
) -> Result<session::Model> {
    let txn = ctx.db.begin_write().await?;
    let task = lock_for_a_session(&txn, environment.task_id, task_id).await?;
    let environment = env_store::find_attachable(&txn, environment.id)
        .await?
        .ok_or_else(|| Error::Stale("the task's environment changed meanwhile; retry".into()))?;
    let model = record(&txn, ctx, &task, attached(draft, environment.id)).await?;
    // Followed by the answer, or a launch that records its handle (flushed) before it spawns.
    ctx.commit_answered(txn).await?;
    Ok(model)
}

/// Locks the environment's owner, then the task (the order every writer uses, so a barrier on either is
/// seen), and refuses an archived task or one under a cleanup barrier (I7: either the new session commits
/// before a barrier, or it is refused).
async fn lock_for_a_session(
    txn: &DatabaseTransaction,
    owner_id: TaskId,
    task_id: TaskId,
) -> Result<crate::entity::task::Model> {
    if owner_id != task_id {
        lock_task(txn, owner_id).await?;
    }
    let task = lock_task(txn, task_id).await?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    ensure_no_cleanup(txn, &[task.id, owner_id]).await?;
    Ok(task)
}

/// The draft of a session attached to `environment_id`, timed when it is recorded.
fn attached(draft: session::Model, environment_id: EnvironmentId) -> session::Model {
    let now = crate::clock::now();
    session::Model {
        task_environment_id: Some(environment_id),
        last_activity_at: now,
        created_at: now,
        updated_at: now,
        ..draft
    }
}

/// `Prefer: respond-async`: the session is recorded `preparing` at once (under the same rules as a
/// synchronous create: the task readable and not archived, no cleanup barrier, I7), and its task's
/// environment is made ready in the background; then it goes on as [`create`] would: `created`, launched
/// when `start` (the first prompt waits in its inbox meanwhile), or `failed` with `last_error`.
pub async fn create_async(ctx: &Ctx, p: &UnboundPrincipal, task_id: TaskId, input: NewSession) -> Result<SessionView> {
    let request = validate(ctx, &input)?;
    let task = crate::domain::tasks::readable(&ctx.db.conn, p, task_id).await?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let owner = task_store::owner_of(&ctx.db.conn, &task).await?;
    let txn = ctx.db.begin_write().await?;
    let task = lock_for_a_session(&txn, owner.id, task_id).await?;
    let mut model = first_record(&request, input.executor_type, &task, None, SessionState::Preparing);
    // Kept so that the preparation, resumed by another process after a restart, still launches.
    model.desired_open = request.start;
    let model = record(&txn, ctx, &task, model).await?;
    if let Some(prompt) = &request.prompt {
        // Durable with the session: delivered once the agent runs, whichever process launches it.
        super::inbox::enqueue_in(&txn, ctx, &task, &model, prompt).await?;
    }
    ctx.commit(txn).await?;
    spawn_preparation(ctx, model.id);
    Ok(SessionView {
        session: model,
        workspace_path: None,
        node: None,
    })
}

/// At startup: sessions left `preparing` by a stopped process are prepared again (materializing is
/// idempotent per task: a ready environment is attached, a fresh `creating` one is waited for, an
/// abandoned one is taken over). Two processes preparing one session is safe: one moves it on.
pub async fn resume_preparing(ctx: &Ctx) -> Result<usize> {
    let preparing = store::in_states(&ctx.db.conn, &[SessionState::Preparing]).await?;
    for s in &preparing {
        spawn_preparation(ctx, s.id);
    }
    Ok(preparing.len())
}

/// In a task of its own: it outlives the request that created the session.
fn spawn_preparation(ctx: &Ctx, session_id: SessionId) {
    let ctx = ctx.clone();
    crate::actor::spawn(async move {
        if let Err(e) = prepare(&ctx, session_id).await {
            tracing::warn!(session = %session_id, error = %e, "preparing a session failed");
        }
    });
}

/// How long a preparation waits for another request's materialization of the same task.
const PREPARE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);

async fn prepare(ctx: &Ctx, session_id: SessionId) -> Result<()> {
    let deadline = tokio::time::Instant::now() + PREPARE_PATIENCE;
    loop {
        let s = match reload(&ctx.db.conn, session_id).await {
            Err(Error::NotFound(_)) => return Ok(()),
            other => other?,
        };
        if s.state != SessionState::Preparing {
            // Deleted, stopped, cancelled by an archive, or moved on by another process.
            return Ok(());
        }
        let task = task_store::find(&ctx.db.conn, s.task_id)
            .await?
            .ok_or(Error::NotFound("task"))?;
        let attached = match environments::ensure_ready(ctx, &task, s.executor_type).await {
            Ok(environment) => attach(ctx, &task, &s, &environment).await,
            Err(e) => Err(e),
        };
        match attached {
            Ok(Some(created)) => {
                if created.desired_open {
                    // As a synchronous create: admission, launch, and a failure recorded on the session.
                    if let Err(e) = super::launch::launch_session(ctx, created, None).await {
                        tracing::info!(session = %session_id, error = %e, "launching a prepared session failed");
                    }
                }
                return Ok(());
            }
            Ok(None) => return Ok(()),
            // Someone else is materializing, or what was read changed meanwhile: wait, then try again.
            Err(Error::WorkspacePreparing | Error::Stale(_) | Error::Unavailable(_))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => {
                let (code, message) = preparation_error(&e);
                // Unless an archive or a stop moved it on while it was being prepared.
                super::launch::record_failure(ctx, &task, session_id, super::launch::Seen::exactly(&s), code, &message)
                    .await?;
                return Ok(());
            }
        }
    }
}

/// Attaches the ready environment and moves the session to `created` (compare-and-set: `None` when the
/// session is no longer `preparing`).
async fn attach(
    ctx: &Ctx,
    task: &crate::entity::task::Model,
    s: &session::Model,
    environment: &crate::entity::task_environment::Model,
) -> Result<Option<session::Model>> {
    let txn = ctx.db.begin_write().await?;
    if environment.task_id != task.id {
        lock_task(&txn, environment.task_id).await?;
    }
    let task = lock_task(&txn, task.id).await?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    // I7: either the session attaches before a cleanup barrier, or it fails.
    ensure_no_cleanup(&txn, &[task.id, environment.task_id]).await?;
    let environment = env_store::find_attachable(&txn, environment.id)
        .await?
        .ok_or_else(|| Error::Stale("the task's environment changed meanwhile; retry".into()))?;
    let current = super::access::reload_locked(&txn, s.id).await?;
    if current.state != SessionState::Preparing {
        return Ok(None);
    }
    let patch = crate::store::sessions::StatePatch {
        task_environment_id: Some(Some(environment.id)),
        ..Default::default()
    };
    let moved = super::state::transition(&txn, ctx, &task, &current, super::SessionEvent::Prepared, patch).await?;
    ctx.commit(txn).await?;
    Ok(moved.map(|state| session::Model {
        state,
        task_environment_id: Some(environment.id),
        ..current
    }))
}

/// `last_error` of a session whose preparation failed: a stable code and a message without paths.
fn preparation_error(e: &Error) -> (&'static str, String) {
    match e {
        Error::MaterializationFailed { repository_name, .. } => (
            "materialization_failed",
            format!("preparing repository {repository_name} failed; the environment's repos say why"),
        ),
        Error::TaskArchived => (
            "task_archived",
            "the task was archived while its workspace was prepared".into(),
        ),
        Error::TaskCleanupInProgress => (
            "task_cleanup_in_progress",
            "the task's resources are being cleaned up".into(),
        ),
        Error::WorkspacePreparing | Error::Stale(_) | Error::Unavailable(_) => (
            "materialization_failed",
            "the workspace could not be prepared in time; create a new session".into(),
        ),
        Error::WorkspaceReuseUnsupported(why) => ("workspace_reuse_unsupported", (*why).to_string()),
        Error::Invalid { detail, .. } => ("validation_failed", detail.clone()),
        _ => ("materialization_failed", "preparing the workspace failed".into()),
    }
}

pub async fn list(ctx: &Ctx, p: &UnboundPrincipal, task_id: TaskId, page: PageRequest) -> Result<Page<SessionView>> {
    crate::domain::tasks::readable(&ctx.db.conn, p, task_id).await?;
    let rows = store::page_of_task(&ctx.db.conn, task_id, page.before, page.fetch()).await?;
    // I19/I20: each with its environment's effective workspace path.
    Ok(Page::from_rows(rows, &page, |(s, _)| s.id).map(|(s, e)| SessionView {
        session: s,
        node: e.as_ref().map(|e| super::access::node_of(ctx, &e.node_id)),
        workspace_path: e.and_then(|e| e.workspace_path),
    }))
}

pub async fn get(ctx: &Ctx, p: &Principal, id: SessionId) -> Result<SessionView> {
    let s = visible(&ctx.db.conn, p, id).await?;
    project(ctx, s).await
}

/// Makes a session its task's primary.
pub async fn make_primary(ctx: &Ctx, p: &Principal, id: SessionId) -> Result<SessionView> {
    let s = visible(&ctx.db.conn, p, id).await?;
    let txn = ctx.db.begin_write().await?;
    let task = lock_task(&txn, s.task_id).await?;
    let s = reload(&txn, id).await?;
    if !s.is_primary {
        let previous = store::primary_of(&txn, task.id).await?;
        // Clear first: the database allows at most one primary per task.
        store::clear_primary(&txn, task.id).await?;
        store::set_primary(&txn, id, crate::clock::now()).await?;
        events::append(
            &txn,
            ctx.instance_id,
            EventType::SessionPrimaryChanged,
            subject(&task, &s),
            json!({ "previous_session_id": previous.map(|p| p.id), "reason": "requested" }),
        )
        .await?;
    }
    ctx.commit(txn).await?;
    get(ctx, p, id).await
}
