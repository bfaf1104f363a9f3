//! HTTP for sessions.
use crate::ids::{EnvironmentId, ExecutionId, SessionId, TaskId};
use actix_web::{HttpResponse, delete, get, post, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_actix_web::service_config::ServiceConfig;

use super::extract::{Authorized, FollowPoint, SessionsDelete, SessionsRead, SessionsWrite, Unbound};
use super::problem::Problem;
use super::{AppState, PageQuery};
use crate::domain::sessions::{self, NewSession, SessionView};
use crate::entity::task_session::{ExecutorType, SessionState};
use crate::error::Error;

pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(create_session)
        .service(list_sessions)
        .service(get_session)
        .service(delete_session)
        .service(make_primary)
        .service(launch_session)
        .service(resume_session)
        .service(stop_session)
        .service(abort_session)
        .service(answer_attention);
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchSession {
    /// A first prompt to deliver once the agent runs.
    pub prompt: Option<String>,
}

/// An optional JSON body: empty means the defaults; anything else must parse strictly.
fn optional_body<T: serde::de::DeserializeOwned + Default>(bytes: &web::Bytes) -> Result<T, Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        if e.is_data() && !e.to_string().starts_with("unknown field") {
            Error::Invalid {
                detail: e.to_string(),
                errors: Vec::new(),
            }
        } else {
            Error::BadRequest(e.to_string())
        }
    })
}

/// Launch a session's agent
///
/// Starts the agent in the session's environment after admission; if the agent already runs, answers the
/// session as it is. Refused with `409 workspace_reuse_unsafe` (nothing started or changed),
/// `session_busy`, `task_archived` or `task_cleanup_in_progress`; `409 conflict` when the agent command
/// could not start (the session is then `failed`); `422` when the session has no agent profile. Scope
/// `sessions:write`.
#[utoipa::path(
    operation_id = "launchSession",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id")),
    request_body(content = Option<LaunchSession>, description = "Optional"),
    responses(
        (status = 200, description = "The session with its agent running (or the running one, if it already was)", body = Session),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 409, description = "`workspace_reuse_unsafe` (admission refused; nothing started or changed), `session_busy`, `task_archived`, `task_cleanup_in_progress`, or `conflict` when the agent command could not start (the session is `failed`)", body = Problem),
        (status = 422, description = "The session has no agent profile (`validation_failed`)", body = Problem),
    )
)]
#[post("/sessions/{id}/launch")]
async fn launch_session(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
    body: web::Bytes,
) -> Result<web::Json<Session>, Error> {
    start(auth, state, *id, body).await
}

/// Launch and resume are one act: the agent started (again) in the session's environment, through
/// admission, with an optional first prompt.
async fn start(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    id: SessionId,
    body: web::Bytes,
) -> Result<web::Json<Session>, Error> {
    let body: LaunchSession = optional_body(&body)?;
    Ok(web::Json(
        sessions::launch(&state.ctx, &auth, id, body.prompt).await?.into(),
    ))
}

/// Resume a stopped session
///
/// Starts the agent again in the same environment, through admission, continuing the same agent
/// conversation. Refused as `launchSession` is. Scope `sessions:write`.
#[utoipa::path(
    operation_id = "resumeSession",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id")),
    request_body(content = Option<LaunchSession>, description = "Optional"),
    responses(
        (status = 200, description = "The session with its agent running again, in the same workspace, through admission", body = Session),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 409, description = "As for launch", body = Problem),
    )
)]
#[post("/sessions/{id}/resume")]
async fn resume_session(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
    body: web::Bytes,
) -> Result<web::Json<Session>, Error> {
    start(auth, state, *id, body).await
}

/// Stop a session's agent
///
/// Clears `desired_open` so nothing restarts it, aborts a working agent, then terminates it (escalating if
/// it does not exit). The transcript is kept and the session can be resumed. On a multi-replica deployment
/// the replica running the agent carries it out; if it does not in time, `503 unavailable` (retryable) and
/// nothing was done. Scope `sessions:write`.
#[utoipa::path(
    operation_id = "stopSession",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "Stopped: desired_open cleared, a working agent aborted, then terminated with escalation; the transcript is kept", body = Session),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 503, description = "Another replica runs the agent and did not carry the request out in time; nothing was done (`unavailable`, retryable)", body = Problem),
    )
)]
#[post("/sessions/{id}/stop")]
async fn stop_session(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
) -> Result<web::Json<Session>, Error> {
    Ok(web::Json(sessions::stop(&state.ctx, &auth, *id).await?.into()))
}

