//! What changed in a worktree, read without writing to it, its index or its refs.
//!
//! The worktree's whole state (tracked, staged, unstaged and untracked files, `.gitignore` respected, a
//! symlink as a link) is staged into a temporary index, never the worktree's own: a copy of its index
//! (so that unchanged files are not hashed again) in a private temporary directory, `git add -A` with
//! `GIT_INDEX_FILE` pointing at the copy. That writes blob objects to the repository's object store and
//! nothing else. `git diff --cached` against that index then gives the uncommitted changes (against
//! HEAD) or everything since the base (against the merge base); committed changes are `git diff base
//! head`. Rename and copy detection are git's (`-M -C`); binary detection is git's too, and patch bytes
//! are kept as git wrote them (a patch that is not UTF-8 is given base64-encoded, never mangled).
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::cli::{GitError, GitMutations};

mod stream;

/// Which changes a diff shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Committed since the base, staged, unstaged and untracked.
    All,
    /// Staged, unstaged and untracked (against HEAD).
    Uncommitted,
    /// Committed since the base (base to HEAD).
    Committed,
}

impl Scope {
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "all" => Some(Scope::All),
            "uncommitted" => Some(Scope::Uncommitted),
            "committed" => Some(Scope::Committed),
            _ => None,
        }
    }
}

/// How a file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeStatus {
    Added,
    Modified,
    Deleted,
    Renamed,
    Copied,
    TypeChanged,
    /// New in the worktree and not in the worktree's index (`git add` never ran on it).
    Untracked,
}

/// One file of a diff, patch not yet cut to the limits.
#[derive(Debug, Clone)]
pub struct FileChange {
    pub path: String,
    pub old_path: Option<String>,
    pub status: ChangeStatus,
    pub old_mode: Option<String>,
    pub new_mode: Option<String>,
    /// `None` for a binary file.
    pub additions: Option<u64>,
    pub deletions: Option<u64>,
    pub binary: bool,
    /// The file's unified diff, headers included, as git wrote it.
    pub patch: Vec<u8>,
}

/// A worktree's changes.
#[derive(Debug, Clone)]
pub struct Changes {
    /// The commit compared against: the merge base with the base branch (`All`, `Committed`) or HEAD
    /// (`Uncommitted`); `None` when there is none (an unborn branch).
    pub base: Option<String>,
    pub head: Option<String>,
    pub files: Vec<FileChange>,
}

/// What to compare.
pub struct Request<'a> {
    pub scope: Scope,
    /// The branch the task's branch is compared with (the slot's base branch).
    pub base_branch: &'a str,
    /// Lines of context around each change.
    pub context: u32,
    /// Only these paths (git pathspecs taken literally); empty is every path.
    pub paths: &'a [String],
    /// Where the temporary index is made (never inside the worktree).
    pub scratch: &'a Path,
    /// Bytes kept of each file's patch (the rest is read through as git writes it, never held).
    pub keep: usize,
    /// The files (by position in this worktree's diff) whose patches are kept at all: the page an
    /// answer shows; the others are listed and counted only.
    pub window: std::ops::Range<usize>,
}

/// The changes of the worktree at `worktree`.
pub async fn changes(git: &dyn GitMutations, worktree: &Path, req: &Request<'_>) -> Result<Changes, GitError> {
    let head = rev(git, worktree, "HEAD^{commit}").await?;
    let base = match req.scope {
        Scope::Uncommitted => head.clone(),
        Scope::All | Scope::Committed => match &head {
            Some(_) => merge_base(git, worktree, req.base_branch).await?.or(head.clone()),
            None => None,
        },
    };
    let empty_tree = empty_tree(git, worktree).await?;
    let from = base.clone().unwrap_or_else(|| empty_tree.clone());
    let mut diff_args = diff_command();
    let index_dir;
    let mut envs: Vec<(&str, &OsStr)> = Vec::new();
    let index_file: PathBuf;
    match req.scope {
        Scope::Committed => {
            diff_args.push(from.clone());
            diff_args.push(head.clone().unwrap_or_else(|| empty_tree.clone()));
        }
        Scope::All | Scope::Uncommitted => {
            index_dir = Scratch::new(req.scratch)?;
            index_file = index_dir.0.join("index");
            stage_worktree(git, worktree, &index_file).await?;
            envs.push(("GIT_INDEX_FILE", index_file.as_os_str()));
            diff_args.push("--cached".into());
            diff_args.push(from.clone());
        }
    }
    let keep = (req.keep, req.window.clone());
    let mut files = files_of(git, worktree, diff_args, &envs, req.context, req.paths, keep).await?;
    if req.scope != Scope::Committed {
        let untracked = untracked(git, worktree).await?;
        for f in files.iter_mut() {
            if f.status == ChangeStatus::Added && untracked.contains(&f.path) {
                f.status = ChangeStatus::Untracked;
            }
        }
    }
    Ok(Changes { base, head, files })
}

