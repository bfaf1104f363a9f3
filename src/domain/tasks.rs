//! Tasks: the owners of environments and worktrees. This file holds creation, reads and updates; the
//! lifecycle (archive, delete, cleanup) arrives with its own issue.
use crate::ids::{ColumnId, RepositoryId, SessionId, TaskId, TaskRepositoryId, WorkspaceId};
use std::collections::{HashMap, HashSet};

use sea_orm::ConnectionTrait;
use serde_json::json;

use super::Ctx;
use super::pagination::{Page, PageRequest};
use super::precondition::{IfMatch, etag};
use crate::auth::{Principal, UnboundPrincipal};
use crate::entity::task::{self, TaskKind, WorkspaceMode};
use crate::entity::task_repository;
use crate::entity::workspace::WorkspaceStatus;
use crate::error::{Error, Result};
use crate::events::EventType;
use crate::events::{self, Subject};
use crate::git::BranchName;
use crate::store::sessions as sessions_store;
use crate::store::tasks::{self as store, TaskQuery};

pub const MAX_REPOSITORIES: usize = 20;

pub struct NewTask {
    pub title: String,
    pub description: Option<String>,
    pub kind: TaskKind,
    pub parent_task_id: Option<TaskId>,
    pub workspace_mode: WorkspaceMode,
    pub repositories: Vec<NewSlot>,
    /// The board column it starts in; the workspace's first when absent.
    pub column_id: Option<ColumnId>,
}

pub struct NewSlot {
    pub repository_id: RepositoryId,
    pub base_branch: Option<String>,
    pub branch: Option<String>,
}

pub struct TaskPatch {
    pub title: Option<String>,
    pub description: Option<String>,
    /// Moves the task to this column of its workspace.
    pub column_id: Option<ColumnId>,
}

/// A task with what its readers need alongside it.
#[derive(Debug, Clone)]
pub struct TaskView {
    pub task: task::Model,
    pub repositories: Vec<task_repository::Model>,
    pub primary_session_id: Option<SessionId>,
    pub session_count: u64,
    /// The pull requests berth opened for it.
    pub pull_requests: Vec<crate::entity::pull_request::Model>,
    /// What its sessions' agents spent, deleted sessions included.
    pub usage: super::usage::Totals,
}

