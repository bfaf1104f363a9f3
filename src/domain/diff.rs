//! What the agent did, as a diff: per repository slot of an environment, the changes of its worktree
//! against the merge base with the slot's base branch (or HEAD, or base to HEAD), read by `git::diff`
//! without writing to the worktree, its index or its refs. Answers are bounded by two settings: a file's
//! patch longer than `BERTH_DIFF_MAX_FILE_BYTES` is cut at a line and says so (`truncated`); more files
//! than `BERTH_DIFF_MAX_FILES` are paged by file (`next_cursor`). The ETag is the answer's content hash.

use crate::ids::{EnvironmentId, RepositoryId, SessionId};
use base64::Engine;
use serde::Serialize;
use sha2::Digest;
use utoipa::ToSchema;

use super::Ctx;
use crate::auth::Principal;
use crate::entity::task_environment::{self as env, EnvironmentStatus};
use crate::error::{Error, Result, ReuseCategory};
use crate::git::diff::{self as git_diff, ChangeStatus, Scope};

/// What a caller asks for.
pub struct Query {
    pub scope: Scope,
    pub context: u32,
    pub paths: Vec<String>,
    pub repository_id: Option<RepositoryId>,
    pub cursor: Option<String>,
}

/// The most context lines a caller may ask for.
pub const MAX_CONTEXT: u32 = 1_000;

