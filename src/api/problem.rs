//! RFC 9457 problem+json: the one place where domain errors become HTTP responses.
use crate::ids::EnvironmentId;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ConversationCategory, Error, FieldError, ReuseCategory};

pub use super::error_code::ErrorCode;

/// An `application/problem+json` body. Never carries a path, a token, a secret or a stack trace.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_url: String,
    pub title: String,
    pub status: u16,
    pub code: ErrorCode,
    pub detail: String,
    pub retryable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The request id (also in `X-Request-Id`): enough to find the log line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// The scope that was missing, for `insufficient_scope`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_scope: Option<String>,
    /// How many live tasks hold a repository, for `repository_in_use`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_count: Option<u64>,
    /// Why, for `workspace_reuse_unsafe` and `agent_session_unavailable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<ProblemCategory>,
    /// For `task_delete_dirty_worktree`: which repositories hold how many changed files (no paths).
    /// The same list as `dirty_repositories`, kept for clients written before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repositories: Option<Vec<crate::error::DirtyRepository>>,
    /// For `task_delete_dirty_worktree`: each worktree holding changes, by repository and the environment
    /// it belongs to (the task's current one or an earlier one the operation also removes), with its
    /// count of changed files (no paths).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dirty_repositories: Option<Vec<crate::error::DirtyRepository>>,
    /// The environment concerned, when there is one (for example a failed preparation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_environment_id: Option<EnvironmentId>,
    /// For `node_unavailable`: the node whose agents or disk the request needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// For `merge_conflict`: the paths both sides changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflicting_paths: Option<Vec<String>>,
    /// For a writer refused because another holds the environment's worktrees (`session_busy`,
    /// `restore_in_progress`, `landing_in_progress`, `task_cleanup_in_progress`): who holds them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writer: Option<crate::error::WriterHolding>,
}

/// The `category` of a problem: why a workspace may not be reused, or why a conversation is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ProblemCategory {
    Reuse(ReuseCategory),
    Conversation(ConversationCategory),
}

impl Problem {
    pub fn new(status: StatusCode, code: ErrorCode, title: &str, detail: impl Into<String>) -> Problem {
        Problem {
            type_url: format!("https://berth.dev/problems/{}", code.as_str()),
            title: title.to_string(),
            status: status.as_u16(),
            code,
            detail: detail.into(),
            retryable: false,
            retry_after_ms: None,
            action: None,
            request_id: super::middleware::current_request_id(),
            errors: Vec::new(),
            required_scope: None,
            task_count: None,
            category: None,
            repositories: None,
            dirty_repositories: None,
            task_environment_id: None,
            node_id: None,
            conflicting_paths: None,
            writer: None,
        }
    }

    pub fn response(&self) -> HttpResponse {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut res = HttpResponse::build(status);
        res.insert_header((
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        ));
        if self.code == ErrorCode::Unauthenticated {
            res.insert_header((
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"berth\""),
            ));
        }
        if let Some(ms) = self.retry_after_ms {
            res.insert_header((header::RETRY_AFTER, ms.div_ceil(1000).to_string()));
        }
        res.body(serde_json::to_string(self).unwrap_or_default())
    }
}

