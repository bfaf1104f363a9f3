//! Workspaces: the tenancy boundary. Deletion arrives with the cleanup issue (it is a cleanup job).
use crate::ids::{EnvironmentId, WorkspaceId};
use sea_orm::ConnectionTrait;
use serde_json::json;

use super::Ctx;
use super::pagination::{Page, PageRequest};
use crate::auth::{Principal, UnboundPrincipal};
use crate::entity::workspace::{self, WorkspaceStatus};
use crate::error::{Error, Result, is_unique_violation};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::store::workspaces as store;
use crate::store::{sessions as sessions_store, tasks as task_store};

pub async fn create(ctx: &Ctx, p: &UnboundPrincipal, name: &str) -> Result<workspace::Model> {
    if p.workspace_filter().is_some() {
        // Names are unique across workspaces: a limited token must not learn other tenants' names.
        return Err(Error::Forbidden(
            "a token limited to some workspaces cannot create workspaces",
        ));
    }
    let name = super::required_text("name", name, 100)?;
    let now = crate::clock::now();
    let model = workspace::Model {
        id: WorkspaceId::now_v7(),
        name,
        status: WorkspaceStatus::Active,
        created_at: now,
        updated_at: now,
    };
    let txn = ctx.db.begin_write().await?;
    match store::insert(&txn, &model).await {
        Err(e) if is_unique_violation(&e) => {
            return Err(Error::AlreadyExists("a workspace with this name exists"));
        }
        other => other?,
    };
    // Its board's default columns.
    crate::store::columns::insert_defaults(&txn, model.id, now).await?;
    events::append(
        &txn,
        ctx.instance_id,
        EventType::WorkspaceCreated,
        Subject::workspace(model.id),
        json!({ "name": model.name }),
    )
    .await?;
    ctx.commit(txn).await?;
    Ok(model)
}

pub async fn list(ctx: &Ctx, p: &UnboundPrincipal, page: PageRequest) -> Result<Page<workspace::Model>> {
    let rows = store::page(&ctx.db.conn, p.workspace_filter(), page.before, page.fetch()).await?;
    Ok(Page::from_rows(rows, &page, |w| w.id))
}

pub async fn get(ctx: &Ctx, p: &UnboundPrincipal, id: WorkspaceId) -> Result<workspace::Model> {
    visible(&ctx.db.conn, p, id).await
}

/// The workspace, if it exists and the token may see it; otherwise `not_found` (I33).
pub(crate) async fn visible<C: ConnectionTrait>(conn: &C, p: &Principal, id: WorkspaceId) -> Result<workspace::Model> {
    if !p.sees_workspace(id) {
        return Err(Error::NotFound("workspace"));
    }
    store::find(conn, id).await?.ok_or(Error::NotFound("workspace"))
}

/// Counts of one directory (or the whole workspace).
#[derive(Debug, Default, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct SessionCounts {
    pub open: u64,
    pub working: u64,
    pub recovering: u64,
    pub attention: u64,
    pub error: u64,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct DirectorySummary {
    pub task_environment_id: EnvironmentId,
    pub workspace_path: Option<String>,
    #[serde(flatten)]
    pub sessions: SessionCounts,
    /// Set when six or more sessions are open here: they share files and git state (a warning, no cap).
    pub warning: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct WorkspaceSummary {
    pub tasks_active: u64,
    pub tasks_archived: u64,
    pub sessions: SessionCounts,
    pub directories: Vec<DirectorySummary>,
}

/// The workspace's summary, from stored state only (it is polled): no per-session process queries.
pub async fn summary(ctx: &Ctx, p: &UnboundPrincipal, id: WorkspaceId) -> Result<WorkspaceSummary> {
    use crate::entity::task_session::SessionState;
    visible(&ctx.db.conn, p, id).await?;
    let tasks = task_store::archival_of_workspace(&ctx.db.conn, id).await?;
    let archived = tasks.iter().filter(|t| t.1.is_some()).count() as u64;
    let sessions = sessions_store::of_workspace(&ctx.db.conn, id).await?;
    let mut total = SessionCounts::default();
    let mut dirs: std::collections::BTreeMap<EnvironmentId, SessionCounts> = Default::default();
    for s in &sessions {
        let count = |c: &mut SessionCounts| {
            if s.desired_open && !s.state.is_terminal() {
                c.open += 1;
            }
            match s.state {
                SessionState::Running | SessionState::Starting => c.working += 1,
                SessionState::Recovering => c.recovering += 1,
                SessionState::Attention => c.attention += 1,
                SessionState::Failed => c.error += 1,
                _ => {}
            }
        };
        count(&mut total);
        if let Some(env_id) = s.task_environment_id {
            count(dirs.entry(env_id).or_default());
        }
    }
    let paths: std::collections::HashMap<EnvironmentId, Option<String>> =
        crate::store::environments::workspace_paths(&ctx.db.conn, dirs.keys().copied())
            .await?
            .into_iter()
            .collect();
    let directories = dirs
        .into_iter()
        .map(|(env_id, counts)| DirectorySummary {
            task_environment_id: env_id,
            workspace_path: paths.get(&env_id).cloned().flatten(),
            warning: (counts.open >= 6).then(|| {
                format!(
                    "{} sessions are open in this directory; they share its files and git state",
                    counts.open
                )
            }),
            sessions: counts,
        })
        .collect();
    Ok(WorkspaceSummary {
        tasks_active: tasks.len() as u64 - archived,
        tasks_archived: archived,
        sessions: total,
        directories,
    })
}
