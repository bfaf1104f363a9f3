//! Checkpoints: the complete state of an environment's worktrees at one moment, one git tree per
//! repository slot, taken through a temporary index (`git::diff::snapshot`) without touching the
//! worktree, its index, the stash or any branch, and kept alive by berth's own refs
//! (`refs/berth/checkpoints/<environment>/<checkpoint>-<position>`), which the environment's cleanup
//! removes. Only the node whose disk holds the worktrees takes one, and only of berth's worktrees (a
//! `local` session's checkout is the user's own: no checkpoint, no ref of berth's in it).
use crate::ids::{CheckpointId, EnvironmentId, RepositoryId, SessionId};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Ctx;
use super::writer::{Asking, WriterLease};
use crate::entity::checkpoint;
use crate::entity::task_environment::{self as env, EnvironmentStatus, ExecutorType};
use crate::error::{Error, Result};
use crate::git::diff as git_diff;

/// One slot's tree in a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlotTree {
    pub repository_id: RepositoryId,
    pub position: i32,
    pub tree: String,
}

/// Where temporary indexes are made: under the data directory, never inside a worktree.
pub(crate) fn scratch_dir(ctx: &Ctx) -> Result<PathBuf> {
    let dir = ctx.config.data_dir.join("tmp");
    std::fs::create_dir_all(&dir).map_err(|err| Error::Internal(err.into()))?;
    Ok(dir)
}

/// The prefix of an environment's checkpoint refs.
pub fn ref_prefix(env_id: EnvironmentId) -> String {
    format!("refs/berth/checkpoints/{env_id}/")
}

/// A repository slot of an environment, where its files are.
pub(crate) struct SlotPath {
    pub repository_id: RepositoryId,
    pub position: i32,
    /// The worktree (the repository's own checkout for a `local` environment).
    pub worktree: PathBuf,
    pub repository: PathBuf,
    pub default_branch: String,
}

/// The environment's active slots, first to last, with where their files are.
pub(crate) async fn worktrees(ctx: &Ctx, e: &env::Model) -> Result<Vec<SlotPath>> {
    let mut rows = crate::store::environments::active_repos_with_repository(&ctx.db.conn, e.id).await?;
    rows.sort_by_key(|(row, _)| row.position);
    Ok(rows
        .into_iter()
        .filter_map(|(row, repo)| {
            let repo = repo?;
            let worktree = match (e.executor_type, &row.worktree_path) {
                (ExecutorType::Worktree, Some(p)) => PathBuf::from(p),
                (ExecutorType::Local, _) => PathBuf::from(&repo.path),
                _ => return None,
            };
            Some(SlotPath {
                repository_id: row.repository_id,
                position: row.position,
                worktree,
                repository: PathBuf::from(repo.path),
                default_branch: repo.default_branch,
            })
        })
        .collect())
}

/// Takes a checkpoint of the environment now; `None` when there is nothing to take it of here (another
/// node's disk, an environment that is not ready).
pub(crate) async fn take(
    ctx: &Ctx,
    e: &env::Model,
    session_id: Option<SessionId>,
    lease: &WriterLease,
) -> Result<Option<checkpoint::Model>> {
    if lease.environment_id() != e.id {
        return Err(Error::Internal(anyhow::anyhow!(
            "a checkpoint under another environment's lease"
        )));
    }
    // Only berth's worktrees: a `local` session works in the user's own checkout, where berth keeps no
    // refs of its own.
    if e.node_id != ctx.config.node_id
        || e.executor_type != ExecutorType::Worktree
        || !matches!(e.status, EnvironmentStatus::Ready | EnvironmentStatus::Stopped)
    {
        return Ok(None);
    }
    let scratch = scratch_dir(ctx)?;
    let id = CheckpointId::now_v7();
    let mut trees = Vec::new();
    for SlotPath {
        repository_id,
        position,
        worktree,
        repository: repo,
        ..
    } in worktrees(ctx, e).await?
    {
        if !worktree.is_dir() {
            return Ok(None);
        }
        let git = |err: crate::git::cli::GitError| Error::Internal(anyhow::anyhow!("checkpoint: {err}"));
        let tree = git_diff::snapshot(ctx.git.as_ref(), &worktree, &scratch)
            .await
            .map_err(git)?;
        let refname = format!("{}{id}-{position}", ref_prefix(e.id));
        // Never a ref after another writer began (a cleanup that took over a lapsed holding forgets the
        // environment's refs: one left after it would stay in the user's repository for good): written,
        // then the lease read; lost meanwhile, the ref goes again.
        ctx.git.keep_object(&repo, &refname, &tree).await.map_err(git)?;
        if !super::writer::still_held(ctx, lease).await? {
            ctx.git.drop_refs(&repo, &refname).await.map_err(git)?;
            return Ok(None);
        }
        trees.push(SlotTree {
            repository_id,
            position,
            tree,
        });
    }
    let model = checkpoint::Model {
        id,
        task_environment_id: e.id,
        session_id,
        trees: serde_json::to_value(&trees).map_err(|err| Error::Internal(err.into()))?,
        created_at: crate::clock::now(),
    };
    crate::store::turns::insert_checkpoint(&ctx.db.conn, model.clone()).await?;
    Ok(Some(model))
}