impl From<&Error> for Problem {
    fn from(err: &Error) -> Problem {
        use ErrorCode as C;
        use StatusCode as S;
        match err {
            Error::Unauthenticated(why) => {
                Problem::new(S::UNAUTHORIZED, C::Unauthenticated, "Authentication required", *why)
            }
            Error::InsufficientScope(scope) => Problem {
                required_scope: Some(scope.to_string()),
                ..Problem::new(
                    S::FORBIDDEN,
                    C::InsufficientScope,
                    "Insufficient scope",
                    format!("this operation needs the {scope} scope"),
                )
            },
            Error::SessionBound => Problem::new(
                S::FORBIDDEN,
                C::InsufficientScope,
                "Insufficient scope",
                "a session-bound token acts only on its session",
            ),
            Error::Forbidden(why) => Problem::new(S::FORBIDDEN, C::InsufficientScope, "Insufficient scope", *why),
            Error::NotFound(what) => Problem::new(S::NOT_FOUND, C::NotFound, "Not found", format!("{what} not found")),
            Error::BadRequest(detail) => {
                Problem::new(S::BAD_REQUEST, C::ValidationFailed, "Bad request", detail.clone())
            }
            Error::Invalid { detail, errors } => Problem {
                errors: errors.clone(),
                ..Problem::new(
                    S::UNPROCESSABLE_ENTITY,
                    C::ValidationFailed,
                    "Validation failed",
                    detail.clone(),
                )
            },
            Error::PayloadTooLarge { limit } => Problem::new(
                S::PAYLOAD_TOO_LARGE,
                C::ValidationFailed,
                "Request body too large",
                format!("the body must be at most {limit} bytes"),
            ),
            Error::Stale(detail) => Problem {
                retryable: true,
                ..Problem::new(S::CONFLICT, C::Conflict, "Changed meanwhile", detail.clone())
            },
            Error::InvalidState(detail) => Problem::new(S::CONFLICT, C::Conflict, "Conflict", detail.clone()),
            Error::AlreadyExists(detail) => Problem::new(S::CONFLICT, C::Conflict, "Already exists", *detail),
            Error::TaskArchived => Problem {
                action: Some("unarchive_task".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::TaskArchived,
                    "Task is archived",
                    "unarchive the task first",
                )
            },
            Error::OwnerArchived => Problem {
                action: Some("unarchive_task".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::TaskArchived,
                    "Environment owner is archived",
                    "the task works in the environment of an archived task: unarchive that task first; nothing was changed",
                )
            },
            Error::RepositoryInUse { task_count } => Problem {
                task_count: Some(*task_count),
                ..Problem::new(
                    S::CONFLICT,
                    C::RepositoryInUse,
                    "Repository in use",
                    "archive or delete the tasks that use this repository first",
                )
            },
            Error::NotAGitRepository(detail) => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                C::NotAGitRepository,
                "Not a git repository",
                *detail,
            ),
            Error::PathNotAllowed(detail) => {
                Problem::new(S::UNPROCESSABLE_ENTITY, C::PathNotAllowed, "Path not allowed", *detail)
            }
            Error::InvalidCursor => Problem::new(
                S::BAD_REQUEST,
                C::InvalidCursor,
                "Invalid cursor",
                "the cursor is not one this list returned; start again without it",
            ),
            Error::PreconditionFailed(what) => Problem {
                action: Some(format!("reload_{what}")),
                ..Problem::new(
                    S::PRECONDITION_FAILED,
                    C::PreconditionFailed,
                    "Changed since you read it",
                    format!("the {what} changed since the version in If-Match; reload it and apply your change again"),
                )
            },
            Error::TaskCleanupInProgress => Problem::new(
                S::CONFLICT,
                C::TaskCleanupInProgress,
                "Task cleanup in progress",
                "the task's resources are being cleaned up; nothing new can be created for it",
            ),
            Error::WorkspacePreparing => Problem {
                retryable: true,
                retry_after_ms: Some(1000),
                ..Problem::new(
                    S::CONFLICT,
                    C::WorkspacePreparing,
                    "Workspace is being prepared",
                    "another request is preparing the task's workspace; retry shortly",
                )
            },
            Error::SessionBusy => Problem {
                retryable: true,
                retry_after_ms: Some(0),
                action: Some("stop_session".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::SessionBusy,
                    "Session is busy",
                    "stop the session before deleting it",
                )
            },
            Error::WorkspaceReuseUnsafe(category) => Problem {
                retryable: true,
                action: Some("reset_environment".into()),
                category: Some(ProblemCategory::Reuse(*category)),
                ..Problem::new(
                    S::CONFLICT,
                    C::WorkspaceReuseUnsafe,
                    "Workspace reuse is unsafe",
                    "the task's workspace failed validation; nothing was started or changed",
                )
            },
            Error::AgentSessionUnavailable(category) => Problem {
                action: Some("inspect_session".into()),
                category: Some(ProblemCategory::Conversation(*category)),
                ..Problem::new(
                    S::CONFLICT,
                    C::AgentSessionUnavailable,
                    "The agent's conversation is unavailable",
                    "the session's recorded conversation cannot be continued and is never replaced; nothing was started",
                )
            },
            Error::WorkspaceReuseUnsupported(detail) => Problem {
                action: Some("choose_executor".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::WorkspaceReuseUnsupported,
                    "Workspace reuse unsupported",
                    *detail,
                )
            },
            Error::TaskDeleteDirtyWorktree(repos) => Problem {
                repositories: Some(repos.clone()),
                dirty_repositories: Some(repos.clone()),
                action: Some("discard_worktree_changes".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::TaskDeleteDirtyWorktree,
                    "Worktrees hold changes",
                    "commit or discard the changes, or repeat the request with discard_worktree_changes=true; nothing was changed",
                )
            },
            Error::AgentAuthRequired(detail) => Problem {
                action: Some("check_agent_profile".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::AgentAuthRequired,
                    "The agent requires authentication",
                    detail.clone(),
                )
            },
            Error::SteerUnsupported => Problem {
                action: Some("send_as_follow_up".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::SteerUnsupported,
                    "The agent takes no steering messages",
                    "this session's agent cannot be steered mid-turn; send the message with delivery auto or follow_up, or abort the turn",
                )
            },
            Error::AgentStartFailed => Problem {
                action: Some("check_agent_profile".into()),
                ..Problem::new(
                    S::CONFLICT,
                    C::Conflict,
                    "The agent could not be started",
                    "the agent command could not be started; the session's last_error says why",
                )
            },
            Error::MaterializationFailed {
                environment_id,
                repository_name,
            } => Problem {
                retryable: true,
                task_environment_id: Some(*environment_id),
                ..Problem::new(
                    S::CONFLICT,
                    C::Conflict,
                    "Preparing the workspace failed",
                    format!(
                        "preparing repository {repository_name} failed; the environment's repos say why, and a new session retries"
                    ),
                )
            },
            Error::IdempotencyKeyReused => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                C::IdempotencyKeyReused,
                "Idempotency key reused",
                "this Idempotency-Key was used for another request (method, path, query or body); use a new key",
            ),
            Error::IdempotencyInProgress => Problem {
                retryable: true,
                retry_after_ms: Some(1000),
                ..Problem::new(
                    S::CONFLICT,
                    C::Conflict,
                    "Request in progress",
                    "a request with this Idempotency-Key is still being processed; retry shortly",
                )
            },
            Error::Unavailable(_) => Problem {
                retryable: true,
                retry_after_ms: Some(1000),
                ..Problem::new(
                    S::SERVICE_UNAVAILABLE,
                    C::Unavailable,
                    "Temporarily unavailable",
                    "a dependency (the database or git) is unavailable right now; nothing was changed; retry",
                )
            },
            Error::RepositoriesOnDifferentNodes(detail) => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                C::RepositoriesOnDifferentNodes,
                "Repositories on different nodes",
                detail.clone(),
            ),
            Error::NodeUnavailable {
                node_id,
                decommissioned: false,
                retry_after,
            } => Problem {
                retryable: true,
                retry_after_ms: Some(retry_after.as_millis() as u64),
                node_id: Some(node_id.clone()),
                ..Problem::new(
                    S::SERVICE_UNAVAILABLE,
                    C::NodeUnavailable,
                    "Node unavailable",
                    format!(
                        "node {node_id} holds this work and none of its berth processes is up; nothing was changed; retry once it is back (GET /api/v1/nodes shows it)"
                    ),
                )
            },
            Error::NodeUnavailable { node_id, .. } => Problem {
                node_id: Some(node_id.clone()),
                ..Problem::new(
                    S::SERVICE_UNAVAILABLE,
                    C::NodeUnavailable,
                    "Node decommissioned",
                    format!("node {node_id} was decommissioned: what it held is lost; nothing was changed"),
                )
            },
            Error::NothingToCommit => Problem::new(
                S::CONFLICT,
                C::NothingToCommit,
                "Nothing to commit",
                "the worktrees (or the listed paths) hold no change; nothing was committed",
            ),
            Error::MergeConflict(paths) => Problem {
                conflicting_paths: Some(paths.clone()),
                ..Problem::new(
                    S::CONFLICT,
                    C::MergeConflict,
                    "Merge conflict",
                    "both branches changed the same lines; nothing was changed (resolve in the task branch and merge again)",
                )
            },
            Error::BranchMoved(detail) => Problem {
                retryable: true,
                ..Problem::new(S::CONFLICT, C::BranchMoved, "The branch moved", detail.clone())
            },
            Error::TargetCheckedOut(branch) => Problem::new(
                S::CONFLICT,
                C::TargetCheckedOut,
                "The target branch is checked out",
                format!(
                    "{branch} is checked out in a checkout with changes (or in several): berth moves a checkout only when it is clean; nothing was changed"
                ),
            ),
            Error::TargetInUse(branch) => Problem::new(
                S::CONFLICT,
                C::TargetInUse,
                "The target branch is checked out where an agent works",
                format!(
                    "{branch} is checked out in the checkout a local session's agent works in: a merge would change its files under it; stop the session first; nothing was changed"
                ),
            ),
            Error::WriterBusy(holding) => {
                let (code, title, detail) = match holding.holder.as_str() {
                    "turn" => (
                        C::SessionBusy,
                        "Session is busy",
                        "an agent's turn is writing the environment's worktrees",
                    ),
                    "cleanup" => (
                        C::TaskCleanupInProgress,
                        "Task cleanup in progress",
                        "a cleanup job is removing the environment's worktrees",
                    ),
                    "restore" => (
                        C::RestoreInProgress,
                        "A restore is in progress",
                        "a restore is writing the environment's worktrees",
                    ),
                    _ => (
                        C::LandingInProgress,
                        "A landing is in progress",
                        "a commit or a merge is writing the environment's worktrees",
                    ),
                };
                Problem {
                    retryable: true,
                    retry_after_ms: Some(1000),
                    task_environment_id: Some(holding.task_environment_id),
                    writer: Some((**holding).clone()),
                    ..Problem::new(S::CONFLICT, code, title, format!("{detail}; nothing was changed"))
                }
            }
            Error::PushRejected(why) => Problem::new(
                S::CONFLICT,
                C::PushRejected,
                "The remote rejected the push",
                why.clone(),
            ),
            Error::RemoteAuthFailed => Problem::new(
                S::BAD_GATEWAY,
                C::RemoteAuthFailed,
                "The remote refused the credentials",
                "the remote (or its API) refused berth's credentials for its host, or berth has none: check [remotes] in the configuration",
            ),
            Error::RemoteUnreachable(why) => Problem {
                retryable: true,
                ..Problem::new(
                    S::BAD_GATEWAY,
                    C::RemoteUnreachable,
                    "The remote is unreachable",
                    why.clone(),
                )
            },
            Error::Internal(_) => Problem {
                retryable: true,
                ..Problem::new(
                    S::INTERNAL_SERVER_ERROR,
                    C::Internal,
                    "Internal error",
                    "an unexpected error occurred; quote the request id",
                )
            },
        }
    }
}

