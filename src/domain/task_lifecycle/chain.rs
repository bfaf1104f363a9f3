//! Inherit chains stay whole (I8): when a task leaves its chain (deleted, or archived while inheritors
//! live on), every task that worked in its environment keeps resolving to an owner.
use crate::ids::{EnvironmentId, TaskId};
use std::collections::HashSet;

use sea_orm::DatabaseTransaction;
use serde_json::json;

use crate::domain::Ctx;
use crate::entity::task::{self, WorkspaceMode};
use crate::error::Result;
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::store::environments as env_store;
use crate::store::tasks::{self as task_store, live_inheritors};

/// How a task leaves its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Leaving {
    /// The row goes: nothing may point at it afterwards.
    Delete,
    /// The row stays, archived: an archived link does not cut a chain, but an archived owner cannot
    /// serve its live inheritors.
    Archive,
}

/// Keeps the chain through `from` whole, in the mutation's transaction; `leaving` is every task the
/// operation removes or archives. An owner hands its environment (`env_id`, if it has one) and its place
/// to the nearest live inheritor outside `leaving`, which the rest of the chain, archived links included,
/// now inherits through. Without a live inheritor, a deleted owner's environment is cleaned by its own
/// job and its direct inheritors become tasks of their own (no environment), the rest of the chain
/// inheriting through them; an archived one keeps its chain (unarchiving a link first needs the owner
/// back). A deleted `inherit_parent` link is spliced out: its children inherit through its parent.
/// Returns whether the environment passed to an heir (the job must not remove it).
pub(super) async fn keep_whole(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    from: &task::Model,
    env_id: Option<EnvironmentId>,
    leaving: &HashSet<TaskId>,
    how: Leaving,
) -> Result<bool> {
    let now = crate::clock::now();
    if from.workspace_mode == WorkspaceMode::InheritParent {
        if how == Leaving::Delete {
            let children: Vec<task::Model> = task_store::children_of(txn, from.id)
                .await?
                .into_iter()
                .filter(|c| !leaving.contains(&c.id))
                .collect();
            task_store::reparent(txn, &children, from.parent_task_id, now).await?;
            for c in &children {
                changed(txn, ctx, c, json!({ "parent_task_id": from.parent_task_id }), from.id).await?;
            }
        }
        return Ok(false);
    }
    let heir = live_inheritors(txn, from.id)
        .await?
        .into_iter()
        .find(|c| !leaving.contains(&c.id));
    let Some(heir) = heir else {
        if how == Leaving::Delete {
            for c in task_store::children_of(txn, from.id).await? {
                if leaving.contains(&c.id) {
                    continue;
                }
                if c.workspace_mode == WorkspaceMode::InheritParent {
                    task_store::reroot(txn, c.id, from.parent_task_id, now).await?;
                    let change = json!({ "workspace_mode": "new_workspace", "parent_task_id": from.parent_task_id });
                    changed(txn, ctx, &c, change, from.id).await?;
                } else {
                    task_store::reparent(txn, std::slice::from_ref(&c), from.parent_task_id, now).await?;
                    changed(txn, ctx, &c, json!({ "parent_task_id": from.parent_task_id }), from.id).await?;
                }
            }
        }
        return Ok(false);
    };
    let env = match env_id {
        Some(id) => env_store::find(txn, id).await?,
        None => None,
    };
    let (heir_parent, all_children) = match how {
        Leaving::Delete => (from.parent_task_id, true),
        Leaving::Archive => (Some(from.id), false),
    };
    let moved =
        task_store::transfer_environment(txn, env.as_ref(), from, &heir, heir_parent, all_children, now).await?;
    // The branches berth made for the environment go with it (the heir deletes them).
    crate::store::branches::transfer(txn, from.id, heir.id).await?;
    let subject = Subject {
        task_environment_id: env.as_ref().map(|e| e.id),
        ..Subject::task(heir.workspace_id, heir.id)
    };
    events::append(
        txn,
        ctx.instance_id,
        EventType::TaskUpdated,
        subject,
        json!({
            "changed": { "workspace_mode": "new_workspace", "parent_task_id": heir_parent },
            "environment_transferred_from": from.id,
        }),
    )
    .await?;
    for c in &moved {
        changed(txn, ctx, c, json!({ "parent_task_id": heir.id }), from.id).await?;
    }
    Ok(env.is_some())
}

/// `task.updated` for a task whose place in a chain changed because `from` left it.
async fn changed(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    t: &task::Model,
    change: serde_json::Value,
    from: TaskId,
) -> Result<()> {
    events::append(
        txn,
        ctx.instance_id,
        EventType::TaskUpdated,
        Subject::task(t.workspace_id, t.id),
        json!({ "changed": change, "chain_left_by": from }),
    )
    .await?;
    Ok(())
}
