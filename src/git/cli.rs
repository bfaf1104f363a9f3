//! Mutations through the `git` CLI: library-level worktree mutation has overwritten uncommitted work in
//! other tools, so berth only ever asks git itself. Every call has a timeout and waits for a slot under a
//! process-wide cap. Nothing here decides what to change; callers pass a `ManagedPath` as the target.
//!
//! Mutations of one source repository are serialized in the process (git's locks under `.git/worktrees`
//! and the ref store make concurrent ones fail), and a failure that is git's lock contention (another
//! process: a replica on the same disk, the user's own git) is retried with bounded backoff.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::Semaphore;

use super::lock_retry::backoff;
mod stream;
#[cfg(test)]
use super::lock_retry::{LOCK_BACKOFF_FIRST, LOCK_BACKOFF_MAX, is_lock_contention};
use super::{BranchDeletionConsent, BranchName, MergedBranch};
use crate::managed_path::{Consent, ManagedPath, RecordedRegistration};
use crate::metrics::{GitOutcome, Metrics};

/// Attempts of one mutation that meets git's lock contention, and the first and longest wait between.
const LOCK_ATTEMPTS: u32 = 8;

pub use super::error::GitError;

/// One async mutex per source repository, so that berth's own mutations of it never overlap.
#[derive(Default)]
struct RepoLocks(Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>);

impl RepoLocks {
    async fn lock(&self, repo: &Path) -> RepoGuard<'_> {
        // The repository's canonical path is its key (callers pass the registered, canonical path; a
        // spelling with symlinks still meets the same lock).
        let key = std::fs::canonicalize(repo).unwrap_or_else(|_| repo.to_path_buf());
        let lock = self
            .0
            .lock()
            .expect("the repository lock map is never poisoned")
            .entry(key.clone())
            .or_default()
            .clone();
        let guard = lock.clone().lock_owned().await;
        RepoGuard {
            locks: self,
            key,
            lock,
            _guard: Some(guard),
        }
    }
}

struct RepoGuard<'a> {
    locks: &'a RepoLocks,
    key: PathBuf,
    lock: Arc<tokio::sync::Mutex<()>>,
    _guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for RepoGuard<'_> {
    fn drop(&mut self) {
        self._guard.take();
        // Forget a repository nobody waits for (the map's and this guard's references are the only ones).
        let mut map = self.locks.0.lock().expect("the repository lock map is never poisoned");
        if Arc::strong_count(&self.lock) == 2 && map.get(&self.key).is_some_and(|l| Arc::ptr_eq(l, &self.lock)) {
            map.remove(&self.key);
        }
    }
}

#[derive(Clone)]
pub struct GitCli {
    slots: Arc<Semaphore>,
    timeout: Duration,
    repos: Arc<RepoLocks>,
    metrics: Option<Arc<Metrics>>,
}

impl GitCli {
    pub fn new(max_concurrent: usize, timeout: Duration) -> GitCli {
        GitCli {
            slots: Arc::new(Semaphore::new(max_concurrent.max(1))),
            timeout,
            repos: Arc::default(),
            metrics: None,
        }
    }