impl ResponseError for Error {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(Problem::from(self).status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            // The whole chain goes to the log; the body says nothing about it.
            Error::Internal(source) => tracing::error!(error = ?source, "internal error"),
            Error::Unavailable(why) => tracing::warn!(reason = %why, "answered 503"),
            _ => {}
        }
        Problem::from(self).response()
    }
}

/// Body errors: malformed JSON and unknown fields are 400, wrong types 422, oversized 413.
pub fn json_error(err: actix_web::error::JsonPayloadError, _req: &HttpRequest, limit: usize) -> actix_web::Error {
    use actix_web::error::JsonPayloadError as J;
    let domain = match &err {
        J::Overflow { .. } | J::OverflowKnownLength { .. } => Error::PayloadTooLarge { limit },
        J::Deserialize(e) if e.is_data() => {
            let msg = e.to_string();
            if msg.starts_with("unknown field") {
                Error::BadRequest(msg)
            } else {
                Error::Invalid {
                    detail: msg,
                    errors: Vec::new(),
                }
            }
        }
        J::Deserialize(e) => Error::BadRequest(format!("malformed JSON: {e}")),
        J::ContentType => Error::BadRequest("expected Content-Type: application/json".into()),
        other => Error::BadRequest(format!("could not read the body: {other}")),
    };
    actix_web::error::InternalError::from_response(err, domain.error_response()).into()
}

pub fn path_error(err: actix_web::error::PathError, _req: &HttpRequest) -> actix_web::Error {
    let domain = Error::BadRequest("a path parameter is malformed (ids are UUIDs)".into());
    actix_web::error::InternalError::from_response(err, domain.error_response()).into()
}

pub fn query_error(err: actix_web::error::QueryPayloadError, _req: &HttpRequest) -> actix_web::Error {
    let domain = Error::BadRequest(format!("invalid query string: {err}"));
    actix_web::error::InternalError::from_response(err, domain.error_response()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_say_whether_a_retry_can_help() {
        let stale = Problem::from(&Error::Stale("the session changed meanwhile; retry".into()));
        assert_eq!(
            (stale.status, stale.code, stale.retryable),
            (409, ErrorCode::Conflict, true)
        );
        let invalid = Problem::from(&Error::InvalidState("the task is not archived".into()));
        assert_eq!(
            (invalid.status, invalid.code, invalid.retryable),
            (409, ErrorCode::Conflict, false)
        );
        let taken = Problem::from(&Error::AlreadyExists("a workspace with this name exists"));
        assert_eq!(
            (taken.status, taken.code, taken.retryable),
            (409, ErrorCode::Conflict, false)
        );
    }
}
