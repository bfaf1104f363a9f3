//! The one error enum, usable by every layer (auth and domain alike). `api::problem` maps each variant
//! to problem+json exactly once.
use crate::ids::{EnvironmentId, RepositoryId};
use crate::scope::Scope;

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
    /// 409, retryable: what the request read changed before it could commit (a race); nothing changed.
    #[error("stale: {0}")]
    Stale(String),
    /// 409, not retryable as is: the resource's state does not allow the operation.
    #[error("invalid state: {0}")]
    InvalidState(String),
    /// 409: a unique name or path is taken.
    #[error("already exists: {0}")]
    AlreadyExists(&'static str),
    #[error("the task is archived")]
    TaskArchived,
    /// An `inherit_parent` task whose owner (the task whose environment it works in) is archived cannot
    /// be unarchived on its own (`409 task_archived`).
    #[error("the task that owns the task's environment is archived")]
    OwnerArchived,
    #[error("the repository is used by a live task")]
    RepositoryInUse { task_count: u64 },
    #[error("not a git repository: {0}")]
    NotAGitRepository(&'static str),
    #[error("path not allowed: {0}")]
    PathNotAllowed(&'static str),
    #[error("invalid cursor")]
    InvalidCursor,
    /// 412: an `If-Match` names a version that is no longer current; nothing changed.
    #[error("precondition failed: {0}")]
    PreconditionFailed(&'static str),
    #[error("a cleanup of the task is in progress")]
    TaskCleanupInProgress,
    #[error("the workspace is being prepared")]
    WorkspacePreparing,
    #[error("the session is busy")]
    SessionBusy,
    /// I16: typed, retry-aware, and never carrying a path, branch or secret.
    #[error("workspace reuse is unsafe: {0:?}")]
    WorkspaceReuseUnsafe(ReuseCategory),
    /// Seed 002: a recorded agent conversation is never replaced by another; nothing was started.
    #[error("the session's agent conversation is unavailable: {0:?}")]
    AgentSessionUnavailable(ConversationCategory),
    #[error("workspace reuse is unsupported: {0}")]
    WorkspaceReuseUnsupported(&'static str),
    /// I11: worktrees hold changes and no consent was given; nothing changed.
    #[error("the task's worktrees hold uncommitted or untracked changes")]
    TaskDeleteDirtyWorktree(Vec<DirtyRepository>),
    /// The agent command could not be started; the session is `failed` with the reason.
    #[error("the agent could not be started")]
    AgentStartFailed,
    /// The agent wants authentication berth does not give it; the session is `failed` naming its methods.
    #[error("{0}")]
    AgentAuthRequired(String),
    /// The agent takes no steering messages; the message was not stored.
    #[error("the session's agent does not take steering messages")]
    SteerUnsupported,
    /// Preparing the workspace failed; the environment is `failed` and its repos say why.
    #[error("preparing the workspace failed for repository {repository_name}")]
    MaterializationFailed {
        environment_id: EnvironmentId,
        repository_name: String,
    },
    /// 422: an `Idempotency-Key` already used by this caller for another method, path, query or body.
    #[error("the idempotency key was used for another request")]
    IdempotencyKeyReused,
    /// 409, retryable: a request with the same `Idempotency-Key` is still being processed.
    #[error("a request with this idempotency key is in progress")]
    IdempotencyInProgress,
    /// A dependency is down for now (the database unreachable or full, git failing): retry later. The
    /// reason goes to the log only.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    /// A task's repositories are on different nodes.
    #[error("{0}")]
    RepositoriesOnDifferentNodes(String),
    /// The request needs the agents or the disk of a node no instance of which holds a lease (or one
    /// an operator gave up).
    #[error("node {node_id} is unavailable")]
    NodeUnavailable {
        node_id: String,
        decommissioned: bool,
        retry_after: std::time::Duration,
    },
    /// A commit found nothing to commit in any slot; nothing changed.
    #[error("there is nothing to commit")]
    NothingToCommit,
    /// A merge met conflicts in these paths; nothing changed.
    #[error("the merge has conflicts")]
    MergeConflict(Vec<String>),
    /// Retryable: the target branch moved since it was read (or was not where the caller expected it).
    #[error("{0}")]
    BranchMoved(String),
    /// The merge's target branch is checked out in a checkout with changes (or in several); its name only.
    #[error("{0} is checked out where it cannot be moved")]
    TargetCheckedOut(String),
    /// The merge would move the checkout an agent of a `local` session works in; its branch name only.
    #[error("{0} is checked out where an agent works")]
    TargetInUse(String),
    /// 409: another writer holds the environment's worktrees (`domain::writer`); nothing changed.
    #[error("the environment's worktrees are held by a {}", .0.holder)]
    WriterBusy(Box<WriterHolding>),
    /// The remote refused the push: git's reason.
    #[error("the remote rejected the push: {0}")]
    PushRejected(String),
    /// The remote (or its API) refused the credentials berth has for its host, or there were none.
    #[error("the remote refused berth's credentials")]
    RemoteAuthFailed,
    /// Retryable: the remote (or its API) could not be reached or failed.
    #[error("the remote is unreachable: {0}")]
    RemoteUnreachable(String),
    /// Anything unexpected; the source chain goes to the log, never into the response.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// Why a workspace may not be reused (`category` of `workspace_reuse_unsafe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
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

impl ReuseCategory {
    /// Its snake_case name (what `broken_category` stores).
    pub fn as_str(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    pub fn parse(s: &str) -> Option<ReuseCategory> {
        serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
    }
}

/// Why a session's recorded agent conversation cannot be continued (`category` of
/// `agent_session_unavailable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConversationCategory {
    /// Its file is gone, or the agent does not know the recorded conversation.
    Missing,
    /// Its file is not the conversation berth recorded (unreadable, not a conversation, another one).
    Corrupt,
    /// Another live session holds the same conversation.
    Leased,
    /// The agent cannot load a recorded conversation at all.
    Unsupported,
}

/// A repository whose worktree holds changes (for `task_delete_dirty_worktree`; no paths).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct DirtyRepository {
    pub repository_id: RepositoryId,
    /// The environment the worktree belongs to: the task's current one, or an earlier one a delete also
    /// removes (issue 38 item 2).
    pub task_environment_id: EnvironmentId,
    pub dirty_file_count: usize,
}

/// Who holds an environment's writer lease, for the `409` a writer that could not take it gets.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct WriterHolding {
    pub task_environment_id: EnvironmentId,
    /// `turn` (an agent's turn), `restore`, `landing` (a commit or a merge into a checkout) or `cleanup`.
    pub holder: String,
    /// The session whose turn, or the cleanup job, that holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_id: Option<uuid::Uuid>,
    pub node_id: String,
    pub since: chrono::DateTime<chrono::Utc>,
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
        if is_unstorable_text(&e) {
            // PostgreSQL cannot store NUL in text or JSON; the transaction rolled back, nothing changed.
            return Error::invalid("body", "text must not contain NUL (\\u0000) characters");
        }
        if is_unavailable(&e) {
            crate::outage::note();
            return Error::Unavailable(e.to_string());
        }
        Error::Internal(anyhow::Error::new(e))
    }
}

/// True when a database error is a unique-constraint violation (both backends).
/// The database cannot be reached or cannot take writes right now (a restart, a full disk, an exhausted
/// pool): a 503 the client may retry, never a 500.
/// An error and its causes, `outer: inner: innermost` (a client's "error sending request" alone says
/// nothing of a refused connection).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

pub fn is_unavailable(e: &sea_orm::DbErr) -> bool {
    use sea_orm::{DbErr, RuntimeErr, sqlx};
    let inner = match e {
        DbErr::ConnectionAcquire(_) => return true,
        DbErr::Conn(RuntimeErr::SqlxError(s))
        | DbErr::Exec(RuntimeErr::SqlxError(s))
        | DbErr::Query(RuntimeErr::SqlxError(s)) => s,
        _ => return false,
    };
    match inner.as_ref() {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // SQLite's extended codes keep the primary code in the low byte: SQLITE_BUSY (5) and
                // SQLITE_LOCKED (6) past the busy timeout, SQLITE_IOERR (10) and its variants, SQLITE_FULL (13).
                return code.parse::<i32>().is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13));
            }
            // PostgreSQL: connection exceptions (08), insufficient resources such as a full disk (53),
            // operator intervention such as a shutdown (57).
            code.starts_with("08") || code.starts_with("53") || code.starts_with("57")
        }
        _ => false,
    }
}

/// PostgreSQL refused a character it cannot store (NUL in text: 22021; in JSON: 22P05).
fn is_unstorable_text(e: &sea_orm::DbErr) -> bool {
    use sea_orm::{DbErr, RuntimeErr, sqlx};
    match e {
        DbErr::Exec(RuntimeErr::SqlxError(s)) | DbErr::Query(RuntimeErr::SqlxError(s)) => matches!(
            s.as_ref(),
            sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("22021") | Some("22P05"))
        ),
        _ => false,
    }
}

pub fn is_unique_violation(e: &sea_orm::DbErr) -> bool {
    matches!(e.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
}
