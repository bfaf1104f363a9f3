//! Launch admission (I15, I17): read-only proof that a workspace is the one its environment names,
//! before any agent process exists. `AdmittedWorkspace` can only be built here; the code that spawns
//! agents accepts nothing else, so a path that was not proven can never become a working directory.
use std::path::{Path, PathBuf};

use uuid::Uuid;

use crate::entity::task_environment::ExecutorType;
use crate::git;

/// Why admission refused (mapped to `workspace_reuse_unsafe` categories; carries no path or branch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    ExecutorMismatch,
    InventoryIncomplete,
    InventoryAmbiguous,
    WorkspaceMissing,
    NotAGitWorktree,
    RepositoryMismatch,
    EnvironmentNotReady,
}

/// The proof: this environment's workspace, validated just now. No public constructor (I17): code
/// outside this module cannot make one, so it cannot start an agent anywhere admission did not prove.
///
/// ```compile_fail
/// let forged = berth::executor::admission::AdmittedWorkspace { environment_id: uuid::Uuid::nil(), path: "/tmp".into() };
/// ```
#[derive(Debug)]
pub struct AdmittedWorkspace {
    environment_id: Uuid,
    path: PathBuf,
}

impl AdmittedWorkspace {
    pub fn environment_id(&self) -> Uuid {
        self.environment_id
    }

    /// The effective workspace (I19): the worktree for one repository, the task root for several, the
    /// source repository for the local executor.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A repository slot the task asks for, with the repository's identity.
#[derive(Debug, Clone)]
pub struct Slot {
    pub repository_id: Uuid,
    pub branch_slug: String,
    pub common_git_dir: PathBuf,
    pub source_path: PathBuf,
}

/// An active inventory row of the environment.
#[derive(Debug, Clone)]
pub struct Row {
    pub repository_id: Uuid,
    pub branch_slug: String,
    pub worktree_path: Option<PathBuf>,
}

pub struct Candidate<'a> {
    pub environment_id: Uuid,
    pub executor: ExecutorType,
    pub ready: bool,
    /// Where this environment's worktrees must live: `BERTH_WORKTREE_ROOT/<task dir>`.
    pub task_root: &'a Path,
    pub slots: &'a [Slot],
    pub rows: &'a [Row],
}

/// Validates without writing anything: no status scan, no index refresh, no file contents read.
pub fn admit(c: &Candidate<'_>, requested: ExecutorType) -> Result<AdmittedWorkspace, Refusal> {
    if c.executor != requested {
        return Err(Refusal::ExecutorMismatch);
    }
    if !c.ready {
        return Err(Refusal::EnvironmentNotReady);
    }
    let mut paths = Vec::with_capacity(c.slots.len());
    for slot in c.slots {
        let mut matching = c
            .rows
            .iter()
            .filter(|r| r.repository_id == slot.repository_id && r.branch_slug == slot.branch_slug);
        let row = matching.next().ok_or(Refusal::InventoryIncomplete)?;
        if matching.next().is_some() {
            return Err(Refusal::InventoryAmbiguous);
        }
        let path = match c.executor {
            ExecutorType::Local => slot.source_path.clone(),
            ExecutorType::Worktree => {
                let p = row.worktree_path.clone().ok_or(Refusal::InventoryIncomplete)?;
                // The path must be this environment's, not a stale copy from elsewhere.
                if !p.starts_with(c.task_root) {
                    return Err(Refusal::InventoryAmbiguous);
                }
                p
            }
        };
        check_worktree(&path, &slot.common_git_dir, c.executor)?;
        paths.push(path);
    }
    let path = match (c.executor, paths.as_slice()) {
        (_, []) => return Err(Refusal::InventoryIncomplete),
        (_, [one]) => one.clone(),
        (ExecutorType::Worktree, _) => {
            if !c.task_root.is_dir() {
                return Err(Refusal::WorkspaceMissing);
            }
            c.task_root.to_path_buf()
        }
        (ExecutorType::Local, _) => return Err(Refusal::InventoryAmbiguous),
    };
    Ok(AdmittedWorkspace {
        environment_id: c.environment_id,
        path,
    })
}

fn check_worktree(path: &Path, common_git_dir: &Path, executor: ExecutorType) -> Result<(), Refusal> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(Refusal::NotAGitWorktree),
        Err(_) => return Err(Refusal::WorkspaceMissing),
    }
    let info = git::inspect_worktree(path).map_err(|_| Refusal::NotAGitWorktree)?;
    if info.common_git_dir != common_git_dir {
        return Err(Refusal::RepositoryMismatch);
    }
    if executor == ExecutorType::Worktree && info.worktree_id.is_none() {
        return Err(Refusal::NotAGitWorktree);
    }
    Ok(())
}