/// The changes from tree (or commit) `from` to `to`, both already in the object store (checkpoints).
pub async fn between(
    git: &dyn GitMutations,
    worktree: &Path,
    from: &str,
    to: &str,
    context: u32,
    paths: &[String],
    keep: usize,
) -> Result<Vec<FileChange>, GitError> {
    let mut args = diff_command();
    args.push(from.to_string());
    args.push(to.to_string());
    files_of(git, worktree, args, &[], context, paths, (keep, 0..usize::MAX)).await
}

/// How many files differ from tree (or commit) `from` to `to` (renames and copies paired, as a diff
/// shows them), counted as git names them: no patch is made or held.
pub async fn count_between(git: &dyn GitMutations, worktree: &Path, from: &str, to: &str) -> Result<usize, GitError> {
    let mut args = diff_command();
    args.extend([
        "--name-status".to_string(),
        "-z".to_string(),
        from.to_string(),
        to.to_string(),
    ]);
    // Fields: status NUL path NUL, and a second path for a rename or a copy.
    let (mut files, mut paths_due, mut field) = (0usize, 0u8, 0usize);
    let mut first = 0u8;
    let mut sink = |bytes: &[u8]| {
        for &b in bytes {
            if b != 0 {
                if field == 0 {
                    first = b;
                }
                field += 1;
                continue;
            }
            field = 0;
            if paths_due > 0 {
                paths_due -= 1;
            } else {
                files += 1;
                paths_due = if matches!(first, b'R' | b'C') { 2 } else { 1 };
            }
        }
    };
    git.read_stream("diff", worktree, &as_strs(&args), &[], &mut sink)
        .await?;
    Ok(files)
}

/// The paths `to` has and `from` does not (renames not paired: a renamed file's new path counts).
pub async fn added_between(
    git: &dyn GitMutations,
    worktree: &Path,
    from: &str,
    to: &str,
) -> Result<Vec<String>, GitError> {
    let out = git
        .read_bytes(
            "diff",
            worktree,
            &["diff", "--name-only", "-z", "--no-renames", "--diff-filter=A", from, to],
            &[],
        )
        .await?;
    Ok(out
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect())
}

fn diff_command() -> Vec<String> {
    [
        "-c",
        "core.quotePath=false",
        "diff",
        "--no-ext-diff",
        "--no-textconv",
        "--no-color",
        "-M",
        "-C",
    ]
    .map(String::from)
    .to_vec()
}

/// The files a `git diff` with `diff_args` shows, with their patches, from one run of git.
async fn files_of(
    git: &dyn GitMutations,
    worktree: &Path,
    diff_args: Vec<String>,
    envs: &[(&str, &OsStr)],
    context: u32,
    paths: &[String],
    (keep, window): (usize, std::ops::Range<usize>),
) -> Result<Vec<FileChange>, GitError> {
    let pathspec: Vec<String> = paths.iter().map(|p| format!(":(literal){p}")).collect();
    // One pass: the listing (status, paths, modes, counts: NUL-separated) then, after an empty field, the
    // patches in the same order.
    let mut args = diff_args;
    args.extend(["--raw", "-z", "--numstat", "-p"].map(String::from));
    args.push(format!("-U{context}"));
    args.push("--".into());
    args.extend(pathspec);
    // Each file's patch is cut as it streams: never more than `keep` of it held.
    let mut reader = stream::Reader::new(keep, window);
    let mut sink = |bytes: &[u8]| reader.feed(bytes);
    git.read_stream("diff", worktree, &as_strs(&args), envs, &mut sink)
        .await?;
    reader.finish().map_err(|m| GitError::Failed { op: "diff", stderr: m })
}

