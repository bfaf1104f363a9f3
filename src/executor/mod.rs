//! Executors: where an environment's files live and how they come to exist. `worktree` creates one git
//! worktree per repository slot under `BERTH_WORKTREE_ROOT`; `local` uses the registered repository itself
//! and never creates or removes anything. Every path berth may create or remove is a `ManagedPath`, which
//! only `ManagedRoot` can build, inside the root and without following a symlink out of it (I13).
pub mod admission;
pub mod worktree;

use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("a path component is not a plain name")]
    NotPlain,
    #[error("the path leaves the managed root")]
    Outside,
    #[error("a symlink lies on the path")]
    Symlink,
}

/// `BERTH_WORKTREE_ROOT`, canonical.
#[derive(Debug, Clone)]
pub struct ManagedRoot(PathBuf);

/// A path inside the managed root. No public constructor: destructive and creating git calls take this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedPath(PathBuf);

impl ManagedPath {
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl ManagedRoot {
    /// `root` must be canonical (configuration canonicalizes it at startup).
    pub fn new(root: PathBuf) -> ManagedRoot {
        ManagedRoot(root)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `root/part/part...` from plain names only; no existing component may be a symlink.
    pub fn join(&self, parts: &[&str]) -> Result<ManagedPath, PathError> {
        let mut path = self.0.clone();
        for part in parts {
            let mut comps = Path::new(part).components();
            match (comps.next(), comps.next()) {
                (Some(Component::Normal(_)), None) if !part.contains('/') => path.push(part),
                _ => return Err(PathError::NotPlain),
            }
            if let Ok(meta) = std::fs::symlink_metadata(&path)
                && meta.file_type().is_symlink()
            {
                return Err(PathError::Symlink);
            }
        }
        Ok(ManagedPath(path))
    }

    /// A path recorded in the inventory, accepted only if it is exactly where the root says it is: the
    /// canonical form equals the recorded one (no symlink anywhere) and lies inside the root.
    pub fn adopt(&self, recorded: &Path) -> Result<ManagedPath, PathError> {
        if !recorded.starts_with(&self.0) || recorded == self.0 {
            return Err(PathError::Outside);
        }
        let rel = recorded.strip_prefix(&self.0).map_err(|_| PathError::Outside)?;
        let parts: Vec<String> = rel
            .components()
            .map(|c| match c {
                Component::Normal(n) => Ok(n.to_string_lossy().into_owned()),
                _ => Err(PathError::NotPlain),
            })
            .collect::<Result<_, _>>()?;
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        self.join(&parts)
    }
}

/// The directory of a task under the root: a readable slug of its title and a unique suffix of its id.
pub fn task_dir_name(title: &str, task_id: uuid::Uuid) -> String {
    let mut slug = String::new();
    for c in title.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
        if slug.len() >= 40 {
            break;
        }
    }
    let slug = slug.trim_end_matches('-');
    let hex = task_id.simple().to_string();
    let suffix = &hex[hex.len() - 12..];
    if slug.is_empty() {
        format!("task-{suffix}")
    } else {
        format!("{slug}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_paths_stay_inside_the_root() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = ManagedRoot::new(dir.path().canonicalize().unwrap());
        assert!(root.join(&["task", "repo"]).is_ok());
        for bad in [&["..", "x"][..], &["a/b"], &["."], &["/etc"], &[""]] {
            assert!(root.join(bad).is_err(), "{bad:?}");
        }
        // A symlink planted under the root is not followed.
        let outside = tempfile::TempDir::new().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        assert!(matches!(root.join(&["link", "x"]), Err(PathError::Symlink)));
        assert!(matches!(root.adopt(&outside.path().join("x")), Err(PathError::Outside)));
        assert!(matches!(
            root.adopt(&root.path().join("a/../b")),
            Err(PathError::NotPlain)
        ));
        assert!(root.adopt(root.path()).is_err());
        assert_eq!(
            root.adopt(&root.path().join("t/r")).unwrap().as_path(),
            root.path().join("t/r")
        );
    }

    #[test]
    fn task_dirs_are_readable_and_unique() {
        let id = uuid::Uuid::parse_str("0190f0f0-0000-7000-8000-00000000abcd").unwrap();
        assert_eq!(task_dir_name("Add login: OAuth!", id), "add-login-oauth-00000000abcd");
        assert_eq!(task_dir_name("***", id), "task-00000000abcd");
    }
}