#[derive(Debug, Serialize, ToSchema)]
pub struct Diff {
    pub task_environment_id: EnvironmentId,
    /// `all`, `uncommitted` or `committed`.
    pub scope: String,
    /// One entry per repository slot that has files on this page (every slot on the first page).
    pub repositories: Vec<RepositoryDiff>,
    /// Files in the whole diff, over every page.
    pub total_files: u64,
    /// The next page (`cursor=`), when there are more files than one answer carries.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RepositoryDiff {
    pub repository_id: RepositoryId,
    /// The slot's base branch.
    pub base_branch: String,
    /// The commit compared against: the merge base of the task branch with the base branch (`all`,
    /// `committed`), or HEAD (`uncommitted`); null on a branch with no commit yet.
    pub base: Option<String>,
    pub head: Option<String>,
    pub files: Vec<FileDiff>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FileDiff {
    pub path: String,
    /// The path it had before a rename or a copy.
    pub old_path: Option<String>,
    pub status: ChangeStatus,
    /// git's file modes (`100644`, `100755`, `120000` for a symlink, shown as the link, never followed).
    pub old_mode: Option<String>,
    pub new_mode: Option<String>,
    /// Lines added and removed; null for a binary file.
    pub additions: Option<u64>,
    pub deletions: Option<u64>,
    pub binary: bool,
    /// The patch is cut at a line (it was longer than `BERTH_DIFF_MAX_FILE_BYTES`).
    pub truncated: bool,
    /// The unified diff of the file, headers included.
    pub patch: String,
    /// `utf8`, or `base64` when the patch is not UTF-8 (its bytes are kept as git wrote them).
    pub patch_encoding: String,
}

/// The diff of an environment, and its ETag.
pub async fn of_environment(ctx: &Ctx, p: &Principal, env_id: EnvironmentId, q: Query) -> Result<(Diff, String)> {
    let view = super::environments::get(ctx, p, env_id).await?;
    diff(ctx, &view.env, q).await
}

/// The diff of the session's environment (the route is the session's; the identity the environment's).
pub async fn of_session(ctx: &Ctx, p: &Principal, session_id: SessionId, q: Query) -> Result<(Diff, String)> {
    let s = super::sessions::visible(&ctx.db.conn, p, session_id).await?;
    let env_id = s
        .task_environment_id
        .ok_or_else(|| Error::InvalidState("the session has no environment yet".into()))?;
    let e = crate::store::environments::find(&ctx.db.conn, env_id)
        .await?
        .ok_or(Error::NotFound("environment"))?;
    diff(ctx, &e, q).await
}

/// One slot's changes, whole (before paging).
pub(crate) struct SlotChanges {
    pub repository_id: RepositoryId,
    pub base_branch: String,
    pub changes: git_diff::Changes,
}

/// Every slot's changes in an environment whose worktrees can be read here (the typed 409s a refresh
/// gives otherwise: what admission found stands until a reset; only a ready environment's worktrees are
/// read; another node's disk is that node's to read).
///
/// Each file's patch is kept to `keep.bytes` as git streams it, and only for the files of the page
/// (`keep.skip`, `keep.take` over every slot in order): the rest is never held.
pub(crate) async fn slot_changes(ctx: &Ctx, e: &env::Model, q: &Query, keep: Keep) -> Result<Vec<SlotChanges>> {
    if e.status == EnvironmentStatus::Broken {
        return Err(Error::WorkspaceReuseUnsafe(super::environments::broken_category(e)));
    }
    if !matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped) {
        return Err(Error::InvalidState(
            "only a ready environment's worktrees are read".into(),
        ));
    }
    super::nodes::here(ctx, &e.node_id).await?;
    let conn = &ctx.db.conn;
    let worktrees = super::checkpoints::worktrees(ctx, e).await?;
    if let Some(id) = q.repository_id
        && !worktrees.iter().any(|w| w.repository_id == id)
    {
        return Err(Error::invalid(
            "repository_id",
            "is not a repository of this environment",
        ));
    }
    super::git_status::prove(ctx, e).await?;
    let slots = crate::store::tasks::slots_of(conn, e.task_id).await?;
    let scratch = super::checkpoints::scratch_dir(ctx)?;
    let mut repos = Vec::new();
    let (mut skip, mut take) = (keep.skip, keep.take);
    for w in worktrees {
        if q.repository_id.is_some_and(|id| id != w.repository_id) {
            continue;
        }
        if !w.worktree.is_dir() {
            return Err(Error::WorkspaceReuseUnsafe(ReuseCategory::WorkspaceMissing));
        }
        let base_branch = slots
            .iter()
            .find(|s| s.repository_id == w.repository_id && s.position == w.position)
            .and_then(|s| s.base_branch.clone())
            .unwrap_or(w.default_branch);
        let req = git_diff::Request {
            scope: q.scope,
            base_branch: &base_branch,
            context: q.context,
            paths: &q.paths,
            scratch: &scratch,
            keep: keep.bytes,
            window: skip..skip.saturating_add(take),
        };
        let changes = git_diff::changes(ctx.git.as_ref(), &w.worktree, &req)
            .await
            .map_err(|err| Error::Internal(anyhow::anyhow!("git diff: {err}")))?;
        let n = changes.files.len();
        let skipped = skip.min(n);
        take -= (n - skipped).min(take);
        skip -= skipped;
        repos.push(SlotChanges {
            repository_id: w.repository_id,
            base_branch,
            changes,
        });
    }
    Ok(repos)
}

async fn diff(ctx: &Ctx, e: &env::Model, q: Query) -> Result<(Diff, String)> {
    let offset = match &q.cursor {
        Some(c) => decode_cursor(c)?,
        None => 0,
    };
    let limit = ctx.config.diff_max_files;
    let page = Keep {
        bytes: keep(ctx),
        skip: offset,
        take: limit,
    };
    let repos = slot_changes(ctx, e, &q, page).await?;
    let total: usize = repos.iter().map(|r| r.changes.files.len()).sum();
    let mut skip = offset;
    let mut room = limit;
    let mut out = Vec::new();
    for SlotChanges {
        repository_id,
        base_branch,
        changes,
    } in repos
    {
        let n = changes.files.len();
        let take_from = skip.min(n);
        skip -= take_from;
        let files: Vec<FileDiff> = changes
            .files
            .into_iter()
            .skip(take_from)
            .take(room)
            .map(|f| file(f, ctx.config.diff_max_file_bytes))
            .collect();
        room -= files.len();
        // The first page names every slot (an empty one says it has no changes); later pages only theirs.
        if offset == 0 || !files.is_empty() {
            out.push(RepositoryDiff {
                repository_id,
                base_branch,
                base: changes.base,
                head: changes.head,
                files,
            });
        }
    }
    let next = offset + limit;
    let answer = Diff {
        task_environment_id: e.id,
        scope: match q.scope {
            Scope::All => "all",
            Scope::Uncommitted => "uncommitted",
            Scope::Committed => "committed",
        }
        .into(),
        repositories: out,
        total_files: total as u64,
        next_cursor: (next < total).then(|| encode_cursor(next)),
    };
    tagged(answer, 'd')
}

