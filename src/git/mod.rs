//! Git. Reads happen in-process with gix (repository identity, HEAD, worktree identity); mutations
//! (worktree add/remove, branch delete) go through the `git` CLI in `cli`, with a timeout and a
//! process-wide concurrency cap.
pub mod cli;
pub mod diff;
pub mod error;
mod harden;
pub mod land;
mod lock_retry;
pub mod merge;
pub mod patch;
pub use crate::config::signature;
pub mod status;

use std::path::{Path, PathBuf};

/// A branch name git would accept (`refs/heads/<name>` is a valid reference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchName(String);

impl BranchName {
    pub fn parse(name: &str) -> Result<BranchName, &'static str> {
        if name.is_empty() || name.len() > 200 {
            return Err("must be 1 to 200 characters");
        }
        if name.starts_with('-') {
            return Err("must not start with '-'");
        }
        if name == "HEAD" {
            return Err("HEAD is not a branch name");
        }
        let full = format!("refs/heads/{name}");
        gix::validate::reference::branch_name(full.as_bytes().into()).map_err(|_| "is not a valid git branch name")?;
        Ok(BranchName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Proof that a branch holds nothing that its base or its upstream lacks, at one commit: built only by
/// `MergedBranch::prove`, which asked git. Deleting it loses no commit.
#[derive(Debug, Clone)]
pub struct MergedBranch {
    branch: BranchName,
    tip: String,
}

impl MergedBranch {
    /// Asks git whether `tip` (the branch's commit now) is reachable from `base` or from the branch's
    /// upstream. `Some(true)`: from the base; `Some(false)`: from the upstream; `None`: from neither.
    pub async fn prove(
        git: &dyn cli::GitMutations,
        repo: &Path,
        branch: &BranchName,
        tip: &str,
        base: Option<&str>,
    ) -> Result<Option<(MergedBranch, bool)>, cli::GitError> {
        let proof = || MergedBranch {
            branch: branch.clone(),
            tip: tip.to_string(),
        };
        if let Some(base) = base.filter(|b| !b.is_empty() && !b.starts_with('-'))
            && git.is_ancestor(repo, tip, base).await.unwrap_or(false)
        {
            return Ok(Some((proof(), true)));
        }
        if let Some(upstream) = git.upstream_tip(repo, branch).await?
            && git.is_ancestor(repo, tip, &upstream).await?
        {
            return Ok(Some((proof(), false)));
        }
        Ok(None)
    }

    pub fn branch(&self) -> &BranchName {
        &self.branch
    }

    pub fn tip(&self) -> &str {
        &self.tip
    }
}

/// Consent to delete berth-created branches that are not merged: only from a delete request's explicit
/// `delete_branches=true`, or read back from the cleanup job snapshot that recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchDeletionConsent {
    _given: (),
}

impl BranchDeletionConsent {
    pub(crate) fn from_flag(delete_branches: Option<bool>) -> Option<BranchDeletionConsent> {
        (delete_branches == Some(true)).then_some(BranchDeletionConsent { _given: () })
    }
}

/// `#[serde(with)]` for a recorded branch consent: stored as the boolean `delete_branches`.
pub mod recorded_branch_consent {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::BranchDeletionConsent;

    pub fn serialize<S: Serializer>(consent: &Option<BranchDeletionConsent>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(consent.is_some())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BranchDeletionConsent>, D::Error> {
        Ok(bool::deserialize(d)?.then_some(BranchDeletionConsent { _given: () }))
    }
}

/// What berth records about a source repository when it is registered.
#[cfg(test)]
mod tests {
    use super::{BranchName, branch_exists_in, inspect_repository};

    fn git(dir: &std::path::Path, args: &[&str]) {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn a_branch_is_found_loose_or_packed_and_a_missing_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().canonicalize().unwrap().join("r");
        std::fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "init"]);
        git(&repo, &["branch", "feature/x"]);
        let common = inspect_repository(&repo).unwrap().common_git_dir;
        assert!(branch_exists_in(&common, &repo, "feature/x").unwrap(), "a loose ref");
        git(&repo, &["pack-refs", "--all"]);
        assert!(
            !common.join("refs/heads/feature/x").exists(),
            "the ref is only packed now"
        );
        assert!(branch_exists_in(&common, &repo, "feature/x").unwrap(), "a packed ref");
        assert!(!branch_exists_in(&common, &repo, "feature/y").unwrap());
        assert!(
            !branch_exists_in(&common, &repo, "feature").unwrap(),
            "a directory of refs is no branch"
        );
        let plain = dir.path().join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        assert!(branch_exists_in(&plain, &plain, "main").is_err(), "not a repository");
    }

