//! Workspaces: the tenancy boundary. Deletion arrives with the cleanup issue (it is a cleanup job).
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde_json::json;
use uuid::Uuid;

use super::Ctx;
use super::error::{Error, Result, is_unique_violation};
use super::pagination::{Page, PageRequest};
use crate::auth::Principal;
use crate::entity::workspace;
use crate::events::{self, Subject};

pub async fn create(ctx: &Ctx, p: &Principal, name: &str) -> Result<workspace::Model> {
    p.require_unbound()?;
    if p.workspace_filter().is_some() {
        // Names are unique across workspaces: a limited token must not learn other tenants' names.
        return Err(Error::Forbidden(
            "a token limited to some workspaces cannot create workspaces",
        ));
    }
    let name = super::required_text("name", name, 100)?;
    let now = crate::domain::now();
    let model = workspace::Model {
        id: Uuid::now_v7(),
        name,
        status: "active".into(),
        created_at: now,
        updated_at: now,
    };
    let txn = ctx.db.begin_write().await?;
    let inserted = workspace::Entity::insert(workspace::ActiveModel {
        id: Set(model.id),
        name: Set(model.name.clone()),
        status: Set(model.status.clone()),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .exec_without_returning(&txn)
    .await;
    match inserted {
        Err(e) if is_unique_violation(&e) => {
            return Err(Error::Conflict("a workspace with this name exists".into()));
        }
        other => other?,
    };
    events::append(
        &txn,
        ctx.instance_id,
        "workspace.created",
        Subject::workspace(model.id),
        json!({ "name": model.name }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(model)
}

pub async fn list(ctx: &Ctx, p: &Principal, page: PageRequest) -> Result<Page<workspace::Model>> {
    p.require_unbound()?;
    let mut q = workspace::Entity::find();
    if let Some(ids) = p.workspace_filter() {
        q = q.filter(workspace::Column::Id.is_in(ids.iter().copied()));
    }
    if let Some(before) = page.before {
        q = q.filter(workspace::Column::Id.lt(before));
    }
    let rows = q
        .order_by_desc(workspace::Column::Id)
        .limit(page.fetch())
        .all(&ctx.db.conn)
        .await?;
    Ok(Page::from_rows(rows, &page, |w| w.id))
}

pub async fn get(ctx: &Ctx, p: &Principal, id: Uuid) -> Result<workspace::Model> {
    p.require_unbound()?;
    visible(&ctx.db.conn, p, id).await
}

/// The workspace, if it exists and the token may see it; otherwise `not_found` (I33).
pub(crate) async fn visible<C: ConnectionTrait>(conn: &C, p: &Principal, id: Uuid) -> Result<workspace::Model> {
    if !p.sees_workspace(id) {
        return Err(Error::NotFound("workspace"));
    }
    workspace::Entity::find_by_id(id)
        .one(conn)
        .await?
        .ok_or(Error::NotFound("workspace"))
}
