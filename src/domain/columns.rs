//! A workspace's board: ordered columns a task moves through. A workspace starts with `Backlog`,
//! `In progress`, `In review` and `Done`; `tasks:write` adds, renames, reorders and removes them (only an
//! empty one, never the last). A task is in one column: the first unless its creation or a `PATCH` says
//! otherwise. It moves on its own only where a column says so (`moves_in_on`): by default a started
//! session moves a task into `In progress` and a merge into `Done`, and only ever forward (a task in
//! review does not go back to in progress because another session started).
use crate::ids::{ColumnId, WorkspaceId};
use sea_orm::{ConnectionTrait, DatabaseTransaction};
use serde_json::json;

use super::Ctx;
use crate::auth::UnboundPrincipal;
use crate::entity::task;
use crate::entity::workspace_column::{self as column, MovesInOn};
use crate::error::{Error, Result, is_unique_violation};
use crate::events::{self, EventType, Subject};
use crate::store::columns as store;

/// A workspace has at most this many columns.
pub const MAX_COLUMNS: usize = 20;

pub struct NewColumn {
    pub name: String,
    /// Where it goes (0 is first); at the end when absent.
    pub position: Option<i32>,
    pub moves_in_on: Option<MovesInOn>,
}

pub struct ColumnPatch {
    pub name: Option<String>,
    pub position: Option<i32>,
    /// `Some(None)` clears the rule.
    pub moves_in_on: Option<Option<MovesInOn>>,
}

pub async fn list(ctx: &Ctx, p: &UnboundPrincipal, workspace_id: WorkspaceId) -> Result<Vec<column::Model>> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    store::of_workspace(&ctx.db.conn, workspace_id).await
}

pub async fn create(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    workspace_id: WorkspaceId,
    input: NewColumn,
) -> Result<column::Model> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let name = super::required_text("name", &input.name, 100)?;
    let txn = ctx.db.begin_write().await?;
    let mut columns = locked(&txn, workspace_id).await?;
    if columns.len() >= MAX_COLUMNS {
        return Err(Error::invalid("name", "a workspace has at most 20 columns"));
    }
    let now = crate::clock::now();
    let c = column::Model {
        id: ColumnId::now_v7(),
        workspace_id,
        name,
        position: columns.len() as i32,
        moves_in_on: input.moves_in_on,
        created_at: now,
        updated_at: now,
    };
    match store::insert(&txn, &c).await {
        Err(e) if is_unique_violation(&e) => return Err(Error::AlreadyExists("a column with this name exists")),
        other => other?,
    }
    columns.push(c.clone());
    let at = input.position.unwrap_or(c.position);
    let columns = place(&txn, columns, c.id, at).await?;
    changed(&txn, ctx, workspace_id, &columns).await?;
    ctx.commit(txn).await?;
    Ok(columns.into_iter().find(|x| x.id == c.id).unwrap_or(c))
}

pub async fn update(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    workspace_id: WorkspaceId,
    id: ColumnId,
    patch: ColumnPatch,
) -> Result<column::Model> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let name = patch
        .name
        .as_deref()
        .map(|n| super::required_text("name", n, 100))
        .transpose()?;
    let txn = ctx.db.begin_write().await?;
    let mut columns = locked(&txn, workspace_id).await?;
    let c = columns
        .iter_mut()
        .find(|c| c.id == id)
        .ok_or(Error::NotFound("column"))?;
    if let Some(name) = name {
        c.name = name;
    }
    if let Some(rule) = patch.moves_in_on {
        c.moves_in_on = rule;
    }
    c.updated_at = crate::clock::now();
    let saved = c.clone();
    match store::save(&txn, &saved).await {
        Err(e) if is_unique_violation(&e) => return Err(Error::AlreadyExists("a column with this name exists")),
        other => other?,
    }
    let columns = match patch.position {
        Some(at) => place(&txn, columns, id, at).await?,
        None => columns,
    };
    changed(&txn, ctx, workspace_id, &columns).await?;
    ctx.commit(txn).await?;
    Ok(columns.into_iter().find(|x| x.id == id).unwrap_or(saved))
}

