//! Every path berth may create or remove is a `ManagedPath`, which only `ManagedRoot` can build: inside
//! `BERTH_WORKTREE_ROOT` and without following a symlink out of it (I13). A leaf module: git and the
//! executors take these types, and nothing here imports them back.
use std::path::{Component, Path, PathBuf};

use crate::config::Config;

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
    /// The only way to a root: `BERTH_WORKTREE_ROOT`, which configuration canonicalized at startup.
    pub fn from_config(config: &Config) -> ManagedRoot {
        ManagedRoot(config.worktree_root.clone())
    }

    #[cfg(test)]
    fn for_tests(canonical: PathBuf) -> ManagedRoot {
        ManagedRoot(canonical)
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

/// I11: consent to destroy uncommitted or untracked work in a worktree (`git worktree remove --force`).
/// Two ways to one: a request's explicit `discard_worktree_changes=true`, and reading back the cleanup
/// job snapshot that recorded it (`recorded_consent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consent {
    _given: (),
}

impl Consent {
    /// The request said `discard_worktree_changes=true`; anything else is no consent.
    pub(crate) fn from_discard_flag(discard_worktree_changes: Option<bool>) -> Option<Consent> {
        (discard_worktree_changes == Some(true)).then_some(Consent { _given: () })
    }
}

/// `#[serde(with)]` for a recorded consent: stored as the boolean `discard_worktree_changes`.
pub mod recorded_consent {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Consent;

    pub fn serialize<S: Serializer>(consent: &Option<Consent>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(consent.is_some())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Consent>, D::Error> {
        Ok(bool::deserialize(d)?.then_some(Consent { _given: () }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_paths_stay_inside_the_root() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = ManagedRoot::for_tests(dir.path().canonicalize().unwrap());
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
    fn consent_comes_only_from_an_explicit_flag_and_survives_its_record() {
        assert_eq!(Consent::from_discard_flag(None), None);
        assert_eq!(Consent::from_discard_flag(Some(false)), None);
        let given = Consent::from_discard_flag(Some(true));
        assert!(given.is_some());
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Record {
            #[serde(with = "recorded_consent")]
            discard_worktree_changes: Option<Consent>,
        }
        let stored = serde_json::to_value(Record {
            discard_worktree_changes: given.clone(),
        })
        .unwrap();
        assert_eq!(stored, serde_json::json!({"discard_worktree_changes": true}));
        let back: Record = serde_json::from_value(stored).unwrap();
        assert_eq!(back.discard_worktree_changes, given);
        let none: Record = serde_json::from_value(serde_json::json!({"discard_worktree_changes": false})).unwrap();
        assert_eq!(none.discard_worktree_changes, None);
    }
}
