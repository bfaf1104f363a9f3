//! The one domain error enum. `api::problem` maps each variant to problem+json exactly once.
use crate::auth::Scope;

/// A field-level complaint, returned under `errors` in a `validation_failed` problem.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unauthenticated: {0}")]
    Unauthenticated(&'static str),
    #[error("the token lacks the {0} scope")]
    InsufficientScope(Scope),
    #[error("a session-bound token acts only on its session")]
    SessionBound,
    /// 403 for a token whose limits (not scopes) forbid the operation.
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    #[error("{0} not found")]
    NotFound(&'static str),
    /// 400: the request is malformed (syntax, unknown field, bad id in the path, bad query).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// 422: well-formed but semantically invalid.
    #[error("validation failed: {detail}")]
    Invalid { detail: String, errors: Vec<FieldError> },
    #[error("request body too large")]
    PayloadTooLarge { limit: usize },
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("the task is archived")]
    TaskArchived,
    #[error("the repository is used by a live task")]
    RepositoryInUse { task_count: u64 },
    #[error("not a git repository: {0}")]
    NotAGitRepository(&'static str),
    #[error("path not allowed: {0}")]
    PathNotAllowed(&'static str),
    #[error("invalid cursor")]
    InvalidCursor,
    #[error("a cleanup of the task is in progress")]
    TaskCleanupInProgress,
    #[error("the workspace is being prepared")]
    WorkspacePreparing,
    #[error("the session is busy")]
    SessionBusy,
    /// I16: typed, retry-aware, and never carrying a path, branch or secret.
    #[error("workspace reuse is unsafe: {0:?}")]
    WorkspaceReuseUnsafe(ReuseCategory),
    #[error("workspace reuse is unsupported: {0}")]
    WorkspaceReuseUnsupported(&'static str),
    /// I11: worktrees hold changes and no consent was given; nothing changed.
    #[error("the task's worktrees hold uncommitted or untracked changes")]
    TaskDeleteDirtyWorktree(Vec<super::cleanup::DirtyRepository>),
    /// The agent command could not be started; the session is `failed` with the reason.
    #[error("the agent could not be started")]
    AgentStartFailed,
    /// Preparing the workspace failed; the environment is `failed` and its repos say why.
    #[error("preparing the workspace failed for repository {repository_name}")]
    MaterializationFailed {
        environment_id: uuid::Uuid,
        repository_name: String,
    },
    /// Anything unexpected; the source chain goes to the log, never into the response.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// Why a workspace may not be reused (`category` of `workspace_reuse_unsafe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReuseCategory {
    ExecutorMismatch,
    InventoryIncomplete,
    InventoryAmbiguous,
    WorkspaceMissing,
    NotAGitWorktree,
    RepositoryMismatch,
    EnvironmentNotReady,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(field: &str, message: impl Into<String>) -> Error {
        let message = message.into();
        Error::Invalid {
            detail: format!("{field}: {message}"),
            errors: vec![FieldError {
                field: field.to_string(),
                message,
            }],
        }
    }
}

impl From<sea_orm::DbErr> for Error {
    fn from(e: sea_orm::DbErr) -> Self {
        Error::Internal(anyhow::Error::new(e))
    }
}

/// True when a database error is a unique-constraint violation (both backends).
pub fn is_unique_violation(e: &sea_orm::DbErr) -> bool {
    matches!(e.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
}