/// Removes an empty column (one no task, archived or not, is in); never the last one.
pub async fn remove(ctx: &Ctx, p: &UnboundPrincipal, workspace_id: WorkspaceId, id: ColumnId) -> Result<()> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let txn = ctx.db.begin_write().await?;
    let columns = locked(&txn, workspace_id).await?;
    if !columns.iter().any(|c| c.id == id) {
        return Err(Error::NotFound("column"));
    }
    if columns.len() == 1 {
        return Err(Error::InvalidState("a workspace keeps at least one column".into()));
    }
    let tasks = store::task_count(&txn, id).await?;
    if tasks > 0 {
        return Err(Error::InvalidState(format!(
            "the column holds {tasks} task(s): move them to another column first"
        )));
    }
    store::delete(&txn, id).await?;
    let rest: Vec<column::Model> = columns.into_iter().filter(|c| c.id != id).collect();
    let rest = renumber(&txn, rest).await?;
    changed(&txn, ctx, workspace_id, &rest).await?;
    ctx.commit(txn).await
}

/// The column a task is created in, or moved to: one of its workspace's (422 otherwise); the first when
/// none is asked for.
pub(crate) async fn resolve<C: ConnectionTrait>(
    conn: &C,
    workspace_id: WorkspaceId,
    asked: Option<ColumnId>,
    field: &str,
) -> Result<Option<ColumnId>> {
    let columns = store::of_workspace(conn, workspace_id).await?;
    match asked {
        Some(id) if columns.iter().any(|c| c.id == id) => Ok(Some(id)),
        Some(_) => Err(Error::invalid(field, "is not a column of the task's workspace")),
        None => Ok(columns.first().map(|c| c.id)),
    }
}

/// A session of the task started: the task moves into the column that says so, if that is further on
/// than where it is. In the launch's transaction, under the task's lock.
pub(crate) async fn on_session_started(txn: &DatabaseTransaction, ctx: &Ctx, t: &task::Model) -> Result<()> {
    move_forward(txn, ctx, t, MovesInOn::SessionStarted, "session_started").await
}

/// A task branch of the task was merged: the task moves into the column that takes merged work, if that
/// is further on than where it is. In the merge's transaction, under the task's lock.
pub(crate) async fn on_merged(txn: &DatabaseTransaction, ctx: &Ctx, t: &task::Model) -> Result<()> {
    move_forward(txn, ctx, t, MovesInOn::Merged, "merged").await
}

async fn move_forward(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    t: &task::Model,
    on: MovesInOn,
    reason: &str,
) -> Result<()> {
    let Some(target) = store::moving_in_on(txn, t.workspace_id, on).await? else {
        return Ok(());
    };
    let columns = store::of_workspace(txn, t.workspace_id).await?;
    let here = columns
        .iter()
        .find(|c| Some(c.id) == t.column_id)
        .map_or(0, |c| c.position);
    if t.column_id == Some(target.id) || here >= target.position {
        return Ok(());
    }
    store::move_task(txn, t.id, target.id, crate::clock::now()).await?;
    events::append(
        txn,
        ctx.instance_id,
        EventType::TaskUpdated,
        Subject::task(t.workspace_id, t.id),
        json!({ "changed": { "column_id": target.id }, "reason": reason }),
    )
    .await?;
    Ok(())
}

/// The workspace's columns with the workspace row locked (column writes of one workspace take turns).
async fn locked(txn: &DatabaseTransaction, workspace_id: WorkspaceId) -> Result<Vec<column::Model>> {
    crate::store::workspaces::lock(txn, workspace_id)
        .await?
        .ok_or(Error::NotFound("workspace"))?;
    store::of_workspace(txn, workspace_id).await
}

/// Moves column `id` to position `at` (clamped) and renumbers the rest densely.
async fn place(
    txn: &DatabaseTransaction,
    mut columns: Vec<column::Model>,
    id: ColumnId,
    at: i32,
) -> Result<Vec<column::Model>> {
    if at < 0 {
        return Err(Error::invalid("position", "must be 0 or more"));
    }
    let from = columns
        .iter()
        .position(|c| c.id == id)
        .ok_or(Error::NotFound("column"))?;
    let c = columns.remove(from);
    let at = (at as usize).min(columns.len());
    columns.insert(at, c);
    renumber(txn, columns).await
}

async fn renumber(txn: &DatabaseTransaction, mut columns: Vec<column::Model>) -> Result<Vec<column::Model>> {
    for (i, c) in columns.iter_mut().enumerate() {
        if c.position != i as i32 {
            c.position = i as i32;
            store::save(txn, c).await?;
        }
    }
    Ok(columns)
}

async fn changed(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    workspace_id: WorkspaceId,
    columns: &[column::Model],
) -> Result<()> {
    events::append(
        txn,
        ctx.instance_id,
        EventType::WorkspaceColumnsChanged,
        Subject::workspace(workspace_id),
        json!({ "column_ids": columns.iter().map(|c| c.id).collect::<Vec<_>>() }),
    )
    .await?;
    Ok(())
}