/// An answer with its ETag: the hash of its content (`kind` tells an environment's diff from a turn's).
pub(crate) fn tagged(answer: Diff, kind: char) -> Result<(Diff, String)> {
    let body = serde_json::to_vec(&answer).map_err(|err| Error::Internal(err.into()))?;
    let hash = sha2::Sha256::digest(&body);
    let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    Ok((answer, format!("\"{kind}-{hex}\"")))
}

/// What is kept of a diff's patches as git streams them: `bytes` of each, for the `take` files after the
/// first `skip` (over every slot in order).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    pub bytes: usize,
    pub skip: usize,
    pub take: usize,
}

impl Keep {
    /// Every patch, whole (a review quotes any line of any file).
    pub(crate) const ALL: Keep = Keep {
        bytes: usize::MAX,
        skip: 0,
        take: usize::MAX,
    };
}

/// What a diff answer keeps of each file's patch as git streams it: one byte past the cut, so that `file`
/// knows it was cut.
pub(crate) fn keep(ctx: &Ctx) -> usize {
    ctx.config.diff_max_file_bytes.saturating_add(1)
}

/// A file of the answer: its patch cut to the limit at a line, as text when it is UTF-8.
pub(crate) fn file(f: git_diff::FileChange, max_bytes: usize) -> FileDiff {
    let mut patch = f.patch;
    let truncated = patch.len() > max_bytes;
    if truncated {
        let cut = patch[..max_bytes]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        patch.truncate(cut);
    }
    let (patch, patch_encoding) = match String::from_utf8(patch) {
        Ok(text) => (text, "utf8"),
        Err(bytes) => (
            base64::engine::general_purpose::STANDARD.encode(bytes.into_bytes()),
            "base64",
        ),
    };
    FileDiff {
        path: f.path,
        old_path: f.old_path,
        status: f.status,
        old_mode: f.old_mode,
        new_mode: f.new_mode,
        additions: f.additions,
        deletions: f.deletions,
        binary: f.binary,
        truncated,
        patch,
        patch_encoding: patch_encoding.into(),
    }
}

fn encode_cursor(offset: usize) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("f{offset}"))
}

fn decode_cursor(c: &str) -> Result<usize> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.strip_prefix('f').and_then(|n| n.parse().ok()))
        .ok_or_else(|| Error::invalid("cursor", "is not a cursor this diff gave"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(patch: &[u8]) -> git_diff::FileChange {
        git_diff::FileChange {
            path: "a".into(),
            old_path: None,
            status: ChangeStatus::Modified,
            old_mode: None,
            new_mode: None,
            additions: Some(1),
            deletions: Some(0),
            binary: false,
            patch: patch.to_vec(),
        }
    }

    #[test]
    fn a_long_patch_is_cut_at_a_line_and_bytes_are_never_mangled() {
        let f = file(change(b"line one\nline two\nline three\n"), 20);
        assert!(f.truncated);
        assert_eq!(f.patch, "line one\nline two\n");
        let f = file(change(b"+caf\xe9\n"), 100);
        assert_eq!(f.patch_encoding, "base64");
        assert_eq!(
            base64::engine::general_purpose::STANDARD.decode(&f.patch).unwrap(),
            b"+caf\xe9\n"
        );
        assert!(!f.truncated);
    }

    #[test]
    fn cursors_round_trip_and_refuse_strangers() {
        assert_eq!(decode_cursor(&encode_cursor(500)).unwrap(), 500);
        assert!(decode_cursor("nope!").is_err());
    }
}
