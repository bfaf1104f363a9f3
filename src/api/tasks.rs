//! HTTP for tasks.
use crate::ids::{CleanupJobId, ColumnId, RepositoryId, SessionId, TaskId, WorkspaceId};
use actix_web::{HttpResponse, delete, get, patch, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_actix_web::service_config::ServiceConfig;

use super::cleanup_jobs::CleanupJob;
use super::extract::{
    Authorized, FollowPoint, IfMatchHeader, TasksArchive, TasksDelete, TasksRead, TasksWrite, Unbound,
};
use super::problem::Problem;
use super::{AppState, PageQuery};
use crate::domain::cleanup::branch_report::BranchDecision;
use crate::domain::task_lifecycle::{self as lifecycle, BranchRecovery};
use crate::domain::tasks::{self, NewSlot, NewTask, TaskFilter, TaskPatch, TaskView};
use crate::entity::task::{TaskKind, WorkspaceMode};
use crate::error::Error;
use crate::git::BranchDeletionConsent;
use crate::managed_path::Consent;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(create_task)
        .service(list_tasks)
        .service(get_task)
        .service(update_task)
        .service(archive_task)
        .service(unarchive_task)
        .service(delete_task)
        .service(reset_environment);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TaskRepository {
    pub repository_id: RepositoryId,
    /// The branch the worktree starts from; the repository's default branch when null.
    pub base_branch: Option<String>,
    /// The branch the task works on; berth names one when null.
    pub branch: Option<String>,
    /// The slot key: the branch when one was asked for, else empty.
    pub branch_slug: String,
    pub position: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Task {
    pub id: TaskId,
    pub workspace_id: WorkspaceId,
    pub parent_task_id: Option<TaskId>,
    pub title: String,
    pub description: String,
    pub kind: TaskKind,
    pub workspace_mode: WorkspaceMode,
    pub repositories: Vec<TaskRepository>,
    pub archived_at: Option<DateTime<Utc>>,
    pub primary_session_id: Option<SessionId>,
    pub session_count: u64,
    /// The column of the workspace's board the task is in (`GET /workspaces/{id}/columns`).
    pub column_id: Option<ColumnId>,
    /// The pull requests berth opened for it, with their state as last read from their host.
    pub pull_requests: Vec<crate::domain::landing::pull_requests::PullRequest>,
    /// What its sessions' agents reported their model calls used and cost, deleted sessions included.
    pub usage: super::usage::Usage,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<TaskView> for Task {
    fn from(v: TaskView) -> Self {
        let t = v.task;
        Task {
            id: t.id,
            workspace_id: t.workspace_id,
            parent_task_id: t.parent_task_id,
            title: t.title,
            description: t.description,
            kind: t.kind,
            workspace_mode: t.workspace_mode,
            repositories: v
                .repositories
                .into_iter()
                .map(|s| TaskRepository {
                    repository_id: s.repository_id,
                    base_branch: s.base_branch,
                    branch: s.branch,
                    branch_slug: s.branch_slug,
                    position: s.position,
                })
                .collect(),
            archived_at: t.archived_at,
            primary_session_id: v.primary_session_id,
            session_count: v.session_count,
            column_id: t.column_id,
            pull_requests: v.pull_requests.into_iter().map(Into::into).collect(),
            usage: super::usage::Usage::from(&v.usage),
            created_at: t.created_at,
            updated_at: t.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    pub items: Vec<Task>,
    pub next_cursor: Option<String>,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRepositoryInput {
    pub repository_id: RepositoryId,
    pub base_branch: Option<String>,
    pub branch: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    pub title: String,
    pub description: Option<String>,
    /// Default `standard`.
    pub kind: Option<TaskKind>,
    pub parent_task_id: Option<TaskId>,
    /// Default `new_workspace`. `inherit_parent` uses the parent's environment and repositories.
    pub workspace_mode: Option<WorkspaceMode>,
    #[serde(default)]
    pub repositories: Vec<TaskRepositoryInput>,
    /// The board column it starts in: one of the workspace's; default its first.
    pub column_id: Option<ColumnId>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateTask {
    pub title: Option<String>,
    pub description: Option<String>,
    /// Moves the task to this column of its workspace's board.
    pub column_id: Option<ColumnId>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskListQuery {
    /// `false` (default): live tasks; `true`: archived ones.
    pub archived: Option<bool>,
    /// Only the subtasks of this task.
    pub parent_task_id: Option<TaskId>,
    /// Only the tasks in this column of the workspace's board (newest first, as every listing).
    pub column: Option<ColumnId>,
    /// Page size, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u64>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// Create a task in a workspace
///
/// A task is the unit of work and the owner of its environment: the workspace directory and one worktree
/// per repository it lists, created when its first session needs them. A subtask (`parent_task_id`) with
/// `workspace_mode: inherit_parent` shares its parent's environment and never gets one of its own. Refused
/// with `409 task_archived` under an archived parent, and `422 validation_failed` for a repository from
/// another workspace or an inconsistent mode. Scope `tasks:write`.
#[utoipa::path(
    operation_id = "createTask",
    tag = "tasks",
    security(("bearer" = ["tasks:write"])),
    params(("id" = Uuid, Path, description = "Workspace id")),
    request_body = CreateTask,
    responses(
        (status = 201, description = "Created", body = Task, headers(("Location" = String), ("ETag" = String, description = "The task's version, for `If-Match`"))),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
        (status = 409, description = "The parent task is archived (`task_archived`)", body = Problem),
        (status = 422, description = "Invalid task (`validation_failed`)", body = Problem),
    )
)]
#[post("/workspaces/{id}/tasks")]
async fn create_task(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    id: web::Path<WorkspaceId>,
    body: web::Json<CreateTask>,
) -> Result<HttpResponse, Error> {
    let body = body.into_inner();
    let input = NewTask {
        title: body.title,
        description: body.description,
        kind: body.kind.unwrap_or(TaskKind::Standard),
        parent_task_id: body.parent_task_id,
        workspace_mode: body.workspace_mode.unwrap_or(WorkspaceMode::NewWorkspace),
        repositories: body
            .repositories
            .into_iter()
            .map(|r| NewSlot {
                repository_id: r.repository_id,
                base_branch: r.base_branch,
                branch: r.branch,
            })
            .collect(),
        column_id: body.column_id,
    };
    let task = tasks::create(&state.ctx, &auth, *id, input).await?;
    let etag = task.etag();
    Ok(super::tagged(
        super::created(format!("/api/v1/tasks/{}", task.task.id), &Task::from(task)),
        &etag,
    ))
}

/// List a workspace's tasks
///
/// The workspace's tasks, newest first, one keyset page at a time: unarchived ones by default
/// (`archived=true` for the archived ones), optionally only the subtasks of `parent_task_id`. Scope
/// `tasks:read`.
#[utoipa::path(
    operation_id = "listWorkspaceTasks",
    tag = "tasks",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Workspace id"), TaskListQuery),
    responses(
        (status = 200, description = "Tasks, newest first", body = TaskList),
        (status = 404, description = "No such workspace (`not_found`)", body = Problem),
    )
)]
#[get("/workspaces/{id}/tasks")]
async fn list_tasks(
    auth: Unbound<TasksRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    id: web::Path<WorkspaceId>,
    query: web::Query<TaskListQuery>,
) -> Result<web::Json<TaskList>, Error> {
    let page = PageQuery {
        limit: query.limit,
        cursor: query.cursor.clone(),
    }
    .page()?;
    let filter = TaskFilter {
        archived: query.archived.unwrap_or(false),
        parent_task_id: query.parent_task_id,
        column_id: query.column,
    };
    let page = tasks::list(&state.ctx, &auth, *id, filter, page).await?;
    Ok(web::Json(TaskList {
        items: page.items.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
        latest_seq: seq.0,
    }))
}

/// Get a task
///
/// One task, with its repositories, its primary session and its session count. A token bound to a session
/// may read that session's task. Scope `tasks:read`.
#[utoipa::path(
    operation_id = "getTask",
    tag = "tasks",
    security(("bearer" = ["tasks:read"])),
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task", body = Task, headers(("ETag" = String, description = "The task's version, for `If-Match`"))),
        (status = 404, description = "No such task (`not_found`)", body = Problem),
    )
)]
#[get("/tasks/{id}")]
async fn get_task(
    auth: Authorized<TasksRead>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
) -> Result<HttpResponse, Error> {
    let task = tasks::get(&state.ctx, &auth, *id).await?;
    Ok(super::ok_tagged(&task.etag(), &Task::from(task)))
}

/// Update a task's title or description
///
/// Changes only the fields given; an archived task is read-only (`409 task_archived`). Scope
/// `tasks:write`.
#[utoipa::path(
    operation_id = "updateTask",
    tag = "tasks",
    security(("bearer" = ["tasks:write"])),
    params(
        ("id" = Uuid, Path, description = "Task id"),
        ("If-Match" = Option<String>, Header, description = "The `ETag` the change is based on; `412 precondition_failed` if the task changed since"),
    ),
    request_body = UpdateTask,
    responses(
        (status = 200, description = "The updated task", body = Task, headers(("ETag" = String, description = "The task's new version"))),
        (status = 412, description = "The task changed since the `If-Match` version (`precondition_failed`); nothing changed", body = Problem),
        (status = 404, description = "No such task (`not_found`)", body = Problem),
        (status = 409, description = "The task is archived (`task_archived`)", body = Problem),
        (status = 422, description = "Invalid field (`validation_failed`)", body = Problem),
    )
)]
#[patch("/tasks/{id}")]
async fn update_task(
    auth: Unbound<TasksWrite>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
    body: web::Json<UpdateTask>,
    if_match: IfMatchHeader,
) -> Result<HttpResponse, Error> {
    let body = body.into_inner();
    let patch = TaskPatch {
        title: body.title,
        description: body.description,
        column_id: body.column_id,
    };
    let task = tasks::update(&state.ctx, &auth, *id, patch, &if_match.0).await?;
    Ok(super::ok_tagged(&task.etag(), &Task::from(task)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CascadeQuery {
    /// Also archive the task's live subtasks.
    pub cascade: Option<bool>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Also delete the task's subtasks.
    pub cascade: Option<bool>,
    /// Consent to remove worktrees that hold uncommitted or untracked changes.
    pub discard_worktree_changes: Option<bool>,
    /// Consent to delete without the dirty check, keeping dirty work: each worktree that holds changes
    /// when the job runs is left where it is, untouched, and listed under the workspace's leftovers. The
    /// way to delete a task whose node is down (the check cannot be made there: `503 node_unavailable`
    /// otherwise). Not together with `discard_worktree_changes`.
    pub keep_dirty_worktrees: Option<bool>,
    /// Consent to delete the branches berth created for the task even when they are not merged into
    /// their base and their upstream lacks commits. Branches the user named or that existed before the
    /// task are never deleted.
    pub delete_branches: Option<bool>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ResetQuery {
    /// Consent to remove worktrees that hold uncommitted or untracked changes.
    pub discard_worktree_changes: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ArchiveResult {
    pub task: Task,
    pub cleanup_jobs: Vec<CleanupJob>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UnarchiveResult {
    pub task: Task,
    pub cancelled_cleanup_jobs: Vec<CleanupJobId>,
    /// Per repository: whether the task's branch is still there to re-materialize from.
    pub recovery: Vec<BranchRecovery>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CleanupJobs {
    pub cleanup_jobs: Vec<CleanupJob>,
    /// What the jobs will do with each worktree's branch, as things stand now (a job decides again
    /// once its worktree is gone and records what it did in its `resource_snapshot.branches`).
    pub branches: Vec<BranchDecision>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ResetResult {
    pub cleanup_job: CleanupJob,
}

/// Archive a task
///
/// Stops the task's agents, cancels its sessions and marks it archived, then hands the removal of its clean
/// worktrees to a durable cleanup job (branches are kept, and so is a worktree with uncommitted changes), so
/// the work can be picked up again with `unarchiveTask`. With `cascade=true` its live subtasks are archived
/// as well. Refused when already archived (`409 task_archived`) or while a cleanup runs (`409
/// task_cleanup_in_progress`). Scope `tasks:archive`.
#[utoipa::path(
    operation_id = "archiveTask",
    tag = "tasks",
    security(("bearer" = ["tasks:archive"])),
    params(("id" = Uuid, Path, description = "Task id"), CascadeQuery),
    responses(
        (status = 202, description = "Archived: agents stopped, sessions cancelled; a durable job removes the clean worktrees (branches are kept)", body = ArchiveResult),
        (status = 404, description = "No such task (`not_found`)", body = Problem),
        (status = 409, description = "Already archived (`task_archived`), or a cleanup is in progress (`task_cleanup_in_progress`)", body = Problem),
    )
)]
#[post("/tasks/{id}/archive")]
async fn archive_task(
    auth: Unbound<TasksArchive>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
    query: web::Query<CascadeQuery>,
) -> Result<HttpResponse, Error> {
    let (task, jobs) = lifecycle::archive(&state.ctx, &auth, *id, query.cascade.unwrap_or(false)).await?;
    Ok(HttpResponse::Accepted().json(ArchiveResult {
        task: task.into(),
        cleanup_jobs: super::cleanup_jobs::CleanupJob::views(&state.ctx, jobs).await?,
    }))
}

/// Unarchive a task
///
/// Makes the task live again: an archive cleanup not yet started is cancelled, a running one is waited
/// for. The answer says, per repository, whether its branch is still there (`local`) or gone (`missing`),
/// so the next session knows what it resumes from; an old session's launch or resume materializes a fresh
/// environment if the archive cleanup removed it. Refused when the task is not archived (`409 conflict`),
/// and, for an `inherit_parent` task, while the task whose environment it works in is archived (`409
/// task_archived`: unarchive that one first); nothing changes then. Scope `tasks:archive`.
#[utoipa::path(
    operation_id = "unarchiveTask",
    tag = "tasks",
    security(("bearer" = ["tasks:archive"])),
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "Unarchived: a pending archive cleanup is cancelled, a running one waited for", body = UnarchiveResult),
        (status = 404, description = "No such task (`not_found`)", body = Problem),
        (status = 409, description = "The task is not archived (`conflict`), or it inherits the environment of an archived task (`task_archived`); nothing changed", body = Problem),
    )
)]
#[post("/tasks/{id}/unarchive")]
async fn unarchive_task(
    auth: Unbound<TasksArchive>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
) -> Result<web::Json<UnarchiveResult>, Error> {
    let (task, cancelled, recovery) = lifecycle::unarchive(&state.ctx, &auth, *id).await?;
    Ok(web::Json(UnarchiveResult {
        task: task.into(),
        cancelled_cleanup_jobs: cancelled,
        recovery,
    }))
}

/// Delete a task
///
/// Deletes the task and hands the removal of its worktrees, branches and environment to durable cleanup
/// jobs. Uncommitted work is never lost silently: if a worktree is dirty, the answer is `409
/// task_delete_dirty_worktree` listing each repository with its count of dirty files, and nothing changes;
/// repeat with `discard_worktree_changes=true` to consent. While the node that holds a worktree is down the
/// check cannot be made: the answer is `503 node_unavailable` and nothing changes, unless the request says
/// `keep_dirty_worktrees=true`; then the job, run on that node once it is back, keeps each worktree with
/// changes where it is and lists it under the workspace's leftovers. With `cascade=true` its subtasks are
/// deleted too.
/// Once a worktree is gone, its branch is deleted only if berth created it and it is fully merged into its
/// base, or its upstream has every commit, or the request says `delete_branches=true`; a branch the user
/// named or that existed before the task is always kept. `branches` says, per branch, `delete` or `keep`
/// and why. The task's agents are stopped first, on whichever replica runs them: if that replica does
/// not carry the stop out in time, the answer is `503 unavailable` (retryable) and nothing changes.
/// Scope `tasks:delete`.
#[utoipa::path(
    operation_id = "deleteTask",
    tag = "tasks",
    security(("bearer" = ["tasks:delete"])),
    params(("id" = Uuid, Path, description = "Task id"), DeleteQuery),
    responses(
        (status = 202, description = "The task is deleted; durable jobs remove its worktrees and registrations", body = CleanupJobs),
        (status = 404, description = "No such task (`not_found`)", body = Problem),
        (status = 409, description = "`task_delete_dirty_worktree` (with `repositories: [{repository_id, dirty_file_count}]`; nothing changed) or `task_cleanup_in_progress`", body = Problem),
        (status = 422, description = "`keep_dirty_worktrees` and `discard_worktree_changes` both given (`validation_failed`)", body = Problem),
        (status = 503, description = "A worktree's node is down, so the dirty check cannot be made (`node_unavailable`, retryable; nothing changed): repeat with `keep_dirty_worktrees=true` to keep dirty work", body = Problem),
    )
)]
#[delete("/tasks/{id}")]
async fn delete_task(
    auth: Unbound<TasksDelete>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
    query: web::Query<DeleteQuery>,
) -> Result<HttpResponse, Error> {
    let dirty = lifecycle::DirtyConsent::from_flags(query.discard_worktree_changes, query.keep_dirty_worktrees)?;
    let branch_consent = BranchDeletionConsent::from_flag(query.delete_branches);
    let cascade = query.cascade.unwrap_or(false);
    let jobs = lifecycle::delete(&state.ctx, &auth, *id, cascade, dirty, branch_consent).await?;
    let branches = crate::domain::branches::predict(&state.ctx, &jobs).await;
    Ok(HttpResponse::Accepted().json(CleanupJobs {
        cleanup_jobs: super::cleanup_jobs::CleanupJob::views(&state.ctx, jobs).await?,
        branches,
    }))
}