/// Abort a session's current turn
///
/// Aborts what the agent is doing now, ahead of anything queued: messages berth has queued are cancelled,
/// and the session goes back to idle with its agent still running. Refused with `409 conflict` when no
/// agent runs. Scope `sessions:write`.
#[utoipa::path(
    operation_id = "abortSession",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The current turn is aborted ahead of anything queued: berth's queued messages are cancelled, and the session goes back to idle with its agent running", body = Session),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 503, description = "Another replica runs the agent and did not carry the request out in time; nothing was done (`unavailable`, retryable)", body = Problem),
        (status = 409, description = "The session has no running agent (`conflict`)", body = Problem),
    )
)]
#[post("/sessions/{id}/abort")]
async fn abort_session(
    auth: Authorized<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
) -> Result<web::Json<Session>, Error> {
    Ok(web::Json(sessions::abort(&state.ctx, &auth, *id).await?.into()))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionError {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Session {
    pub id: SessionId,
    pub task_id: TaskId,
    pub task_environment_id: Option<EnvironmentId>,
    pub name: String,
    pub executor_type: ExecutorType,
    pub agent_profile: Option<String>,
    pub state: SessionState,
    pub is_primary: bool,
    pub desired_open: bool,
    /// The environment's effective workspace path (never a copy kept on the session).
    pub workspace_path: Option<String>,
    /// The node whose disk holds the environment (and where its agent runs), and whether it is up;
    /// absent before the environment exists.
    pub node: Option<crate::domain::sessions::SessionNode>,
    pub execution_id: Option<ExecutionId>,
    /// The agent's own identity of the conversation this session continues (Pi: its `sessionId`), once
    /// recorded; every relaunch continues exactly that conversation.
    pub agent_session_ref: Option<String>,
    pub last_error: Option<SessionError>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// What its agent reported its model calls used and cost (issue 42); on `GET /sessions/{id}` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<super::usage::Usage>,
}

impl From<SessionView> for Session {
    fn from(v: SessionView) -> Self {
        let s = v.session;
        Session {
            id: s.id,
            task_id: s.task_id,
            task_environment_id: s.task_environment_id,
            name: s.name,
            executor_type: s.executor_type,
            agent_profile: s.agent_profile,
            state: s.state,
            is_primary: s.is_primary,
            desired_open: s.desired_open,
            workspace_path: v.workspace_path,
            node: v.node,
            execution_id: s.execution_id,
            agent_session_ref: s.agent_session_ref.clone(),
            last_error: s.last_error_code.map(|code| SessionError {
                code,
                message: s.last_error_message.unwrap_or_default(),
            }),
            created_at: s.created_at,
            updated_at: s.updated_at,
            started_at: s.started_at,
            ended_at: s.ended_at,
            usage: None,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub items: Vec<Session>,
    pub next_cursor: Option<String>,
    /// Every event with `seq <= latest_seq` is reflected in this list: follow with
    /// `GET /events/stream?after=<latest_seq>` to miss nothing.
    pub latest_seq: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// `worktree`: one git worktree per repository slot; `local`: the registered repository itself.
    pub executor_type: ExecutorType,
    /// A profile from the config file (`GET /api/v1/agent-profiles`).
    pub agent_profile: Option<String>,
    pub name: Option<String>,
    /// A first prompt for the agent (needs `start`).
    pub prompt: Option<String>,
    /// Launch the agent after admission. Default: true when an agent profile resolves (the one named,
    /// or the only one configured), false otherwise.
    pub start: Option<bool>,
}

/// RFC 7240: `Prefer: respond-async` (among other preferences, any case).
fn prefers_async(req: &actix_web::HttpRequest) -> bool {
    req.headers()
        .get_all("prefer")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| {
            p.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("respond-async")
        })
}

/// Create a session on a task
///
/// A session is one agent conversation; it uses its task's environment and owns nothing on disk. It attaches
/// to the task's ready environment, or materializes it first (the workspace directory and one worktree per
/// repository). With `start` (the default when an agent profile resolves) the agent is launched after
/// admission, which checks that the environment is safe to reuse. Refused with `409 workspace_preparing`
/// (retryable) while another request prepares the environment, `409 workspace_reuse_unsafe` or
/// `workspace_reuse_unsupported` when admission fails (nothing started), and `409 task_archived` or
/// `task_cleanup_in_progress`. Scope `sessions:write`.
#[utoipa::path(
    operation_id = "createSession",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(
        ("id" = Uuid, Path, description = "Task id"),
        ("Prefer" = Option<String>, Header, description = "`respond-async`: answer `202` at once with the session `preparing`, and prepare the environment in the background (`environment.progress` events, then `session.state_changed`)", example = "respond-async"),
    ),
    request_body = CreateSession,
    responses(
        (status = 201, description = "Attached to the task's ready environment, materializing it first if needed", body = Session, headers(("Location" = String), ("ETag" = String, description = "The session's version"))),
        (status = 202, description = "With `Prefer: respond-async`: recorded `preparing`; the task's environment is being prepared. It then becomes `created` (or is launched when `start`), or `failed` with `last_error`", body = Session, headers(("Location" = String), ("Preference-Applied" = String, description = "`respond-async`"))),
        (status = 404, description = "No such task (`not_found`)", body = Problem),
        (status = 409, description = "`workspace_preparing` (retry), `task_archived`, `task_cleanup_in_progress`, `workspace_reuse_unsafe`, `workspace_reuse_unsupported`, or `conflict` when preparing the workspace failed", body = Problem),
        (status = 422, description = "Invalid request (`validation_failed`)", body = Problem),
    )
)]
#[post("/tasks/{id}/sessions")]
async fn create_session(
    auth: Unbound<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<TaskId>,
    req: actix_web::HttpRequest,
    body: web::Json<CreateSession>,
) -> Result<HttpResponse, Error> {
    let body = body.into_inner();
    let input = NewSession {
        executor_type: body.executor_type,
        agent_profile: body.agent_profile,
        name: body.name,
        prompt: body.prompt,
        start: body.start,
    };
    if prefers_async(&req) {
        let view = sessions::create_async(&state.ctx, &auth, *id, input).await?;
        let etag = view.etag();
        let res = HttpResponse::Accepted()
            .insert_header((
                actix_web::http::header::LOCATION,
                format!("/api/v1/sessions/{}", view.session.id),
            ))
            .insert_header(("Preference-Applied", "respond-async"))
            .json(Session::from(view));
        return Ok(super::tagged(res, &etag));
    }
    let view = sessions::create(&state.ctx, &auth, *id, input).await?;
    let etag = view.etag();
    Ok(super::tagged(
        super::created(format!("/api/v1/sessions/{}", view.session.id), &Session::from(view)),
        &etag,
    ))
}

/// List a task's sessions
///
/// The task's sessions, newest first, one keyset page at a time. Scope `sessions:read`.
#[utoipa::path(
    operation_id = "listTaskSessions",
    tag = "sessions",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Task id"), PageQuery),
    responses(
        (status = 200, description = "The task's sessions, newest first", body = SessionList),
        (status = 404, description = "No such task (`not_found`)", body = Problem),
    )
)]
#[get("/tasks/{id}/sessions")]
async fn list_sessions(
    auth: Unbound<SessionsRead>,
    state: web::Data<AppState>,
    seq: FollowPoint,
    id: web::Path<TaskId>,
    query: web::Query<PageQuery>,
) -> Result<web::Json<SessionList>, Error> {
    let page = sessions::list(&state.ctx, &auth, *id, query.page()?).await?;
    Ok(web::Json(SessionList {
        items: page.items.into_iter().map(Into::into).collect(),
        next_cursor: page.next_cursor,
        latest_seq: seq.0,
    }))
}

