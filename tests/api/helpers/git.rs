//! Real git for the tests: repositories made under the scratch dir, and what git says of them.
use std::path::{Path, PathBuf};
use std::process::Command;

use super::Reply;

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "berth-test")
        .env("GIT_AUTHOR_EMAIL", "test@berth.invalid")
        .env("GIT_COMMITTER_NAME", "berth-test")
        .env("GIT_COMMITTER_EMAIL", "test@berth.invalid")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `git init` with one commit on `branch`; returns the canonical path.
pub fn git_repo(dir: &Path, branch: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", branch]);
    std::fs::write(dir.join("README.md"), "hello\n").unwrap();
    git(dir, &["add", "README.md"]);
    git(dir, &["commit", "-q", "-m", "init"]);
    dir.canonicalize().unwrap()
}

/// Asserts that a response body names no filesystem path under `dir` (I34).
#[track_caller]
pub fn assert_no_path(reply: &Reply, dir: &Path) {
    let dir = dir.display().to_string();
    assert!(!reply.text.contains(&dir), "the body discloses a path: {}", reply.text);
}

/// The worktree paths git has registered for a repository (`git worktree list --porcelain`).
pub fn worktrees_of(repo: &Path) -> Vec<String> {
    git(repo, &["worktree", "list", "--porcelain"])
        .lines()
        .filter_map(|l| l.strip_prefix("worktree "))
        .map(str::to_string)
        .collect()
}

pub fn branch_exists(repo: &Path, branch: &str) -> bool {
    Command::new("git")
        .args(["rev-parse", "--verify", "--quiet", &format!("refs/heads/{branch}")])
        .current_dir(repo)
        .output()
        .unwrap()
        .status
        .success()
}
