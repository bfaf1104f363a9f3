//! What a git command can fail with (a leaf: every git file names it).
use super::lock_retry::is_lock_contention;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {op} failed: {stderr}")]
    Failed { op: &'static str, stderr: String },
    #[error("git {op} timed out after {secs}s")]
    Timeout { op: &'static str, secs: u64 },
    #[error("could not run git: {0}")]
    Spawn(#[from] std::io::Error),
}

impl GitError {
    /// git failed because another process held one of its lock files: worth another attempt.
    pub(super) fn is_lock_contention(&self) -> bool {
        matches!(self, GitError::Failed { stderr, .. } if is_lock_contention(stderr))
    }
}