/// Reset a task's environment
///
/// Supersedes the task's current environment and hands the removal of its resources to a durable cleanup
/// job; the next session materializes a fresh one, and so does the next launch or resume of an existing
/// session, through the normal election. The way out of `workspace_reuse_unsafe`. Uncommitted work is never
/// lost silently: if a worktree is dirty, the answer is `409 task_delete_dirty_worktree` listing each
/// repository with its count of dirty files, and nothing changes; repeat with
/// `discard_worktree_changes=true` to consent. Refused with `409 session_busy` while a session of the task
/// runs, and while a cleanup is in progress. Scope `tasks:delete`.
#[utoipa::path(
    operation_id = "resetTaskEnvironment",
    tag = "tasks",
    security(("bearer" = ["tasks:delete"])),
    params(("id" = Uuid, Path, description = "Task id"), ResetQuery),
    responses(
        (status = 202, description = "The environment is superseded; a durable job removes its resources; the next session, launch or resume materializes afresh", body = ResetResult),
        (status = 404, description = "No such task or environment (`not_found`)", body = Problem),
        (status = 409, description = "`task_delete_dirty_worktree` (with `repositories: [{repository_id, dirty_file_count}]`; nothing changed), a session runs (`session_busy`), or a cleanup is in progress (`task_cleanup_in_progress`)", body = Problem),
    )
)]
#[post("/tasks/{id}/environment/reset")]
async fn reset_environment(
    auth: Unbound<TasksDelete>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
    query: web::Query<ResetQuery>,
) -> Result<HttpResponse, Error> {
    let consent = Consent::from_discard_flag(query.discard_worktree_changes);
    let job = lifecycle::reset_environment(&state.ctx, &auth, *id, consent).await?;
    Ok(HttpResponse::Accepted().json(ResetResult {
        cleanup_job: job.into(),
    }))
}
