//! A merge computed in the object store: `git merge-tree --write-tree` and `git commit-tree` write
//! objects only; no worktree, index or ref changes.
use std::ffi::OsStr;
use std::path::Path;

use super::cli::GitMutations;
use super::error::GitError;
use super::land::{Signature, committer};

/// What `git merge-tree --write-tree` found.
#[derive(Debug, PartialEq, Eq)]
pub enum MergeTree {
    Clean { tree: String },
    Conflict { paths: Vec<String> },
}

/// The merge of `theirs` into `ours`, computed in the object store (no worktree, no index, no ref).
pub async fn merge_tree(git: &dyn GitMutations, repo: &Path, ours: &str, theirs: &str) -> Result<MergeTree, GitError> {
    let out = git
        .read_answer(
            "merge-tree",
            repo,
            &[
                "merge-tree",
                "--write-tree",
                "-z",
                "--name-only",
                "--no-messages",
                ours,
                theirs,
            ],
        )
        .await?;
    let (code, stdout) = out;
    let mut parts = stdout.split(|b| *b == 0).filter(|p| !p.is_empty());
    let tree = parts
        .next()
        .map(|t| String::from_utf8_lossy(t).trim().to_string())
        .unwrap_or_default();
    match code {
        0 => Ok(MergeTree::Clean { tree }),
        _ => {
            let mut paths: Vec<String> = parts.map(|p| String::from_utf8_lossy(p).into_owned()).collect();
            paths.dedup();
            Ok(MergeTree::Conflict { paths })
        }
    }
}

/// A commit of `tree` with `parents`, by `author`, committed by berth (an object only: no ref moves).
pub async fn commit_tree(
    git: &dyn GitMutations,
    repo: &Path,
    tree: &str,
    parents: &[&str],
    message: &str,
    author: &Signature,
) -> Result<String, GitError> {
    let c = committer();
    let envs: [(&str, &OsStr); 4] = [
        ("GIT_AUTHOR_NAME", OsStr::new(&author.name)),
        ("GIT_AUTHOR_EMAIL", OsStr::new(&author.email)),
        ("GIT_COMMITTER_NAME", OsStr::new(&c.name)),
        ("GIT_COMMITTER_EMAIL", OsStr::new(&c.email)),
    ];
    let mut args = vec!["-c", "commit.gpgSign=false", "commit-tree", tree];
    for p in parents {
        args.extend(["-p", p]);
    }
    args.extend(["-m", message]);
    let out = git.read_bytes("commit-tree", repo, &args, &envs).await?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}
