//! Where a task's work happens: on the node whose disk holds it. A task's repositories share a node (the
//! one that registered them); its environment is made there, its agents run there, and every request
//! that touches that disk or those agents is carried out there, whichever replica took it
//! (`api::forward`).
use crate::ids::{EnvironmentId, SessionId, TaskId};

use super::Ctx;
use crate::entity::repository;
use crate::error::{Error, Result};
use crate::store::{environments as env_store, sessions as session_store, tasks as task_store};

/// The one node of these repositories; none when none records one (registered before nodes were).
/// Repositories of two nodes cannot be one task's: `422 repositories_on_different_nodes`.
pub fn common_node<'a>(repos: impl IntoIterator<Item = &'a repository::Model>) -> Result<Option<String>> {
    let mut node: Option<&str> = None;
    for r in repos {
        match (node, r.node_id.as_deref()) {
            (_, None) => {}
            (None, Some(n)) => node = Some(n),
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                return Err(Error::RepositoriesOnDifferentNodes(format!(
                    "the repositories are on nodes {a} and {b}; a task's repositories must be on one node"
                )));
            }
        }
    }
    Ok(node.map(str::to_string))
}

/// The node holding a task's work: its (owner's) current environment's, else its repositories'. None for
/// a task that does not exist (the request then answers 404 where it is) or one bound to no node.
pub async fn of_task(ctx: &Ctx, task_id: TaskId) -> Result<Option<String>> {
    let conn = &ctx.db.conn;
    let Some(task) = task_store::find(conn, task_id).await? else {
        return Ok(None);
    };
    let owner = task_store::owner_of(conn, &task).await?;
    if let Some(env) = env_store::live_of(conn, owner.id).await?.into_iter().next() {
        return Ok(Some(env.node_id));
    }
    let slots = task_store::slots_with_repositories(conn, owner.id).await?;
    common_node(slots.iter().filter_map(|(_, r)| r.as_ref()))
}

/// The node holding a session's work: its environment's, else its task's.
pub async fn of_session(ctx: &Ctx, session_id: SessionId) -> Result<Option<String>> {
    let Some(s) = session_store::find(&ctx.db.conn, session_id).await? else {
        return Ok(None);
    };
    if let Some(env_id) = s.task_environment_id
        && let Some(env) = env_store::find(&ctx.db.conn, env_id).await?
    {
        return Ok(Some(env.node_id));
    }
    of_task(ctx, s.task_id).await
}

/// The node holding an environment.
pub async fn of_environment(ctx: &Ctx, env_id: EnvironmentId) -> Result<Option<String>> {
    Ok(env_store::find(&ctx.db.conn, env_id).await?.map(|e| e.node_id))
}

/// Where to carry out a request for `node`: `None` here; otherwise the URL of a live instance of it
/// (the newest), or `503 node_unavailable`.
pub async fn elsewhere(ctx: &Ctx, node: Option<&str>) -> Result<Option<String>> {
    let Some(node) = node.filter(|n| *n != ctx.config.node_id) else {
        return Ok(None);
    };
    let live = crate::store::nodes::live_instances_of(&ctx.db.conn, node, crate::clock::now()).await?;
    match live.into_iter().next() {
        Some(i) => Ok(Some(i.url)),
        None => match super::state(ctx, node).await? {
            // Given up: what it held is lost; the work is carried out here afresh.
            super::NodeState::Decommissioned => Ok(None),
            state => Err(super::unavailable(ctx, node, state)),
        },
    }
}