impl TaskView {
    /// The task row's version: its own fields (title, description, archive state, slots). The derived
    /// `session_count` and `primary_session_id` are not versioned by it.
    pub fn etag(&self) -> String {
        etag(self.task.row_version)
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct TaskFilter {
    pub archived: bool,
    pub parent_task_id: Option<TaskId>,
    /// Only the tasks in this column.
    pub column_id: Option<ColumnId>,
}

/// A requested slot, parsed: (repository, branch slug, base branch, branch).
type Slot = (RepositoryId, String, Option<String>, Option<String>);

pub async fn create(ctx: &Ctx, p: &UnboundPrincipal, workspace_id: WorkspaceId, input: NewTask) -> Result<TaskView> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let title = super::required_text("title", &input.title, 500)?;
    let description = description(input.description.as_deref())?;
    let slots = parse_slots(&input)?;

    let txn = ctx.db.begin_write().await?;
    // A workspace being deleted takes no new task (its cleanup has listed the tasks it removes).
    let ws = crate::store::workspaces::lock_shared(&txn, workspace_id)
        .await?
        .ok_or(Error::NotFound("workspace"))?;
    if ws.status != WorkspaceStatus::Active {
        return Err(Error::InvalidState("the workspace is being deleted".into()));
    }
    let slots = resolve_slots(&txn, workspace_id, &input, slots).await?;
    let column_id = super::columns::resolve(&txn, workspace_id, input.column_id, "column_id").await?;
    let now = crate::clock::now();
    let id = TaskId::now_v7();
    let model = task::Model {
        id,
        workspace_id,
        parent_task_id: input.parent_task_id,
        slug: crate::executor::task_dir_name(&title, id),
        title,
        description,
        kind: input.kind,
        workspace_mode: input.workspace_mode,
        archived_at: None,
        last_activity_at: now,
        created_at: now,
        updated_at: now,
        row_version: 1,
        imported_from: None,
        column_id,
    };
    let rows: Vec<task_repository::Model> = slots
        .into_iter()
        .enumerate()
        .map(
            |(position, (repository_id, branch_slug, base_branch, branch))| task_repository::Model {
                id: TaskRepositoryId::now_v7(),
                task_id: model.id,
                repository_id,
                branch_slug,
                base_branch,
                branch,
                position: position as i32,
                created_at: now,
            },
        )
        .collect();
    store::insert_with_slots(&txn, &model, &rows).await?;
    events::append(
        &txn,
        ctx.instance_id,
        EventType::TaskCreated,
        Subject::task(workspace_id, model.id),
        json!({ "title": model.title, "kind": model.kind, "parent_task_id": model.parent_task_id }),
    )
    .await?;
    // Only the answer acts on it.
    ctx.commit_answered(txn).await?;
    Ok(TaskView {
        task: model,
        repositories: rows,
        primary_session_id: None,
        session_count: 0,
        pull_requests: Vec::new(),
        usage: Default::default(),
    })
}

/// The requested slots, parsed and checked against each other and the workspace mode (no database).
fn parse_slots(input: &NewTask) -> Result<Vec<Slot>> {
    if input.repositories.len() > MAX_REPOSITORIES {
        return Err(Error::invalid("repositories", format!("at most {MAX_REPOSITORIES}")));
    }
    let mut slots = Vec::with_capacity(input.repositories.len());
    let mut seen = HashSet::new();
    for (i, slot) in input.repositories.iter().enumerate() {
        let field = |name: &str| format!("repositories[{i}].{name}");
        let branch = parse_branch(&field("branch"), slot.branch.as_deref())?;
        let base_branch = parse_branch(&field("base_branch"), slot.base_branch.as_deref())?;
        let branch_slug = branch.clone().unwrap_or_default();
        if !seen.insert((slot.repository_id, branch_slug.clone())) {
            return Err(Error::invalid(
                &field("repository_id"),
                "the same repository and branch appear twice",
            ));
        }
        slots.push((slot.repository_id, branch_slug, base_branch, branch));
    }
    match (input.workspace_mode, input.parent_task_id) {
        (WorkspaceMode::InheritParent, None) => Err(Error::invalid(
            "workspace_mode",
            "inherit_parent needs a parent_task_id",
        )),
        (WorkspaceMode::InheritParent, Some(_)) if !slots.is_empty() => Err(Error::invalid(
            "repositories",
            "an inherit_parent subtask uses its parent's repositories",
        )),
        _ => Ok(slots),
    }
}

/// Inside the creating transaction: checks the parent, takes an `inherit_parent` subtask's slots from it,
/// and share-locks the slots' repositories (PostgreSQL) so a concurrent deregistration waits for this task.
async fn resolve_slots(
    txn: &sea_orm::DatabaseTransaction,
    workspace_id: WorkspaceId,
    input: &NewTask,
    mut slots: Vec<Slot>,
) -> Result<Vec<Slot>> {
    if let Some(parent_id) = input.parent_task_id {
        let parent = store::lock_shared(txn, parent_id)
            .await?
            .filter(|t| t.workspace_id == workspace_id)
            .ok_or_else(|| Error::invalid("parent_task_id", "no such task in this workspace"))?;
        if parent.archived_at.is_some() {
            return Err(Error::TaskArchived);
        }
        if input.workspace_mode == WorkspaceMode::InheritParent {
            slots = store::slots_of(txn, parent_id)
                .await?
                .into_iter()
                .map(|s| (s.repository_id, s.branch_slug, s.base_branch, s.branch))
                .collect();
        }
    }
    let ids: Vec<RepositoryId> = slots.iter().map(|s| s.0).collect();
    let repos = crate::store::repositories::lock_shared_registered_in(txn, workspace_id, &ids).await?;
    let live: HashSet<RepositoryId> = repos.iter().map(|r| r.id).collect();
    if let Some(i) = ids.iter().position(|id| !live.contains(id)) {
        return Err(Error::invalid(
            &format!("repositories[{i}].repository_id"),
            "not a repository of this workspace",
        ));
    }
    // A task's work happens on one node, the one whose disk holds its repositories.
    crate::domain::nodes::placement::common_node(&repos)?;
    Ok(slots)
}

pub async fn list(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    workspace_id: WorkspaceId,
    filter: TaskFilter,
    page: PageRequest,
) -> Result<Page<TaskView>> {
    super::workspaces::visible(&ctx.db.conn, p, workspace_id).await?;
    let query = TaskQuery {
        workspace_id,
        archived: filter.archived,
        parent_task_id: filter.parent_task_id,
        column_id: filter.column_id,
        before: page.before,
        limit: page.fetch(),
    };
    let rows = store::page(&ctx.db.conn, query).await?;
    let page = Page::from_rows(rows, &page, |t| t.id);
    let views = views(&ctx.db.conn, page.items).await?;
    Ok(Page {
        items: views,
        next_cursor: page.next_cursor,
    })
}

pub async fn get(ctx: &Ctx, p: &Principal, id: TaskId) -> Result<TaskView> {
    let task = readable(&ctx.db.conn, p, id).await?;
    Ok(views(&ctx.db.conn, vec![task]).await?.remove(0))
}

/// Applies a patch; with `if_match`, only while the task is still the version the caller read.
pub async fn update(
    ctx: &Ctx,
    p: &UnboundPrincipal,
    id: TaskId,
    patch: TaskPatch,
    if_match: &IfMatch,
) -> Result<TaskView> {
    let title = patch
        .title
        .as_deref()
        .map(|t| super::required_text("title", t, 500))
        .transpose()?;
    let description = patch.description.as_deref().map(|d| description(Some(d))).transpose()?;
    let txn = ctx.db.begin_write().await?;
    let task = store::lock_task(&txn, id).await?;
    if !p.sees_workspace(task.workspace_id) {
        return Err(Error::NotFound("task"));
    }
    // Checked under the row lock: of two writers that read one version, the second gets 412.
    if !if_match.admits(&etag(task.row_version)) {
        return Err(Error::PreconditionFailed("task"));
    }
    if task.archived_at.is_some() {
        return Err(Error::TaskArchived);
    }
    let title = title.filter(|t| *t != task.title);
    let description = description.filter(|d| *d != task.description);
    let column_id = match patch.column_id {
        Some(asked) => super::columns::resolve(&txn, task.workspace_id, Some(asked), "column_id")
            .await?
            .filter(|c| task.column_id != Some(*c)),
        None => None,
    };
    let mut changed = serde_json::Map::new();
    if let Some(column_id) = column_id {
        changed.insert("column_id".into(), json!(column_id));
        crate::store::columns::move_task(&txn, id, column_id, crate::clock::now()).await?;
    }
    if let Some(title) = &title {
        changed.insert("title".into(), json!(title));
    }
    if let Some(description) = &description {
        changed.insert("description".into(), json!(description));
    }
    if changed.is_empty() {
        txn.rollback().await?;
        return get(ctx, p, id).await;
    }
    store::update_text(&txn, id, title, description, crate::clock::now()).await?;
    let mut data = json!({ "changed": changed });
    if column_id.is_some() {
        data["reason"] = json!("requested");
    }
    events::append(
        &txn,
        ctx.instance_id,
        EventType::TaskUpdated,
        Subject::task(task.workspace_id, id),
        data,
    )
    .await?;
    // Only the answer acts on it.
    ctx.commit_answered(txn).await?;
    get(ctx, p, id).await
}

/// A task the principal may read: in a visible workspace and, for a session-bound token, the task of
/// its session. Anything else is `not_found` (I33).
pub(crate) async fn readable<C: ConnectionTrait>(conn: &C, p: &Principal, id: TaskId) -> Result<task::Model> {
    let task = store::find(conn, id)
        .await?
        .filter(|t| p.sees_workspace(t.workspace_id))
        .ok_or(Error::NotFound("task"))?;
    if let Some(session_id) = p.session_id
        && !sessions_store::belongs_to_task(conn, session_id, id).await?
    {
        return Err(Error::NotFound("task"));
    }
    Ok(task)
}

/// Loads slots and session facts for a page of tasks in two queries, not two per task.
async fn views<C: ConnectionTrait>(conn: &C, tasks: Vec<task::Model>) -> Result<Vec<TaskView>> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
    let slots = store::slots_of_each(conn, &tasks).await?;
    let sessions = sessions_store::facts_of_tasks(conn, &ids).await?;
    let mut prs: HashMap<TaskId, Vec<crate::entity::pull_request::Model>> = HashMap::new();
    for p in crate::store::pull_requests::of_tasks(conn, &ids).await? {
        prs.entry(p.task_id).or_default().push(p);
    }
    let mut usage = super::usage::of_tasks(conn, &ids).await?;
    let mut counts: HashMap<TaskId, u64> = HashMap::new();
    let mut primaries: HashMap<TaskId, SessionId> = HashMap::new();
    for (task_id, session_id, is_primary) in sessions {
        *counts.entry(task_id).or_default() += 1;
        if is_primary {
            primaries.insert(task_id, session_id);
        }
    }
    Ok(tasks
        .into_iter()
        .zip(slots)
        .map(|(task, repositories)| TaskView {
            repositories,
            primary_session_id: primaries.get(&task.id).copied(),
            session_count: counts.get(&task.id).copied().unwrap_or(0),
            pull_requests: prs.remove(&task.id).unwrap_or_default(),
            usage: usage.remove(&task.id).unwrap_or_default(),
            task,
        })
        .collect())
}

fn description(value: Option<&str>) -> Result<String> {
    let value = value.unwrap_or("");
    if value.chars().count() > 20_000 {
        return Err(Error::invalid("description", "must be at most 20000 characters"));
    }
    Ok(value.to_string())
}

fn parse_branch(field: &str, value: Option<&str>) -> Result<Option<String>> {
    value
        .map(|b| {
            BranchName::parse(b)
                .map(|b| b.as_str().to_string())
                .map_err(|m| Error::invalid(field, m))
        })
        .transpose()
}