pub fn trees_of(c: &checkpoint::Model) -> Vec<SlotTree> {
    serde_json::from_value(c.trees.clone()).unwrap_or_default()
}

/// What changed from checkpoint `from` to checkpoint `to`, per slot: (repository id, position, files).
pub(crate) async fn changes_between(
    ctx: &Ctx,
    e: &env::Model,
    from: &checkpoint::Model,
    to: &checkpoint::Model,
    context: u32,
    paths: &[String],
    keep: usize,
) -> Result<Vec<(RepositoryId, i32, String, String, Vec<git_diff::FileChange>)>> {
    let mut out = Vec::new();
    for (at, old, after) in pairs(ctx, e, from, to).await? {
        let files = git_diff::between(ctx.git.as_ref(), &at, &old.tree, &after.tree, context, paths, keep)
            .await
            .map_err(|err| Error::Internal(anyhow::anyhow!("checkpoint diff: {err}")))?;
        out.push((
            after.repository_id,
            after.position,
            old.tree.clone(),
            after.tree.clone(),
            files,
        ));
    }
    Ok(out)
}

/// How many files changed from one checkpoint to another, over every slot, without making a patch
/// (the end of a turn counts them: an agent's big files cost berth nothing).
pub(crate) async fn files_changed(
    ctx: &Ctx,
    e: &env::Model,
    from: &checkpoint::Model,
    to: &checkpoint::Model,
) -> Result<usize> {
    let mut n = 0;
    for (at, old, after) in pairs(ctx, e, from, to).await? {
        n += git_diff::count_between(ctx.git.as_ref(), &at, &old.tree, &after.tree)
            .await
            .map_err(|err| Error::Internal(anyhow::anyhow!("checkpoint diff: {err}")))?;
    }
    Ok(n)
}

/// Each slot's tree in both checkpoints, with where its objects can be read.
async fn pairs(
    ctx: &Ctx,
    e: &env::Model,
    from: &checkpoint::Model,
    to: &checkpoint::Model,
) -> Result<Vec<(std::path::PathBuf, SlotTree, SlotTree)>> {
    let worktrees = worktrees(ctx, e).await?;
    let before = trees_of(from);
    let mut out = Vec::new();
    for after in trees_of(to) {
        let Some(old) = before.iter().find(|b| b.position == after.position) else {
            continue;
        };
        // The objects are in the repository; any worktree of it reads them.
        let Some(slot) = worktrees.iter().find(|w| w.position == after.position) else {
            continue;
        };
        let at = if slot.worktree.is_dir() {
            slot.worktree.clone()
        } else {
            slot.repository.clone()
        };
        out.push((at, old.clone(), after));
    }
    Ok(out)
}