    #[test]
    fn branch_names_follow_git_rules() {
        for ok in ["main", "trunk", "feature/login", "berth/task-1", "v1.2"] {
            assert!(BranchName::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "a..b", "a b", "x~1", "a:b", "HEAD", "a/", "a.lock", "a@{1}"] {
            assert!(BranchName::parse(bad).is_err(), "{bad:?}");
        }
    }
}

#[derive(Debug, Clone)]
pub struct RepositoryIdentity {
    /// The canonical work tree root.
    pub workdir: PathBuf,
    /// The canonical common git directory: the identity shared by the repository and all its worktrees.
    pub common_git_dir: PathBuf,
    /// HEAD's branch (also when unborn), if HEAD is not detached.
    pub head_branch: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("not a git repository")]
    NotARepository,
    #[error("a bare repository has no work tree")]
    Bare,
    #[error("the path is inside a repository but not its work tree root")]
    NotTheRoot,
}

/// Opens `path` read-only (isolated from user and system config) and reports its identity.
pub fn inspect_repository(path: &Path) -> Result<RepositoryIdentity, InspectError> {
    identity_of(&open(path)?, path)
}

fn open(path: &Path) -> Result<gix::Repository, InspectError> {
    gix::open_opts(path, gix::open::Options::isolated()).map_err(|_| InspectError::NotARepository)
}

fn identity_of(repo: &gix::Repository, path: &Path) -> Result<RepositoryIdentity, InspectError> {
    if repo.is_bare() {
        return Err(InspectError::Bare);
    }
    let workdir = repo.workdir().ok_or(InspectError::Bare)?;
    let workdir = workdir.canonicalize().map_err(|_| InspectError::NotARepository)?;
    if workdir != path {
        return Err(InspectError::NotTheRoot);
    }
    // gix returns the common dir un-normalized (`.../worktrees/x/../..`): canonicalize before comparing.
    let common_git_dir = repo
        .common_dir()
        .canonicalize()
        .map_err(|_| InspectError::NotARepository)?;
    let head_branch = repo.head_name().ok().flatten().map(|name| name.shorten().to_string());
    Ok(RepositoryIdentity {
        workdir,
        common_git_dir,
        head_branch,
    })
}

/// What a work tree directory is, as far as git says (read-only).
#[derive(Debug, Clone)]
pub struct WorktreeInfo {
    /// The canonical common git directory: equal to the source repository's when it is one of its worktrees.
    pub common_git_dir: PathBuf,
    /// The linked worktree's id (its admin directory under `<common>/worktrees/`), `None` for a main work tree.
    pub worktree_id: Option<String>,
    pub branch: Option<String>,
}

/// Inspects an existing work tree root without changing anything.
pub fn inspect_worktree(path: &Path) -> Result<WorktreeInfo, InspectError> {
    // One open for both questions (admission opened every worktree twice).
    let repo = open(path)?;
    let identity = identity_of(&repo, path)?;
    let git_dir = repo
        .git_dir()
        .canonicalize()
        .map_err(|_| InspectError::NotARepository)?;
    let worktree_id = (git_dir != identity.common_git_dir)
        .then(|| git_dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .flatten();
    Ok(WorktreeInfo {
        common_git_dir: identity.common_git_dir,
        worktree_id,
        branch: identity.head_branch,
    })
}

/// True when `refs/heads/<branch>` exists in the repository whose common git directory is
/// `common_git_dir` (the one berth recorded for it). Reads the ref store alone: opening the whole
/// repository (its configuration, its object database) cost more than the lookup, on the path of every
/// materialization. A lookup that fails that way (a ref it cannot parse, say) is asked again through
/// the repository at `repo_path`.
pub fn branch_exists_in(common_git_dir: &Path, repo_path: &Path, branch: &str) -> Result<bool, InspectError> {
    gix::discover::is_git(common_git_dir).map_err(|_| InspectError::NotARepository)?;
    let refs = gix::refs::file::Store::at(common_git_dir.to_path_buf(), gix::hash::Kind::Sha1);
    match refs.try_find(format!("refs/heads/{branch}").as_str()) {
        Ok(found) => Ok(found.is_some()),
        Err(_) => branch_exists(repo_path, branch),
    }
}

/// True when `refs/heads/<branch>` exists in the repository at `repo_path`.
pub fn branch_exists(repo_path: &Path, branch: &str) -> Result<bool, InspectError> {
    let repo = gix::open_opts(repo_path, gix::open::Options::isolated()).map_err(|_| InspectError::NotARepository)?;
    let name = format!("refs/heads/{branch}");
    Ok(repo.try_find_reference(name.as_str()).ok().flatten().is_some())
}