/// Get a session
///
/// One session with its state, whether it is the task's primary, whether it should be running
/// (`desired_open`) and its last error. A token bound to a session sees only that one. Scope
/// `sessions:read`.
#[utoipa::path(
    operation_id = "getSession",
    tag = "sessions",
    security(("bearer" = ["sessions:read"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session", body = Session, headers(("ETag" = String, description = "The session's version"))),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
    )
)]
#[get("/sessions/{id}")]
async fn get_session(
    auth: Authorized<SessionsRead>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
) -> Result<HttpResponse, Error> {
    let view = sessions::get(&state.ctx, &auth, *id).await?;
    let totals = crate::domain::usage::of_session(&state.ctx, view.session.id).await?;
    let etag = view.etag();
    let mut session = Session::from(view);
    session.usage = Some(super::usage::Usage::from(&totals));
    Ok(super::ok_tagged(&etag, &session))
}

/// Delete a session
///
/// Deletes the session and its conversation. The task's environment, files, worktrees and branches remain:
/// a session owns nothing physical. Refused with `409 session_busy` while it is starting, running,
/// recovering or stopping (stop it first). Needs only `sessions:delete`, which grants nothing on the task.
/// Carried out by the session's node; while that node is down the delete is accepted all the same, and
/// ending its agent and removing its conversation there wait as a `session_delete` cleanup job.
#[utoipa::path(
    operation_id = "deleteSession",
    tag = "sessions",
    security(("bearer" = ["sessions:delete"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 204, description = "The session and its conversation are deleted. The task's workspace, files, worktrees and branches remain."),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
        (status = 409, description = "The session is starting, running, recovering or stopping (`session_busy`)", body = Problem),
        (status = 503, description = "The session's agent runs on an instance that could not be reached in time (`unavailable`, retryable); nothing changed", body = Problem),
    )
)]
#[delete("/sessions/{id}")]
async fn delete_session(
    auth: Authorized<SessionsDelete>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
) -> Result<HttpResponse, Error> {
    sessions::delete(&state.ctx, &auth, *id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Make a session its task's primary
///
/// A task has at most one primary session, the one a client shows first; making this one primary clears the
/// flag on the previous one. Scope `sessions:write`; a session-bound token is refused.
#[utoipa::path(
    operation_id = "makeSessionPrimary",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session, now its task's primary", body = Session),
        (status = 404, description = "No such session (`not_found`)", body = Problem),
    )
)]
#[post("/sessions/{id}/primary")]
async fn make_primary(
    auth: Unbound<SessionsWrite>,
    state: web::Data<AppState>,
    id: web::Path<SessionId>,
) -> Result<web::Json<Session>, Error> {
    Ok(web::Json(sessions::make_primary(&state.ctx, &auth, *id).await?.into()))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttentionAnswer {
    pub value: Option<serde_json::Value>,
    pub confirmed: Option<bool>,
    /// For a permission request: the `optionId` of one of the options the agent offered.
    pub option_id: Option<String>,
    pub cancelled: Option<bool>,
}

/// Answer an agent's attention request
///
/// Answers a question the agent asked (listed in the session snapshot's `attention_requests`): `value` for
/// select, input and editor, `confirmed` for confirm, `option_id` for a permission request (one of its
/// `options`), or `cancelled: true` to decline. `404` when that request
/// is not pending on this session (already answered, or another session's). The agent then goes on. Scope
/// `sessions:write`; a session-bound token is refused (an agent never grants itself a permission).
#[utoipa::path(
    operation_id = "answerAttentionRequest",
    tag = "sessions",
    security(("bearer" = ["sessions:write"])),
    params(("id" = Uuid, Path, description = "Session id"), ("request_id" = String, Path, description = "The agent's request id")),
    request_body = AttentionAnswer,
    responses(
        (status = 200, description = "Answered; the agent goes on", body = Session),
        (status = 404, description = "That request is not pending on this session (`not_found`)", body = Problem),
        (status = 503, description = "Another replica runs the agent and did not carry the request out in time; nothing was done (`unavailable`, retryable)", body = Problem),
        (status = 422, description = "Not the shape the question takes: `value` (select, input, editor), `confirmed` (confirm), `option_id` (one of a permission request's options) or `cancelled: true` (`validation_failed`)", body = Problem),
    )
)]
#[post("/sessions/{id}/attention/{request_id}")]
async fn answer_attention(
    auth: Unbound<SessionsWrite>,
    state: web::Data<AppState>,
    path: web::Path<(SessionId, String)>,
    body: web::Json<AttentionAnswer>,
) -> Result<web::Json<Session>, Error> {
    let (id, request_id) = path.into_inner();
    let b = body.into_inner();
    let answer = sessions::parse_answer(b.value, b.confirmed, b.option_id, b.cancelled)?;
    let view = sessions::answer_attention(&state.ctx, &auth, id, &request_id, answer).await?;
    Ok(web::Json(view.into()))
}