    /// Records every command's duration and outcome here.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> GitCli {
        self.metrics = Some(metrics);
        self
    }

    /// A mutation of `repo`: under the repository's lock, retried while git reports lock contention.
    async fn mutate(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<String, GitError> {
        let _repo = self.repos.lock(repo).await;
        self.run_retrying(op, repo, args).await
    }

    /// `run`, again after a backoff while the failure is lock contention, at most `LOCK_ATTEMPTS` times.
    /// The caller holds the repository's lock.
    async fn run_retrying(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<String, GitError> {
        let mut attempt = 0;
        loop {
            match self.run(op, repo, args).await {
                Err(e) if e.is_lock_contention() && attempt + 1 < LOCK_ATTEMPTS => {
                    tracing::debug!(op, attempt, error = %e, "git lock contention; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn run(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<String, GitError> {
        match self.run_status(op, repo, args, &[0]).await? {
            (Some(0), stdout, _) => Ok(stdout),
            (_, _, stderr) => Err(GitError::Failed { op, stderr }),
        }
    }

    /// A read whose exit code is its answer (`merge-base --is-ancestor`, `rev-parse --verify --quiet`):
    /// exit code 1 means "no"; anything else but 0 is a failure.
    async fn run_yes_no(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<Option<String>, GitError> {
        match self.run_status(op, repo, args, &[0, 1]).await? {
            (Some(0), stdout, _) => Ok(Some(stdout)),
            (Some(1), _, _) => Ok(None),
            (_, _, stderr) => Err(GitError::Failed { op, stderr }),
        }
    }

    /// Runs git; `answers` are the exit codes that are answers, not failures (for the metrics).
    async fn run_status(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        answers: &[i32],
    ) -> Result<(Option<i32>, String, String), GitError> {
        let (code, stdout, stderr) = self.run_bytes(op, repo, args, &[], answers).await?;
        Ok((code, String::from_utf8_lossy(&stdout).into_owned(), stderr))
    }

    /// A mutation with extra environment variables, under the repository's lock (landing).
    pub(super) async fn mutate_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Vec<u8>, GitError> {
        let _repo = self.repos.lock(repo).await;
        self.output_bytes(op, repo, args, envs).await
    }

    /// A read whose output is bytes, as git wrote them (a diff: its content is not always UTF-8), with
    /// extra environment variables (a temporary index: `GIT_INDEX_FILE`).
    async fn output_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Vec<u8>, GitError> {
        match self.run_bytes(op, repo, args, envs, &[0]).await? {
            (Some(0), stdout, _) => Ok(stdout),
            (_, _, stderr) => Err(GitError::Failed { op, stderr }),
        }
    }

    async fn run_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
        answers: &[i32],
    ) -> Result<(Option<i32>, Vec<u8>, String), GitError> {
        let _slot = self.slots.acquire().await.expect("the semaphore is never closed");
        let mut cmd = command(repo, args, envs);
        let started = std::time::Instant::now();
        let out = tokio::time::timeout(self.timeout, cmd.output()).await;
        if let Some(m) = &self.metrics {
            let outcome = match &out {
                Err(_) => GitOutcome::Timeout,
                Ok(Ok(o)) if o.status.code().is_some_and(|c| answers.contains(&c)) => GitOutcome::Ok,
                Ok(_) => GitOutcome::Failed,
            };
            m.git_command(op, started.elapsed(), outcome);
        }
        let out = out.map_err(|_| GitError::Timeout {
            op,
            secs: self.timeout.as_secs(),
        })??;
        // Exit code 128 is not proof of absence; callers inspect before concluding anything.
        let stderr = String::from_utf8_lossy(&out.stderr).trim().chars().take(2000).collect();
        Ok((out.status.code(), out.stdout, stderr))
    }
}

/// How berth runs git, every call alike: in `repo`, with only what git needs of berth's environment and
/// nothing else of it (its secrets), nothing the repository's configuration names running (hooks,
/// fsmonitor, filters, merge drivers), no prompt, output piped, killed with its handle.
fn command(repo: &Path, args: &[&str], envs: &[(&str, &std::ffi::OsStr)]) -> Command {
    let mut cmd = Command::new("git");
    cmd.arg("-C")
        .arg(repo)
        .args(args)
        .env_clear()
        .envs(super::harden::inherited_env())
        .envs(super::harden::config_env(repo))
        .envs(envs.iter().copied())
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
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
    /// A git command whose output is bytes as git wrote them, with extra environment variables (a
    /// temporary index: `GIT_INDEX_FILE`), never taking an optional lock (`GIT_OPTIONAL_LOCKS=0`): diffs
    /// and checkpoints, which must leave the worktree, its index and its refs as they were.
    async fn read_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Vec<u8>, GitError>;
    /// `read_bytes`, its output handed to `sink` as it comes instead of collected (a diff is cut as it
    /// streams). The default collects it first (test doubles).
    async fn read_stream(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
        sink: &mut (dyn for<'b> FnMut(&'b [u8]) + Send),
    ) -> Result<(), GitError> {
        let out = self.read_bytes(op, repo, args, envs).await?;
        sink(&out);
        Ok(())
    }
    /// A read whose exit code 1 is an answer, not a failure (`merge-tree`: conflicts): (code, stdout).
    async fn read_answer(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<(i32, Vec<u8>), GitError>;
    /// One step of landing work, each with the proof it may change what it changes.
    async fn land(&self, step: &super::land::Step<'_>) -> Result<super::land::Landed, GitError>;
    /// Points berth's own ref `refname` (under `refs/berth/`) at `oid`, keeping that object alive (a
    /// checkpoint's tree). Never any other ref.
    async fn keep_object(&self, repo: &Path, refname: &str, oid: &str) -> Result<(), GitError>;
    /// Deletes every ref under berth's own `prefix` (under `refs/berth/`); a missing one is no error.
    async fn drop_refs(&self, repo: &Path, prefix: &str) -> Result<(), GitError>;
    /// Writes every file of `tree` into the managed worktree `target` (overwriting), through the
    /// temporary index `index_file`: the worktree's own index and refs are not touched. Only a restore
    /// with the caller's consent, or of a worktree with no change since its last checkpoint, calls it.
    async fn write_tree_files(&self, target: &ManagedPath, tree: &str, index_file: &Path) -> Result<(), GitError>;
    /// How many files differ from HEAD or are untracked, without taking the index lock or writing it.
    async fn dirty_file_count(&self, worktree: &Path) -> Result<usize, GitError>;
    /// The commit `refs/heads/<branch>` points at, `None` when there is no such branch (read-only).
    async fn branch_tip(&self, repo: &Path, branch: &BranchName) -> Result<Option<String>, GitError>;
    /// The commit the branch's upstream points at, `None` when it has none (read-only).
    async fn upstream_tip(&self, repo: &Path, branch: &BranchName) -> Result<Option<String>, GitError>;
    /// Whether `commit` is reachable from `rev` (`git merge-base --is-ancestor`, read-only).
    async fn is_ancestor(&self, repo: &Path, commit: &str, rev: &str) -> Result<bool, GitError>;
    /// The worktree paths (canonical, as git lists them) that have `branch` checked out (read-only).
    async fn checked_out_at(&self, repo: &Path, branch: &BranchName) -> Result<Vec<PathBuf>, GitError>;
    /// Deletes a branch proven to hold nothing its base or upstream lacks, only while it still points at
    /// the commit that was proven (`git update-ref -d <ref> <oid>`), then drops its `branch.<name>` config.
    async fn branch_delete_merged(&self, repo: &Path, proof: &MergedBranch) -> Result<(), GitError>;
    /// `git branch -D`: only with the consent the delete request gave (`delete_branches=true`).
    async fn branch_delete_consented(
        &self,
        repo: &Path,
        branch: &BranchName,
        consent: &BranchDeletionConsent,
    ) -> Result<(), GitError>;
}

#[async_trait::async_trait]
impl super::land::Runner for GitCli {
    async fn mutate_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Vec<u8>, GitError> {
        GitCli::mutate_bytes(self, op, repo, args, envs).await
    }
}

#[async_trait::async_trait]
impl GitMutations for GitCli {
    async fn read_answer(&self, op: &'static str, repo: &Path, args: &[&str]) -> Result<(i32, Vec<u8>), GitError> {
        let envs = [("GIT_OPTIONAL_LOCKS", std::ffi::OsStr::new("0"))];
        match self.run_bytes(op, repo, args, &envs, &[0, 1]).await? {
            (Some(code @ (0 | 1)), out, _) => Ok((code, out)),
            (_, _, stderr) => Err(GitError::Failed { op, stderr }),
        }
    }

    async fn land(&self, step: &super::land::Step<'_>) -> Result<super::land::Landed, GitError> {
        super::land::run(self, step).await
    }

    async fn keep_object(&self, repo: &Path, refname: &str, oid: &str) -> Result<(), GitError> {
        if !refname.starts_with("refs/berth/") {
            return Err(GitError::Failed {
                op: "update-ref",
                stderr: format!("{refname} is not berth's"),
            });
        }
        self.mutate("update-ref", repo, &["update-ref", refname, oid])
            .await
            .map(|_| ())
    }

    async fn write_tree_files(&self, target: &ManagedPath, tree: &str, index_file: &Path) -> Result<(), GitError> {
        let worktree = target.as_path();
        let envs = [("GIT_INDEX_FILE", index_file.as_os_str())];
        self.output_bytes("read-tree", worktree, &["read-tree", tree], &envs)
            .await?;
        self.output_bytes(
            "checkout-index",
            worktree,
            &["-c", "core.hooksPath=/dev/null", "checkout-index", "--all", "--force"],
            &envs,
        )
        .await
        .map(|_| ())
    }

    async fn drop_refs(&self, repo: &Path, prefix: &str) -> Result<(), GitError> {
        if !prefix.starts_with("refs/berth/") {
            return Err(GitError::Failed {
                op: "update-ref",
                stderr: format!("{prefix} is not berth's"),
            });
        }
        let _repo = self.repos.lock(repo).await;
        let listed = self
            .run("for-each-ref", repo, &["for-each-ref", "--format=%(refname)", prefix])
            .await?;
        for name in listed.lines().filter(|l| l.starts_with(prefix)) {
            self.run_retrying("update-ref", repo, &["update-ref", "-d", name])
                .await?;
        }
        Ok(())
    }

    async fn read_bytes(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Vec<u8>, GitError> {
        let mut all: Vec<(&str, &std::ffi::OsStr)> = vec![("GIT_OPTIONAL_LOCKS", std::ffi::OsStr::new("0"))];
        all.extend_from_slice(envs);
        self.output_bytes(op, repo, args, &all).await
    }

    async fn read_stream(
        &self,
        op: &'static str,
        repo: &Path,
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
        sink: &mut (dyn for<'b> FnMut(&'b [u8]) + Send),
    ) -> Result<(), GitError> {
        self.stream_bytes(op, repo, args, envs, sink).await
    }

    /// `git worktree add`: on a new branch from `base` when `new_branch`, else on the existing `branch`.
    async fn worktree_add(
        &self,
        repo: &Path,
        target: &ManagedPath,
        branch: &str,
        base: Option<&str>,
    ) -> Result<(), GitError> {
        let target = target.as_path().to_string_lossy().into_owned();
        let _repo = self.repos.lock(repo).await;
        let mut attempt = 0;
        loop {
            // A failed attempt may have created the branch before it met a lock: the next one uses it.
            let new_branch = match base {
                Some(_) if attempt > 0 => !branch_exists(repo, branch).await,
                Some(_) => true,
                None => false,
            };
            let result = match (base, new_branch) {
                (Some(base), true) => {
                    self.run(
                        "worktree add",
                        repo,
                        &["worktree", "add", "-b", branch, "--", &target, base],
                    )
                    .await
                }
                _ => {
                    self.run("worktree add", repo, &["worktree", "add", "--", &target, branch])
                        .await
                }
            };
            match result {
                Err(e) if e.is_lock_contention() && attempt + 1 < LOCK_ATTEMPTS => {
                    tracing::debug!(attempt, error = %e, "git lock contention; retrying worktree add");
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                other => return other.map(|_| ()),
            }
        }
    }

    /// `git worktree remove` without `--force`: git refuses a worktree with changes, which is the point.
    async fn worktree_remove(&self, repo: &Path, target: &ManagedPath) -> Result<(), GitError> {
        let target = target.as_path().to_string_lossy().into_owned();
        self.mutate("worktree remove", repo, &["worktree", "remove", "--", &target])
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
        self.mutate(
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
        self.mutate("worktree remove", repo, &["worktree", "remove", "--", &target])
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

    async fn branch_tip(&self, repo: &Path, branch: &BranchName) -> Result<Option<String>, GitError> {
        let r = format!("refs/heads/{}", branch.as_str());
        let out = self
            .run_yes_no(
                "rev-parse",
                repo,
                &["rev-parse", "--verify", "--quiet", "--end-of-options", &r],
            )
            .await?;
        Ok(out.map(|o| o.trim().to_string()).filter(|o| !o.is_empty()))
    }

    async fn upstream_tip(&self, repo: &Path, branch: &BranchName) -> Result<Option<String>, GitError> {
        let r = format!("refs/heads/{}@{{upstream}}", branch.as_str());
        // No upstream (or an upstream ref that is gone) is exit code 128 with `--verify`: read as none.
        match self
            .run_status(
                "rev-parse",
                repo,
                &["rev-parse", "--verify", "--quiet", "--end-of-options", &r],
                &[0, 1, 128],
            )
            .await?
        {
            (Some(0), out, _) => Ok(Some(out.trim().to_string()).filter(|o| !o.is_empty())),
            _ => Ok(None),
        }
    }

    async fn is_ancestor(&self, repo: &Path, commit: &str, rev: &str) -> Result<bool, GitError> {
        Ok(self
            .run_yes_no(
                "merge-base",
                repo,
                &["merge-base", "--is-ancestor", "--end-of-options", commit, rev],
            )
            .await?
            .is_some())
    }

    async fn checked_out_at(&self, repo: &Path, branch: &BranchName) -> Result<Vec<PathBuf>, GitError> {
        let out = self
            .run("worktree list", repo, &["worktree", "list", "--porcelain"])
            .await?;
        let wanted = format!("branch refs/heads/{}", branch.as_str());
        let mut at = Vec::new();
        let mut path = None;
        for line in out.lines() {
            if let Some(p) = line.strip_prefix("worktree ") {
                path = Some(PathBuf::from(p));
            } else if line == wanted
                && let Some(p) = path.take()
            {
                at.push(p);
            }
        }
        Ok(at)
    }

    async fn branch_delete_merged(&self, repo: &Path, proof: &MergedBranch) -> Result<(), GitError> {
        let r = format!("refs/heads/{}", proof.branch().as_str());
        let _repo = self.repos.lock(repo).await;
        self.run_retrying(
            "update-ref",
            repo,
            &["update-ref", "-d", "--end-of-options", &r, proof.tip()],
        )
        .await?;
        // Its tracking configuration, if any (`git branch -d` would drop it too); none is fine.
        let section = format!("branch.{}", proof.branch().as_str());
        let _ = self
            .run_retrying(
                "config",
                repo,
                &["config", "--remove-section", "--end-of-options", &section],
            )
            .await;
        Ok(())
    }

    async fn branch_delete_consented(
        &self,
        repo: &Path,
        branch: &BranchName,
        _consent: &BranchDeletionConsent,
    ) -> Result<(), GitError> {
        self.mutate("branch delete", repo, &["branch", "-D", "--", branch.as_str()])
            .await?;
        Ok(())
    }
}

/// Read in-process (gix), off the async threads.
async fn branch_exists(repo: &Path, branch: &str) -> bool {
    let (repo, branch) = (repo.to_path_buf(), branch.to_string());
    tokio::task::spawn_blocking(move || super::branch_exists(&repo, &branch).unwrap_or(false))
        .await
        .unwrap_or(false)
}

#[cfg(test)]
mod tests;
