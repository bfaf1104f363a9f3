//! What a cleanup leaves on disk, and how it is listed and disposed of. Nothing holding someone's work
//! is lost without consent, and nothing kept goes unlisted:
//!
//! - a worktree with changes nobody consented to discard stays where it is (`dirty_worktree`): a
//!   superseded environment's, one a delete consented to keep (`keep_dirty_worktrees`), and one a delete's
//!   job failed on (its task is gone: listed, it is owned);
//! - a directory in a worktree's place that admission refuses (no longer the worktree, or no longer the
//!   repository's: a user replaced or re-cloned it) is never given to git. With consent it is removed;
//!   empty, it is removed; otherwise it is moved aside, whole, to
//!   `BERTH_WORKTREE_ROOT/.berth-leftovers/<id>/<name>` (`set_aside`), which frees the path for a fresh
//!   worktree.
//!
//! Each kept directory is a row of `leftovers`, listed and disposed of by `disposal`.
use crate::ids::{EnvironmentId, LeftoverId, TaskId, WorkspaceId};
use anyhow::anyhow;

use super::WorktreeSnapshot;
use crate::domain::Ctx;
use crate::entity::leftover::{self, LeftoverReason};
use crate::error::{Error, Result};
use crate::executor::admission::{self, Refusal};
use crate::managed_path::{Consent, ManagedPath, ManagedRoot};
use crate::store::leftovers as store;

/// The directory leftovers are moved aside into, directly under the worktree root (a task's directory is
/// named by its slug, which never starts with a dot).
const ASIDE: &str = ".berth-leftovers";

/// Whose a kept directory was: recorded with it.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub workspace_id: WorkspaceId,
    pub task_id: Option<TaskId>,
    pub environment_id: Option<EnvironmentId>,
}

/// What sits at a snapshot's worktree path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The worktree berth made: git may run in it.
    Worktree,
    /// Something admission refuses: the user's, never given to git.
    Refused(Refusal),
    /// The repository's own git directory is not there (moved away for a while, a mount not up): nothing
    /// can be told about the worktree now, so nothing is decided; ask again later.
    RepositoryAway,
}

/// Looks at the directory at a snapshot's worktree path (off the async threads).
pub(crate) async fn examine(target: &ManagedPath, w: &WorktreeSnapshot) -> Found {
    let path = target.as_path().to_path_buf();
    let common = std::path::PathBuf::from(&w.common_git_dir);
    let id = w.worktree_id.clone();
    tokio::task::spawn_blocking(move || {
        if !common.join("HEAD").is_file() {
            return Found::RepositoryAway;
        }
        match admission::prove_worktree(&path, &common, id.as_deref()) {
            Ok(()) => Found::Worktree,
            Err(r) => Found::Refused(r),
        }
    })
    .await
    .unwrap_or(Found::RepositoryAway)
}

/// A worktree with `dirty` changed files stays where it is: listed.
pub(super) async fn keep_dirty(ctx: &Ctx, owner: Owner, w: &WorktreeSnapshot, dirty: usize) -> Result<()> {
    let detail = format!("{dirty} changed files; removing them was not consented to");
    record(ctx, owner, w, &w.worktree_path, LeftoverReason::DirtyWorktree, detail).await
}

/// A directory admission refused at a worktree's path: removed with consent or when empty, moved aside
/// otherwise (and listed). Never given to git. An error is permanent: it will fail the same way again.
pub(super) async fn refused_directory(
    ctx: &Ctx,
    root: &ManagedRoot,
    target: &ManagedPath,
    w: &WorktreeSnapshot,
    owner: Owner,
    consent: Option<&Consent>,
    refusal: Refusal,
) -> anyhow::Result<()> {
    let path = target.as_path().to_path_buf();
    let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
    let empty = is_dir && std::fs::read_dir(&path).is_ok_and(|mut d| d.next().is_none());
    if consent.is_some() || empty {
        // I11: what it holds goes only with the consent the job recorded.
        return blocking(move || {
            if is_dir {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
        })
        .await
        .map_err(|e| anyhow!(e).context("removing a directory that is no longer the worktree failed"));
    }
    let id = LeftoverId::now_v7();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "worktree".into());
    let bucket = root
        .join(&[ASIDE, &id.to_string()])
        .map_err(|e| anyhow!(e).context("the leftovers directory is not usable"))?;
    let dest = bucket.as_path().join(&name);
    let (from, to, dir) = (path.clone(), dest.clone(), bucket.as_path().to_path_buf());
    blocking(move || {
        std::fs::create_dir_all(&dir)?;
        std::fs::rename(&from, &to)
    })
    .await
    .map_err(|e| anyhow!(e).context("moving aside a directory that is no longer the worktree failed"))?;
    tracing::warn!(repository = %w.repository_id, ?refusal, "moved aside what sat in a worktree's place");
    let detail = format!(
        "admission refused it ({}); moved aside untouched",
        crate::error::ReuseCategory::from(refusal).as_str()
    );
    let at = dest.to_string_lossy().into_owned();
    record(ctx, owner, w, &at, LeftoverReason::SetAside, detail)
        .await
        .map_err(|e| anyhow!(e).context("recording a directory moved aside failed"))?;
    // A directory set aside is still there if recording failed: the error says so, nothing is lost.
    Ok(())
}

pub(super) async fn blocking(f: impl FnOnce() -> std::io::Result<()> + Send + 'static) -> std::io::Result<()> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

async fn record(
    ctx: &Ctx,
    owner: Owner,
    w: &WorktreeSnapshot,
    path: &str,
    reason: LeftoverReason,
    detail: String,
) -> Result<()> {
    let worktree = serde_json::to_value(w).map_err(|e| Error::Internal(e.into()))?;
    store::record(
        &ctx.db.conn,
        leftover::Model {
            id: LeftoverId::now_v7(),
            workspace_id: owner.workspace_id,
            task_id: owner.task_id,
            task_environment_id: owner.environment_id,
            repository_id: Some(w.repository_id),
            path: path.to_string(),
            original_path: w.worktree_path.clone(),
            reason,
            detail,
            worktree,
            created_at: crate::clock::now(),
            node_id: Some(ctx.config.node_id.clone()),
        },
    )
    .await
}
