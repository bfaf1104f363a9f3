//! Which sessions a principal may act on, and how a session is shown.
use crate::ids::SessionId;
use sea_orm::ConnectionTrait;

use crate::auth::Principal;
use crate::entity::task;
use crate::entity::task_session as session;
use crate::error::{Error, Result};
use crate::events::Subject;
use crate::store::environments as env_store;
use crate::store::sessions as store;

/// A session as readers see it: the workspace path is the environment's, never a copy (I20).
#[derive(Debug, Clone)]
pub struct SessionView {
    pub session: session::Model,
    pub workspace_path: Option<String>,
    /// The node whose disk holds the session's environment, and whether it is up.
    pub node: Option<SessionNode>,
}

/// Where a session's work is, and whether that node can be reached.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct SessionNode {
    pub id: String,
    /// `up`, `down` (requests that need its agent or its disk answer `503 node_unavailable`) or
    /// `decommissioned`.
    pub state: crate::domain::nodes::NodeState,
}

/// The node of an environment as this process last saw it.
pub(crate) fn node_of(ctx: &super::Ctx, node_id: &str) -> SessionNode {
    let state = if node_id == ctx.config.node_id {
        crate::domain::nodes::NodeState::Up
    } else {
        ctx.nodes.cached(node_id)
    };
    SessionNode {
        id: node_id.to_string(),
        state,
    }
}

impl SessionView {
    /// The session row's version (`workspace_path` is the environment's, versioned there).
    pub fn etag(&self) -> String {
        crate::domain::precondition::etag(self.session.row_version)
    }
}

/// A session the principal may act on: in a visible workspace and, for a session-bound token, itself.
pub(crate) async fn visible<C: ConnectionTrait>(conn: &C, p: &Principal, id: SessionId) -> Result<session::Model> {
    Ok(visible_with_task(conn, p, id).await?.0)
}

/// As [`visible`], with the session's task.
pub(crate) async fn visible_with_task<C: ConnectionTrait>(
    conn: &C,
    p: &Principal,
    id: SessionId,
) -> Result<(session::Model, task::Model)> {
    if p.session_id.is_some_and(|bound| bound != id) {
        return Err(Error::NotFound("session"));
    }
    let Some((s, Some(task))) = store::find_with_task(conn, id).await? else {
        return Err(Error::NotFound("session"));
    };
    if !p.sees_workspace(task.workspace_id) {
        return Err(Error::NotFound("session"));
    }
    Ok((s, task))
}

/// I19/I20: the session shows its environment's effective workspace path, and its node.
pub(crate) async fn project(ctx: &super::Ctx, s: session::Model) -> Result<SessionView> {
    let env = match s.task_environment_id {
        Some(env_id) => env_store::find(&ctx.db.conn, env_id).await?,
        None => None,
    };
    // A node the view does not hold up is read again before it is shown down: a node that came up since
    // the last renewal period is up, not down.
    let node = match &env {
        Some(e) => Some(SessionNode {
            id: e.node_id.clone(),
            state: crate::domain::nodes::state(ctx, &e.node_id).await?,
        }),
        None => None,
    };
    Ok(SessionView {
        session: s,
        node,
        workspace_path: env.and_then(|e| e.workspace_path),
    })
}

/// The session, as it is now.
pub(crate) async fn reload<C: ConnectionTrait>(conn: &C, id: SessionId) -> Result<session::Model> {
    store::find(conn, id).await?.ok_or(Error::NotFound("session"))
}

/// The session as it stands, locked for the rest of a write transaction: a transition from what this
/// read cannot miss because another writer moved the row meanwhile (PostgreSQL; SQLite holds the writer
/// lock already). Session rows are taken after task rows and before the event sequence, as every writer does.
pub(crate) async fn reload_locked(txn: &sea_orm::DatabaseTransaction, id: SessionId) -> Result<session::Model> {
    store::find_locked(txn, id).await?.ok_or(Error::NotFound("session"))
}

/// What a session's events are about.
pub(crate) fn subject(task: &task::Model, s: &session::Model) -> Subject {
    Subject {
        session_id: Some(s.id),
        task_environment_id: s.task_environment_id,
        execution_id: s.execution_id,
        ..Subject::task(task.workspace_id, task.id)
    }
}