/// The worktree's complete state (tracked, staged, unstaged and untracked; `.gitignore` respected) as a
/// tree object, through a temporary index: the worktree, its index and its refs stay as they were (a
/// checkpoint). The tree is written to the object store; keeping it alive is the caller's (a ref under
/// `refs/berth/`).
pub async fn snapshot(git: &dyn GitMutations, worktree: &Path, scratch: &Path) -> Result<String, GitError> {
    let dir = Scratch::new(scratch)?;
    let index_file = dir.0.join("index");
    stage_worktree(git, worktree, &index_file).await?;
    let tree = git
        .read_bytes(
            "write-tree",
            worktree,
            &["write-tree"],
            &[("GIT_INDEX_FILE", index_file.as_os_str())],
        )
        .await?;
    Ok(String::from_utf8_lossy(&tree).trim().to_string())
}

/// A private directory for one temporary index, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(under: &Path) -> Result<Scratch, GitError> {
        let dir = under.join(format!("diff-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The worktree's whole state into the index at `index_file` (a copy of the worktree's own index, so
/// that git re-hashes only what changed). The worktree's index is read, never written.
async fn stage_worktree(git: &dyn GitMutations, worktree: &Path, index_file: &Path) -> Result<(), GitError> {
    let own = git
        .read_bytes("rev-parse", worktree, &["rev-parse", "--git-path", "index"], &[])
        .await?;
    let own = PathBuf::from(String::from_utf8_lossy(&own).trim());
    let own = if own.is_absolute() { own } else { worktree.join(own) };
    match std::fs::copy(&own, index_file) {
        // The copy keeps the index's modification time: git's check for "racily clean" entries (a file
        // changed in the same instant the index was written, its size unchanged) compares against it, and
        // a copy made now would make such a change look clean and leave it out.
        Ok(_) => {
            let modified = std::fs::metadata(&own)?.modified()?;
            std::fs::File::options()
                .write(true)
                .open(index_file)?
                .set_modified(modified)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(GitError::Spawn(e)),
    }
    git.read_bytes(
        "add",
        worktree,
        &[
            "-c",
            "core.fsmonitor=false",
            "-c",
            "gc.auto=0",
            "-c",
            "core.hooksPath=/dev/null",
            "add",
            "--all",
            "--ignore-errors",
            "--",
            ":/",
        ],
        &[("GIT_INDEX_FILE", index_file.as_os_str())],
    )
    .await?;
    Ok(())
}

/// Paths not in the worktree's own index and not ignored.
async fn untracked(git: &dyn GitMutations, worktree: &Path) -> Result<std::collections::HashSet<String>, GitError> {
    let out = git
        .read_bytes(
            "ls-files",
            worktree,
            &["ls-files", "--others", "--exclude-standard", "-z", "--full-name", ":/"],
            &[],
        )
        .await?;
    Ok(out
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect())
}

async fn rev(git: &dyn GitMutations, worktree: &Path, rev: &str) -> Result<Option<String>, GitError> {
    match git
        .read_bytes("rev-parse", worktree, &["rev-parse", "--verify", "--quiet", rev], &[])
        .await
    {
        Ok(out) => Ok(Some(String::from_utf8_lossy(&out).trim().to_string())),
        // Exit code 1 with nothing said: no such revision.
        Err(GitError::Failed { stderr, .. }) if stderr.is_empty() => Ok(None),
        Err(e) => Err(e),
    }
}

async fn merge_base(git: &dyn GitMutations, worktree: &Path, base_branch: &str) -> Result<Option<String>, GitError> {
    let Some(base) = rev(git, worktree, &format!("refs/heads/{base_branch}^{{commit}}")).await? else {
        return Ok(None);
    };
    match git
        .read_bytes("merge-base", worktree, &["merge-base", "HEAD", &base], &[])
        .await
    {
        Ok(out) => Ok(Some(String::from_utf8_lossy(&out).trim().to_string())),
        // No common ancestor.
        Err(GitError::Failed { stderr, .. }) if stderr.is_empty() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The empty tree of the repository's hash (SHA-1 or SHA-256), written nowhere.
async fn empty_tree(git: &dyn GitMutations, worktree: &Path) -> Result<String, GitError> {
    let out = git
        .read_bytes(
            "hash-object",
            worktree,
            &["hash-object", "-t", "tree", "/dev/null"],
            &[],
        )
        .await?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

/// `--raw -z --numstat` output: raw records, then numstat records, in the same order.
fn parse_listing(out: &[u8]) -> Result<Vec<FileChange>, String> {
    let mut fields = out.split(|b| *b == 0).peekable();
    let mut files = Vec::new();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    // Raw: ":old_mode new_mode old_oid new_oid status" NUL path NUL [path2 NUL]
    while let Some(f) = fields.peek() {
        if !f.starts_with(b":") {
            break;
        }
        let head = text(fields.next().unwrap_or_default());
        let parts: Vec<&str> = head.trim_start_matches(':').split(' ').collect();
        let [old_mode, new_mode, _, _, status] = parts.as_slice() else {
            return Err(format!("unexpected raw record {head:?}"));
        };
        let first = text(fields.next().ok_or("a raw record without its path")?);
        let (status, old_path, path) = match status.chars().next() {
            Some('R') => (
                ChangeStatus::Renamed,
                Some(first),
                text(fields.next().ok_or("a rename without its new path")?),
            ),
            Some('C') => (
                ChangeStatus::Copied,
                Some(first),
                text(fields.next().ok_or("a copy without its new path")?),
            ),
            Some('A') => (ChangeStatus::Added, None, first),
            Some('D') => (ChangeStatus::Deleted, None, first),
            Some('T') => (ChangeStatus::TypeChanged, None, first),
            _ => (ChangeStatus::Modified, None, first),
        };
        let mode = |m: &str| (m != "000000").then(|| m.to_string());
        files.push(FileChange {
            path,
            old_path,
            status,
            old_mode: mode(old_mode),
            new_mode: mode(new_mode),
            additions: None,
            deletions: None,
            binary: false,
            patch: Vec::new(),
        });
    }
    // Numstat: "added\tdeleted\tpath" NUL, or "added\tdeleted\t" NUL old NUL new NUL for a rename/copy.
    for f in files.iter_mut() {
        let record = text(fields.next().ok_or("fewer numstat records than files")?);
        let mut counts = record.splitn(3, '\t');
        let (added, deleted, rest) = (counts.next(), counts.next(), counts.next().unwrap_or_default());
        if rest.is_empty() {
            // The paths follow (rename or copy).
            fields.next();
            fields.next();
        }
        match (added, deleted) {
            (Some("-"), Some("-")) => f.binary = true,
            (Some(a), Some(d)) => {
                f.additions = a.parse().ok();
                f.deletions = d.parse().ok();
            }
            _ => return Err(format!("unexpected numstat record {record:?}")),
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_is_read_with_renames_and_binaries() {
        let out = b":100644 100644 aaa bbb M\0src/a.rs\0:100644 100644 ccc ddd R090\0old.txt\0new.txt\0:000000 100644 000 eee A\0img.png\0\
3\t1\tsrc/a.rs\0\x32\t0\t\0old.txt\0new.txt\0-\t-\timg.png\0";
        let files = parse_listing(out).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            (files[0].path.as_str(), files[0].status),
            ("src/a.rs", ChangeStatus::Modified)
        );
        assert_eq!((files[0].additions, files[0].deletions), (Some(3), Some(1)));
        assert_eq!(files[1].status, ChangeStatus::Renamed);
        assert_eq!(files[1].old_path.as_deref(), Some("old.txt"));
        assert_eq!(files[1].path, "new.txt");
        assert_eq!(files[1].additions, Some(2));
        assert!(files[2].binary && files[2].additions.is_none());
        assert_eq!(files[2].old_mode, None);
    }
}