/// Removes the environment's checkpoint refs from its repositories (its cleanup); the rows go too.
pub(crate) async fn forget(
    ctx: &Ctx,
    env_id: EnvironmentId,
    repositories: &[String],
    lease: &WriterLease,
) -> Result<()> {
    if lease.environment_id() != env_id {
        return Err(Error::Internal(anyhow::anyhow!(
            "forgetting checkpoints under another environment's lease"
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for repo in repositories.iter().filter(|r| seen.insert(r.as_str())) {
        let path = std::path::Path::new(repo);
        if !path.is_dir() {
            continue;
        }
        ctx.git
            .drop_refs(path, &ref_prefix(env_id))
            .await
            .map_err(|err| Error::Internal(anyhow::anyhow!("dropping checkpoint refs: {err}")))?;
    }
    crate::store::turns::delete_checkpoints_of(&ctx.db.conn, env_id).await
}

/// Puts the environment's worktrees back to a checkpoint, holding the environment's writer lease: refused
/// while another writer holds it (an agent's turn, `attention` included: `409 session_busy`; a landing,
/// a cleanup) or an agent is starting, recovering or stopping in it, on an archived task or one being
/// cleaned, and, without consent, when the worktrees changed since the last checkpoint (those changes
/// would be lost). Files the checkpoint does not have are removed (walked without following a symbolic
/// link), the others written as it holds them; `.gitignore`d files are left alone; the worktree's index
/// and refs are not touched. The state after it is a new checkpoint and a live git status observation;
/// `environment.restored` says so.
pub async fn restore(
    ctx: &Ctx,
    p: &crate::auth::UnboundPrincipal,
    env_id: EnvironmentId,
    checkpoint_id: CheckpointId,
    discard: bool,
) -> Result<checkpoint::Model> {
    let view = super::environments::get(ctx, p, env_id).await?;
    let e = view.env;
    if e.status == EnvironmentStatus::Broken {
        return Err(Error::WorkspaceReuseUnsafe(super::environments::broken_category(&e)));
    }
    super::nodes::here(ctx, &e.node_id).await?;
    let target = crate::store::turns::checkpoint(&ctx.db.conn, checkpoint_id)
        .await?
        .filter(|c| c.task_environment_id == e.id)
        .ok_or_else(|| Error::invalid("checkpoint_id", "is not a checkpoint of this environment"))?;
    let lease = super::writer::acquire(ctx, e.id, Asking::Restore).await?;
    let restored = restore_held(ctx, &e, &target, discard, &lease).await;
    super::writer::release(ctx, lease).await;
    let (after, changed) = restored?;
    // What the worktrees hold now, for every reader of the git status (never the files that are gone).
    if let Err(err) = super::git_status::inspect_and_record(
        ctx,
        &e,
        crate::entity::git_status_observation::ObservationKind::Live,
        None,
        false,
    )
    .await
    {
        tracing::warn!(environment = %e.id, error = %err, "no git status observation after the restore");
    }
    if let Some(task) = crate::store::tasks::find(&ctx.db.conn, e.task_id).await? {
        let txn = ctx.db.begin_write().await?;
        crate::events::append(
            &txn,
            ctx.instance_id,
            crate::events::EventType::EnvironmentRestored,
            crate::events::Subject {
                task_environment_id: Some(e.id),
                ..crate::events::Subject::task(task.workspace_id, task.id)
            },
            serde_json::json!({ "checkpoint_id": target.id, "new_checkpoint_id": after.id, "discarded_changes": changed }),
        )
        .await?;
        ctx.commit(txn).await?;
    }
    Ok(after)
}

/// The restore itself, under the lease: the checkpoint after it, and whether it discarded changes.
async fn restore_held(
    ctx: &Ctx,
    e: &env::Model,
    target: &checkpoint::Model,
    discard: bool,
    lease: &WriterLease,
) -> Result<(checkpoint::Model, bool)> {
    let conn = &ctx.db.conn;
    let busy = crate::store::sessions::in_environment(conn, e.id)
        .await?
        .iter()
        .any(|s| s.state.is_busy() || s.state == crate::entity::task_session::SessionState::Attention);
    if busy {
        return Err(Error::SessionBusy);
    }
    super::git_status::prove(ctx, e).await?;
    let scratch = scratch_dir(ctx)?;
    let git = |err: crate::git::cli::GitError| Error::Internal(anyhow::anyhow!("restore: {err}"));
    let worktrees = worktrees(ctx, e).await?;
    // What is there now, per slot, against the last checkpoint.
    let last = crate::store::turns::latest_checkpoint_of(conn, e.id).await?;
    let last = last.as_ref().map(trees_of).unwrap_or_default();
    let mut now = Vec::new();
    for SlotPath { position, worktree, .. } in &worktrees {
        let tree = git_diff::snapshot(ctx.git.as_ref(), worktree, &scratch)
            .await
            .map_err(git)?;
        let unchanged = last.iter().any(|t| t.position == *position && t.tree == tree);
        now.push((*position, tree, unchanged));
    }
    let changed = now.iter().any(|(_, _, unchanged)| !unchanged);
    if changed && !discard {
        return Err(Error::InvalidState(
            "the worktrees changed since the last checkpoint and a restore would discard those changes: \
             send discard_worktree_changes: true to discard them"
                .into(),
        ));
    }
    let root = crate::managed_path::ManagedRoot::from_config(&ctx.config);
    let wanted = trees_of(target);
    for SlotPath { position, worktree, .. } in &worktrees {
        let Some(want) = wanted.iter().find(|t| t.position == *position) else {
            continue;
        };
        let Some((_, current, _)) = now.iter().find(|(p, _, _)| p == position) else {
            continue;
        };
        let managed = root
            .adopt(worktree)
            .map_err(|err| Error::Internal(anyhow::anyhow!("restore: {err}")))?;
        // Files there now that the checkpoint does not have: removed inside the worktree, never through
        // a symbolic link on the way.
        let extra = git_diff::added_between(ctx.git.as_ref(), worktree, &want.tree, current)
            .await
            .map_err(git)?;
        let base = managed.as_path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            for path in &extra {
                let full = base.join(path);
                if let Err(f) = crate::agent::fs::remove_inside(&base, &full.to_string_lossy()) {
                    tracing::warn!(path = %path, error = %f.message, "a restore left a file it could not remove");
                }
            }
        })
        .await
        .map_err(|err| Error::Internal(err.into()))?;
        let index = scratch.join(format!("restore-{}", Uuid::now_v7()));
        let written = ctx.git.write_tree_files(&managed, &want.tree, &index).await;
        let _ = std::fs::remove_file(&index);
        written.map_err(git)?;
    }
    let after = take(ctx, e, None, lease)
        .await?
        .ok_or_else(|| Error::Internal(anyhow::anyhow!("no checkpoint after the restore")))?;
    Ok((after, changed))
}
