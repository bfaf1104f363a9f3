//! Sessions: agent conversations that use their task's environment and own nothing physical.
//!
//! The rule for deleting a session lives here: it removes the session row and its conversation history,
//! and nothing else — no directory, worktree registration, branch or cleanup job (I2, I3) — and it is
//! refused while the session is busy (I4).
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use serde_json::json;
use uuid::Uuid;

use super::Ctx;
use super::environments;
use super::pagination::{Page, PageRequest};
use crate::auth::Principal;
use crate::entity::task;
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::entity::task_session::{self as session, SessionState};
use crate::error::{Error, Result};
use crate::events::{self, Subject};
use crate::store::tasks::{ensure_no_cleanup, lock_task};

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
}

pub struct NewSession {
    pub executor_type: ExecutorType,
    pub agent_profile: Option<String>,
    pub name: Option<String>,
    pub prompt: Option<String>,
    /// Launch after attaching; default: when an agent profile resolves.
    pub start: Option<bool>,
}

/// A session as readers see it: the workspace path is the environment's, never a copy (I20).
#[derive(Debug, Clone)]
pub struct SessionView {
    pub session: session::Model,
    pub workspace_path: Option<String>,
}

pub async fn create(ctx: &Ctx, p: &Principal, task_id: Uuid, input: NewSession) -> Result<SessionView> {
    p.require_unbound()?;
    let name = match input.name.as_deref() {
        Some(n) if n.chars().count() > 200 => {
            return Err(Error::invalid("name", "must be at most 200 characters"));
        }
        Some(n) => n.trim().to_string(),
        None => String::new(),
    };
    // The profile named, else the only one configured.
    let agent_profile = match input.agent_profile {
        Some(name) if ctx.config.agents.contains_key(&name) => Some(name),
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
    let prompt = input.prompt.filter(|p| !p.trim().is_empty());
    if prompt.is_some() && !start {
        return Err(Error::invalid(
            "prompt",
            "a prompt is delivered only to a started agent",
        ));
    }
    let task = super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let environment = environments::ensure_ready(ctx, &task, input.executor_type).await?;

    let txn = ctx.db.begin_write().await?;
    // Owner first, then the task (the order every writer uses): a barrier on either is seen.
    if environment.task_id != task_id {
        lock_task(&txn, environment.task_id).await?;
    }
    let task = lock_task(&txn, task_id).await?;
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    // I7: either this session commits before a cleanup barrier, or it is refused.
    ensure_no_cleanup(&txn, &[task.id, environment.task_id]).await?;
    let environment = env::Entity::find_by_id(environment.id)
        .filter(env::Column::Status.is_in([EnvironmentStatus::Ready, EnvironmentStatus::Stopped]))
        .one(&txn)
        .await?
        .ok_or_else(|| Error::Conflict("the task's environment changed meanwhile; retry".into()))?;
    let has_primary = session::Entity::find()
        .filter(session::Column::TaskId.eq(task.id))
        .filter(session::Column::IsPrimary.eq(true))
        .one(&txn)
        .await?
        .is_some();
    let now = crate::clock::now();
    let model = session::Model {
        id: Uuid::now_v7(),
        task_id: task.id,
        task_environment_id: Some(environment.id),
        name,
        executor_type: input.executor_type,
        agent_profile,
        state: SessionState::Created,
        is_primary: !has_primary,
        desired_open: false,
        execution_id: None,
        agent_session_ref: None,
        last_error_code: None,
        last_error_message: None,
        last_activity_at: now,
        created_at: now,
        updated_at: now,
        started_at: None,
        ended_at: None,
    };
    let am: session::ActiveModel = model.clone().into();
    session::Entity::insert(am).exec_without_returning(&txn).await?;
    touch_task(&txn, task.id, now).await?;
    events::append(
        &txn,
        ctx.instance_id,
        "session.created",
        subject(&task, &model),
        json!({ "is_primary": model.is_primary, "executor_type": model.executor_type }),
    )
    .await?;
    ctx.commit(txn).await?;
    if start {
        return super::agents::launch_session(ctx, model, prompt).await;
    }
    Ok(SessionView {
        session: model,
        workspace_path: environment.workspace_path,
    })
}

pub async fn list(ctx: &Ctx, p: &Principal, task_id: Uuid, page: PageRequest) -> Result<Page<SessionView>> {
    p.require_unbound()?;
    super::tasks::readable(&ctx.db.conn, p, task_id).await?;
    let mut q = session::Entity::find().filter(session::Column::TaskId.eq(task_id));
    if let Some(before) = page.before {
        q = q.filter(session::Column::Id.lt(before));
    }
    let rows = q
        .order_by_desc(session::Column::Id)
        .limit(page.fetch())
        .all(&ctx.db.conn)
        .await?;
    let page = Page::from_rows(rows, &page, |s| s.id);
    let mut items = Vec::with_capacity(page.items.len());
    for s in page.items {
        items.push(project(&ctx.db.conn, s).await?);
    }
    Ok(Page {
        items,
        next_cursor: page.next_cursor,
    })
}

pub async fn get(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<SessionView> {
    let s = visible(&ctx.db.conn, p, id).await?;
    project(&ctx.db.conn, s).await
}

/// Deletes a session: its row and conversation history, nothing else (I2). Refused while busy (I4).
pub async fn delete(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<()> {
    let s = visible(&ctx.db.conn, p, id).await?;
    let txn = ctx.db.begin_write().await?;
    let task = lock_task(&txn, s.task_id).await?;
    // Re-read under the task's lock: the state may have moved since.
    let s = session::Entity::find_by_id(id)
        .one(&txn)
        .await?
        .ok_or(Error::NotFound("session"))?;
    if s.state.is_busy() {
        return Err(Error::SessionBusy);
    }
    if ctx.runtime.is_live(id) {
        // I4: an idle or attention session has its process stopped first (outside the transaction).
        drop(txn);
        super::agents::stop_session(ctx, &s).await?;
        return Box::pin(delete(ctx, p, id)).await;
    }
    session::Entity::delete_by_id(id).exec(&txn).await?;
    events::append(
        &txn,
        ctx.instance_id,
        "session.deleted",
        subject(&task, &s),
        json!({ "was_primary": s.is_primary }),
    )
    .await?;
    if s.is_primary
        && let Some(promoted) = promote(&txn, task.id).await?
    {
        events::append(
            &txn,
            ctx.instance_id,
            "session.primary_changed",
            subject(&task, &promoted),
            json!({ "previous_session_id": id, "reason": "primary_deleted" }),
        )
        .await?;
    }
    ctx.commit(txn).await?;
    Ok(())
}

/// Makes a session its task's primary.
pub async fn make_primary(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<SessionView> {
    let s = visible(&ctx.db.conn, p, id).await?;
    let txn = ctx.db.begin_write().await?;
    let task = lock_task(&txn, s.task_id).await?;
    let s = session::Entity::find_by_id(id)
        .one(&txn)
        .await?
        .ok_or(Error::NotFound("session"))?;
    if !s.is_primary {
        let previous = session::Entity::find()
            .filter(session::Column::TaskId.eq(task.id))
            .filter(session::Column::IsPrimary.eq(true))
            .one(&txn)
            .await?;
        // Clear first: the database allows at most one primary per task.
        session::Entity::update_many()
            .col_expr(session::Column::IsPrimary, sea_orm::sea_query::Expr::value(false))
            .filter(session::Column::TaskId.eq(task.id))
            .filter(session::Column::IsPrimary.eq(true))
            .exec(&txn)
            .await?;
        set_primary(&txn, id).await?;
        events::append(
            &txn,
            ctx.instance_id,
            "session.primary_changed",
            subject(&task, &s),
            json!({ "previous_session_id": previous.map(|p| p.id), "reason": "requested" }),
        )
        .await?;
    }
    ctx.commit(txn).await?;
    get(ctx, p, id).await
}

/// I4: a running session first, then the most recently active non-terminal one, then any.
async fn promote(txn: &DatabaseTransaction, task_id: Uuid) -> Result<Option<session::Model>> {
    let candidates = session::Entity::find()
        .filter(session::Column::TaskId.eq(task_id))
        .order_by_desc(session::Column::LastActivityAt)
        .order_by_desc(session::Column::Id)
        .all(txn)
        .await?;
    let chosen = candidates
        .iter()
        .find(|s| s.state == SessionState::Running)
        .or_else(|| candidates.iter().find(|s| !s.state.is_terminal()))
        .or_else(|| candidates.first())
        .cloned();
    if let Some(s) = &chosen {
        set_primary(txn, s.id).await?;
    }
    Ok(chosen)
}

async fn set_primary(txn: &DatabaseTransaction, id: Uuid) -> Result<()> {
    session::Entity::update(session::ActiveModel {
        id: Set(id),
        is_primary: Set(true),
        updated_at: Set(crate::clock::now()),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

async fn touch_task(txn: &DatabaseTransaction, task_id: Uuid, now: chrono::DateTime<chrono::Utc>) -> Result<()> {
    task::Entity::update(task::ActiveModel {
        id: Set(task_id),
        last_activity_at: Set(now),
        ..Default::default()
    })
    .exec(txn)
    .await?;
    Ok(())
}

/// A session the principal may act on: in a visible workspace and, for a session-bound token, itself.
pub(crate) async fn visible<C: ConnectionTrait>(conn: &C, p: &Principal, id: Uuid) -> Result<session::Model> {
    if p.session_id.is_some_and(|bound| bound != id) {
        return Err(Error::NotFound("session"));
    }
    let s = session::Entity::find_by_id(id)
        .one(conn)
        .await?
        .ok_or(Error::NotFound("session"))?;
    let task = task::Entity::find_by_id(s.task_id)
        .one(conn)
        .await?
        .ok_or(Error::NotFound("session"))?;
    if !p.sees_workspace(task.workspace_id) {
        return Err(Error::NotFound("session"));
    }
    Ok(s)
}

/// I19/I20: the session shows its environment's effective workspace path.
pub(crate) async fn project<C: ConnectionTrait>(conn: &C, s: session::Model) -> Result<SessionView> {
    let workspace_path = match s.task_environment_id {
        Some(env_id) => env::Entity::find_by_id(env_id)
            .one(conn)
            .await?
            .and_then(|e| e.workspace_path),
        None => None,
    };
    Ok(SessionView {
        session: s,
        workspace_path,
    })
}

fn subject(task: &task::Model, s: &session::Model) -> Subject {
    Subject {
        session_id: Some(s.id),
        task_environment_id: s.task_environment_id,
        execution_id: s.execution_id,
        ..Subject::task(task.workspace_id, task.id)
    }
}
