//! Launch admission (I15, I17): read-only proof that a workspace is the one its environment names,
//! before any agent process exists. `AdmittedWorkspace` can only be built here; the code that spawns
//! agents accepts nothing else, so a path that was not proven can never become a working directory.
use crate::ids::{EnvironmentId, RepositoryId};
use std::path::{Path, PathBuf};

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
/// let forged = berth::executor::admission::AdmittedWorkspace { environment_id: berth::ids::EnvironmentId::from(uuid::Uuid::nil()), path: "/tmp".into() };
/// ```
#[derive(Debug)]
pub struct AdmittedWorkspace {
    environment_id: EnvironmentId,
    path: PathBuf,
    trees: Vec<Tree>,
}

/// A worktree of an admitted workspace, with its repository's common git directory: what the agent's box
/// shows of it (`runtime::sandbox`).
#[derive(Debug, Clone)]
pub struct Tree {
    pub path: PathBuf,
    pub common_git_dir: PathBuf,
    /// The `local` executor's source repository, its main checkout included.
    pub local: bool,
}

impl AdmittedWorkspace {
    pub fn environment_id(&self) -> EnvironmentId {
        self.environment_id
    }

    /// The effective workspace (I19): the worktree for one repository, the task root for several, the
    /// source repository for the local executor.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every worktree of the workspace, as admission proved it.
    pub fn trees(&self) -> &[Tree] {
        &self.trees
    }
}

/// A repository slot the task asks for, with the repository's identity.
#[derive(Debug, Clone)]
pub struct Slot {
    pub repository_id: RepositoryId,
    pub branch_slug: String,
    pub common_git_dir: PathBuf,
    pub source_path: PathBuf,
}

/// An active inventory row of the environment.
#[derive(Debug, Clone)]
pub struct Row {
    pub repository_id: RepositoryId,
    pub branch_slug: String,
    pub worktree_path: Option<PathBuf>,
    /// The linked worktree's git id the inventory recorded: the directory must still be that worktree.
    pub worktree_id: Option<String>,
}

pub struct Candidate<'a> {
    pub environment_id: EnvironmentId,
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
    let mut trees = Vec::with_capacity(c.slots.len());
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
        check_worktree(&path, &slot.common_git_dir, c.executor, row.worktree_id.as_deref())?;
        trees.push(Tree {
            path: path.clone(),
            common_git_dir: slot.common_git_dir.clone(),
            local: c.executor == ExecutorType::Local,
        });
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
        trees,
    })
}

/// Whether the directory at `path` is still the worktree berth made there (of the repository whose common
/// git directory is `common_git_dir`, registered as `worktree_id` when one was recorded): what a cleanup
/// job asks before it runs git in it (never git in a directory admission refuses). Read-only; blocking
/// (gix), so off the async threads.
pub fn prove_worktree(path: &Path, common_git_dir: &Path, worktree_id: Option<&str>) -> Result<(), Refusal> {
    check_worktree(path, common_git_dir, ExecutorType::Worktree, worktree_id)
}

fn check_worktree(
    path: &Path,
    common_git_dir: &Path,
    executor: ExecutorType,
    recorded_id: Option<&str>,
) -> Result<(), Refusal> {
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
    if executor == ExecutorType::Worktree && recorded_id.is_some() && info.worktree_id.as_deref() != recorded_id {
        // Another worktree of the same repository now sits at the recorded path.
        return Err(Refusal::RepositoryMismatch);
    }
    Ok(())
}

/// Remote executors (containers, sandboxes, other hosts) validate through their own inventory contract
/// instead of host filesystem inspection: given the environment and the handles its inventory records,
/// the executor proves, read-only, that they are live and belong to that environment, and names the
/// working directory inside it. No remote executor exists yet; this is the contract one implements.
pub trait RemoteInventory: Send + Sync {
    fn validate(&self, environment_id: EnvironmentId, handles: &[String]) -> Result<PathBuf, Refusal>;
}

/// Admission for a remote executor: the proof is still built only here.
pub fn admit_remote(
    inventory: &dyn RemoteInventory,
    environment_id: EnvironmentId,
    handles: &[String],
) -> Result<AdmittedWorkspace, Refusal> {
    if handles.is_empty() {
        return Err(Refusal::InventoryIncomplete);
    }
    let path = inventory.validate(environment_id, handles)?;
    Ok(AdmittedWorkspace {
        environment_id,
        path,
        trees: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(Result<PathBuf, Refusal>);
    impl RemoteInventory for Fake {
        fn validate(&self, _: EnvironmentId, _: &[String]) -> Result<PathBuf, Refusal> {
            self.0.clone()
        }
    }

    #[test]
    fn remote_admission_goes_through_the_inventory_contract() {
        let env = EnvironmentId::now_v7();
        let ok = admit_remote(&Fake(Ok("/workspace".into())), env, &["container-1".into()]).unwrap();
        assert_eq!((ok.environment_id(), ok.path()), (env, Path::new("/workspace")));
        assert_eq!(
            admit_remote(&Fake(Ok("/w".into())), env, &[]).unwrap_err(),
            Refusal::InventoryIncomplete
        );
        assert_eq!(
            admit_remote(&Fake(Err(Refusal::WorkspaceMissing)), env, &["x".into()]).unwrap_err(),
            Refusal::WorkspaceMissing
        );
    }

    #[test]
    fn local_admission_refuses_without_touching_anything() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let slot = Slot {
            repository_id: RepositoryId::now_v7(),
            branch_slug: String::new(),
            common_git_dir: root.join(".git"),
            source_path: root.join("src"),
        };
        let candidate = |executor, ready, rows: &[Row]| {
            let slots = [slot.clone()];
            let c = Candidate {
                environment_id: EnvironmentId::now_v7(),
                executor,
                ready,
                task_root: &root,
                slots: &slots,
                rows,
            };
            admit(&c, ExecutorType::Worktree).map(|_| ())
        };
        assert_eq!(
            candidate(ExecutorType::Local, true, &[]),
            Err(Refusal::ExecutorMismatch)
        );
        assert_eq!(
            candidate(ExecutorType::Worktree, false, &[]),
            Err(Refusal::EnvironmentNotReady)
        );
        assert_eq!(
            candidate(ExecutorType::Worktree, true, &[]),
            Err(Refusal::InventoryIncomplete)
        );
        let row = Row {
            repository_id: slot.repository_id,
            branch_slug: String::new(),
            worktree_path: Some(root.join("missing")),
            worktree_id: None,
        };
        assert_eq!(
            candidate(ExecutorType::Worktree, true, &[row.clone(), row.clone()]),
            Err(Refusal::InventoryAmbiguous)
        );
        assert_eq!(
            candidate(ExecutorType::Worktree, true, &[row]),
            Err(Refusal::WorkspaceMissing)
        );
        let stale = Row {
            repository_id: slot.repository_id,
            branch_slug: String::new(),
            worktree_path: Some("/elsewhere".into()),
            worktree_id: None,
        };
        assert_eq!(
            candidate(ExecutorType::Worktree, true, &[stale]),
            Err(Refusal::InventoryAmbiguous),
            "a path outside the environment"
        );
    }
}
