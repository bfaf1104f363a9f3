//! Mutations through the `git` CLI: library-level worktree mutation has overwritten uncommitted work in
//! other tools, so berth only ever asks git itself. Every call has a timeout and waits for a slot under a
//! process-wide cap. Nothing here decides what to change; callers pass a `ManagedPath` as the target.
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::Semaphore;

use crate::managed_path::{Consent, ManagedPath, RecordedRegistration};

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {op} failed: {stderr}")]
    Failed { op: &'static str, stderr: String },
    #[error("git {op} timed out after {secs}s")]
    Timeout { op: &'static str, secs: u64 },
    #[error("could not run git: {0}")]
    Spawn(#[from] std::io::Error),
}

#[derive(Clone)]
pub struct GitCli {
    slots: Arc<Semaphore>,
    timeout: Duration,
}

impl GitCli {
    pub fn new(max_concurrent: usize, timeout: Duration) -> GitCli {
        GitCli {
            slots: Arc::new(Semaphore::new(max_concurrent.max(1))),
            timeout,
        }
    }

    async fn run(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<String, GitError> {
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let mut cmd = Command::new("git");
        cmd.arg("-C")
            .arg(repo)
            .args(args)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(self.timeout, cmd.output())
            .await
            .map_err(|_| GitError::Timeout {
                op,
                secs: self.timeout.as_secs(),
            })??;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            // Exit code 128 is not proof of absence; callers inspect before concluding anything.
            let stderr = String::from_utf8_lossy(&out.stderr).trim().chars().take(2000).collect();
            Err(GitError::Failed { op, stderr })
        }
    }
}

/// Every git mutation berth makes (and the one status read that needs the CLI), behind one trait.
/// `GitCli` is the implementation: the `git` binary, with a timeout and a concurrency cap.
#[async_trait::async_trait]
pub trait GitMutations: Send + Sync {
    /// `git worktree add`: on a new branch from `base` when given, else on the existing `branch`.
    async fn worktree_add(
        &self,
        repo: &Path,
        target: &ManagedPath,
        branch: &str,
        base: Option<&str>,
    ) -> Result<(), GitError>;
    /// `git worktree remove` without `--force`: git refuses a worktree with changes, which is the point.
    async fn worktree_remove(&self, repo: &Path, target: &ManagedPath) -> Result<(), GitError>;
    /// `git worktree remove --force`: only with consent recorded in a cleanup job's snapshot (I11).
    async fn worktree_remove_consented(
        &self,
        repo: &Path,
        target: &ManagedPath,
        consent: &Consent,
    ) -> Result<(), GitError>;
    /// Forgets exactly one registration whose directory is gone, the one berth recorded (never a
    /// repository-wide `git worktree prune`, which would drop the user's own missing worktrees too).
    async fn worktree_forget(&self, repo: &Path, registration: &RecordedRegistration) -> Result<(), GitError>;
    /// How many files differ from HEAD or are untracked, without taking the index lock or writing it.
    async fn dirty_file_count(&self, worktree: &Path) -> Result<usize, GitError>;
}

#[async_trait::async_trait]
impl GitMutations for GitCli {
    /// `git worktree add`: on a new branch from `base` when `new_branch`, else on the existing `branch`.
    async fn worktree_add(
        &self,
        repo: &Path,
        target: &ManagedPath,
        branch: &str,
        base: Option<&str>,
    ) -> Result<(), GitError> {
        let target = target.as_path().to_string_lossy().into_owned();
        match base {
            Some(base) => {
                self.run(
                    "worktree add",
                    repo,
                    &["worktree", "add", "-b", branch, "--", &target, base],
                )
                .await?
            }
            None => {
                self.run("worktree add", repo, &["worktree", "add", "--", &target, branch])
                    .await?
            }
        };
        Ok(())
    }

    /// `git worktree remove` without `--force`: git refuses a worktree with changes, which is the point.
    async fn worktree_remove(&self, repo: &Path, target: &ManagedPath) -> Result<(), GitError> {
        let target = target.as_path().to_string_lossy().into_owned();
        self.run("worktree remove", repo, &["worktree", "remove", "--", &target])
            .await?;
        Ok(())
    }

    /// `git worktree remove --force`: only with consent recorded in a cleanup job's snapshot (I11).
    async fn worktree_remove_consented(
        &self,
        repo: &Path,
        target: &ManagedPath,
        _consent: &Consent,
    ) -> Result<(), GitError> {
        let target = target.as_path().to_string_lossy().into_owned();
        self.run(
            "worktree remove",
            repo,
            &["worktree", "remove", "--force", "--", &target],
        )
        .await?;
        Ok(())
    }

    /// `git worktree remove` of a directory that is gone removes only that registration's admin
    /// directory (git allows it without `--force`; it still refuses a locked one).
    async fn worktree_forget(&self, repo: &Path, registration: &RecordedRegistration) -> Result<(), GitError> {
        let target = registration.target().as_path().to_string_lossy().into_owned();
        self.run("worktree remove", repo, &["worktree", "remove", "--", &target])
            .await?;
        Ok(())
    }

    /// How many files differ from HEAD or are untracked, without taking the index lock or writing it.
    async fn dirty_file_count(&self, worktree: &Path) -> Result<usize, GitError> {
        let out = self
            .run(
                "status",
                worktree,
                &["--no-optional-locks", "status", "--porcelain", "--untracked-files=all"],
            )
            .await?;
        Ok(out.lines().filter(|l| !l.trim().is_empty()).count())
    }
}
